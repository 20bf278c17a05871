"""Published vector file (issue 47 item 2): open time, memory and query time at 1M x 384,
exactness against the in-memory float32 path at 1M and on the shared eval sets.

    python benchmarks/bench_vector_file.py scale --out benchmarks/results   # 1M x 384, synthetic
    python benchmarks/bench_vector_file.py scale --out benchmarks/results --redo --steps serve,second,inmemory
    python benchmarks/bench_vector_file.py sets  --out benchmarks/results   # eval sets, real models

``scale`` writes seeded synthetic unit vectors (isotropic Gaussian, normalized: fine for
time and memory, which do not depend on the values; the pre-selection's pool does, so the
eval sets measure it on real embeddings too) into ``benchmarks/out/vector_file/`` (git-
ignored, ~2 GB) and runs each step in a fresh process, writing the results after each:

* ``serve``: open time, first query (verifies the scanned arrays, loads the kernel), then
  200 queries at depth 100 (the retriever's candidate depth) and 10; RSS, USS and PSS
  (``psutil.memory_full_info``) before the open and after the queries, the peak RSS of
  the whole run (``VmHWM``), and the file mapping's own resident bytes (``/proc/self/smaps``).
* ``second``: a second serving process opened while the first still holds the file: its
  USS after the same 200 queries (the pages are shared, not copied).
* ``inmemory``: today's path (the float32 matrix in memory, ``dense_topk.dense_top``): RSS and
  p50 of the same queries; then the mapped scorer in the same process: every answer
  compared (ids and score bits), and the int8 pre-selection's recall@depth when the pool
  is a fixed multiple of the depth (the scorer itself uses the certified pool).

Each step resumes: a step already in the results JSON is skipped (``--redo`` reruns).
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

from benchmarks.common import DEFAULT_OUT, add_io_args, out_dir, say_written, use_data  # noqa: E402

NAME = "vector_file"
N, DIM, QUERIES, SEED = 1_000_000, 384, 200, 47
DEPTHS = (100, 10)
FACTORS = (1, 2, 4, 8)
SETS = ("scifact", "cranfield", "cmrc2018-trial", "xquad-de", "xquad-ru", "xquad-ar", "xquad-th")
_LOAD = os.getloadavg()


def _cmd() -> str:
    return "python benchmarks/bench_vector_file.py " + " ".join(sys.argv[1:])


def _file(n: int) -> Path:
    return DEFAULT_OUT / NAME / f"synthetic-{n}x{DIM}.rsvec"


def _synthetic(n: int, lo: int, hi: int) -> np.ndarray:
    """Rows [lo, hi) of the seeded synthetic corpus (each block from its own seed)."""
    from ragspine_pipeline.retrieval.vector.published import unit_rows

    block = 65536
    parts = []
    for b in range(lo // block, -(-hi // block)):
        rng = np.random.default_rng([SEED, b])
        rows = rng.standard_normal((min(block, n - b * block), DIM), dtype=np.float32)
        parts.append(unit_rows(rows)[max(lo - b * block, 0):hi - b * block])
    return np.concatenate(parts) if parts else np.zeros((0, DIM), np.float32)


def _queries(pv) -> np.ndarray:
    """Half near a stored row (cosine ~0.7 to it), half random directions."""
    from ragspine_pipeline.retrieval.vector.published import unit_rows

    rng = np.random.default_rng([SEED, 999])
    near = pv.unit_rows(np.sort(rng.choice(len(pv), QUERIES // 2, replace=False)))
    noise = unit_rows(rng.standard_normal((QUERIES, DIM), dtype=np.float32))
    return unit_rows(np.vstack([near + noise[:QUERIES // 2], noise[QUERIES // 2:]]))


def _memory() -> dict:
    import psutil

    m = psutil.Process().memory_full_info()
    with open("/proc/self/status") as fh:
        hwm = next(int(line.split()[1]) for line in fh if line.startswith("VmHWM:"))
    return {"rss_mib": round(m.rss / 2**20, 1), "uss_mib": round(m.uss / 2**20, 1), "pss_mib": round(m.pss / 2**20, 1),
            "peak_rss_mib": round(hwm / 1024, 1)}


def _mapped_resident(path: Path) -> float:
    """MiB of the file's mapping resident in this process (summed over its smaps entries)."""
    total, inside = 0, False
    with open("/proc/self/smaps") as fh:
        for line in fh:
            if line[0] in "0123456789abcdef" and "-" in line.split()[0]:
                inside = line.rstrip().endswith(str(path))
            elif inside and line.startswith("Rss:"):
                total += int(line.split()[1])
    return round(total / 1024, 1)


