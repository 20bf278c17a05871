"""Open cost of a published library (#27 item 2): time and memory of
``open_published_retriever`` in a fresh process, and the answers it gives.

    python benchmarks/bench_open.py                       # build (resumable) + measure
    python benchmarks/bench_open.py --out benchmarks/results --label after

The library is SciFact's documents written ten times under distinct ids (51,830
documents, ~253k chunks: the ``scifact-x10`` row of bench_pipeline), published BM25-only
by the engine steps the Dagster assets call (raw -> chunks -> lexical_index ->
snapshot). The warehouse is kept in ``--cache`` (default ``benchmarks/.cache/open``,
git-ignored): a second run only refreshes what changed (e.g. a lexical index rewritten
with its BM25 file after a code change) and goes straight to the measurement.

Each measured open runs in a new Python process after the package is imported: wall
time of ``open_published_retriever(W, library, mode="bm25")``; peak RSS growth during
the open (VmHWM after minus VmRSS before, the peak reset through
``/proc/self/clear_refs``); RSS/PSS/USS after the open from ``/proc/self/smaps_rollup``
(a mapped index is shared between processes: RSS counts it in each, USS does not).

Answers: the first process also runs ``--queries`` SciFact queries (top 10) and writes
the snippets (text, ids, scores, order) as JSON; their sha256 is reported, and with
``--reference FILE`` compared to a run of other code (byte-identical or not).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.bench_bm25_mmap import _reset_peak, _rollup_kib, _status_kib  # noqa: E402
from benchmarks.common import add_io_args, out_dir, require_sets, say_written, use_data  # noqa: E402
from ragspine_pipeline.retrieval.chunking.chunk_columns import CACHE_MAX  # noqa: E402

LIBRARY = "scifact_x10"
COPIES = 10
DEFAULT_CACHE = ROOT / "benchmarks" / ".cache" / "open"


def write_library(folder: Path, data: Path) -> int:
    """SciFact x COPIES as one .txt per document (written once; a marker says it is whole)."""
    marker = folder / ".complete"
    if marker.exists():
        return int(marker.read_text())
    from ragspine_pipeline.eval.beir import load_beir

    ds = load_beir(data / "scifact")
    folder.mkdir(parents=True, exist_ok=True)
    n = 0
    for k in range(COPIES):
        for i, d in enumerate(ds.corpus.values()):
            (folder / f"c{k}_d{i:06d}.txt").write_text(f"{d.title}\n\n{d.text}\n", encoding="utf-8")
            n += 1
    marker.write_text(str(n))
    return n


def build(cache: Path, data: Path) -> dict:
    """The published BM25-only library, by the asset's engine steps (each incremental)."""
    from ragspine_pipeline.warehouse.pipeline import (
        build_chunks,
        build_lexical_index,
        build_raw_documents,
        publish_snapshot,
    )
    from ragspine_pipeline.warehouse.versioned import VersionedTables

    docs = write_library(cache / "corpus" / LIBRARY, data)
    wh = VersionedTables(cache / "warehouse")
    steps = {}
    for name, fn in (("raw_documents", lambda: build_raw_documents(wh, cache / "corpus", LIBRARY)),
                     ("chunks", lambda: build_chunks(wh, LIBRARY)),
                     ("lexical_index", lambda: build_lexical_index(wh, LIBRARY)),
                     ("snapshot", lambda: publish_snapshot(wh, LIBRARY))):
        t0 = time.perf_counter()
        res = fn()
        steps[name] = {"seconds": round(time.perf_counter() - t0, 2), "version": res.published.version,
                       **{k: v for k, v in res.metadata.items()
                          if k in ("reused", "active_chunks", "chunks_indexed", "bm25_docs", "bm25_bytes",
                                   "bm25_seconds")}}
        print(f"  {name}: {steps[name]}", file=sys.stderr)
    return {"documents": docs, "steps": steps}


