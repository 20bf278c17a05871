"""Open cost of a published library (#27 item 2): time and memory of
``open_published_retriever`` in a fresh process, and the answers it gives.

    python benchmarks/bench_open.py                       # build (resumable) + measure
    python benchmarks/bench_open.py --out benchmarks/results --label after
    python benchmarks/bench_open.py --copies 40 --out benchmarks/results --label 1m
    python benchmarks/bench_open.py --copies 40 --skip-build --compare /tmp/base   # engines side by side

The library is SciFact's documents written ``--copies`` times under distinct ids (10, the
default: 51,830 documents, ~253k chunks, the ``scifact-x10`` row of bench_pipeline; 40:
207,320 documents, ~1.01M chunks), published BM25-only by the engine steps the Dagster
assets call (raw -> chunks -> lexical_index -> snapshot). The warehouse is kept in
``--cache`` (default ``benchmarks/.cache/open`` for x10, ``benchmarks/.cache/open_xN``
otherwise; git-ignored): a second run only refreshes what changed (e.g. a lexical index
rewritten with its BM25 file after a code change) and goes straight to the measurement.

The build runs in its own process under the machine-wide heavy lock and an address-space
cap (``flock /tmp/heavy.lock prlimit --as=BUILD_AS nice -n 10``: a 1M-chunk build peaks
near 2.3 GB and the box has no swap); the timed opens run outside the lock, each with the
load average at its start recorded (the cores are shared).

Each measured open runs in a new Python process after the package is imported: wall
time of ``open_published_retriever(W, library, mode="bm25")``, and of the first query right
after it (what the open left for the first query to load counts there); peak RSS growth during
the open (VmHWM after minus VmRSS before, the peak reset through
``/proc/self/clear_refs``); RSS/PSS/USS after the open from ``/proc/self/smaps_rollup``
(a mapped index is shared between processes: RSS counts it in each, USS does not).

Where it goes: each open's RSS growth is split by mapping (the served files' pages, which
the open's whole-column id and label checks touch and which are shared and evictable;
libraries; anonymous memory), the kernel load is timed apart, and one open of each kind
runs under cProfile; the report lists its top calls. ``--skip-build`` shows the figures of
the last real build (``build.json`` in the cache). ``--throughput`` (default: x10 only)
compares query speed with the token path, which rebuilds the index in memory.

Engines: ``BENCH_OPEN_ENGINE=DIR`` makes every measuring process import the package from the
checkout ``DIR`` (e.g. a ``git archive`` of a commit, so that uncommitted work elsewhere in the
tree is not measured); ``--compare DIR`` runs the opens of a second checkout alternated with
this one's (the same machine load for both) and reports the two side by side, with their
answers compared byte for byte. Pass ``--data``: the default data folder is found relative to
the benchmarks package, which then comes from ``DIR``. ``--note`` says in the report what the
checkouts are.

Answers: the first process also runs ``--queries`` SciFact queries (top 10) and writes
the snippets (text, ids, scores, order) as JSON; their sha256 is reported, and with
``--reference FILE`` compared to a run of other code (byte-identical or not).
"""

from __future__ import annotations

import argparse
import cProfile
import hashlib
import json
import os
import platform
import pstats
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
# A child measuring another checkout's engine (``--compare``) imports the package from it.
ENGINE_ENV = "BENCH_OPEN_ENGINE"
if os.environ.get(ENGINE_ENV):
    sys.path.insert(0, os.environ[ENGINE_ENV])

from benchmarks.bench_bm25_mmap import _reset_peak, _rollup_kib, _status_kib  # noqa: E402
from benchmarks.common import add_io_args, out_dir, require_sets, say_written, use_data  # noqa: E402
from ragspine_pipeline.retrieval.chunking.chunk_columns import CACHE_MAX  # noqa: E402

LIBRARY = "scifact_x10"
COPIES = 10
DEFAULT_CACHE = ROOT / "benchmarks" / ".cache" / "open"
BUILD_AS = 12 << 30  # address-space cap of the build process (bytes)
HEAVY_LOCK = "/tmp/heavy.lock"


def library_name(copies: int) -> str:
    """The library id of SciFact x ``copies`` (``scifact_x10`` for the default)."""
    return f"scifact_x{copies}"