def _p(xs: list[float], q: float) -> float:
    return round(float(np.percentile(np.array(xs) * 1000, q)), 2)


# ------------------------------------------------------------------ steps (each its own process)
def step_write(args) -> dict:
    from ragspine_pipeline.retrieval.vector.published_write import write_vectors

    path = _file(args.n)
    path.parent.mkdir(parents=True, exist_ok=True)
    ids = [f"doc{i // 8:07d}#{i % 8}" for i in range(args.n)]
    t0 = time.perf_counter()
    batches = (_synthetic(args.n, lo, min(lo + 65536, args.n)) for lo in range(0, args.n, 65536))
    write_vectors(path, batches, args.n, DIM, ids, metadata={"synthetic": True, "seed": SEED})
    return {"write_s": round(time.perf_counter() - t0, 2), "file_mib": round(path.stat().st_size / 2**20, 1)}


def step_serve(args) -> dict:
    """Open, first query, 200 queries per depth; memory. With --hold, wait for a line on
    stdin before exiting (the second process runs meanwhile)."""
    from ragspine_pipeline.retrieval.vector.published import open_vectors

    path = _file(args.n)
    before = _memory()
    t0 = time.perf_counter()
    pv = open_vectors(path)
    open_s = time.perf_counter() - t0
    qv = _queries(pv)
    everything = np.arange(len(pv))
    t0 = time.perf_counter()
    pv.top(qv[:1], everything, DEPTHS[0])
    first_s = time.perf_counter() - t0
    out = {"open_s": round(open_s, 4), "first_query_s": round(first_s, 3), "memory_before_open": before}
    for depth in DEPTHS:
        lat, pools = [], []
        for row in qv:
            t0 = time.perf_counter()
            pv.top(row[None], everything, depth)
            lat.append(time.perf_counter() - t0)
            pools.append(pv.last_pool[0])
        half = QUERIES // 2
        out[f"depth{depth}"] = {"p50_ms": _p(lat, 50), "p95_ms": _p(lat, 95),
                                "pool_median_near": int(statistics.median(pools[:half])),
                                "pool_max_near": int(max(pools[:half])),
                                "pool_median_random": int(statistics.median(pools[half:])),
                                "pool_max_random": int(max(pools[half:]))}
    out["memory_serving"] = _memory()
    out["file_resident_mib"] = _mapped_resident(path)
    if args.hold:
        print(json.dumps(out), flush=True)
        sys.stdin.readline()
        return {}
    return out


def step_inmemory(args) -> dict:
    """Today's path: the float32 matrix read into memory (what ``preload_vectors`` holds, no
    mapping), its RSS; then both paths timed query by query in this one process
    (alternating, so load on the shared machine hits both alike), every answer compared,
    and the int8 pre-selection's recall when the pool is a fixed multiple of the depth."""
    from ragspine_pipeline.retrieval.hybrid.dense_topk import dense_top
    from ragspine_pipeline.retrieval.vector.published import open_vectors
    from ragspine_pipeline.retrieval.vector.published_scan import approx_scores

    path = _file(args.n)
    before = _memory()
    t0 = time.perf_counter()
    pv = open_vectors(path)
    spec = pv.toc["arrays"]["rows"]
    mat = np.fromfile(path, np.float32, count=len(pv) * DIM, offset=spec.offset).reshape(len(pv), DIM)
    load_s = time.perf_counter() - t0
    qv = _queries(pv)
    everything = np.arange(len(pv))
    dense_top(mat, everything, qv[0], DEPTHS[0])
    pv.top(qv[:1], everything, DEPTHS[0])
    out: dict = {"load_s": round(load_s, 2), "memory_before": before, "memory_serving": _memory()}
    for depth in DEPTHS:
        lat_mem, lat_map, same, exact = [], [], 0, []
        for j, row in enumerate(qv):
            runs = [("mem", lambda r=row, k=depth: dense_top(mat, everything, r, k)),
                    ("map", lambda r=row, k=depth: pv.top(r[None], everything, k)[0])]
            got = {}
            for name, fn in (runs if j % 2 else runs[::-1]):
                t0 = time.perf_counter()
                got[name] = fn()
                (lat_mem if name == "mem" else lat_map).append(time.perf_counter() - t0)
            a, b = got["mem"], got["map"]
            same += bool(np.array_equal(a.ids, b.ids) and np.array_equal(a.scores.view(np.uint64),
                                                                         b.scores.view(np.uint64)))
            exact.append(a)
        approx = approx_scores(pv._a["codes"], pv._a["scale"], everything, qv)
        recall = {}
        for f in FACTORS:
            hit = [len(np.intersect1d(np.argpartition(-approx[j], f * depth)[:f * depth], exact[j].ids))
                   for j in range(len(qv))]
            recall[f"x{f}"] = round(sum(hit) / (depth * len(qv)), 4)
        out[f"depth{depth}"] = {"p50_ms": _p(lat_mem, 50), "p95_ms": _p(lat_mem, 95),
                                "mapped_p50_ms": _p(lat_map, 50), "mapped_p95_ms": _p(lat_map, 95),
                                "identical": f"{same}/{len(qv)}", "fixed_pool_recall": recall}
    return out


