"""Brute-force (in-process numpy) vs LanceDB IVF-PQ at 100k vectors: latency and recall@10.

    python benchmarks/bench_vector_stores.py [--n 100000] [--dim 384]

Vectors are clustered (1,000 Gaussian centres) so an ANN index has structure to use;
queries are perturbed corpus points. Recall@10 is measured against the exact brute-force
answer. Needs the ``[ann]`` extra.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.common import add_io_args, out_dir, say_written  # noqa: E402
from ragspine_pipeline.retrieval.vector.lancedb_store import LanceDBVectorStore  # noqa: E402
from ragspine_pipeline.retrieval.vector.store import InProcessVectorStore  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--dim", type=int, default=384)
    ap.add_argument("--queries", type=int, default=100)
    add_io_args(ap, data=False)
    args = ap.parse_args()
    RESULTS = out_dir(args.out)
    rng = np.random.default_rng(3)
    centres = rng.normal(size=(1000, args.dim)).astype(np.float32)
    vecs = centres[rng.integers(0, 1000, args.n)] + 0.35 * rng.normal(size=(args.n, args.dim)).astype(np.float32)
    ids = [f"c{i:07d}" for i in range(args.n)]
    meta = [{"entity": "A" if i % 3 else "B"} for i in range(args.n)]
    queries = vecs[rng.integers(0, args.n, args.queries)] + 0.1 * rng.normal(size=(args.queries, args.dim)).astype(np.float32)
    rows = {}
    brute = InProcessVectorStore()
    t0 = time.perf_counter()
    brute.upsert(ids, vecs, meta)
    rows["brute_force"] = {"build_s": time.perf_counter() - t0}
    with tempfile.TemporaryDirectory() as tmp:
        lance = LanceDBVectorStore(tmp, nprobes=20, refine_factor=10)
        t0 = time.perf_counter()
        lance.upsert(ids, vecs, meta)
        lance.build_index(num_partitions=256, num_sub_vectors=args.dim // 8)
        rows["lancedb_ivf_pq"] = {"build_s": time.perf_counter() - t0}
        for where in (None, {"entity": "B"}):
            tag = "" if where is None else "_filtered"
            exact = [[h.id for h in brute.query(q, 10, where)] for q in queries]
            for name, store in (("brute_force", brute), ("lancedb_ivf_pq", lance)):
                store.query(queries[0], 10, where)
                lat, found = [], []
                for q in queries:
                    t = time.perf_counter()
                    found.append([h.id for h in store.query(q, 10, where)])
                    lat.append(time.perf_counter() - t)
                recall = statistics.mean(len(set(f) & set(e)) / 10 for f, e in zip(found, exact, strict=True))
                rows[name].update({f"p50_ms{tag}": 1000 * statistics.median(lat),
                                   f"p95_ms{tag}": 1000 * float(np.percentile(lat, 95)), f"recall@10{tag}": recall})
    cmd = "python benchmarks/bench_vector_stores.py " + " ".join(sys.argv[1:])
    (RESULTS / "vector_stores.json").write_text(json.dumps({"command": cmd, "cpu_count": os.cpu_count(), "n": args.n,
                                                            "dim": args.dim, "rows": rows}, indent=2))
    lines = [f"# Vector stores at {args.n:,} vectors × {args.dim}\n", f"Command: `{cmd}` (cpu_count={os.cpu_count()})\n",
             "| store | build s | p50 ms | p95 ms | recall@10 | p50 ms (filter 1/3) | recall@10 (filter) |",
             "|---|---|---|---|---|---|---|"]
    for name, r in rows.items():
        lines.append(f"| {name} | {r['build_s']:.1f} | {r['p50_ms']:.2f} | {r['p95_ms']:.2f} | {r['recall@10']:.3f} | "
                     f"{r['p50_ms_filtered']:.2f} | {r['recall@10_filtered']:.3f} |")
    (RESULTS / "vector_stores.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    say_written([RESULTS / "vector_stores.json", RESULTS / "vector_stores.md"])


if __name__ == "__main__":
    main()