def default_cache(copies: int) -> Path:
    """One warehouse per size: x10 keeps the folder its committed results were built in."""
    return DEFAULT_CACHE if copies == COPIES else DEFAULT_CACHE.with_name(f"open_x{copies}")


def write_library(folder: Path, data: Path, copies: int = COPIES) -> int:
    """SciFact x ``copies`` as one .txt per document (written once; a marker says it is whole)."""
    marker = folder / ".complete"
    if marker.exists():
        return int(marker.read_text())
    from ragspine_pipeline.eval.beir import load_beir

    ds = load_beir(data / "scifact")
    folder.mkdir(parents=True, exist_ok=True)
    n = 0
    for k in range(copies):
        for i, d in enumerate(ds.corpus.values()):
            (folder / f"c{k}_d{i:06d}.txt").write_text(f"{d.title}\n\n{d.text}\n", encoding="utf-8")
            n += 1
    marker.write_text(str(n))
    return n


def build(cache: Path, data: Path, copies: int = COPIES) -> dict:
    """The published BM25-only library, by the asset's engine steps (each incremental).

    Runs in the calling process (``bench_ray_serving`` calls it for x10); ``main`` runs it
    in a capped child (``build_in_child``). The peak RSS of the process is reported."""
    from ragspine_pipeline.warehouse.pipeline import (
        build_chunks,
        build_lexical_index,
        build_raw_documents,
        publish_snapshot,
    )
    from ragspine_pipeline.warehouse.versioned import VersionedTables

    library = library_name(copies)
    docs = write_library(cache / "corpus" / library, data, copies)
    wh = VersionedTables(cache / "warehouse")
    steps = {}
    for name, fn in (("raw_documents", lambda: build_raw_documents(wh, cache / "corpus", library)),
                     ("chunks", lambda: build_chunks(wh, library)),
                     ("lexical_index", lambda: build_lexical_index(wh, library)),
                     ("snapshot", lambda: publish_snapshot(wh, library))):
        t0 = time.perf_counter()
        res = fn()
        steps[name] = {"seconds": round(time.perf_counter() - t0, 2), "version": res.published.version,
                       **{k: v for k, v in res.metadata.items()
                          if k in ("reused", "active_chunks", "chunks_indexed", "bm25_docs", "bm25_bytes",
                                   "bm25_seconds")}}
        print(f"  {name}: {steps[name]}", file=sys.stderr)
    return {"documents": docs, "library": library, "steps": steps,
            "peak_rss_mib": round(_status_kib("VmHWM") / 1024, 1)}


def capped(cmd: list[str]) -> list[str]:
    """``cmd`` under the machine-wide heavy lock, the address-space cap and ``nice``."""
    return ["flock", HEAVY_LOCK, "prlimit", f"--as={BUILD_AS}", "nice", "-n", "10", *cmd]


def build_in_child(cache: Path, data: Path, copies: int) -> dict:
    """``build`` in a child process holding the heavy lock, capped at ``BUILD_AS`` bytes of
    address space and niced: an over-budget build fails alone instead of pushing the
    swapless box into the OOM killer. The lock wait is reported apart from the build."""
    cmd = [sys.executable, __file__, "--build-child", "--copies", str(copies), "--cache", str(cache),
           "--data", str(data)]
    cmd = capped(cmd)
    t0 = time.perf_counter()
    res = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, check=False)
    if res.returncode:
        raise SystemExit(f"build failed (exit {res.returncode}; cap {BUILD_AS >> 30} GiB address space): "
                         f"{' '.join(cmd)}")
    out = json.loads(res.stdout.strip().splitlines()[-1])
    out["seconds_with_lock_wait"] = round(time.perf_counter() - t0, 1)
    out["command"] = " ".join(cmd[:6]) + " ..."
    return out


SERVED_FILES = ("bm25.rsbm25", "served_chunks.arrow")


def rss_by_mapping() -> dict[str, int]:
    """Resident KiB of this process by kind of mapping: each served file of the snapshot
    (file pages: shared between processes, evictable), other files (libraries) and
    anonymous memory (heap, arrays). Says what a peak-RSS figure is made of."""
    kinds: dict[str, int] = {}
    kind = "anonymous"
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split(maxsplit=5)
        if head and "-" in head[0] and not head[0].endswith(":"):
            name = head[5] if len(head) > 5 else ""
            base = Path(name).name
            kind = base if base in SERVED_FILES else ("other files" if name.startswith("/") else "anonymous")
        elif line.startswith("Rss:"):
            kinds[kind] = kinds.get(kind, 0) + int(line.split()[1])
    return kinds


