"""Load and latency of the retrieval service (issue 29), against in-process retrieval.

For each warehouse (the demo corpus; SciFact as one library) and mode (bm25; hybrid):

1. in-process: ``open_published_retriever`` answers the queries one at a time (the
   baseline: per-query latency, qps);
2. concurrency 1: one HTTP client sends the same queries in turn to ``ragspine serve``
   (``serve_main``, a subprocess on 127.0.0.1): the service's overhead is the difference;
3. load: ``--clients`` asyncio httpx clients for ``--duration`` seconds (bounded), with the
   demo library republished every ``--refresh-every`` seconds during the demo runs; every
   response is checked: no error, every snippet from the snapshot version it names.

Hybrid uses the deterministic hash embedding stored in the snapshots (no model load):
it measures the service's overhead on the hybrid path, not an ONNX model. The load
generator runs on the same 2 cores as the server: the 64-client ratio to in-process is a
lower bound. ``python -m benchmarks.bench_service [--duration 60 --clients 64] --out DIR``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from benchmarks.common import ROOT, add_io_args, out_dir, require_sets, say_written, use_data

CACHE = ROOT / "benchmarks" / ".cache" / "service"


def _pct(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, int(round(p / 100 * (len(s) - 1))))]


def _summary(lat_s: list[float], seconds: float, errors: int) -> dict[str, Any]:
    ms = [x * 1000 for x in lat_s]
    return {"requests": len(ms), "errors": errors, "qps": round(len(ms) / seconds, 1) if seconds else None,
            "p50_ms": round(_pct(ms, 50), 2), "p95_ms": round(_pct(ms, 95), 2), "p99_ms": round(_pct(ms, 99), 2)}


def _publish(wh: Any, corpus: Path, lib: str) -> str:
    from ragspine_pipeline.retrieval.vector.embedding_backends import DeterministicHashBackend
    from ragspine_pipeline.warehouse import pipeline as P

    P.build_raw_documents(wh, corpus, lib)
    P.build_chunks(wh, lib)
    P.build_lexical_index(wh, lib)
    P.build_embeddings(wh, lib, DeterministicHashBackend(), "deterministic")
    return P.publish_snapshot(wh, lib).metadata["version"]


def build_demo(root: Path) -> tuple[Path, Path, list[dict]]:
    from ragspine_pipeline.corpus import list_libraries, load_golden
    from ragspine_pipeline.paths import DEMO_ROOT
    from ragspine_pipeline.warehouse.versioned import VersionedTables

    shutil.rmtree(root, ignore_errors=True)
    corpus = root / "corpus"
    shutil.copytree(DEMO_ROOT, corpus)
    wh = VersionedTables(root / "wh")
    for lib in list_libraries(corpus):
        _publish(wh, corpus, lib)
    queries = [{"query": g["query"], "filters": g.get("filters")} for g in load_golden(DEMO_ROOT / "golden_queries.json")]
    return root / "wh", corpus, queries


def build_scifact(root: Path, data: Path, n_queries: int) -> tuple[Path, list[dict]]:
    from ragspine_pipeline.eval.beir import load_beir
    from ragspine_pipeline.warehouse.versioned import VersionedTables

    ds = load_beir(data / "scifact")
    wh_root = root / "wh"
    if not (root / ".complete").exists():
        shutil.rmtree(root, ignore_errors=True)
        folder = root / "corpus" / "scifact"
        folder.mkdir(parents=True)
        for i, d in enumerate(ds.corpus.values()):
            (folder / f"d{i:06d}.txt").write_text(f"{d.title}\n\n{d.text}\n", encoding="utf-8")
        _publish(VersionedTables(wh_root), root / "corpus", "scifact")
        (root / ".complete").write_text("1")
    return wh_root, [{"query": q, "filters": None} for q in list(ds.queries.values())[:n_queries]]


def in_process(warehouse: Path, mode: str, queries: list[dict], top_k: int, rounds: int) -> dict[str, Any]:
    from ragspine_pipeline.serving import open_published_retriever

    r = open_published_retriever(warehouse, mode=mode)
    for q in queries[:5]:
        r.retrieve(q["query"], filters=q["filters"], top_k=top_k)
    lat = []
    t0 = time.perf_counter()
    for _ in range(rounds):
        for q in queries:
            s = time.perf_counter()
            r.retrieve(q["query"], filters=q["filters"], top_k=top_k)
            lat.append(time.perf_counter() - s)
    return _summary(lat, time.perf_counter() - t0, 0) | {"latencies": lat}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(warehouse: Path, mode: str, workers: int) -> tuple[subprocess.Popen, str]:
    import httpx

    port = _free_port()
    from ragspine_pipeline import settings

    service_vars = {s.name for s in settings.SETTINGS if s.group == "service"}  # the run sets its own
    env = {**{k: v for k, v in os.environ.items() if k not in service_vars},
           "RAGSPINE_SERVICE_RATE": "0", "RAGSPINE_SERVICE_RELOAD_S": "0.5"}
    proc = subprocess.Popen(
        [sys.executable, "-c", "import sys; from ragspine_pipeline.service import serve_main; "
         "sys.exit(serve_main(sys.argv[1:]))", "--warehouse", str(warehouse), "--port", str(port), "--mode", mode,
         "--workers", str(workers), "--log-level", "warning"],
        env=env, start_new_session=True, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if httpx.get(base + "/readyz").status_code == 200:
                return proc, base
        except httpx.TransportError:
            pass
        if proc.poll() is not None:
            raise SystemExit(f"the server exited with {proc.returncode}")
        time.sleep(0.2)
    raise SystemExit("the server did not become ready in 120 s")


def stop_server(proc: subprocess.Popen) -> None:
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def sequential(base: str, queries: list[dict], top_k: int, rounds: int) -> dict[str, Any]:
    import httpx

    lat = []
    with httpx.Client(base_url=base, timeout=30) as c:
        for q in queries[:5]:
            c.post("/v1/search", json={**q, "top_k": top_k})
        t0 = time.perf_counter()
        for _ in range(rounds):
            for q in queries:
                s = time.perf_counter()
                r = c.post("/v1/search", json={**q, "top_k": top_k})
                lat.append(time.perf_counter() - s)
                r.raise_for_status()
    return _summary(lat, time.perf_counter() - t0, 0) | {"latencies": lat}


async def _load(base: str, queries: list[dict], top_k: int, clients: int, duration: float) -> dict[str, Any]:
    import httpx

    lat: list[float] = []
    bodies: list[dict] = []
    errors = 0
    stop_at = time.perf_counter() + duration
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)

    async with httpx.AsyncClient(base_url=base, timeout=60, limits=limits) as c:
        async def worker(i: int) -> None:
            nonlocal errors
            k = i
            while time.perf_counter() < stop_at:
                q = queries[k % len(queries)]
                k += clients
                s = time.perf_counter()
                try:
                    r = await c.post("/v1/search", json={**q, "top_k": top_k})
                    lat.append(time.perf_counter() - s)
                    if r.status_code != 200:
                        errors += 1
                    else:
                        bodies.append(r.json())
                except httpx.HTTPError:
                    errors += 1
        t0 = time.perf_counter()
        await asyncio.gather(*(worker(i) for i in range(clients)))
        seconds = time.perf_counter() - t0
    return _summary(lat, seconds, errors) | {"bodies": bodies}


def mixed_versions(warehouse: Path, bodies: list[dict]) -> tuple[int, int]:
    """(responses whose snippets all come from the versions they name, mixed ones)."""
    from ragspine_pipeline.warehouse.common import SNAPSHOT
    from ragspine_pipeline.warehouse.versioned import VersionedTables

    wh = VersionedTables(warehouse)
    ids: dict[tuple[str, str], set[str]] = {}
    mixed = 0
    for body in bodies:
        bad = False
        for s in body["snippets"]:
            lib = s.get("library_id") or next(iter(body["versions"]))
            key = (lib, body["versions"][lib])
            if key not in ids:
                chunks = wh.get(SNAPSHOT, *key).manifest["metadata"]["chunks"]
                ids[key] = set(wh.read("chunks", lib, "chunks", chunks).column("chunk_id").to_pylist())
            bad = bad or s["chunk_id"] not in ids[key]
        mixed += bad
    return len(bodies) - mixed, mixed


def refresher(warehouse: Path, corpus: Path, every: float, stop: threading.Event, out: list[str]) -> None:
    from ragspine_pipeline.warehouse.versioned import VersionedTables

    wh = VersionedTables(warehouse)
    target = corpus / "acme_reports" / "ar2023_cn_revenue.md"
    n = 0
    while not stop.wait(every):
        n += 1
        target.write_text(target.read_text(encoding="utf-8") + f"\n\nRevenue note {n}.\n", encoding="utf-8")
        out.append(_publish(wh, corpus, "acme_reports"))


MAPPED_FILES = ("bm25.rsbm25", "served_chunks.arrow")  # the published index files each worker maps
OPEN_WAREHOUSE = ROOT / "benchmarks" / ".cache" / "open" / "warehouse"  # bench_open's SciFact x10


def smaps_mib(pid: int) -> dict[str, float]:
    """RSS, PSS and USS (private clean + dirty) of one process, and the RSS/PSS of its mappings
    of the published index files, in MiB: a mapped page counts once in PSS however many
    workers share it, so the PSS sum over processes is what the service costs."""
    def kib(text: str) -> dict[str, int]:
        vals: dict[str, int] = {}
        for line in text.splitlines():
            key, _, rest = line.partition(":")
            if rest.strip().endswith("kB"):
                vals[key] = vals.get(key, 0) + int(rest.split()[0])
        return vals

    roll = kib(Path(f"/proc/{pid}/smaps_rollup").read_text().split("\n", 1)[1])
    mapped = {"Rss": 0, "Pss": 0}
    current = False
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        head = line.split(maxsplit=5)
        if len(head) >= 5 and "-" in head[0] and ":" not in head[0]:  # a mapping's header line
            current = len(head) == 6 and head[5].endswith(MAPPED_FILES)
        elif current and line.startswith(("Rss:", "Pss:")):
            mapped[line[:3]] += int(line.split()[1])
    mib = lambda v: round(v / 1024, 1)  # noqa: E731
    return {"rss": mib(roll.get("Rss", 0)), "pss": mib(roll.get("Pss", 0)),
            "uss": mib(roll.get("Private_Clean", 0) + roll.get("Private_Dirty", 0)),
            "mapped_index_rss": mib(mapped["Rss"]), "mapped_index_pss": mib(mapped["Pss"])}


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def worker_pids(proc: subprocess.Popen, workers: int) -> list[int]:
    """uvicorn serves in the process itself with one worker; with more, its children are
    the workers (multiprocessing's resource tracker is not one)."""
    if workers == 1:
        return [proc.pid]
    with open(f"/proc/{proc.pid}/task/{proc.pid}/children", encoding="ascii") as fh:
        kids = [int(p) for p in fh.read().split()]
    return [pid for pid in kids if b"resource_tracker" not in Path(f"/proc/{pid}/cmdline").read_bytes()]


async def _fresh_connections(base: str, queries: list[dict], top_k: int, concurrency: int) -> int:
    """Every query on a new connection, ``concurrency`` at a time, so the kernel hands the
    connections to whichever worker is free: all workers end up answering."""
    import httpx

    sem = asyncio.Semaphore(concurrency)
    limits = httpx.Limits(max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=base, timeout=60, limits=limits) as c:
        async def one(q: dict) -> int:
            async with sem:
                r = await c.post("/v1/search", json={**q, "top_k": top_k}, headers={"Connection": "close"})
                return int(r.status_code != 200)
        return sum(await asyncio.gather(*(one(q) for q in queries)))


def workers_memory(warehouse: Path, workers: int, queries: list[dict], top_k: int,
                   min_cpu_s: float = 1.0, max_passes: int = 20) -> dict[str, Any]:
    """``ragspine serve --workers N`` (BM25) on ``warehouse``: memory of each worker after
    every worker has answered queries (each one's CPU time grew by ``min_cpu_s``, or
    ``max_passes`` passes over the queries), and of the supervisor when there is one."""
    proc, base = start_server(warehouse, "bm25", workers)
    try:
        pids = worker_pids(proc, workers)
        cpu0 = {pid: _cpu_s(pid) for pid in pids}
        passes = errors = 0
        while passes < max_passes and min(_cpu_s(p) - cpu0[p] for p in pids) < min_cpu_s:
            errors += asyncio.run(_fresh_connections(base, queries, top_k, 2 * workers))
            passes += 1
        time.sleep(1)  # let every worker settle (freed buffers, finished responses)
        per = [smaps_mib(pid) | {"cpu_s": round(_cpu_s(pid) - cpu0[pid], 2)} for pid in pids]
        supervisor = smaps_mib(proc.pid) if workers > 1 else None
    finally:
        stop_server(proc)
    processes = per + ([supervisor] if supervisor else [])
    return {"workers": workers, "passes": passes, "queries_per_pass": len(queries), "errors": errors,
            "per_worker_mib": per, "supervisor_mib": supervisor,
            "total_pss_mib": round(sum(p["pss"] for p in processes), 1),
            "total_rss_mib": round(sum(p["rss"] for p in processes), 1)}


def memory_step(results: dict, path: Path, warehouse: Path, counts: list[int], queries: list[dict],
                top_k: int, redo: bool) -> None:
    """Resumable: each worker count already in ``results["workers_memory"]`` for this
    warehouse is kept (``--redo-memory`` measures again); the JSON is rewritten after each."""
    from ragspine_pipeline import serving

    where = warehouse.resolve()
    name = str(where.relative_to(ROOT)) if where.is_relative_to(ROOT) else str(where)
    done = results.setdefault("workers_memory", {})
    if done.get("warehouse") != name or redo:
        done.clear()
        done.update({"warehouse": name, "libraries": serving.published_library_ids(where, None), "runs": {}})
    for n in counts:
        if str(n) in done["runs"]:
            print(f"memory: --workers {n} already measured (kept)", file=sys.stderr)
            continue
        print(f"memory: --workers {n} on {warehouse}", file=sys.stderr)
        done["runs"][str(n)] = workers_memory(warehouse, n, queries, top_k)
        path.write_text(json.dumps(results, indent=2))


def memory_markdown(mem: dict) -> list[str]:
    runs = mem.get("runs") or {}
    if not runs:
        return []
    lines = [f"Memory of `ragspine serve --workers N --mode bm25` on `{mem['warehouse']}` (libraries "
             f"{', '.join(mem.get('libraries', []))}), MiB from `/proc/PID/smaps_rollup` after every worker answered queries "
             "(fresh connections, until each worker's CPU time grew by 1 s). USS: the worker's private pages; "
             "PSS: shared pages divided among the processes mapping them; mapped index: the worker's pages of "
             f"the published index files ({', '.join(MAPPED_FILES)}), page cache shared by every worker. From 2 "
             "workers on, uvicorn's supervisor process (no index) is counted in the total.", "",
             "| workers | worker | RSS | PSS | USS | mapped index RSS / PSS | CPU s | total PSS (all processes) | "
             "total PSS added per worker over the row above |", "|---|---|---|---|---|---|---|---|---|"]
    prev: tuple[int, float] | None = None
    for n, run in sorted(runs.items(), key=lambda kv: int(kv[0])):
        extra = round((run["total_pss_mib"] - prev[1]) / (int(n) - prev[0]), 1) if prev else ""
        prev = (int(n), run["total_pss_mib"])
        rows = [(f"worker {i + 1}", w) for i, w in enumerate(run["per_worker_mib"])]
        if run.get("supervisor_mib"):
            rows.append(("supervisor", run["supervisor_mib"]))
        for i, (who, w) in enumerate(rows):
            lines.append(f"| {n if i == 0 else ''} | {who} | {w['rss']} | {w['pss']} | {w['uss']} | "
                         f"{w['mapped_index_rss']} / {w['mapped_index_pss']} | {w.get('cpu_s', '')} | "
                         f"{run['total_pss_mib'] if i == 0 else ''} | {extra if i == 0 else ''} |")
    return lines + [""]


def run(name: str, warehouse: Path, corpus: Path | None, mode: str, queries: list[dict], args: Any) -> dict:
    print(f"{name} {mode}: in-process", file=sys.stderr)
    # enough samples for a p95 that is not the second-slowest of 24 (the demo has 8 queries)
    rounds = max(args.rounds, -(-args.min_samples // len(queries)))
    base_line = in_process(warehouse, mode, queries, args.top_k, rounds)
    proc, base = start_server(warehouse, mode, 1)
    try:
        print(f"{name} {mode}: concurrency 1", file=sys.stderr)
        one = sequential(base, queries, args.top_k, rounds)
        stop, published = threading.Event(), []
        thread = None
        if corpus is not None and args.refresh_every > 0:
            thread = threading.Thread(target=refresher, args=(warehouse, corpus, args.refresh_every, stop, published))
            thread.start()
        print(f"{name} {mode}: {args.clients} clients for {args.duration} s", file=sys.stderr)
        load = asyncio.run(_load(base, queries, args.top_k, args.clients, args.duration))
        stop.set()
        if thread is not None:
            thread.join()
    finally:
        stop_server(proc)
    ok, mixed = mixed_versions(warehouse, load.pop("bodies"))
    diffs = [b - a for a, b in zip(base_line.pop("latencies"), one.pop("latencies"), strict=True)]
    return {"warehouse": name, "mode": mode, "queries": len(queries), "in_process": base_line,
            "service_c1": one, "overhead_ms": {"p50": round(_pct(diffs, 50) * 1000, 2),
                                               "p95_of_difference": round(_pct(diffs, 95) * 1000, 2),
                                               "p95_service_minus_p95_in_process":
                                                   round(one["p95_ms"] - base_line["p95_ms"], 2)},
            "load": load, "load_qps_ratio_to_in_process": round(load["qps"] / base_line["qps"], 3),
            "versions_checked": ok + mixed, "mixed_version_responses": mixed, "refreshes_during_load": len(published)}


def markdown(results: dict) -> str:
    rows, cmd = results.get("rows", []), results.get("command", "")
    lines = ["# Retrieval service: load and latency (issue 29)", "", f"Command: `{cmd}`", "",
             f"Machine: {os.cpu_count()} cores shared by the server (1 uvicorn worker), the load generator "
             "(asyncio httpx, same cores) and the in-process baseline; load average "
             f"{results.get('loadavg', '?')} at the end. Ratios, not absolute times, carry over.", "",
             "| warehouse | mode | in-process qps | in-process p50/p95 ms | service c=1 p50/p95 ms | overhead p50 / "
             "p95(diff) ms | load qps | load p50/p95/p99 ms | errors | qps ratio | mixed / checked | refreshes |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ip, c1, ld, oh = r["in_process"], r["service_c1"], r["load"], r["overhead_ms"]
        lines.append(f"| {r['warehouse']} | {r['mode']} | {ip['qps']} | {ip['p50_ms']} / {ip['p95_ms']} | "
                     f"{c1['p50_ms']} / {c1['p95_ms']} | {oh['p50']} / {oh['p95_of_difference']} | {ld['qps']} | "
                     f"{ld['p50_ms']} / {ld['p95_ms']} / {ld['p99_ms']} | {ld['errors']} | "
                     f"{r['load_qps_ratio_to_in_process']} | {r['mixed_version_responses']} / {r['versions_checked']} | "
                     f"{r['refreshes_during_load']} |")
    lines += ["", "Overhead: per query, service latency at concurrency 1 minus in-process latency of the same "
              "query (p50 and p95 of those differences). Load: the clients share the server's cores, so the qps "
              "ratio to in-process is a lower bound of what the service does on its own cores.", ""]
    mem = results.get("workers_memory") or {}
    if mem.get("runs"):
        lines += ["## Many workers, one copy", "", f"Command: `{results.get('memory_command', '')}`", ""]
        lines += memory_markdown(mem)
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_io_args(ap)
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--duration", type=float, default=60.0)
    ap.add_argument("--rounds", type=int, default=3, help="passes over the queries at concurrency 1 (at least)")
    ap.add_argument("--min-samples", type=int, default=400, help="queries timed at concurrency 1 (more rounds "
                    "over a small query set)")
    ap.add_argument("--top-k", type=int, default=10)
    ap.add_argument("--modes", default="bm25,hybrid")
    ap.add_argument("--warehouses", default="demo,scifact")
    ap.add_argument("--scifact-queries", type=int, default=200)
    ap.add_argument("--refresh-every", type=float, default=10.0, help="republish a demo library this often (s)")
    ap.add_argument("--steps", default="load,memory", help="load (latency and load runs), memory (--workers N "
                    "memory); a step not run keeps its results from the existing service.json")
    ap.add_argument("--memory-warehouse", default=str(OPEN_WAREHOUSE), help="a published warehouse for the memory "
                    "step (default: bench_open's SciFact x10, 252,930 chunks; `python benchmarks/bench_open.py` "
                    "builds it)")
    ap.add_argument("--memory-workers", default="1,2,3", help="worker counts measured")
    ap.add_argument("--redo-memory", action="store_true", help="measure again the worker counts already recorded")
    args = ap.parse_args()
    os.environ["RAGSPINE_EMBEDDING"] = "deterministic"  # the vectors the snapshots hold, in both processes
    data = use_data(args.data)
    wanted, steps = args.warehouses.split(","), args.steps.split(",")
    if "scifact" in wanted or "memory" in steps:
        require_sets(data, ["scifact"])
    out = out_dir(args.out)
    path = out / "service.json"
    results = json.loads(path.read_text()) if path.exists() else {}
    results.pop("rss_workers_mib", None)  # superseded by the memory step
    cmd = "python -m benchmarks.bench_service " + " ".join(sys.argv[1:])
    if "load" in steps:
        rows = []
        for mode in args.modes.split(","):
            if "demo" in wanted:
                wh, corpus, queries = build_demo(CACHE / "demo")
                rows.append(run("demo", wh, corpus, mode, queries, args))
            if "scifact" in wanted:
                wh, queries = build_scifact(CACHE / "scifact", data, args.scifact_queries)
                rows.append(run("scifact", wh, None, mode, queries, args))
        results.update(rows=rows, command=cmd,
                       loadavg=", ".join(f"{x:.2f}" for x in os.getloadavg()))
        path.write_text(json.dumps(results, indent=2))
    if "memory" in steps:
        from ragspine_pipeline.eval.beir import load_beir

        queries = [{"query": q, "filters": None} for q in list(load_beir(data / "scifact").queries.values())[:300]]
        results["memory_command"] = cmd
        memory_step(results, path, Path(args.memory_warehouse), [int(n) for n in args.memory_workers.split(",")],
                    queries, args.top_k, args.redo_memory)
    path.write_text(json.dumps(results, indent=2))
    (out / "service.md").write_text(markdown(results), encoding="utf-8")
    say_written([path, out / "service.md"])


if __name__ == "__main__":
    main()