STEPS = {"write": step_write, "serve": step_serve, "inmemory": step_inmemory}


def _run_step(step: str, n: int, extra: list[str] | None = None, **kw) -> subprocess.Popen:
    cmd = [sys.executable, __file__, "_step", step, "--n", str(n), *(extra or [])]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, **kw)


def _one(step: str, n: int) -> dict:
    p = _run_step(step, n)
    out, _ = p.communicate()
    if p.returncode:
        raise SystemExit(f"step {step} failed ({p.returncode})")
    return json.loads(out.strip().splitlines()[-1])


def _second(n: int) -> dict:
    """The first process serves and holds the mapping; a second one opens and serves while
    it does; both are measured while both are alive (then the pages are shared)."""
    import psutil

    procs = []
    for _ in range(2):
        p = _run_step("serve", n, ["--hold"], stdin=subprocess.PIPE)
        assert p.stdout is not None
        procs.append((p, json.loads(p.stdout.readline())))
    (first, alone), (_, second) = procs
    m = psutil.Process(first.pid).memory_full_info()
    for p, _ in procs:
        assert p.stdin is not None
        p.stdin.write("\n")
        p.stdin.flush()
        p.wait()
    return {"first_uss_alone_mib": alone["memory_serving"]["uss_mib"], "first_uss_shared_mib": round(m.uss / 2**20, 1),
            "second": {k: second[k] for k in ("open_s", "memory_serving", "file_resident_mib")},
            "second_extra_uss_mib": second["memory_serving"]["uss_mib"]}


def _write_results(results: Path, data: dict) -> list[Path]:
    jp, mp = results / f"{NAME}.json", results / f"{NAME}.md"
    jp.write_text(json.dumps(data, indent=1) + "\n")
    mp.write_text(_markdown(data))
    return [jp, mp]