def top_calls(profile: cProfile.Profile, n: int = 25) -> list[str]:
    """The ``n`` calls of a profiled open with the largest cumulative time, as text."""
    stats = pstats.Stats(profile).stats  # type: ignore[attr-defined]
    skip = ("<built-in method builtins.exec>", "<built-in method builtins.__import__>")
    rows = sorted(((k, v) for k, v in stats.items() if not k[0].startswith("<frozen") and k[2] not in skip),
                  key=lambda kv: -kv[1][3])[:n]  # the import machinery's frames repeat their callers' time
    return [f"{ct:.3f} s cum, {tt:.3f} s own, {nc} calls: {Path(f).name}:{line}({fn})"
            for (f, line, fn), (_cc, nc, tt, ct, _callers) in rows]


def child(warehouse: str, library: str, queries: int, dump: str | None, data: str, preload: bool,
          hold: float = 0.0, profile: bool = False) -> None:
    """One fresh process: import, reset the peak, open, measure; optionally answer queries.

    ``preload``: the compiled BM25 kernels (numba, loaded by the first index a process
    opens: ~0.4-0.7 s and ~120 MiB, most of it the shared LLVM library) are loaded before
    the timer by opening the served BM25 file once, as in a serving process that has opened
    it before. ``hold``: after
    answering, keep the index open that many seconds (the first of two serving processes).
    USS growth is measured after the open and the queries (``uss_growth_mib``); the RSS
    growth over the open is split by mapping (``rss_growth_by_mapping_mib``). ``profile``:
    the open runs under cProfile (slower) and its top calls are reported."""
    from ragspine_pipeline.eval.beir import load_beir
    from ragspine_pipeline.serving import open_published_retriever

    qs = list(load_beir(Path(data) / "scifact").queries.values())[:max(queries, 1)]
    if preload:
        from ragspine_pipeline.retrieval.lexical.index.mapped import open_index

        t_k = time.perf_counter()
        # The served BM25 file opened once and dropped: its kernels (numba signatures of its
        # layout, dtypes and read-only arrays) stay loaded, as in a process that served it before.
        open_index(served_folder(warehouse, library) / "bm25.rsbm25")
        kernels_s = round(time.perf_counter() - t_k, 4)
    load = os.getloadavg()[0]
    maps_before = rss_by_mapping()
    prof = cProfile.Profile() if profile else None
    before = _status_kib("VmRSS")
    uss_before = _rollup_kib()["uss"]
    _reset_peak()
    t0 = time.perf_counter()
    if prof is not None:
        prof.enable()
    r = open_published_retriever(warehouse, library, mode="bm25")
    if prof is not None:
        prof.disable()
    open_s = time.perf_counter() - t0
    peak = _status_kib("VmHWM")
    roll = _rollup_kib()
    maps = rss_by_mapping()
    inner = getattr(getattr(r, "index", None), "retriever", None)
    out = {"open_s": round(open_s, 4), "load_1min": round(load, 2), "rss_before_mib": round(before / 1024, 1),
           "peak_growth_mib": round((peak - before) / 1024, 1),
           **{f"{k}_after_mib": round(roll[k] / 1024, 1) for k in ("rss", "pss", "uss")},
           "chunks": len(inner) if inner is not None else None,
           "bm25_index": type(getattr(inner, "index", None)).__name__,
           "rss_growth_by_mapping_mib": {k: round((maps.get(k, 0) - maps_before.get(k, 0)) / 1024, 1)
                                         for k in sorted(set(maps) | set(maps_before))}}
    if preload:
        out["kernels_s"] = kernels_s
    if prof is not None:
        out["profile"] = top_calls(prof)
    if not profile:
        # The first query right after the open pays whatever the open left for it to load.
        t1 = time.perf_counter()
        answers = [r.retrieve(qs[0], top_k=10)]
        out["first_query_s"] = round(time.perf_counter() - t1, 4)
        out["open_first_query_s"] = round(open_s + out["first_query_s"], 4)
        if dump or hold:
            answers += [r.retrieve(q, top_k=10) for q in qs[1:]]
            out["query_s"] = round(time.perf_counter() - t1, 3)
            out["queries"] = len(qs)
        out["uss_growth_mib"] = round((_rollup_kib()["uss"] - uss_before) / 1024, 1)
        if dump:
            Path(dump).write_text(json.dumps(answers, sort_keys=True, ensure_ascii=False, default=str))
    print(json.dumps(out), flush=True)
    if hold:
        time.sleep(hold)