def child(warehouse: str, queries: int, dump: str | None, data: str, preload: bool, hold: float = 0.0) -> None:
    """One fresh process: import, reset the peak, open, measure; optionally answer queries.

    ``preload``: the compiled BM25 kernels (numba, loaded by the first index a process
    opens: ~0.4 s and ~120 MiB, most of it the shared LLVM library) are loaded before the
    timer, as in a serving process that has opened an index before. ``hold``: after
    answering, keep the index open that many seconds (the first of two serving processes).
    USS growth is measured after the open and the queries (``uss_growth_mib``)."""
    from ragspine_pipeline.eval.beir import load_beir
    from ragspine_pipeline.serving import open_published_retriever

    qs = list(load_beir(Path(data) / "scifact").queries.values())[:queries] if dump or hold else []
    if preload:
        from ragspine_pipeline.retrieval.lexical.bm25_kernel import load_kernels

        load_kernels()
    before = _status_kib("VmRSS")
    uss_before = _rollup_kib()["uss"]
    _reset_peak()
    t0 = time.perf_counter()
    r = open_published_retriever(warehouse, LIBRARY, mode="bm25")
    open_s = time.perf_counter() - t0
    peak = _status_kib("VmHWM")
    roll = _rollup_kib()
    inner = getattr(getattr(r, "index", None), "retriever", None)
    out = {"open_s": round(open_s, 4), "rss_before_mib": round(before / 1024, 1),
           "peak_growth_mib": round((peak - before) / 1024, 1),
           **{f"{k}_after_mib": round(roll[k] / 1024, 1) for k in ("rss", "pss", "uss")},
           "chunks": len(inner) if inner is not None else None,
           "bm25_index": type(getattr(inner, "index", None)).__name__}
    if qs:
        t1 = time.perf_counter()
        answers = [r.retrieve(q, top_k=10) for q in qs]
        out["query_s"] = round(time.perf_counter() - t1, 3)
        out["queries"] = len(qs)
        out["uss_growth_mib"] = round((_rollup_kib()["uss"] - uss_before) / 1024, 1)
        if dump:
            Path(dump).write_text(json.dumps(answers, sort_keys=True, ensure_ascii=False, default=str))
    print(json.dumps(out), flush=True)
    if hold:
        time.sleep(hold)


def throughput_child(warehouse: str, queries: int, data: str, rounds: int = 7) -> None:
    """Mapped vs today's in-memory path, one process, rounds alternating (same machine load
    for both): ``retrieve(q, top_k=10)`` over the first ``queries`` SciFact queries, warm.
    The in-memory retriever is the token path (``_published_files`` answering None, as for a
    version written before the files)."""
    from ragspine_pipeline.eval.beir import load_beir
    from ragspine_pipeline.serving import open_published_retriever
    from ragspine_pipeline.warehouse import pipeline as P

    qs = list(load_beir(Path(data) / "scifact").queries.values())[:queries]
    mapped = open_published_retriever(warehouse, LIBRARY, mode="bm25")
    real = P._published_files
    P._published_files = lambda *a, **k: None
    try:
        built = open_published_retriever(warehouse, LIBRARY, mode="bm25")
    finally:
        P._published_files = real
    times: dict[str, list[float]] = {"mapped": [], "in_memory": []}
    cold = {}
    for name, r in (("mapped", mapped), ("in_memory", built)):  # first pass: checksums, page faults, caches
        t0 = time.perf_counter()
        for q in qs:
            r.retrieve(q, top_k=10)
        cold[name] = round((time.perf_counter() - t0) / len(qs) * 1000, 4)
    for _ in range(rounds):
        for name, r in (("mapped", mapped), ("in_memory", built)):
            t0 = time.perf_counter()
            for q in qs:
                r.retrieve(q, top_k=10)
            times[name].append((time.perf_counter() - t0) / len(qs) * 1000)
    ratios = [b / m for m, b in zip(times["mapped"], times["in_memory"], strict=True)]
    print(json.dumps({"queries": len(qs), "rounds": rounds, "first_pass_ms_per_query": cold,
                      "mapped_ms_per_query": [round(x, 4) for x in times["mapped"]],
                      "in_memory_ms_per_query": [round(x, 4) for x in times["in_memory"]],
                      "qps_ratio_mapped_over_in_memory_median": round(statistics.median(ratios), 3),
                      "qps_ratio_best_of": round(min(times["in_memory"]) / min(times["mapped"]), 3)}))