def _markdown(d: dict) -> str:
    lines = ["# Published vector file (issue 47 item 2)", "",
             f"Commands: `{'`, `'.join(d.get('commands', []))}`. Machine: {d['machine']}.", ""]
    s = d.get("scale", {})
    if s:
        lines += [f"## {s.get('n', N):,} x {DIM}, synthetic unit vectors (seeded Gaussian; time and memory only)",
                  ""]
        w, sv, im, sec = s.get("write", {}), s.get("serve", {}), s.get("inmemory", {}), s.get("second", {})
        if w:
            lines.append(f"- write (quantize, checksum, verify, rename): {w['write_s']} s, file {w['file_mib']} MiB")
        if sv:
            m0, m1 = sv["memory_before_open"], sv["memory_serving"]
            lines += [f"- open: {sv['open_s'] * 1000:.1f} ms; first query (verifies the scanned arrays, loads the "
                      f"kernel): {sv['first_query_s']} s",
                      f"- serving process after {QUERIES} queries per depth: RSS {m1['rss_mib']} MiB, USS "
                      f"{m1['uss_mib']} MiB, peak RSS (VmHWM, any moment of the run) {m1.get('peak_rss_mib')} MiB "
                      f"(before the open: RSS {m0['rss_mib']}, USS {m0['uss_mib']}); the file's mapping resident "
                      f"after the queries: {sv['file_resident_mib']} MiB"]
        if sec:
            lines.append(f"- a second serving process (the first still serving): its USS {sec['second_extra_uss_mib']}"
                         f" MiB (RSS {sec['second']['memory_serving']['rss_mib']} MiB, open "
                         f"{sec['second']['open_s'] * 1000:.1f} ms); the first's USS {sec['first_uss_alone_mib']} -> "
                         f"{sec['first_uss_shared_mib']} MiB once the pages are shared")
        if im:
            lines.append(f"- today's path (float32 matrix in memory): RSS {im['memory_serving']['rss_mib']} MiB "
                         f"(before loading {im['memory_before']['rss_mib']}), load {im['load_s']} s")
        if sv and "mapped_p50_ms" in im.get(f"depth{DEPTHS[0]}", {}):
            lines += ["", "Latency: both paths in one process, query by query, alternating (the machine is "
                      "shared; ratios within the run hold, absolute times move with its load). The serving "
                      "process alone (memory step) measured the mapped p50 in its own column.", "",
                      "| depth | mapped p50 ms | p95 | in-memory float32 p50 ms | p95 | ratio (in-memory / mapped) | "
                      "identical answers | mapped p50 alone | pool median near / random (max) | "
                      "fixed-pool recall x1 / x2 / x4 / x8 |",
                      "|---|---|---|---|---|---|---|---|---|---|"]
            for depth in DEPTHS:
                a, b = sv[f"depth{depth}"], im[f"depth{depth}"]
                r = b.get("fixed_pool_recall", {})
                lines.append(f"| {depth} | {b['mapped_p50_ms']} | {b['mapped_p95_ms']} | {b['p50_ms']} | "
                             f"{b['p95_ms']} | {b['p50_ms'] / b['mapped_p50_ms']:.2f} | {b.get('identical')} | "
                             f"{a['p50_ms']} | {a['pool_median_near']} / "
                             f"{a['pool_median_random']} ({max(a['pool_max_near'], a['pool_max_random'])}) | "
                             f"{' / '.join(str(r.get(f'x{f}')) for f in FACTORS)} |")
    rows = d.get("sets", [])
    if rows:
        lines += ["", "## Shared eval sets: mapped scorer vs the exact in-memory path", "",
                  "| set | model | chunks | queries | depth | identical (ids and score bits) | pool median (max) | "
                  "fixed-pool recall x1 / x2 / x4 |", "|---|---|---|---|---|---|---|---|"]
        for r in rows:
            rec = r["fixed_pool_recall"]
            lines.append(f"| {r['set']} | {r['model']} | {r['chunks']} | {r['queries']} | {r['depth']} | "
                         f"{r['identical']} | {r['pool_median']} ({r['pool_max']}) | "
                         f"{rec['x1']} / {rec['x2']} / {rec['x4']} |")
    if rows:
        lines += ["", "A set of at most 4 x depth chunks is rescored whole (as `dense_top` does): its pool is "
                  "every chunk, and only its fixed-pool recall says what the int8 codes would have kept."]
    lines += ["", "The scorer's pool is certified, not a fixed multiple: every row whose int8 upper bound reaches "
              "the depth-th best lower bound is rescored exactly (float64 from its float32 row), so the answers "
              "are the exact path's by construction; the fixed-pool recall columns show what a plain "
              "oversampled pool of that many times the depth would have kept.", ""]
    return "\n".join(lines)


def _load(results: Path) -> dict:
    p = results / f"{NAME}.json"
    d = json.loads(p.read_text()) if p.exists() else {}
    d["machine"] = (f"{os.cpu_count()} cores, {platform.platform()}, Python {platform.python_version()}, "
                    f"load at start {[round(x, 2) for x in _LOAD]}")
    d.setdefault("commands", [])
    if _cmd() not in d["commands"]:
        d["commands"].append(_cmd())
    return d


