"""A/B of the plain unfiltered numba kernels, a git revision against the working tree, in one
process (#27): a shared 2-core machine drifts by 10-30% between processes, so separate runs
cannot resolve a 5% change; here each query runs on both kernels back to back.

    python benchmarks/ab_plain_kernels.py --before HEAD --index /tmp/q/plain_1m.rsbm25 --rounds 8

``kernels/plain_unfiltered`` and ``kernels/selection`` of ``--before`` (``git show``) and of the
working tree are copied into two throwaway packages; the published plain file is opened once
(``open_index``) and its ``_kernels`` swapped between the two for each call. Queries: the
200 of ``bench_bm25.synthetic_arrays`` (the corpus the file was built from, default 1M
docs). Per query the best of ``--rounds`` (order alternating), then mean / p50 / p95, and
``search_batch_arrays`` with 1 and 2 threads per round (best, median). Answers of both
(ids and scores, single and batch) must be identical or it stops.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.bench_bm25 import synthetic_arrays  # noqa: E402
from ragspine_pipeline.retrieval.lexical.index.mapped import open_index  # noqa: E402

LEX = "ragspine_pipeline/retrieval/lexical"
MODULES = ("kernels/plain_unfiltered.py", "kernels/selection.py")


def _package(root: Path, name: str, rev: str | None):
    """The two kernel modules (of ``rev``, else the working tree) as package ``name``."""
    pkg = root / name
    for sub in ("", "kernels", "index"):  # the kernels' relative imports need the sub-packages
        (pkg / sub).mkdir(parents=True, exist_ok=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "index" / "postings.py").write_text(
        f"from {LEX.replace('/', '.')}.index.postings import BLOCK_SIZE  # noqa: F401\n")
    for m in MODULES:
        src = (subprocess.run(["git", "show", f"{rev}:{LEX}/{m}"], cwd=ROOT, check=True, capture_output=True, text=True).stdout
               if rev else (ROOT / LEX / m).read_text())
        (pkg / m).write_text(src)
    return importlib.import_module(f"{name}.kernels.plain_unfiltered")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", default="HEAD")
    ap.add_argument("--index", required=True, help="a published plain BM25 file of the synthetic corpus")
    ap.add_argument("--docs", type=int, default=1_000_000)
    ap.add_argument("--rounds", type=int, default=8)
    args = ap.parse_args()
    arrs = synthetic_arrays(args.docs)
    q_toks, q_lens = np.asarray(arrs["q_toks"]).tolist(), np.asarray(arrs["q_lens"]).tolist()
    queries, pos = [], 0
    for n in q_lens:
        queries.append([f"w{t}" for t in q_toks[pos:pos + n]])
        pos += n
    tmp = Path(tempfile.mkdtemp(prefix="ab_plain_"))
    sys.path.insert(0, str(tmp))
    mods = {"B": _package(tmp, "ab_before", args.before), "A": _package(tmp, "ab_after", None)}
    ix = open_index(args.index)
    kern = {n: dataclasses.replace(ix._kernels, search_one=m.search_one, search_batch=m.search_batch)
            for n, m in mods.items()}
    seen = {}
    for n in "AB":
        ix._kernels = kern[n]
        seen[n] = ([(r.ids.tolist(), r.scores.tolist()) for r in (ix.search(q, k=10) for q in queries)],
                   [x.tolist() for x in ix.search_batch_arrays(queries, k=10, threads=2)])
    assert seen["A"] == seen["B"], "answers differ"
    pc = time.perf_counter
    lat = {n: np.full((args.rounds, len(queries)), np.inf) for n in "AB"}
    batch = {(n, t): [] for n in "AB" for t in (1, 2)}
    for r in range(args.rounds):
        for i, q in enumerate(queries):
            for n in "AB" if (i + r) % 2 else "BA":
                ix._kernels = kern[n]
                t0 = pc()
                ix.search(q, k=10)
                lat[n][r, i] = pc() - t0
        for t in (1, 2):
            for n in "AB" if r % 2 else "BA":
                ix._kernels = kern[n]
                t0 = pc()
                ix.search_batch_arrays(queries, k=10, threads=t)
                batch[(n, t)].append(pc() - t0)
    for n, label in (("B", f"before ({args.before})"), ("A", "after (working tree)")):
        ms = lat[n].min(0) * 1e3
        print(f"{label}: single mean {ms.mean():.4f} ms ({1e3 / ms.mean():.0f} qps) p50 {np.median(ms):.4f} "
              f"p95 {np.percentile(ms, 95):.4f} ms | batch t1 best/median {min(batch[(n, 1)]) * 1e3:.1f}/"
              f"{np.median(batch[(n, 1)]) * 1e3:.1f} ms, t2 {min(batch[(n, 2)]) * 1e3:.1f}/{np.median(batch[(n, 2)]) * 1e3:.1f} ms")
        print("  per-round single sums (ms):", [round(float(x), 1) for x in lat[n].sum(1) * 1e3])


if __name__ == "__main__":
    main()
