"""The published BM25 file against a rebuild from tokens: open time, memory, throughput.

    python benchmarks/bench_bm25_mmap.py --sizes 250000,1000000 --out benchmarks/results

Synthetic Zipf corpora (200k-term vocabulary, s=1.1, Poisson(60) lengths: the
distribution of ``bench_bm25.py``'s synthetic rows), generated once into
``benchmarks/.cache``. Per size, each step runs in a fresh process (``nice -n 5``):

* ``build``: the index built from token lists (what every serving process does today when
  it opens a snapshot), timed, with its peak-RSS growth (VmHWM reset before it); then
  ``write_index`` publishes it (time, bytes on disk).
* ``open``: a fresh process imports the package and loads the compiled kernels (timed
  apart), then ``open_index`` maps the file: open time, peak-RSS growth during the open,
  USS/PSS (``/proc/self/smaps_rollup``) after the open and after the queries, first query.
* ``second``: one more process opens the same file while an ``open`` process holds it
  and has queried it; its USS growth over the queries, against the file size (pages
  are shared).
* ``throughput``: the built and the mapped index in one process, single queries and
  ``search_batch``, interleaved rounds (median); every top-10 compared for equality.

Results: ``bm25_mmap.json`` (one row per size) and ``bm25_mmap.md``, with the command.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.common import add_io_args, out_dir, say_written  # noqa: E402

CACHE = ROOT / "benchmarks" / ".cache"
VOCAB = 200_000
N_QUERIES = 300


# --------------------------------------------------------------------------- memory
def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def _reset_peak() -> None:
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS


def _rollup_kib() -> dict[str, int]:
    """USS (private pages), PSS and RSS of this process, in KiB."""
    vals: dict[str, int] = {}
    for line in Path("/proc/self/smaps_rollup").read_text().splitlines()[1:]:
        key, _, rest = line.partition(":")
        if rest.strip().endswith("kB"):
            vals[key] = int(rest.split()[0])
    return {"uss": vals.get("Private_Clean", 0) + vals.get("Private_Dirty", 0), "pss": vals.get("Pss", 0),
            "rss": vals.get("Rss", 0)}


# --------------------------------------------------------------------------- data
def corpus(n_docs: int, seed: int = 7) -> tuple[list[list[str]], list[list[str]]]:
    """(docs, queries) as token lists; the token ids are cached as npz."""
    CACHE.mkdir(parents=True, exist_ok=True)
    path = CACHE / f"mmap_synthetic_{n_docs}_{seed}.npz"
    if not path.exists():
        rng = np.random.default_rng(seed)
        p = 1.0 / np.arange(1, VOCAB + 1) ** 1.1
        p /= p.sum()
        lens = np.maximum(rng.poisson(60, n_docs), 1)
        toks = rng.choice(VOCAB, size=int(lens.sum()), p=p).astype(np.int32)
        q_lens = rng.integers(2, 6, N_QUERIES)
        q_toks = np.concatenate([rng.choice(VOCAB, size=n, p=p) for n in q_lens]).astype(np.int32)
        np.savez(path, lens=lens, toks=toks, q_lens=q_lens, q_toks=q_toks)
    z = np.load(path)
    names = [f"w{i}" for i in range(VOCAB)]

    def split(lens: np.ndarray, toks: np.ndarray) -> list[list[str]]:
        flat = [names[t] for t in toks.tolist()]
        out, pos = [], 0
        for n in lens.tolist():
            out.append(flat[pos:pos + n])
            pos += n
        return out

    return split(z["lens"], z["toks"]), split(z["q_lens"], z["q_toks"])


def index_path(n_docs: int) -> Path:
    return CACHE / f"mmap_{n_docs}.bm25"


# --------------------------------------------------------------------------- steps
def step_build(n: int) -> dict:
    docs, _ = corpus(n)
    from ragspine_pipeline.retrieval.lexical.index.bm25 import BM25Index
    from ragspine_pipeline.retrieval.lexical.kernels import loader as bm25_kernel
    from ragspine_pipeline.retrieval.lexical.refresh.publish import write_index

    bm25_kernel.load_kernels()
    rss0 = _status_kib("VmRSS")
    _reset_peak()
    t0 = time.perf_counter()
    idx = BM25Index(docs)
    build_s = time.perf_counter() - t0
    peak = _status_kib("VmHWM") - rss0
    t0 = time.perf_counter()
    path = write_index(idx, index_path(n), doc_ids=[f"d{i:08d}" for i in range(n)])
    write_s = time.perf_counter() - t0
    return {"build_from_tokens_s": build_s, "build_peak_rss_growth_mib": peak / 1024,
            "write_verify_s": write_s, "index_bytes": path.stat().st_size, "in_memory_nbytes": idx.nbytes,
            "postings": int(len(idx.indices)), "terms": len(idx.vocab)}


def step_open(n: int, hold: bool = False) -> dict:
    queries = _queries_only(n)  # token lists of the whole corpus would distort the figures
    t0 = time.perf_counter()
    from ragspine_pipeline.retrieval.lexical.index.mapped import open_index
    from ragspine_pipeline.retrieval.lexical.kernels import loader as bm25_kernel

    import_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    bm25_kernel.load_kernels(mapped=True)
    kernels_s = time.perf_counter() - t0
    before = _rollup_kib()
    rss0 = _status_kib("VmRSS")
    _reset_peak()
    t0 = time.perf_counter()
    idx = open_index(index_path(n))
    open_s = time.perf_counter() - t0
    peak = _status_kib("VmHWM") - rss0
    after_open = _rollup_kib()
    t0 = time.perf_counter()
    idx.search(queries[0], k=10)
    first_ms = (time.perf_counter() - t0) * 1000
    for q in queries:
        idx.search(q, k=10)
    after_q = _rollup_kib()
    out = {"import_s": import_s, "kernel_load_s": kernels_s, "open_s": open_s,
           "open_peak_rss_growth_mib": peak / 1024, "first_query_ms": first_ms,
           "uss_growth_open_mib": (after_open["uss"] - before["uss"]) / 1024,
           "uss_growth_after_queries_mib": (after_q["uss"] - before["uss"]) / 1024,
           "pss_growth_after_queries_mib": (after_q["pss"] - before["pss"]) / 1024,
           "rss_growth_after_queries_mib": (after_q["rss"] - before["rss"]) / 1024}
    if hold:  # keep the mapping alive while a second process measures
        print(json.dumps(out), flush=True)
        sys.stdin.readline()
    return out


def _queries_only(n: int) -> list[list[str]]:
    z = np.load(CACHE / f"mmap_synthetic_{n}_7.npz")
    flat = [f"w{t}" for t in z["q_toks"].tolist()]
    out, pos = [], 0
    for m in z["q_lens"].tolist():
        out.append(flat[pos:pos + m])
        pos += m
    return out


def step_second(n: int) -> dict:
    """A holder process opens and queries the file; then this one measures its own USS."""
    holder = subprocess.Popen([sys.executable, __file__, "--step", "hold", "--n", str(n)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        first = json.loads(holder.stdout.readline())
        second = step_open(n, hold=False)
    finally:
        holder.stdin.write("\n")
        holder.stdin.flush()
        holder.wait(timeout=60)
    size_mib = index_path(n).stat().st_size / 2**20
    return {"holder_uss_growth_mib": first["uss_growth_after_queries_mib"],
            "second_uss_growth_mib": second["uss_growth_after_queries_mib"],
            "second_pss_growth_mib": second["pss_growth_after_queries_mib"],
            "second_uss_share_of_index": second["uss_growth_after_queries_mib"] / size_mib}


def step_throughput(n: int, rounds: int = 15, chunk: int = 25) -> dict:
    """Built vs mapped in one process. Single queries are timed in pairs of small chunks
    (built then mapped, the order alternating), so both engines see the same machine load
    (the 2 shared cores are busy with other work); per round the ratio of the summed
    times, and the median over rounds. Batches alternate whole."""
    docs, queries = corpus(n)
    from ragspine_pipeline.retrieval.lexical.index.bm25 import BM25Index
    from ragspine_pipeline.retrieval.lexical.index.mapped import open_index

    built = BM25Index(docs)
    del docs
    mapped = open_index(index_path(n))
    same = all(np.array_equal(a.ids, b.ids) and np.array_equal(a.scores, b.scores)
               for a, b in ((built.search(q, 10), mapped.search(q, 10)) for q in queries))
    mapped.search_batch(queries, 10)
    built.search_batch(queries, 10)
    engines = {"built": built, "mapped": mapped}
    single: dict[str, list[float]] = {"built": [], "mapped": []}
    batch: dict[str, list[float]] = {"built": [], "mapped": []}
    load = [os.getloadavg()[0]]
    for r in range(rounds):
        spent = {"built": 0.0, "mapped": 0.0}
        for c in range(0, len(queries), chunk):
            part = queries[c:c + chunk]
            for name in (("built", "mapped") if (r + c // chunk) % 2 == 0 else ("mapped", "built")):
                idx = engines[name]
                t0 = time.perf_counter()
                for q in part:
                    idx.search(q, 10)
                spent[name] += time.perf_counter() - t0
        for name in spent:
            single[name].append(spent[name])
        for name in (("built", "mapped") if r % 2 == 0 else ("mapped", "built")):
            t0 = time.perf_counter()
            engines[name].search_batch(queries, 10)
            batch[name].append(time.perf_counter() - t0)
    load.append(os.getloadavg()[0])
    nq = len(queries)

    def ratio(d: dict[str, list[float]]) -> float:
        return statistics.median(b / m for b, m in zip(d["built"], d["mapped"], strict=True))

    return {"identical_top10": same, "built_qps": nq / statistics.median(single["built"]),
            "mapped_qps": nq / statistics.median(single["mapped"]),
            "built_batch_qps": nq / statistics.median(batch["built"]),
            "mapped_batch_qps": nq / statistics.median(batch["mapped"]),
            "mapped_vs_built_single": ratio(single), "mapped_vs_built_batch": ratio(batch),
            "best_of_single": min(single["built"]) / min(single["mapped"]),
            "best_of_batch": min(batch["built"]) / min(batch["mapped"]),
            "queries": nq, "rounds": rounds, "load_avg_1min": load}


STEPS = {"build": step_build, "open": step_open, "second": step_second, "throughput": step_throughput}


def run_step(step: str, n: int) -> dict:
    p = subprocess.run(["nice", "-n", "5", sys.executable, __file__, "--step", step, "--n", str(n)],
                       capture_output=True, text=True, cwd=ROOT, timeout=3600)
    if p.returncode != 0:
        raise RuntimeError(f"step {step} at {n} failed:\n{p.stderr[-3000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def machine() -> dict:
    import numba

    return {"cpu_count": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform(),
            "numpy": np.__version__, "numba": numba.__version__, "date": time.strftime("%Y-%m-%d %H:%M:%S %Z")}


def markdown(report: dict) -> str:
    lines = ["# BM25: the published memory-mapped file vs a rebuild from tokens", "",
             "Commands: " + "; ".join(f"`{c}`" for c in report["commands"]), "", f"Machine: {json.dumps(report['machine'])}", "",
             "| docs | postings | file MiB | build from tokens s | build peak MiB | open s | open peak MiB "
             "| kernels load s | first query ms | USS after queries MiB | 2nd process USS MiB (share) "
             "| qps built / mapped | batch qps built / mapped | mapped/built single, batch (median; best) | identical |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in report["rows"]:
        b, o, s, t = r.get("build", {}), r.get("open", {}), r.get("second", {}), r.get("throughput", {})

        def f(d: dict, k: str, nd: int = 3) -> str:
            return f"{d[k]:.{nd}f}" if k in d else "-"

        share = f"{s['second_uss_growth_mib']:.1f} ({s['second_uss_share_of_index']:.1%})" if s else "-"
        lines.append(
            f"| {r['docs']:,} | {b.get('postings', 0):,} | {b.get('index_bytes', 0) / 2**20:.0f} "
            f"| {f(b, 'build_from_tokens_s', 2)} | {f(b, 'build_peak_rss_growth_mib', 0)} | {f(o, 'open_s', 4)} "
            f"| {f(o, 'open_peak_rss_growth_mib', 1)} | {f(o, 'kernel_load_s', 2)} | {f(o, 'first_query_ms', 1)} "
            f"| {f(o, 'uss_growth_after_queries_mib', 1)} | {share} "
            f"| {f(t, 'built_qps', 0)} / {f(t, 'mapped_qps', 0)} "
            f"| {f(t, 'built_batch_qps', 0)} / {f(t, 'mapped_batch_qps', 0)} "
            f"| {f(t, 'mapped_vs_built_single')}, {f(t, 'mapped_vs_built_batch')}; "
            f"{f(t, 'best_of_single')}, {f(t, 'best_of_batch')} | {t.get('identical_top10', '-')} |")
    lines += ["", "Open: a fresh process, package imported and kernels loaded first (timed apart); peak "
              "RSS growth is VmHWM after the open minus VmRSS before it. USS is private pages "
              "(`/proc/self/smaps_rollup`): mapped index pages are shared page cache, so a second "
              "process adds little. Throughput: one process, single queries timed in alternating "
              "pairs of 25-query chunks, batches alternating; ratios >1 mean mapped is faster "
              "(median of per-round ratios; best-of: fastest round of each). The machine's 2 "
              "cores were shared with other work (`load_avg_1min` in the JSON). `identical` "
              "compares every top-10 (ids and scores) of built and mapped."]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="250000,1000000")
    ap.add_argument("--steps", default="build,open,second,throughput")
    ap.add_argument("--step", help=argparse.SUPPRESS)
    ap.add_argument("--n", type=int, help=argparse.SUPPRESS)
    add_io_args(ap, data=False)
    args = ap.parse_args()
    if args.step == "hold":
        step_open(args.n, hold=True)
        return
    if args.step:
        print(json.dumps(STEPS[args.step](args.n)))
        return
    out = out_dir(args.out)
    sizes = [int(s) for s in args.sizes.split(",") if s]
    steps = [s for s in args.steps.split(",") if s]
    paths = [out / "bm25_mmap.json", out / "bm25_mmap.md"]
    command = "python benchmarks/bench_bm25_mmap.py " + " ".join(sys.argv[1:])
    # A run of some steps updates those steps of an earlier report (its commands kept).
    report = json.loads(paths[0].read_text()) if paths[0].exists() else {"commands": [], "rows": []}
    report.setdefault("commands", [report.pop("command")] if "command" in report else [])
    report["commands"].append(command)
    report["machine"] = machine()
    rows = {r["docs"]: r for r in report["rows"]}
    for n in sizes:
        row = rows.setdefault(n, {"docs": n})
        report["rows"] = sorted(rows.values(), key=lambda r: r["docs"])
        for step in steps:
            row[step] = run_step(step, n)
            print(f"{n} {step}: {json.dumps(row[step])}", file=sys.stderr, flush=True)
            paths[0].write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
            paths[1].write_text(markdown(report), encoding="utf-8")
    say_written(paths)


if __name__ == "__main__":
    main()
