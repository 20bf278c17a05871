"""Filtered BM25 queries on the PACKED layout against unfiltered ones, interleaved (issue #27 item 4).

    flock /tmp/heavy.lock nice -n 10 python benchmarks/bench_bm25_packed_filters.py \\
        --docs 10000000 --rounds 3 --label after --out benchmarks/results

The index, queries and filters are the large suite's (``bench_bm25.py peers``), already in
``benchmarks/.cache/large/``: the packed file of n synthetic Zipf documents
(``ragspine_<n>_stream_auto.bm25`` at 10M, ``ragspine_<n>_stream_packed.bm25`` at 1M),
memory-mapped, ``queries_<n>.json`` and the filters ``mask_<n>_<keep>.bits`` (packed bits of
``bench_bm25.filter_mask``: 50%, 5%, 0.1% and 0.01% kept). Each round runs every query
unfiltered and then under every filter and form, back to back (the order of the filtered
rows rotates per round), so load on the shared machine hits all rows alike; p50 over all
rounds. A filter is handed over as a bool mask (what ``bench_bm25`` passes), as packed
words (``PackedFilter``) and, for the selective ones, as sorted positions; a dense filter
(at least ``DENSE_FROM`` kept) is timed once more as packed words with the window route off
(``packed-taat``: the term-at-a-time route), when the engine has the switch.

Filtered answers of the first ``--check`` queries are compared with the numpy path of the
same index (the executable spec: N, df and avgdl over the survivors): same ids, scores
within 1e-9. ``--engine`` runs another checkout's engine (a "before" run: ``git archive
<commit> ragspine_pipeline | tar -x -C DIR``) with this script. Results accumulate in
``bm25_packed_filters.json`` (one run per (docs, label)) and ``bm25_packed_filters.md``.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
LARGE = ROOT / "benchmarks" / ".cache" / "large"
KEEPS = (0.5, 0.05, 0.001, 0.0001)
POSITIONS_UP_TO = 0.05  # filters this selective are also timed as sorted positions
DENSE_FROM = 0.25  # filters this dense are also timed as packed words on the term-at-a-time route


def index_file(n: int) -> Path | None:
    """The cached packed file of the large suite at n documents (None when not built yet)."""
    for name in (f"ragspine_{n}_stream_auto.bm25", f"ragspine_{n}_stream_packed.bm25"):
        path = LARGE / name
        if path.exists():
            return path
    return None


def prepare(n: int) -> None:
    """What ``bench_bm25.py peers-large`` leaves in the cache, made here when missing: the
    synthetic corpus, its queries, the filters' packed bits and the packed file (streamed
    build, this checkout's engine). Runs in its own process (``--prepare``), so a measuring
    process imports only the engine it measures; the caller holds the heavy lock."""
    sys.path.insert(0, str(ROOT))
    from benchmarks import bench_bm25 as bb

    LARGE.mkdir(parents=True, exist_ok=True)
    qj = LARGE / f"queries_{n}.json"
    if not qj.exists():
        qj.write_text(json.dumps(bb._large_queries(bb.synthetic_arrays(n))))
    bb._mask_prefix(n)
    if index_file(n) is None:
        path = LARGE / f"ragspine_{n}_stream_packed.bm25"
        rec = bb._ragspine_build({"k1": bb.K1, "build": "stream", "layout": "packed"}, path, n)
        path.with_name(path.name + ".build.json").write_text(json.dumps(rec))
        print(json.dumps(rec), file=sys.stderr)


def filters(n: int) -> dict[str, tuple[object, int]]:
    """``"<keep>:<form>"`` -> (the filter in that form, its survivors)."""
    from ragspine_pipeline.retrieval.lexical.index.filter import PackedFilter

    out: dict[str, tuple[object, int]] = {}
    for keep in KEEPS:
        raw = np.fromfile(LARGE / f"mask_{n}_{keep}.bits", np.uint8)
        mask = np.unpackbits(raw, bitorder="little")[:n].astype(np.bool_)
        kept = int(mask.sum())
        out[f"{keep}:mask"] = (mask, kept)
        out[f"{keep}:packed"] = (PackedFilter.from_mask(mask), kept)
        if keep <= POSITIONS_UP_TO:
            out[f"{keep}:positions"] = (np.flatnonzero(mask).astype(np.int64), kept)
    return out


def _timed(fn, *args, **kw) -> tuple[float, object]:
    """(wall seconds, result)."""
    t0 = time.perf_counter()
    out = fn(*args, **kw)
    return time.perf_counter() - t0, out


def measure(n: int, rounds: int, label: str, check: int) -> dict:
    # Not bench_bm25_filters' helpers: importing it imports this checkout's engine, and a
    # before run (--engine) must import only the other one.
    import ragspine_pipeline
    from ragspine_pipeline.retrieval.lexical.index.mapped import open_index

    print(f"engine: {ragspine_pipeline.__file__}", file=sys.stderr)

    path = index_file(n)
    if path is None:
        raise SystemExit(f"no cached packed index for {n} documents under {LARGE}: run this script with "
                         "--prepare first (under the heavy lock)")
    idx = open_index(path)
    queries = [q for q in json.loads((LARGE / f"queries_{n}.json").read_text())
               if any(idx.vocab.get(t) is not None for t in q)]
    fil = filters(n)
    from ragspine_pipeline.retrieval.lexical.index import packed_filter_search as fsearch

    if hasattr(fsearch, "WINDOWS"):  # this engine routes dense filters: time the other route too
        for keep in KEEPS:
            if keep >= DENSE_FROM:
                fil[f"{keep}:packed-taat"] = fil[f"{keep}:packed"]

    def search(q, name):
        if not name.endswith("-taat"):
            return idx.search(q, 10, candidates=fil[name][0])
        fsearch.WINDOWS = 0
        try:
            return idx.search(q, 10, candidates=fil[name][0])
        finally:
            fsearch.WINDOWS = 1

    for q in queries:  # warm: the page cache, first-use checks, lazily built filter support
        idx.search(q, 10)
        for f, _ in fil.values():
            idx.search(q, 10, candidates=f)
    lat: dict[str, list[float]] = {"unfiltered": [], **{name: [] for name in fil}}
    got: dict[str, list] = {name: [] for name in fil}
    for r in range(rounds):
        names = list(fil)
        names = names[r % len(names):] + names[:r % len(names)]
        for q in queries:
            lat["unfiltered"].append(_timed(idx.search, q, 10)[0])
            for name in names:
                dt, res = _timed(search, q, name)
                lat[name].append(dt)
                if r == 0 and len(got[name]) < check:
                    got[name].append(res)
    spec = copy.copy(idx)
    spec._kernels = None  # the numpy path: the executable spec of filtered scoring
    unf = 1000 * statistics.median(lat["unfiltered"])
    rows = []
    for name, (f, kept) in fil.items():
        keep, form = name.split(":")
        same = sum(bool(np.array_equal(ref.ids, res.ids) and np.allclose(ref.scores, res.scores, rtol=0, atol=1e-9))
                   for ref, res in ((spec.search(q, 10, candidates=f), res) for q, res in zip(queries, got[name], strict=False)))
        p50 = 1000 * statistics.median(lat[name])
        rows.append({"engine": "ragspine-packed", "label": label, "docs": n, "filter_keeps": float(keep),
                     "filter_as": form, "survivors": kept, "queries": len(queries), "rounds": rounds,
                     "p50_ms": round(p50, 4), "mean_ms": round(1000 * float(np.mean(lat[name])), 4),
                     "unfiltered_p50_ms": round(unf, 4), "ratio_p50": round(p50 / unf, 3),
                     "identical_to_numpy_path": f"{same}/{len(got[name])}"})
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return {"label": label, "docs": n, "commit": head.stdout.strip(), "loadavg_1m": round(os.getloadavg()[0], 2),
            "unfiltered_p50_ms": round(unf, 4), "unfiltered_mean_ms": round(1000 * float(np.mean(lat["unfiltered"])), 4),
            "rows": rows}


def markdown(report: dict) -> str:
    lines = ["# BM25 on the packed layout: filtered against unfiltered queries, interleaved (issue #27 item 4)", "",
             "Command (per size and label): `flock /tmp/heavy.lock nice -n 10 python "
             "benchmarks/bench_bm25_packed_filters.py --docs N --rounds R --label L --out benchmarks/results` "
             "(a before run adds `--engine DIR`, DIR holding `git archive <commit> ragspine_pipeline`).", "",
             f"Machine: {report['machine']}.", "",
             "The large suite's synthetic Zipf corpora, memory-mapped packed index, its 200 queries, top-10. Each "
             "round runs a query unfiltered, then under every filter and form; p50 over all rounds. `ratio` = "
             "filtered p50 / unfiltered p50 of the same run (goal: <= 1.1). Filtered scores use N, df and avgdl "
             "over the survivors (the spec); `identical` compares the first queries with the numpy path of the "
             "same index (same ids, scores within 1e-9). `packed-taat`: packed words with the dense filters' window "
             "route switched off (term at a time), in the same run. The box is shared (2 cores): compare ratios "
             "within a run.",
             ""]
    for run in sorted(report["runs"], key=lambda r: (r["docs"], r["label"] != "before", r["label"])):
        lines += [f"## {run['label']} ({run['docs']:,} docs): unfiltered p50 {run['unfiltered_p50_ms']:.3f} ms",
                  "", f"Engine at commit {run['commit']}, loadavg_1m {run['loadavg_1m']}. {run.get('note', '')}", "",
                  "| filter keeps | given as | survivors | p50 ms | mean ms | ratio | identical to numpy path |",
                  "|---|---|---|---|---|---|---|"]
        for r in sorted(run["rows"], key=lambda r: (-r["filter_keeps"], r["filter_as"])):
            lines.append(f"| {r['filter_keeps']} | {r['filter_as']} | {r['survivors']:,} | {r['p50_ms']:.3f} | "
                         f"{r['mean_ms']:.3f} | {r['ratio_p50']:.2f}x | {r['identical_to_numpy_path']} |")
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--docs", type=int, default=10_000_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--label", default="after")
    ap.add_argument("--check", type=int, default=20, help="queries per row compared with the numpy path")
    ap.add_argument("--engine", default=None, help="a folder holding another checkout's ragspine_pipeline")
    ap.add_argument("--engine-commit", default=None, help="the commit --engine was archived from")
    ap.add_argument("--note", default="")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "out"))
    ap.add_argument("--prepare", action="store_true", help="only make the cached corpus, queries, filters and "
                    "packed file when missing (this checkout's engine), then exit")
    args = ap.parse_args()
    if args.prepare:
        prepare(args.docs)
        return
    if args.engine:
        sys.path.insert(0, str(Path(args.engine).resolve()))
    run = measure(args.docs, args.rounds, args.label, args.check)
    run["note"] = args.note
    if args.engine:
        run["commit"] = args.engine_commit or f"engine from {args.engine}"
    run["command"] = shlex.join(["python", *sys.argv])
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "bm25_packed_filters.json"
    report = json.loads(path.read_text()) if path.exists() else {"runs": []}
    report["runs"] = [r for r in report["runs"] if (r["docs"], r["label"]) != (args.docs, args.label)] + [run]
    import numba

    report["machine"] = (f"{os.cpu_count()} CPUs, Python {platform.python_version()}, numpy {np.__version__}, "
                         f"numba {numba.__version__}")
    path.write_text(json.dumps(report, indent=1) + "\n")
    (out / "bm25_packed_filters.md").write_text(markdown(report))
    print(json.dumps({k: v for k, v in run.items() if k != "rows"}))
    for r in run["rows"]:
        print(f"{r['filter_keeps']:>7} {r['filter_as']:>10} p50 {r['p50_ms']:.3f} ratio {r['ratio_p50']:.2f} "
              f"identical {r['identical_to_numpy_path']}")


if __name__ == "__main__":
    main()