def throughput_child(warehouse: str, library: str, queries: int, data: str, rounds: int = 7) -> None:
    """Mapped vs today's in-memory path, one process, rounds alternating (same machine load
    for both): ``retrieve(q, top_k=10)`` over the first ``queries`` SciFact queries, warm.
    The in-memory retriever is the token path (``_published_files`` answering None, as for a
    version written before the files)."""
    from ragspine_pipeline.eval.beir import load_beir
    from ragspine_pipeline.serving import open_published_retriever
    from ragspine_pipeline.warehouse import pipeline as P

    qs = list(load_beir(Path(data) / "scifact").queries.values())[:queries]
    mapped = open_published_retriever(warehouse, library, mode="bm25")
    real = P._published_files
    P._published_files = lambda *a, **k: None
    try:
        built = open_published_retriever(warehouse, library, mode="bm25")
    finally:
        P._published_files = real
    times: dict[str, list[float]] = {"mapped": [], "in_memory": []}
    cold, answers = {}, {}
    for name, r in (("mapped", mapped), ("in_memory", built)):  # first pass: checksums, page faults, caches
        t0 = time.perf_counter()
        got = [r.retrieve(q, top_k=10) for q in qs]
        cold[name] = round((time.perf_counter() - t0) / len(qs) * 1000, 4)
        answers[name] = json.dumps(got, sort_keys=True, ensure_ascii=False, default=str)
    for _ in range(rounds):
        for name, r in (("mapped", mapped), ("in_memory", built)):
            t0 = time.perf_counter()
            for q in qs:
                r.retrieve(q, top_k=10)
            times[name].append((time.perf_counter() - t0) / len(qs) * 1000)
    ratios = [b / m for m, b in zip(times["mapped"], times["in_memory"], strict=True)]
    print(json.dumps({"queries": len(qs), "rounds": rounds, "first_pass_ms_per_query": cold,
                      "answers_identical": answers["mapped"] == answers["in_memory"],
                      "mapped_ms_per_query": [round(x, 4) for x in times["mapped"]],
                      "in_memory_ms_per_query": [round(x, 4) for x in times["in_memory"]],
                      "qps_ratio_mapped_over_in_memory_median": round(statistics.median(ratios), 3),
                      "qps_ratio_best_of": round(min(times["in_memory"]) / min(times["mapped"]), 3)}))


def _child_cmd(warehouse: Path, library: str, queries: int, data: Path, *extra: str) -> list[str]:
    return [sys.executable, __file__, "--child", str(warehouse), "--library", library, "--queries", str(queries),
            "--data", str(data), *extra]


def second_process(warehouse: Path, library: str, queries: int, data: Path) -> dict:
    """Two serving processes on one snapshot: the first opens, answers and holds; the
    second (kernels preloaded in both) opens and answers the same queries. Its USS growth
    is what a further process costs: the mapped files' pages are shared, not private."""
    index_bytes = sum(p.stat().st_size for p in warehouse.rglob("*") if p.name in ("bm25.rsbm25",
                                                                                  "served_chunks.arrow"))
    first = subprocess.Popen(_child_cmd(warehouse, library, queries, data, "--preload-kernels", "--hold", "120"),
                             stdout=subprocess.PIPE, text=True)
    try:
        a = json.loads(first.stdout.readline())
        b = run_child(warehouse, library, queries, None, data, preload=True, extra=("--hold", "0.001"))
    finally:
        first.kill()
        first.wait()
    files = served_bytes(warehouse, library)
    served = sum(files.values())
    return {"first": a, "second": b, "published_bytes_all_versions": index_bytes, "served_bytes": served,
            "served_bytes_by_file": files, "second_uss_growth_mib": b["uss_growth_mib"],
            "second_uss_pct_of_served": round(b["uss_growth_mib"] * 2**20 / served * 100, 2),
            "second_uss_pct_of_bm25_file": round(b["uss_growth_mib"] * 2**20 / files["bm25.rsbm25"] * 100, 2)}