def _child_cmd(warehouse: Path, queries: int, data: Path, *extra: str) -> list[str]:
    return [sys.executable, __file__, "--child", str(warehouse), "--queries", str(queries), "--data", str(data),
            *extra]


def second_process(warehouse: Path, queries: int, data: Path) -> dict:
    """Two serving processes on one snapshot: the first opens, answers and holds; the
    second (kernels preloaded in both) opens and answers the same queries. Its USS growth
    is what a further process costs: the mapped files' pages are shared, not private."""
    index_bytes = sum(p.stat().st_size for p in warehouse.rglob("*") if p.name in ("bm25.rsbm25",
                                                                                  "served_chunks.arrow"))
    first = subprocess.Popen(_child_cmd(warehouse, queries, data, "--preload-kernels", "--hold", "120"),
                             stdout=subprocess.PIPE, text=True)
    try:
        a = json.loads(first.stdout.readline())
        b = run_child(warehouse, queries, None, data, preload=True, extra=("--hold", "0.001"))
    finally:
        first.kill()
        first.wait()
    return {"first": a, "second": b, "published_bytes_all_versions": index_bytes,
            "second_uss_growth_mib": b["uss_growth_mib"]}


def run_child(warehouse: Path, queries: int, dump: Path | None, data: Path, preload: bool = False,
              extra: tuple[str, ...] = ()) -> dict:
    cmd = _child_cmd(warehouse, queries, data, *(["--preload-kernels"] if preload else []), *extra)
    if dump is not None:
        cmd += ["--dump", str(dump)]
    res = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if res.returncode:
        raise SystemExit(f"child failed:\n{res.stderr[-3000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_io_args(ap)
    ap.add_argument("--cache", default=str(DEFAULT_CACHE), help="warehouse + corpus kept between runs")
    ap.add_argument("--runs", type=int, default=5, help="fresh processes timed (default 5)")
    ap.add_argument("--queries", type=int, default=100, help="SciFact queries answered (default 100)")
    ap.add_argument("--reference", default=None, help="answers JSON of another run, compared byte for byte")
    ap.add_argument("--label", default="", help="name of this run in the report (e.g. before, after)")
    ap.add_argument("--skip-build", action="store_true", help="measure the cached warehouse as it is")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--dump", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--preload-kernels", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--throughput-child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--hold", type=float, default=0.0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    data = use_data(args.data)
    if args.child and args.throughput_child:
        throughput_child(args.child, args.queries, str(data))
        return
    if args.child:
        child(args.child, args.queries, args.dump, str(data), args.preload_kernels, args.hold)
        return
    require_sets(data, ["scifact"])
    cache = Path(args.cache)
    cache.mkdir(parents=True, exist_ok=True)
    report: dict = {"command": " ".join([Path(sys.executable).name, *sys.argv]), "label": args.label,
                    "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                                "platform": platform.platform()}}
    if not args.skip_build:
        t0 = time.perf_counter()
        report["build"] = build(cache, data)
        report["build"]["seconds"] = round(time.perf_counter() - t0, 1)
    answers = cache / f"answers{('_' + args.label) if args.label else ''}.json"
    report["load_before"] = os.getloadavg()
    runs = [run_child(cache / "warehouse", args.queries, answers if i == 0 else None, data) for i in range(args.runs)]
    warm = [run_child(cache / "warehouse", args.queries, None, data, preload=True) for _ in range(args.runs)]
    tp = subprocess.run([sys.executable, __file__, "--child", str(cache / "warehouse"), "--throughput-child",
                         "--queries", "300", "--data", str(data)], capture_output=True, text=True, check=True)
    report["throughput"] = json.loads(tp.stdout.strip().splitlines()[-1])
    report["two_processes"] = second_process(cache / "warehouse", args.queries, data)
    report["load_after"] = os.getloadavg()
    report["runs"] = runs
    report["runs_kernels_preloaded"] = warm
    report["preloaded_open_s_median"] = statistics.median(r["open_s"] for r in warm)
    report["preloaded_peak_growth_mib_max"] = max(r["peak_growth_mib"] for r in warm)
    report["open_s_median"] = statistics.median(r["open_s"] for r in runs)
    report["open_s_max"] = max(r["open_s"] for r in runs)
    report["peak_growth_mib_max"] = max(r["peak_growth_mib"] for r in runs)
    report["answers_sha256"] = hashlib.sha256(answers.read_bytes()).hexdigest()
    if args.reference:
        report["reference_sha256"] = hashlib.sha256(Path(args.reference).read_bytes()).hexdigest()
        report["identical_to_reference"] = report["reference_sha256"] == report["answers_sha256"]
    out = out_dir(args.out)
    stem = f"open_published{('_' + args.label) if args.label else ''}"
    (out / f"{stem}.json").write_text(json.dumps(report, indent=2) + "\n")
    lines = [f"# open_published_retriever, SciFact x{COPIES} ({runs[0]['chunks']} chunks, BM25-only)", "",
             f"Command: `{report['command']}`", "",
             f"Machine: {report['machine']['cpus']} CPUs, Python {report['machine']['python']}, "
             f"{report['machine']['platform']}", "",
             f"BM25 index served: {runs[0]['bm25_index']}", "",
             "| run | open s | peak RSS growth MiB | RSS after MiB | PSS after MiB | USS after MiB |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {i} | {r['open_s']} | {r['peak_growth_mib']} | {r['rss_after_mib']} | {r['pss_after_mib']} | "
              f"{r['uss_after_mib']} |" for i, r in enumerate(runs, 1)]
    lines += [f"| {i}, kernels preloaded | {r['open_s']} | {r['peak_growth_mib']} | {r['rss_after_mib']} | "
              f"{r['pss_after_mib']} | {r['uss_after_mib']} |" for i, r in enumerate(warm, 1)]
    lines += ["", f"Open median {report['open_s_median']} s, max {report['open_s_max']} s; "
              f"peak RSS growth max {report['peak_growth_mib_max']} MiB (the first open of a process, BM25 "
              f"kernels loaded inside it). Kernels preloaded: open median {report['preloaded_open_s_median']} s, "
              f"peak RSS growth max {report['preloaded_peak_growth_mib_max']} MiB.", "",
              f"Load average before/after: {report['load_before']} / {report['load_after']} (2 shared cores: "
              "other work on the machine slows the opens).", "",
              f"Answers ({runs[0].get('queries')} queries, top 10, {runs[0].get('query_s')} s): sha256 "
              f"`{report['answers_sha256'][:16]}`"
              + (f"; identical to the reference: {report['identical_to_reference']}" if args.reference else "")]
    t = report["throughput"]
    lines += ["", f"Query throughput, `retrieve(q, top_k=10)`, {t['queries']} queries, {t['rounds']} alternating "
              f"rounds in one process: mapped {min(t['mapped_ms_per_query'])} ms/query (best), in-memory (token "
              f"path) {min(t['in_memory_ms_per_query'])} ms/query; mapped/in-memory qps ratio median "
              f"{t['qps_ratio_mapped_over_in_memory_median']}, best-of {t['qps_ratio_best_of']}. First pass (mapped: "
              f"first-touch checksums and page faults, chunks built for hits and kept, at most "
              f"{CACHE_MAX}): {t['first_pass_ms_per_query']} ms/query."]
    two = report["two_processes"]
    lines += ["", f"Two serving processes on the snapshot (kernels preloaded in both, {args.queries} queries "
              f"answered by each): the second one's USS grew {two['second_uss_growth_mib']} MiB over the open "
              f"and the queries; the first's {two['first']['uss_growth_mib']} MiB (pages of the mapped files the "
              "first process alone had touched count as private to it until a second process maps them: "
              "file pages, shared, evictable, not heap)."]
    (out / f"{stem}.md").write_text("\n".join(lines) + "\n")
    say_written([out / f"{stem}.json", out / f"{stem}.md"])
    print(json.dumps({k: report[k] for k in ("open_s_median", "open_s_max", "peak_growth_mib_max",
                                             "answers_sha256")}))


if __name__ == "__main__":
    main()