def scale(args) -> None:
    results = out_dir(args.out)
    d = _load(results)
    s = d.setdefault("scale", {})
    if s.get("n") != args.n:
        s.clear()
        s["n"] = args.n
    todo = [x for x in ("write", "serve", "second", "inmemory")
            if (args.redo and x in args.steps.split(",")) or x not in s]
    for step in todo:
        s.pop(step, None)
    if "write" in todo or not _file(args.n).exists():
        s["write"] = _one("write", args.n)
        say_written(_write_results(results, d))
    for step in [x for x in todo if x != "write"]:
        s[step] = _second(args.n) if step == "second" else _one(step, args.n)
        say_written(_write_results(results, d))


def sets(args) -> None:
    """Every judged query of each set, both paths, depth 100 and 300 (``ragspine eval``'s)."""
    import tempfile

    from benchmarks.bench_dense import cached_backend, load_set
    from ragspine_pipeline.retrieval.hybrid.dense_topk import dense_top
    from ragspine_pipeline.retrieval.vector.published import open_vectors, unit_rows
    from ragspine_pipeline.retrieval.vector.published_scan import approx_scores
    from ragspine_pipeline.retrieval.vector.published_write import write_vectors

    use_data(args.data)
    results = out_dir(args.out)
    d = _load(results)
    rows = d.setdefault("sets", [])
    have = {(r["set"], r["model"], r["depth"]) for r in rows}
    for model in args.models.split(","):
        for name in args.sets.split(","):
            if all((name, model, depth) in have for depth in (100, 300)) and not args.redo:
                continue
            ds, chunks = load_set(name)
            be = cached_backend(model, progress=False)
            mat = unit_rows(np.asarray(be.vectors("passage", [c.text for c in chunks]), np.float32))
            qv = unit_rows(np.asarray(be.vectors("query", [ds.queries[q] for q in ds.judged_queries]), np.float32))
            with tempfile.TemporaryDirectory() as tmp:
                pv = open_vectors(write_vectors(Path(tmp) / "v.rsvec", [mat], len(mat), mat.shape[1],
                                                [c.chunk_id for c in chunks]))
                everything = np.arange(len(mat))
                approx = approx_scores(pv._a["codes"], pv._a["scale"], everything, qv)
                for depth in (100, 300):
                    got = pv.top(qv, everything, depth)
                    ref = [dense_top(mat, everything, row, depth) for row in qv]
                    same = sum(np.array_equal(a.ids, b.ids) and np.array_equal(a.scores.view(np.uint64),
                                                                                b.scores.view(np.uint64))
                               for a, b in zip(got, ref, strict=True))
                    recall = {}
                    for f in (1, 2, 4):
                        hit = [len(np.intersect1d(np.argsort(-approx[j], kind="stable")[:f * depth], ref[j].ids))
                               for j in range(len(qv))]
                        recall[f"x{f}"] = round(sum(hit) / max(sum(len(r.ids) for r in ref), 1), 4)
                    rows[:] = [r for r in rows if (r["set"], r["model"], r["depth"]) != (name, model, depth)]
                    rows.append({"set": name, "model": model, "chunks": len(mat), "queries": len(qv), "depth": depth,
                                 "identical": f"{same}/{len(qv)}", "pool_median": int(statistics.median(pv.last_pool)),
                                 "pool_max": int(max(pv.last_pool)), "fixed_pool_recall": recall})
                del pv
            say_written(_write_results(results, d))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("scale")
    add_io_args(a, data=False)
    a.add_argument("--n", type=int, default=N)
    a.add_argument("--redo", action="store_true")
    a.add_argument("--steps", default="write,serve,second,inmemory", help="the steps --redo reruns")
    b = sub.add_parser("sets")
    add_io_args(b)
    b.add_argument("--sets", default=",".join(SETS))
    b.add_argument("--models", default="static")
    b.add_argument("--redo", action="store_true")
    c = sub.add_parser("_step")
    c.add_argument("step", choices=sorted(STEPS))
    c.add_argument("--n", type=int, default=N)
    c.add_argument("--hold", action="store_true")
    args = ap.parse_args()
    if args.cmd == "_step":
        out = STEPS[args.step](args)
        if out:
            print(json.dumps(out), flush=True)
    else:
        {"scale": scale, "sets": sets}[args.cmd](args)


if __name__ == "__main__":
    main()