def served_bytes(warehouse: Path, library: str) -> dict[str, int]:
    """Bytes of the files the newest snapshot serves mapped (the BM25 file and the chunk
    columns of its lexical_index version): the "index size" the second-process USS goal
    is a share of."""
    folder = served_folder(warehouse, library)
    return {name: (folder / name).stat().st_size for name in SERVED_FILES}


def served_folder(warehouse: str | Path, library: str) -> Path:
    """The lexical_index version folder the newest snapshot serves."""
    from ragspine_pipeline.warehouse.common import LEXICAL, SNAPSHOT
    from ragspine_pipeline.warehouse.versioned import VersionedTables

    wh = VersionedTables(Path(warehouse))
    snap = wh.latest(SNAPSHOT, library)
    return Path(wh.get(LEXICAL, library, snap.manifest["metadata"]["lexical_index"]).path)


def run_child(warehouse: Path, library: str, queries: int, dump: Path | None, data: Path, preload: bool = False,
              extra: tuple[str, ...] = (), engine: str | None = None) -> dict:
    """One fresh measuring process; ``engine``: the checkout whose package it imports
    (default: this one)."""
    cmd = _child_cmd(warehouse, library, queries, data, *(["--preload-kernels"] if preload else []), *extra)
    if dump is not None:
        cmd += ["--dump", str(dump)]
    env = dict(os.environ)  # the parent's own engine unless told
    if engine:
        env[ENGINE_ENV] = engine
    res = subprocess.run(cmd, capture_output=True, text=True, check=False, env=env)
    if res.returncode:
        raise SystemExit(f"child failed:\n{res.stderr[-3000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def measure(warehouse: Path, library: str, args: argparse.Namespace, data: Path, answers: Path) -> dict:
    """The timed opens (fresh processes, with and without the kernels preloaded), the
    query throughput (when asked) and the two-process USS figure, outside the heavy lock."""
    report: dict = {"load_before": os.getloadavg()}
    runs, warm = [], []
    other: dict[str, list[dict]] = {"runs": [], "runs_kernels_preloaded": []}
    for i in range(args.runs):  # with --compare, the two engines alternate (same machine load)
        runs.append(run_child(warehouse, library, args.queries, answers if i == 0 else None, data))
        if args.compare:
            dump = answers.with_name(answers.stem + "_compare.json") if i == 0 else None
            other["runs"].append(run_child(warehouse, library, args.queries, dump, data, engine=args.compare))
    for _ in range(args.runs):
        warm.append(run_child(warehouse, library, args.queries, None, data, preload=True))
        if args.compare:
            other["runs_kernels_preloaded"].append(run_child(warehouse, library, args.queries, None, data,
                                                             preload=True, engine=args.compare))
    if args.compare:
        report["compare"] = {"engine": args.compare, **other, **medians(other["runs"], other["runs_kernels_preloaded"]),
                             "answers_identical": answers.read_bytes() == answers.with_name(
                                 answers.stem + "_compare.json").read_bytes()}
    if args.throughput:
        cmd = [sys.executable, __file__, "--child", str(warehouse), "--library", library, "--throughput-child",
               "--queries", "300", "--data", str(data)]
        # The token path rebuilds the whole index in memory (~7 GB at 1M chunks): capped and locked there.
        tp = subprocess.run(cmd if args.copies == COPIES else capped(cmd), capture_output=True, text=True,
                            check=True)
        report["throughput"] = json.loads(tp.stdout.strip().splitlines()[-1])
    report["two_processes"] = second_process(warehouse, library, args.queries, data)
    # Where the time goes: one open of each kind under cProfile (slower than the timed ones).
    report["profiled_open"] = run_child(warehouse, library, 0, None, data, extra=("--profile-open",))
    report["profiled_open_kernels_preloaded"] = run_child(warehouse, library, 0, None, data, preload=True,
                                                          extra=("--profile-open",))
    report["load_after"] = os.getloadavg()
    report["runs"] = runs
    report["runs_kernels_preloaded"] = warm
    report.update(medians(runs, warm))
    return report


def medians(runs: list[dict], warm: list[dict]) -> dict:
    """The summary figures of fresh-process opens (``runs``) and kernels-preloaded ones."""
    return {"preloaded_open_s_median": statistics.median(r["open_s"] for r in warm),
            "preloaded_peak_growth_mib_max": max(r["peak_growth_mib"] for r in warm),
            "open_s_median": statistics.median(r["open_s"] for r in runs),
            "open_s_max": max(r["open_s"] for r in runs),
            "peak_growth_mib_max": max(r["peak_growth_mib"] for r in runs),
            "first_query_s_median": statistics.median(r["first_query_s"] for r in runs),
            "open_first_query_s_median": statistics.median(r["open_first_query_s"] for r in runs),
            "preloaded_open_first_query_s_median": statistics.median(r["open_first_query_s"] for r in warm)}


def machine() -> dict:
    """Cores, memory, Python and platform of the machine the figures come from."""
    mem = next(int(line.split()[1]) for line in Path("/proc/meminfo").read_text().splitlines()
               if line.startswith("MemTotal:"))
    return {"cpus": os.cpu_count(), "memory_gib": round(mem / (1 << 20), 1), "python": platform.python_version(),
            "platform": platform.platform()}


def breakdown(report: dict) -> list[str]:
    """What the open's time and memory are made of: the kernel load, the RSS growth by
    mapping (served files' pages vs heap) and the top calls of the profiled opens."""
    runs, warm = report["runs"], report["runs_kernels_preloaded"]
    lines = [""]
    if all("kernels_s" in r for r in warm):
        lines += [f"Loading the BM25 kernels (numba cache, before the timer in the preloaded runs): median "
                  f"{round(statistics.median(r['kernels_s'] for r in warm), 4)} s.", ""]
    if all("rss_growth_by_mapping_mib" in r for r in runs + warm):
        lines += ["RSS growth over the open by mapping (MiB, after the open, median of the runs; served-file pages "
                  "are shared between processes and evictable):", ""]
        for tag, rows in (("first open of a process", runs), ("kernels preloaded", warm)):
            kinds = sorted({k for r in rows for k in r["rss_growth_by_mapping_mib"]})
            parts = ", ".join(f"{k} {round(statistics.median(r['rss_growth_by_mapping_mib'].get(k, 0) for r in rows), 1)}"
                              for k in kinds)
            lines.append(f"- {tag}: {parts}")
        lines.append("")
    for key, tag in (("profiled_open", "first open of a process"),
                     ("profiled_open_kernels_preloaded", "kernels preloaded")):
        prof = report.get(key)
        if prof and prof.get("profile"):
            lines += [f"Profiled open ({tag}, cProfile, {prof['open_s']} s with the profiler), top calls by "
                      "cumulative time:", "", "```", *prof["profile"][:18], "```", ""]
    return lines[:-1] if lines[-1] == "" else lines


def compare_lines(report: dict) -> list[str]:
    """The ``--compare`` engine's figures beside this one's (runs alternated, same load)."""
    c = report.get("compare")
    if not c:
        return []
    keys = (("open_s_median", "open"), ("open_first_query_s_median", "open + first query"),
            ("first_query_s_median", "first query"), ("preloaded_open_s_median", "open, kernels preloaded"),
            ("preloaded_open_first_query_s_median", "open + first query, kernels preloaded"),
            ("peak_growth_mib_max", "peak RSS growth max (MiB)"))
    lines = [f"Compared with the engine of `{c['engine']}`, runs alternated with this one's (medians of "
             f"{len(c['runs'])} fresh processes each):", "", "| figure | this engine | compared engine | ratio |",
             "|---|---|---|---|"]
    lines += [f"| {tag} | {report[k]} | {c[k]} | {round(c[k] / report[k], 2) if report[k] else ''} |"
              for k, tag in keys]
    lines += ["", f"Answers of the two engines ({report['runs'][0].get('queries')} queries) byte-identical: "
              f"{c['answers_identical']}.", ""]
    return lines


def markdown(report: dict, copies: int, queries: int) -> list[str]:
    """The report as the committed markdown table and its sentences."""
    runs, warm, m = report["runs"], report["runs_kernels_preloaded"], report["machine"]
    lines = [f"# open_published_retriever, SciFact x{copies} ({runs[0]['chunks']} chunks, BM25-only)", "",
             f"Command: `{report['command']}`", "",
             *([report["note"], ""] if report.get("note") else []),
             f"Machine: {m['cpus']} CPUs, {m.get('memory_gib', '?')} GiB RAM, Python {m['python']}, "
             f"{m['platform']}", ""]
    b = report.get("build")
    if b:
        steps = ", ".join(f"{k} {v['seconds']} s" + (" (reused)" if v.get("reused") else "")
                          for k, v in b["steps"].items())
        lines += [("Last build (recorded by the run that built it; this run reused it)" if b.get("recorded")
                   else "Build") + f" ({b['documents']} documents; in a child under `{b.get('command', '')}`): "
                  f"{b['seconds']} s "
                  f"({steps}); peak RSS {b.get('peak_rss_mib')} MiB; {b.get('seconds_with_lock_wait')} s with "
                  "the wait for the heavy lock.", ""]
    lines += [f"BM25 index served: {runs[0]['bm25_index']}", "",
              "| run | open s | first query s | open + first query s | peak RSS growth MiB | RSS after MiB | "
              "PSS after MiB | USS after MiB | load 1 min |",
              "|---|---|---|---|---|---|---|---|---|"]
    for tag, rows in (("", runs), (", kernels preloaded", warm)):
        lines += [f"| {i}{tag} | {r['open_s']} | {r.get('first_query_s', '')} | {r.get('open_first_query_s', '')} | "
                  f"{r['peak_growth_mib']} | {r['rss_after_mib']} | {r['pss_after_mib']} | {r['uss_after_mib']} | "
                  f"{r.get('load_1min', '')} |"
                  for i, r in enumerate(rows, 1)]
    lines += ["", f"Open median {report['open_s_median']} s, max {report['open_s_max']} s; "
              f"peak RSS growth max {report['peak_growth_mib_max']} MiB (the first open of a process, BM25 "
              f"kernels loaded inside it). Kernels preloaded: open median {report['preloaded_open_s_median']} s, "
              f"peak RSS growth max {report['preloaded_peak_growth_mib_max']} MiB.", "",
              f"Open + the first query right after it (`retrieve(q, top_k=10)`, SciFact's first query), median: "
              f"{report.get('open_first_query_s_median')} s (first query {report.get('first_query_s_median')} s); "
              f"kernels preloaded {report.get('preloaded_open_first_query_s_median')} s.", "",
              *compare_lines(report),
              f"Load average before/after: {report['load_before']} / {report['load_after']} (2 shared cores: "
              "other work on the machine slows the opens).", "",
              f"Answers ({runs[0].get('queries')} queries, top 10, {runs[0].get('query_s')} s): sha256 "
              f"`{report['answers_sha256'][:16]}`"
              + (f"; identical to the reference: {report['identical_to_reference']}"
                 if "identical_to_reference" in report else "")]
    lines += breakdown(report)
    t = report.get("throughput")
    if t:
        lines += ["", f"Query throughput, `retrieve(q, top_k=10)`, {t['queries']} queries, {t['rounds']} "
                  f"alternating rounds in one process: mapped {min(t['mapped_ms_per_query'])} ms/query (best), "
                  f"in-memory (token path) {min(t['in_memory_ms_per_query'])} ms/query; mapped/in-memory qps ratio "
                  f"median {t['qps_ratio_mapped_over_in_memory_median']}, best-of {t['qps_ratio_best_of']}. First "
                  f"pass (mapped: first-touch checksums and page faults, chunks built for hits and kept, at most "
                  f"{CACHE_MAX}): {t['first_pass_ms_per_query']} ms/query."
                  + (f" Answers (top 10, text, ids, scores, order) of the two identical: {t['answers_identical']}."
                     if "answers_identical" in t else "")]
    two = report["two_processes"]
    lines += ["", f"Two serving processes on the snapshot (kernels preloaded in both, {queries} queries "
              f"answered by each): the second one's USS grew {two['second_uss_growth_mib']} MiB over the open "
              f"and the queries; the first's {two['first']['uss_growth_mib']} MiB (pages of the mapped files the "
              "first process alone had touched count as private to it until a second process maps them: "
              "file pages, shared, evictable, not heap)."]
    if "served_bytes" in two:
        files = two["served_bytes_by_file"]
        lines[-1] += (f" Served files of the snapshot: {two['served_bytes'] / 2**20:.1f} MiB (BM25 file "
                      f"{files['bm25.rsbm25'] / 2**20:.1f} MiB, chunk columns {files['served_chunks.arrow'] / 2**20:.1f}"
                      f" MiB); the second process's USS growth is {two['second_uss_pct_of_served']}% of them, "
                      f"{two['second_uss_pct_of_bm25_file']}% of the BM25 file alone.")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_io_args(ap)
    ap.add_argument("--copies", type=int, default=COPIES, help="SciFact x COPIES (default 10; 40: ~1.01M chunks)")
    ap.add_argument("--cache", default=None, help="warehouse + corpus kept between runs "
                    "(default benchmarks/.cache/open, open_xN for other --copies)")
    ap.add_argument("--runs", type=int, default=5, help="fresh processes timed (default 5)")
    ap.add_argument("--queries", type=int, default=100, help="SciFact queries answered (default 100)")
    ap.add_argument("--reference", default=None, help="answers JSON of another run, compared byte for byte")
    ap.add_argument("--label", default="", help="name of this run in the report (e.g. before, after)")
    ap.add_argument("--note", default="", help="what the engines are (e.g. the commits they were archived from)")
    ap.add_argument("--compare", default=None, metavar="DIR",
                    help="another checkout (e.g. `git archive` of a base commit): its engine's opens alternate "
                    "with this one's, each in a fresh process, and the report gives both")
    ap.add_argument("--skip-build", action="store_true", help="measure the cached warehouse as it is")
    ap.add_argument("--build-only", action="store_true", help="build (resumable) and stop")
    ap.add_argument("--throughput", action=argparse.BooleanOptionalAction, default=None,
                    help="mapped vs in-memory query throughput (default: only for x10; the in-memory "
                    "token path rebuilds the index: ~7 GB at 1M chunks)")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--library", default=LIBRARY, help=argparse.SUPPRESS)
    ap.add_argument("--dump", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--preload-kernels", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--throughput-child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--build-child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--hold", type=float, default=0.0, help=argparse.SUPPRESS)
    ap.add_argument("--profile-open", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    data = use_data(args.data)
    cache = Path(args.cache) if args.cache else default_cache(args.copies)
    if args.child and args.throughput_child:
        throughput_child(args.child, args.library, args.queries, str(data))
        return
    if args.child:
        child(args.child, args.library, args.queries, args.dump, str(data), args.preload_kernels, args.hold,
              args.profile_open)
        return
    if args.build_child:
        t0 = time.perf_counter()
        res = build(cache, data, args.copies)
        res["seconds"] = round(time.perf_counter() - t0, 1)
        print(json.dumps(res), flush=True)
        return
    require_sets(data, ["scifact"])
    cache.mkdir(parents=True, exist_ok=True)
    if args.throughput is None:
        args.throughput = args.copies == COPIES
    engine = os.environ.get(ENGINE_ENV)
    report: dict = {"command": " ".join([*([f"{ENGINE_ENV}={engine}"] if engine else []), Path(sys.executable).name,
                                         *sys.argv]), "engine": engine or str(ROOT), "note": args.note, "label": args.label,
                    "copies": args.copies, "machine": machine()}
    record = cache / "build.json"  # the last build's figures, shown by a --skip-build run
    if not args.skip_build:
        report["build"] = build_in_child(cache, data, args.copies)
        if not all(step.get("reused") for step in report["build"]["steps"].values()):
            record.write_text(json.dumps(report["build"], indent=2) + "\n")
    elif record.is_file():
        report["build"] = {**json.loads(record.read_text()), "recorded": str(record)}
    if args.build_only:
        print(json.dumps(report["build"]))
        return
    answers = cache / f"answers{('_' + args.label) if args.label else ''}.json"
    report.update(measure(cache / "warehouse", library_name(args.copies), args, data, answers))
    report["answers_sha256"] = hashlib.sha256(answers.read_bytes()).hexdigest()
    if args.reference:
        report["reference_sha256"] = hashlib.sha256(Path(args.reference).read_bytes()).hexdigest()
        report["identical_to_reference"] = report["reference_sha256"] == report["answers_sha256"]
    out = out_dir(args.out)
    stem = f"open_published{('_' + args.label) if args.label else ''}"
    (out / f"{stem}.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / f"{stem}.md").write_text("\n".join(markdown(report, args.copies, args.queries)) + "\n")
    say_written([out / f"{stem}.json", out / f"{stem}.md"])
    print(json.dumps({k: report[k] for k in ("open_s_median", "open_s_max", "peak_growth_mib_max",
                                             "preloaded_open_s_median", "answers_sha256")}))


if __name__ == "__main__":
    main()
