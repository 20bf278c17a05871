"""The service on Ray Serve over S shards (issue 30, items 3-5): latency, memory, faults.

Steps (``--steps``, default both):

- ``latency``: over the SciFact x10 library of ``bench_open`` (252,930 chunks, BM25-only;
  built there if missing), or SciFact x ``--copies`` built here (40: 1,011,720 chunks), laid
  out once in 4 hash buckets (``scale.layout.write_layout``, the streaming segment writer, in
  a capped subprocess), one client sends the SciFact test queries in turn (top_k 10, after
  one untimed pass) to: the single-process service (``ragspine serve``, one uvicorn worker),
  then ``serve --ray`` with S = 1, 2, 4 shards (one replica, replica ingress), each
  interleaved request by request with the single-process service so both see the same load;
  with ``--compare-at S`` also S shards behind Serve's HTTP proxy and behind Serve's HAProxy.
  Beside them, the same queries in-process (``open_published_retriever``) and through the
  shards from this process without HTTP. p50/p95 ms and qps per configuration, and
  RSS/PSS/USS of every shard process (``/proc/PID/smaps_rollup``).
- ``prepare``: build the library and its layout only (no Ray), a short heavy-lock hold.
- ``faults``: the demo warehouse published in 2 hash buckets, on Ray Serve with S = 2; ``--clients`` clients send the
  golden queries for ``--duration`` seconds while one shard of a library is killed with
  SIGKILL at ``--kill-at`` s. Every response must be a 200 equal to the single-process
  service's answer (BM25 and fused scores to 1e-9, float32 cosines to 1e-6) or a 503
  whose message names the shards; the error window (first to last 503) and when the
  killed shard answered again are reported.

Ray must stay on loopback: the command re-runs itself inside ``unshare -n -p`` (root; a
network and a PID namespace) with ``lo`` up, and ends with ``ray stop --force``, which
there sees only this run's processes. Run it with ``nice -n 10``:
``nice -n 10 python -m benchmarks.bench_ray_serving --out benchmarks/results``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import resource
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.common import add_io_args, out_dir, require_sets, say_written, use_data  # noqa: E402

CACHE = ROOT / "benchmarks" / ".cache" / "ray_serving"
OPEN_CACHE = ROOT / "benchmarks" / ".cache" / "open"
LIBRARY = "scifact_x10"
LAYOUT_BUCKETS = 4
NETNS_ENV = "BENCH_RAY_SERVING_IN_NETNS"
RAY_PORT = 8000


# ------------------------------------------------------------------ helpers
def pct(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, int(round(p / 100 * (len(s) - 1))))]


def rollup_mib(pid: int) -> dict[str, float]:
    """RSS, PSS and USS (private pages) of a process, MiB."""
    vals: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]:
        key, _, rest = line.partition(":")
        if rest.strip().endswith("kB"):
            vals[key] = int(rest.split()[0])
    uss = vals.get("Private_Clean", 0) + vals.get("Private_Dirty", 0)
    return {"rss": round(vals.get("Rss", 0) / 1024, 1), "pss": round(vals.get("Pss", 0) / 1024, 1),
            "uss": round(uss / 1024, 1)}


def differences(a: Any, b: Any, path: str = "") -> list[str]:
    """Where two JSON answers differ; BM25 and fused scores may differ by 1e-9 and float32
    cosines by 1e-6 (summation order), nothing else."""
    if isinstance(a, dict) and isinstance(b, dict):
        if set(a) != set(b):
            return [f"{path}: keys {sorted(set(a) ^ set(b))}"]
        return [d for k in a for d in differences(a[k], b[k], f"{path}.{k}")]
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [f"{path}: {len(a)} items vs {len(b)}"]
        return [d for i, (x, y) in enumerate(zip(a, b, strict=True)) for d in differences(x, y, f"{path}[{i}]")]
    if isinstance(a, float) and isinstance(b, float):
        tol = 1e-6 if path.endswith(".vector") else 1e-9
        return [] if abs(a - b) <= tol else [f"{path}: {a} vs {b}"]
    return [] if a == b else [f"{path}: {a!r} vs {b!r}"]


def wait_ready(client: Any, timeout_s: float = 600) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        try:
            if client.get("/readyz").status_code == 200:
                return time.monotonic() - t0
        except Exception:  # noqa: BLE001 - the proxy is not listening yet
            pass
        time.sleep(0.2)
    raise RuntimeError("the service never became ready")


def latency_stats(lat_s: list[float], wall_s: float, errors: int) -> dict[str, Any]:
    ms = [x * 1000 for x in lat_s]
    return {"requests": len(ms), "errors": errors, "qps": round(len(ms) / wall_s, 1),
            "p50_ms": round(pct(ms, 50), 2), "p95_ms": round(pct(ms, 95), 2)}


def paired(single: Any, other: Any, bodies: list[dict], rounds: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """One client alternating between two services request by request (which goes first
    alternates too), after one untimed pass on each: both see the same load on a shared
    box, so their ratio holds even when the load drifts during a run."""
    for b in bodies:
        single.post("/v1/search", json=b)
        other.post("/v1/search", json=b)
    lat: dict[int, list[float]] = {0: [], 1: []}
    wall, errors = [0.0, 0.0], [0, 0]
    clients = (single, other)
    for r in range(rounds):
        for j, b in enumerate(bodies):
            for side in ((0, 1) if (j + r) % 2 == 0 else (1, 0)):
                t = time.perf_counter()
                resp = clients[side].post("/v1/search", json=b)
                dt = time.perf_counter() - t
                lat[side].append(dt)
                wall[side] += dt
                errors[side] += resp.status_code != 200
    return latency_stats(lat[0], wall[0], errors[0]), latency_stats(lat[1], wall[1], errors[1])


def sequential(client: Any, bodies: list[dict], rounds: int) -> dict[str, Any]:
    """One client, one request at a time: p50/p95 ms and qps, after one untimed pass over
    the queries (every configuration's processes have then touched the index pages the
    queries read: steady state, not first-touch page faults)."""
    for b in bodies:  # warm
        client.post("/v1/search", json=b)
    lat, errors = [], 0
    t0 = time.perf_counter()
    for _ in range(rounds):
        for b in bodies:
            s = time.perf_counter()
            r = client.post("/v1/search", json=b)
            lat.append(time.perf_counter() - s)
            errors += r.status_code != 200
    wall = time.perf_counter() - t0
    ms = [x * 1000 for x in lat]
    return {"requests": len(ms), "errors": errors, "qps": round(len(ms) / wall, 1), "p50_ms": round(pct(ms, 50), 2),
            "p95_ms": round(pct(ms, 95), 2)}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ------------------------------------------------------------------ latency
def scifact_library(data: Path, copies: int = 10) -> tuple[Path, str, list[str]]:
    """The published SciFact x ``copies`` library (BM25-only), its name and the queries:
    x10 is ``bench_open``'s (built there if missing); other sizes are built here once, in a
    subprocess capped by ``prlimit`` (a 1M-chunk BM25 build peaks near 2.3 GB; run the
    benchmark under the machine-wide heavy lock)."""
    from ragspine_pipeline.eval.beir import load_beir

    ds = load_beir(data / "scifact")
    queries = [ds.queries[q] for q in ds.judged_queries]
    if copies == 10:
        from benchmarks.bench_open import build

        wh = OPEN_CACHE / "warehouse"
        if not (wh / "retrieval_snapshot").is_dir():
            build(OPEN_CACHE, data)
        return wh, LIBRARY, queries
    cache = CACHE / f"scifact_x{copies}"
    if not (cache / "warehouse" / "retrieval_snapshot").is_dir():
        code = (f"from pathlib import Path; from benchmarks.bench_ray_serving import build_scaled; "
                f"build_scaled(Path({str(cache)!r}), Path({str(data)!r}), {copies})")
        t0 = time.perf_counter()
        subprocess.run(["prlimit", f"--as={10 << 30}", sys.executable, "-c", code], check=True, cwd=ROOT)
        print(f"  scifact_x{copies} built in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    return cache / "warehouse", f"scifact_x{copies}", queries


def build_scaled(cache: Path, data: Path, copies: int) -> None:
    """SciFact x ``copies`` (one .txt per document) through the warehouse's engine steps:
    raw documents, chunks, the BM25 index (one file), the published snapshot."""
    from ragspine_pipeline.eval.beir import load_beir
    from ragspine_pipeline.warehouse.pipeline import (
        build_chunks,
        build_lexical_index,
        build_raw_documents,
        publish_snapshot,
    )
    from ragspine_pipeline.warehouse.versioned import VersionedTables

    library = f"scifact_x{copies}"
    folder = cache / "corpus" / library
    if not (folder / ".complete").exists():
        folder.mkdir(parents=True, exist_ok=True)
        docs = list(load_beir(data / "scifact").corpus.values())
        for k in range(copies):
            for i, d in enumerate(docs):
                (folder / f"c{k}_d{i:06d}.txt").write_text(f"{d.title}\n\n{d.text}\n", encoding="utf-8")
        (folder / ".complete").write_text("ok")
    wh = VersionedTables(cache / "warehouse")
    for step in (lambda: build_raw_documents(wh, cache / "corpus", library), lambda: build_chunks(wh, library),
                 lambda: build_lexical_index(wh, library), lambda: publish_snapshot(wh, library)):
        step()


def write_bucket_layout(wh: Path, library: str = LIBRARY) -> Path:
    """The 4-bucket layout of the published library (once), written from its BM25 file by
    the streaming segment writer with a 256 MiB run budget, in a subprocess capped by
    ``prlimit`` (peak RSS printed; well under the 2 GB that needs the machine-wide lock)."""
    from ragspine_pipeline.scale.shards import segment_buckets
    from ragspine_pipeline.warehouse.common import LEXICAL, SNAPSHOT
    from ragspine_pipeline.warehouse.versioned import VersionedTables

    snap = VersionedTables(wh).latest(SNAPSHOT, library)
    folder = CACHE / "layout" / library / snap.version / f"b{LAYOUT_BUCKETS}"
    if segment_buckets(folder) == LAYOUT_BUCKETS and (folder / ".complete").exists():
        return CACHE / "layout"
    src = VersionedTables(wh).get(LEXICAL, library, snap.manifest["metadata"]["lexical_index"]).path / "bm25.rsbm25"
    code = ("from pathlib import Path; from ragspine_pipeline.retrieval.lexical.index.mapped import open_index; "
            "from ragspine_pipeline.scale.shards import write_layout; "
            f"ix = open_index({str(src)!r}); "
            f"write_layout(Path({str(folder)!r}), ix, ix.doc_ids(range(ix.n_docs)), {LAYOUT_BUCKETS}); "
            f"Path({str(folder)!r}, '.complete').write_text('ok')")
    env = {**os.environ, "RAGSPINE_BM25_BUILD_MEMORY_MIB": "256"}
    t0 = time.perf_counter()
    subprocess.run(["prlimit", f"--as={10 << 30}", sys.executable, "-c", code], check=True, cwd=ROOT, env=env)
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    print(f"  layout written in {time.perf_counter() - t0:.0f} s, peak RSS {peak:.0f} MiB: {folder}", file=sys.stderr)
    return CACHE / "layout"


def timed_retriever(r: Any, queries: list[str], rounds: int) -> dict[str, Any]:
    """One caller in this process, one query at a time (no HTTP): p50/p95 ms and qps, after
    one untimed pass (as ``sequential``)."""
    for q in queries:
        r.retrieve(q, top_k=10)
    lat = []
    t0 = time.perf_counter()
    for _ in range(rounds):
        for q in queries:
            s = time.perf_counter()
            r.retrieve(q, top_k=10)
            lat.append(time.perf_counter() - s)
    wall = time.perf_counter() - t0
    ms = [x * 1000 for x in lat]
    return {"requests": len(ms), "errors": 0, "qps": round(len(ms) / wall, 1), "p50_ms": round(pct(ms, 50), 2),
            "p95_ms": round(pct(ms, 95), 2)}


def answers(client: Any, bodies: list[dict]) -> list[Any]:
    return [client.post("/v1/search", json=b).json() for b in bodies]


@contextlib.contextmanager
def single_service(wh: Path) -> Iterator[tuple[Any, int]]:
    """``ragspine serve`` (one uvicorn worker) on a free port, for the whole latency step:
    its client and pid."""
    import httpx

    port = free_port()
    proc = subprocess.Popen([sys.executable, "-c", "import sys; from ragspine_pipeline.service import serve_main; "
                             "sys.exit(serve_main(sys.argv[1:]))", "--warehouse", str(wh), "--port", str(port),
                             "--mode", "bm25", "--log-level", "warning"], start_new_session=True,
                            stderr=subprocess.DEVNULL)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as c:
            wait_ready(c)
            yield c, proc.pid
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)


def ray_service(wh: Path, bodies: list[dict], rounds: int, shards: int, layout: Path,
                expected: list[Any], single: Any, ingress: str = "replica") -> dict[str, Any]:
    """``serve --ray --shards S`` over HTTP (``ingress``: the replicas' own servers, or
    Serve's proxy); then the same shards from this process (the front in-process, no
    HTTP): what the shard hops cost apart from the HTTP path."""
    import httpx
    import ray

    from ragspine_pipeline.filter_input import hybrid_retrievers
    from ragspine_pipeline.scale import serve as SV
    from ragspine_pipeline.scale.shards import ShardedBM25, attach
    from ragspine_pipeline.serving import open_published_retriever

    SV.deploy(SV.config_from(wh, shards=shards, port=RAY_PORT, mode="bm25", layout_root=str(layout),
                             timeout_s=10.0, ingress=ingress, log_level="warning"))
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{RAY_PORT}", timeout=60) as c:
            ready = wait_ready(c)
            paired_single, out = paired(single, c, bodies, rounds)
            out["paired_single"] = paired_single
            out["ready_s"] = round(ready, 1)
            got = answers(c, bodies)
            out["answers_differing_from_single_service"] = sum(bool(differences(a, b))
                                                               for a, b in zip(expected, got, strict=True))
            handles = [ray.get_actor(n, namespace="ragspine") for n in SV.shard_actors()]
            infos = [ray.get(h.describe.remote()) for h in handles]
            out["shards_memory_mib"] = [{"buckets": i["buckets"], "chunks": len(i["positions"]),
                                         **rollup_mib(i["pid"])} for i in infos]
            r = open_published_retriever(wh, mode="bm25")
            attach(hybrid_retrievers(r)[0], ShardedBM25(handles, timeout_s=10.0))
            out["in_process_front"] = timed_retriever(r, [b["query"] for b in bodies], rounds)
            return out
    finally:
        SV.shutdown()


def with_haproxy(fn: Any) -> Any:
    """``fn()`` on a fresh local cluster whose Serve runs HAProxy and direct-ingress
    replicas (``RAY_SERVE_ENABLE_HA_PROXY=1`` is read when the cluster's processes start),
    then the plain cluster again."""
    import ray

    from ragspine_pipeline.scale.serve import ensure_ray

    ray.shutdown()
    os.environ["RAY_SERVE_ENABLE_HA_PROXY"] = "1"
    try:
        ensure_ray()
        return fn()
    finally:
        ray.shutdown()
        del os.environ["RAY_SERVE_ENABLE_HA_PROXY"]
        ensure_ray()


def run_latency(data: Path, rounds: int, shard_counts: list[int], compare_at: int | None,
                copies: int = 10) -> dict[str, Any]:
    """In-process, the single-process service alone, then each Ray configuration
    interleaved request by request with the single-process service (``paired``)."""
    from ragspine_pipeline.filter_input import hybrid_retrievers
    from ragspine_pipeline.serving import open_published_retriever

    wh, library, queries = scifact_library(data, copies)
    layout = write_bucket_layout(wh, library)
    bodies = [{"query": q, "top_k": 10, "mode": "bm25"} for q in queries]
    res: dict[str, Any] = {"library": library, "queries": len(queries), "rounds": rounds}

    local = open_published_retriever(wh, mode="bm25")
    res["chunks"] = int(hybrid_retrievers(local)[0].index.n_docs)
    res["in_process"] = timed_retriever(local, queries, rounds)
    del local
    print(f"  in-process: {res['in_process']}", file=sys.stderr)
    with single_service(wh) as (single, pid):
        res["single_service"] = sequential(single, bodies, rounds)
        res["single_service"]["memory_mib"] = rollup_mib(pid)
        print(f"  single service: {res['single_service']}", file=sys.stderr)
        expected = answers(single, bodies)
        for s in shard_counts:
            res[f"ray_s{s}"] = ray_service(wh, bodies, rounds, s, layout, expected, single)
            print(f"  ray S={s}: {res[f'ray_s{s}']}", file=sys.stderr)
        if compare_at:  # the same shards behind Serve's own ingress paths
            res[f"serve_proxy_s{compare_at}"] = ray_service(wh, bodies, rounds, compare_at, layout, expected,
                                                            single, "serve")
            print(f"  Serve proxy S={compare_at}: {res[f'serve_proxy_s{compare_at}']}", file=sys.stderr)
            res[f"serve_haproxy_s{compare_at}"] = with_haproxy(
                lambda: ray_service(wh, bodies, rounds, compare_at, layout, expected, single, "serve"))
            print(f"  Serve HAProxy S={compare_at}: {res[f'serve_haproxy_s{compare_at}']}", file=sys.stderr)
    return res


# ------------------------------------------------------------------ faults
async def _load(base: str, bodies: list[dict], expected: list[dict], clients: int, duration: float,
                log: list[dict]) -> None:
    import httpx

    t_end = time.monotonic() + duration

    async def client(i: int) -> None:
        async with httpx.AsyncClient(base_url=base, timeout=30) as c:
            k = i
            while time.monotonic() < t_end:
                j = k % len(bodies)
                k += clients
                t = time.monotonic()
                r = await c.post("/v1/search", json=bodies[j])
                entry = {"t": t, "ms": (time.monotonic() - t) * 1000, "status": r.status_code, "exact": None,
                         "message": None}
                if r.status_code == 200:
                    entry["exact"] = not differences(expected[j], r.json())
                else:
                    entry["message"] = r.json().get("message") if r.headers.get("content-type", "").startswith(
                        "application/json") else r.text[:200]
                log.append(entry)

    await asyncio.gather(*(client(i) for i in range(clients)))


def run_faults(duration: float, clients: int, kill_at: float) -> dict[str, Any]:
    import httpx
    import ray
    from fastapi.testclient import TestClient

    from benchmarks.bench_service import build_demo
    from ragspine_pipeline.scale import serve as SV
    from ragspine_pipeline.service.app import create_app

    os.environ["RAGSPINE_BM25_BUCKETS"] = "2"  # published in 2 buckets: each shard maps its published one
    try:
        wh, _, queries = build_demo(CACHE / "demo")
    finally:
        del os.environ["RAGSPINE_BM25_BUCKETS"]
    bodies = [{"query": q["query"], "filters": q["filters"], "top_k": 10, "mode": m} for q in queries
              for m in ("bm25", None)]
    with TestClient(create_app(wh), base_url="http://127.0.0.1") as single:
        while single.get("/readyz").status_code != 200:
            time.sleep(0.05)
        expected = [single.post("/v1/search", json=b).json() for b in bodies]
    SV.deploy(SV.config_from(wh, shards=2, port=RAY_PORT, timeout_s=2.0))
    try:
        base = f"http://127.0.0.1:{RAY_PORT}"
        with httpx.Client(base_url=base, timeout=60) as c:
            wait_ready(c)
            for b in bodies:
                c.post("/v1/search", json=b)
        name = next(n for n in SV.shard_actors() if "acme_reports" in n)
        actor = ray.get_actor(name, namespace="ragspine")
        victim = ray.get(actor.describe.remote())["pid"]
        log: list[dict] = []
        kill = {}

        def killer() -> None:
            time.sleep(kill_at)
            kill["t"] = time.monotonic()
            os.kill(victim, signal.SIGKILL)
            while True:  # the restarted shard answers (a new process, its buckets mapped again)
                try:
                    info = ray.get(actor.describe.remote(), timeout=5)
                    if info["pid"] != victim:
                        kill["back_t"], kill["new_pid"] = time.monotonic(), info["pid"]
                        return
                except Exception:  # noqa: BLE001 - still restarting
                    time.sleep(0.05)

        th = threading.Thread(target=killer, daemon=True)
        t0 = time.monotonic()
        th.start()
        asyncio.run(_load(base, bodies, expected, clients, duration, log))
        th.join(timeout=60)
    finally:
        SV.shutdown()
    ok = [e for e in log if e["status"] == 200]
    u503 = [e for e in log if e["status"] == 503]
    other = [e for e in log if e["status"] not in (200, 503)]
    inexact = [e for e in ok if not e["exact"]]
    unclear = [e for e in u503 if not e["message"] or "shard" not in e["message"]]
    res = {"duration_s": duration, "clients": clients, "kill_at_s": kill_at, "requests": len(log),
           "ok_exact": len(ok) - len(inexact), "ok_inexact": len(inexact), "unavailable_503": len(u503),
           "unclear_503": len(unclear), "other_status": len(other),
           "qps": round(len(log) / duration, 1),
           "shard_back_after_s": round(kill["back_t"] - kill["t"], 2) if "back_t" in kill else None,
           "p50_ms": round(pct([e["ms"] for e in log], 50), 1), "max_ms": round(max(e["ms"] for e in log), 1)}
    if u503:
        res["error_window_s"] = [round(u503[0]["t"] - t0, 2), round(u503[-1]["t"] - t0, 2)]
        res["error_window_len_s"] = round(u503[-1]["t"] - u503[0]["t"], 2)
        res["example_503"] = u503[0]["message"]
    return res


# ------------------------------------------------------------------ report
def latency_lines(lat: dict[str, Any]) -> list[str]:
    """The markdown of one latency step (one library size)."""
    lines: list[str] = []
    chunks = lat.get("chunks", 252930)
    lines += [f"## Latency over HTTP, {lat['library']} ({chunks:,} chunks, BM25-only)", "",
              f"One client, the {lat['queries']} SciFact test queries x {lat['rounds']} after one untimed pass, "
              "top_k 10, mode bm25. Ray rows: `serve --ray --shards S` (1 replica), the library laid out in 4 "
              "hash buckets (a shard maps 4/S of them); replica ingress (the default: each Serve replica "
              "runs the app on its own uvicorn server on the service port) unless the row names Serve's proxy "
              "or Serve's HAProxy (`RAY_SERVE_ENABLE_HA_PROXY=1`, direct-ingress replicas). The shards answer "
              "queries over their wire channel (`scale/wire.py`). Ratio: p50 over the single-process "
              "service's; a Ray row's is over the single-process service's p50 measured in the same loop, "
              "the two services alternating request by request (so drifting load on the shared box hits "
              "both alike). qps: one client, 1 / mean latency.", "",
              f"Command: `{lat['command']}`", ""] + ([f"Box load: {lat['load']}.", ""] if lat.get("load") else []) + [
              "| configuration | p50 ms | p95 ms | qps | errors | single-process service p50 in the same "
              "loop | p50 ratio |", "|---|---|---|---|---|---|---|"]
    base = lat["single_service"]["p50_ms"]
    rows = [("in-process (open_published_retriever)", lat["in_process"]),
            ("single-process service (ragspine serve)", lat["single_service"])]
    labels = {"ray_s": "Ray Serve, S = {}", "serve_proxy_s": "Ray Serve, S = {}, behind Serve's HTTP proxy",
              "serve_haproxy_s": "Ray Serve, S = {}, behind Serve's HAProxy"}
    runs = [(k, labels[p].format(k[len(p):]), k[len(p):]) for k in lat for p in labels
            if k.startswith(p) and k[len(p):].isdigit()]
    for k, label, _ in runs:
        rows.append((label, lat[k]))
        if k.startswith("ray_s") and "in_process_front" in lat[k]:
            rows.append((f"S = {k[5:]} shards from one process (no HTTP)", lat[k]["in_process_front"]))
    for label, r in rows:
        ref = r.get("paired_single", {}).get("p50_ms")
        lines.append(f"| {label} | {r['p50_ms']} | {r['p95_ms']} | {r['qps']} | {r['errors']} | "
                     f"{ref if ref else '-'} | {r['p50_ms'] / (ref or base):.2f} |")
    s4 = lat.get("ray_s4")
    if s4:
        ratio = s4["p50_ms"] / s4.get("paired_single", {}).get("p50_ms", base)
        lines += ["", f"Goal (issue 30): p50 <= 1.2x the single-process service at S = 4: "
                  f"{'met' if ratio <= 1.2 else 'not met'} ({ratio:.2f}x in this run)."]
    diffs = {label: lat[k].get("answers_differing_from_single_service") for k, label, _ in runs}
    lines += ["", "Answers over HTTP differing from the single-process service's (all queries; BM25 scores "
              f"to 1e-9): {'; '.join(f'{s}: {d}' for s, d in diffs.items())}."]
    http = round(base - lat["in_process"]["p50_ms"], 2)
    for k in (k for k, _, _ in runs if k.startswith("ray_s") and "in_process_front" in lat[k]):
        r, front = lat[k], lat[k]["in_process_front"]
        lines += ["", f"Where the time goes at S = {k[5:]} (p50 differences): the shard hops "
                  f"{front['p50_ms'] - lat['in_process']['p50_ms']:.2f} ms (shards from one process minus "
                  f"in-process), the HTTP path and the replica {r['p50_ms'] - front['p50_ms']:.2f} ms (Ray Serve "
                  f"minus shards from one process); uvicorn's HTTP path in the single service: {http:.2f} ms."]
    lines += ["", "Memory per shard process (MiB, after the run; mapped index pages count in RSS and are "
              "shared through the page cache, USS is the shard's own):", "",
              "| S | shard buckets | chunks | RSS | PSS | USS |", "|---|---|---|---|---|---|"]
    for k in lat:
        if k.startswith("ray_s"):
            for m in lat[k]["shards_memory_mib"]:
                lines.append(f"| {k[5:]} | {m['buckets']} | {m['chunks']} | {m['rss']} | {m['pss']} | {m['uss']} |")
    sm = lat["single_service"]["memory_mib"]
    lines += ["", f"Single-process service: RSS {sm['rss']}, PSS {sm['pss']}, USS {sm['uss']} MiB.", ""]
    return lines


def write_results(out: Path, res: dict[str, Any]) -> list[Path]:
    machine = (f"{os.cpu_count()} CPUs shared by the load client, the single-process service, the Ray cluster (GCS, "
               f"raylet, Serve controller, replica, shards) and other helpers' work; load average {', '.join(f'{x:.2f}' for x in os.getloadavg())} "
               f"at the end; Python {platform.python_version()}")
    js = out / "ray_serving.json"
    if js.exists():  # a run of one step keeps the other step's committed section
        old = json.loads(js.read_text(encoding="utf-8"))
        res = {**{k: v for k, v in old.items() if k.startswith(("latency", "faults"))}, **res}
    lines = ["# Service on Ray Serve: sharded exact serving (issue 30)", "",
             f"Machine (last run): {machine}.", ""]
    for key in sorted(k for k in res if k.startswith("latency")):
        lines += latency_lines(res[key])
    f = res.get("faults")
    if f:
        lines += ["## Fault: a shard killed with SIGKILL under load", "",
                  f"Demo warehouse on Ray Serve, S = 2, {f['clients']} clients for {f['duration_s']:g} s, the golden "
                  f"queries in bm25 and hybrid mode; one acme_reports shard SIGKILLed at {f['kill_at_s']:g} s. "
                  "Exact: equal to the single-process service's answer (BM25/fused scores to 1e-9, cosines 1e-6).",
                  "", f"Command: `{f['command']}`", "", "| requests | 200 exact | 200 not exact | 503 | 503 without a clear message | other | "
                  "error window s (from start) | window length s | shard answering again after s | "
                  "p50 / max ms |",
                  "|---|---|---|---|---|---|---|---|---|---|",
                  f"| {f['requests']} | {f['ok_exact']} | {f['ok_inexact']} | {f['unavailable_503']} | "
                  f"{f['unclear_503']} | {f['other_status']} | {f.get('error_window_s', '-')} | "
                  f"{f.get('error_window_len_s', '-')} | {f['shard_back_after_s']} | {f['p50_ms']} / {f['max_ms']} |",
                  "", "Shard answering again: from the SIGKILL until the restarted actor (a new process, its "
                  "buckets mapped again) answered a call. The requests in flight on the killed shard's channel "
                  "get a 503 at once (connection reset); the next ones ask Ray where the shard listens now and "
                  "wait for the restart within the shard deadline (2 s here), hence the max latency.", ""]
        if f.get("example_503"):
            lines += [f"A 503's message: \"{f['example_503']}\"", ""]
    md = out / "ray_serving.md"
    md.write_text("\n".join(lines), encoding="utf-8")
    js.write_text(json.dumps(res, indent=2), encoding="utf-8")
    return [js, md]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_io_args(ap)
    ap.add_argument("--steps", default="latency,faults", help="latency, faults, prepare (build the library "
                    "and its layout only)")
    ap.add_argument("--rounds", type=int, default=2, help="passes over the queries per configuration")
    ap.add_argument("--shards", default="1,2,4")
    ap.add_argument("--copies", type=int, default=10, help="latency over SciFact x COPIES (40: ~1M chunks)")
    ap.add_argument("--compare-at", type=int, default=4,
                    help="also serve S shards behind Serve's proxy and Serve's HAProxy (0: skip)")
    ap.add_argument("--duration", type=float, default=30.0)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--kill-at", type=float, default=10.0)
    args = ap.parse_args()
    if os.environ.get(NETNS_ENV) != "1":
        if shutil.which("unshare") is None:
            raise SystemExit("bench_ray_serving: unshare is needed (Ray must stay on loopback)")
        ray_cli = str(Path(sys.executable).with_name("ray"))
        inner = " ".join([sys.executable, "-m", "benchmarks.bench_ray_serving", *map(_quote, sys.argv[1:])])
        rc = subprocess.call(["unshare", "-n", "-p", "-f", "--mount-proc", "bash", "-c", f"ip link set lo up; {NETNS_ENV}=1 {inner}; rc=$?; "
                              f"{ray_cli} stop --force >/dev/null 2>&1; exit $rc"], cwd=ROOT)
        raise SystemExit(rc)
    data = use_data(args.data)
    steps = args.steps.split(",")
    if "latency" in steps or "prepare" in steps:
        require_sets(data, ["scifact"])
    if "prepare" in steps:  # the library and its bucket layout only (no Ray): a short heavy-lock hold
        wh, library, _ = scifact_library(data, args.copies)
        print(f"  prepared {library}: {write_bucket_layout(wh, library)}", file=sys.stderr)
        if set(steps) == {"prepare"}:
            return
    out = out_dir(args.out)
    from ragspine_pipeline.scale.serve import ensure_ray

    ensure_ray()
    command = ("nice -n 10 python -m benchmarks.bench_ray_serving " + " ".join(sys.argv[1:])).strip()
    res: dict[str, Any] = {}
    if "faults" in steps:
        res["faults"] = {"command": command, **run_faults(args.duration, args.clients, args.kill_at)}
        print(f"  faults: {res['faults']}", file=sys.stderr)
        say_written(write_results(out, res))
    if "latency" in steps:
        lat = run_latency(data, args.rounds, [int(x) for x in args.shards.split(",")], args.compare_at or None,
                          args.copies)
        lat["load"] = "load average " + ", ".join(f"{x:.2f}" for x in os.getloadavg()) + " at the end of the step"
        res["latency" if args.copies == 10 else f"latency_x{args.copies}"] = {"command": command, **lat}
        say_written(write_results(out, res))


def _quote(s: str) -> str:
    import shlex

    return shlex.quote(s)


if __name__ == "__main__":
    main()
