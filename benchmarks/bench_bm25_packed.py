"""Packed vs plain BM25 postings layout on synthetic Zipf documents (#27 item 3).

Builds ``RawPostings`` straight from ``bench_bm25.synthetic_arrays`` (the same corpus as the
peers benchmark: Zipf s=1.1 over 200k terms, Poisson(60) lengths, 200 queries of 2-5
terms), publishes it in both layouts (``write_plain`` / ``write_packed``), opens each
mapped, and measures bytes on disk (bytes per posting), single-query and batched top-10
throughput, filtered p50 latency at 50/5/0.1/0.01% survivors, and checks that the two
layouts give the same answers (unfiltered: identical ids and scores; filtered: identical
ids, scores to 1e-12 relative).

    nice -n 10 prlimit --as=2500000000 .venv/bin/python benchmarks/bench_bm25_packed.py --docs 500000
    (1M documents peak at ~3 GB: run under ``flock /tmp/heavy.lock``)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.bench_bm25 import CACHE, synthetic_arrays  # noqa: E402
from ragspine_pipeline.retrieval.lexical.format.raw import RawPostings  # noqa: E402
from ragspine_pipeline.retrieval.lexical.index.mapped import open_index  # noqa: E402
from ragspine_pipeline.retrieval.lexical.refresh.publish import write_packed, write_plain  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
FILTERS = (0.5, 0.05, 0.001, 0.0001)
ROUNDS = 5


def raw_from_ids(lens: np.ndarray, toks: np.ndarray) -> RawPostings:
    """Counted postings of documents given as token ids (one sort of term*N + doc keys)."""
    n = len(lens)
    keys = np.asarray(toks).astype(np.int64)
    keys *= n
    keys += np.repeat(np.arange(n, dtype=np.int64), lens)
    keys.sort()
    starts = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]])
    tf = np.diff(np.append(starts, len(keys))).astype(np.uint32)
    uniq = keys[starts]
    del keys
    term = uniq // n
    docs = (uniq - term * n).astype(np.int32)
    del uniq
    present, local = np.unique(term, return_inverse=True)
    indptr = np.zeros(len(present) + 1, np.int64)
    np.cumsum(np.bincount(local, minlength=len(present)), out=indptr[1:])
    tf_dtype = np.uint8 if tf.max() < 256 else np.uint16 if tf.max() < 65536 else np.uint32
    return RawPostings(indptr=indptr, indices=docs, tf=tf.astype(tf_dtype), doc_len=np.asarray(lens, np.uint32),
                       terms=[f"w{t}" for t in present.tolist()])


def _timed(fn) -> tuple[float, object]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def measure(ix, queries: list[list[str]], masks: dict[float, np.ndarray]) -> dict:
    """qps single (best of rounds), batch qps (2 threads, best of rounds), filtered p50."""
    for q in queries:  # warm: every query term resolved and verified, kernels compiled
        ix.search(q, k=10)
    ix.search_batch(queries, k=10, threads=2)
    single = min(_timed(lambda: [ix.search(q, k=10) for q in queries])[0] for _ in range(ROUNDS))
    batch = min(_timed(lambda: ix.search_batch(queries, k=10, threads=2))[0] for _ in range(ROUNDS))
    lat = [_timed(lambda q=q: ix.search(q, k=10))[0] for _ in range(3) for q in queries]
    filtered = {}
    for frac, mask in masks.items():
        ix.search(queries[0], k=10, candidates=mask)
        f_lat = [_timed(lambda q=q, m=mask: ix.search(q, k=10, candidates=m))[0] for q in queries]
        filtered[str(frac)] = round(float(np.median(f_lat)) * 1e3, 4)
    return {"qps": round(len(queries) / single, 1), "batch_qps": round(len(queries) / batch, 1),
            "p50_ms": round(float(np.median(lat)) * 1e3, 4), "filtered_p50_ms": filtered}


def compare(a, b, queries, masks) -> dict:
    """How many answers the two indexes give identically."""
    unf = sum(a.search(q, k=10).ids.tolist() == b.search(q, k=10).ids.tolist()
              and np.array_equal(a.search(q, k=10).scores, b.search(q, k=10).scores) for q in queries)
    filt = 0
    for mask in masks.values():
        for q in queries:
            x, y = a.search(q, k=10, candidates=mask), b.search(q, k=10, candidates=mask)
            filt += x.ids.tolist() == y.ids.tolist() and bool(np.allclose(x.scores, y.scores, rtol=1e-12, atol=0))
    return {"unfiltered_identical": f"{unf}/{len(queries)}", "filtered_same_topk": f"{filt}/{len(queries) * len(masks)}"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--docs", type=int, default=1_000_000)
    ap.add_argument("--out", default=str(RESULTS / "bm25_packed"))
    ap.add_argument("--keep", action="store_true", help="keep the published files in benchmarks/.cache")
    ap.add_argument("--wrapper", default="nice -n 10 prlimit --as=2500000000",
                    help="how the run was wrapped, recorded with the command (1M docs: add flock /tmp/heavy.lock)")
    args = ap.parse_args()
    arrs = synthetic_arrays(args.docs)
    t_raw, raw = _timed(lambda: raw_from_ids(np.asarray(arrs["lens"]), arrs["toks"]))
    q_toks, q_lens = np.asarray(arrs["q_toks"]).tolist(), np.asarray(arrs["q_lens"]).tolist()
    queries, pos = [], 0
    for n in q_lens:
        queries.append([f"w{t}" for t in q_toks[pos:pos + n]])
        pos += n
    rng = np.random.default_rng(3)
    masks = {f: rng.random(raw.n_docs) < f for f in FILTERS}
    folder = CACHE / f"bm25_packed_{args.docs}"
    folder.mkdir(parents=True, exist_ok=True)
    rows, opened = {}, {}
    for layout, writer in (("packed", write_packed), ("plain", write_plain)):
        path = folder / f"{layout}.rsbm25"
        t_build, _ = _timed(lambda w=writer, p=path: w(raw, p, k1=1.5, b=0.75))
        t_open, ix = _timed(lambda p=path: open_index(p))
        size = path.stat().st_size
        arrays = ix._file.arrays
        rows[layout] = {"layout": layout, "docs": raw.n_docs, "postings": raw.n_postings, "bytes": size,
                        "bitset_rows": int(arrays["bits"].shape[0]),
                        "array_bytes": {name: int(arr.nbytes) for name, arr in arrays.items()},
                        "bytes_per_posting": round(size / raw.n_postings, 3), "write_s": round(t_build, 2),
                        "open_s": round(t_open, 4), **measure(ix, queries, masks)}
        opened[layout] = ix
        print(json.dumps(rows[layout]), flush=True)
    report = {
        "command": f"{args.wrapper} .venv/bin/python benchmarks/bench_bm25_packed.py {' '.join(sys.argv[1:])}",
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count(), "load_1m": os.getloadavg()[0],
                    "platform": platform.platform()},
        "corpus": {"docs": raw.n_docs, "postings": raw.n_postings, "terms": raw.n_terms,
                   "raw_count_s": round(t_raw, 2)},
        "rows": [rows["plain"], rows["packed"]],
        "ratios_packed_over_plain": {k: round(rows["packed"][k] / rows["plain"][k], 3)
                                     for k in ("bytes", "qps", "batch_qps", "p50_ms")},
        "answers": compare(opened["packed"], opened["plain"], queries, masks),
    }
    Path(args.out + ".json").write_text(json.dumps(report, indent=2) + "\n")
    Path(args.out + ".md").write_text(markdown(report))
    print(markdown(report))
    if not args.keep:
        del opened
        shutil.rmtree(folder, ignore_errors=True)


def markdown(r: dict) -> str:
    c = r["corpus"]
    lines = [f"# BM25 postings layouts: packed vs plain ({c['docs']:,} synthetic Zipf docs, "
             f"{c['postings']:,} postings)", "", f"Command: `{r['command']}`", "",
             f"Machine: {r['machine']['cpus']} CPUs, load {r['machine']['load_1m']:.1f} at the end, "
             f"Python {r['machine']['python']}.", "",
             "| layout | bytes | bytes/posting | write s | open s | qps (1 thread) | batch qps (2 threads) "
             "| p50 ms | filtered p50 ms 50% / 5% / 0.1% / 0.01% |", "|---|---|---|---|---|---|---|---|---|"]
    for row in r["rows"]:
        f = " / ".join(f"{v:.3f}" for v in row["filtered_p50_ms"].values())
        lines.append(f"| {row['layout']} | {row['bytes']:,} | {row['bytes_per_posting']} | {row['write_s']} | "
                     f"{row['open_s']} | {row['qps']} | {row['batch_qps']} | {row['p50_ms']} | {f} |")
    lines += ["", "Packed / plain: " + ", ".join(f"{k} {v}" for k, v in r["ratios_packed_over_plain"].items()),
              "", f"Answers: unfiltered identical (ids and scores) {r['answers']['unfiltered_identical']}; "
              f"filtered same top-10 {r['answers']['filtered_same_topk']}.", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
