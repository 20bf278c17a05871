"""The first query after open through the one serving door, bare and warmed (issue 47 item 4).

    python benchmarks/bench_served_first_query.py --copies 40 --runs 5

Over the warehouse ``bench_open.py`` builds and keeps (SciFact x ``--copies``: 40 gives
~1.01M chunks, BM25-only; build it first with ``bench_open.py --copies 40 --build-only``),
each run is a fresh process that opens ``open_published_retriever(W, library,
mode="bm25", warm=...)`` and answers one SciFact query first (run i takes query i), then
the same query again: ``bare`` is the CLI's one-shot door (``warm=False``), ``served`` the
door a serving process opens (``warm=True``: ``retrieval.link.assembly_warm``, what the
service runs before ``/readyz`` says ready). Page cache ``warm``: as the box left it;
``cold``: the pages of the served files (the BM25 file, the chunk columns) dropped first
(``posix_fadvise(DONTNEED)``). The four kinds alternate run by run (the same box load for
each); results are written after every run to ``--out``/served_first_query_<label>.json
and .md (a stopped run resumes).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.bench_open import SERVED_FILES, default_cache, library_name, served_folder  # noqa: E402
from benchmarks.common import add_io_args, out_dir, use_data  # noqa: E402

KINDS = [(served, cold) for served in (False, True) for cold in (False, True)]


def _drop(folder: Path) -> None:
    for name in SERVED_FILES:
        fd = os.open(folder / name, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def child(warehouse: str, library: str, data: str, query: int, served: bool, cold: bool, **_: object) -> dict:
    """One fresh process: open through the door (warmed or not), the first query, again."""
    from ragspine_pipeline.eval.beir import load_beir
    from ragspine_pipeline.serving import open_published_retriever

    q = list(load_beir(Path(data) / "scifact").queries.values())[query]
    if cold:
        _drop(served_folder(warehouse, library))
    t0 = time.perf_counter()
    r = open_published_retriever(warehouse, library, mode="bm25", warm=served)
    out = {"open_s": time.perf_counter() - t0, "load_1min": os.getloadavg()[0]}
    t0 = time.perf_counter()
    first = r.retrieve(q, top_k=10)
    out["first_query_ms"] = 1000 * (time.perf_counter() - t0)
    t0 = time.perf_counter()
    again = r.retrieve(q, top_k=10)
    out["again_ms"] = 1000 * (time.perf_counter() - t0)
    out["same_answers"] = [s["chunk_id"] for s in first] == [s["chunk_id"] for s in again]
    return out


def service_child(warehouse: str, library: str, data: str, query: int, **_: object) -> dict:
    """One fresh process: the service app (``create_app``, in-process client), the time
    until ``/readyz`` says ready, then the first ``POST /v1/search`` and the same again."""
    from fastapi.testclient import TestClient

    from ragspine_pipeline.eval.beir import load_beir
    from ragspine_pipeline.service.app import create_app
    from ragspine_pipeline.service.limits import ServiceLimits

    q = list(load_beir(Path(data) / "scifact").queries.values())[query]
    t0 = time.perf_counter()
    app = create_app(warehouse, mode="bm25", libraries=[library], limits=ServiceLimits(rate_per_s=0))
    with TestClient(app, base_url="http://127.0.0.1:8080") as c:
        while c.get("/readyz").status_code != 200:
            time.sleep(0.02)
        out = {"open_s": time.perf_counter() - t0, "load_1min": os.getloadavg()[0]}
        body = {"query": q, "top_k": 10}
        for name in ("first_query_ms", "again_ms"):
            t0 = time.perf_counter()
            r = c.post("/v1/search", json=body)
            out[name] = 1000 * (time.perf_counter() - t0)
            if r.status_code != 200:
                raise RuntimeError(f"/v1/search answered {r.status_code}: {r.text[:200]}")
    return out


def markdown(rep: dict) -> str:
    lines = [f"# First query after open through the serving door, SciFact x{rep['copies']} (BM25-only)", "",
             f"Command: `{rep['command']}`", "", f"Machine: {rep['machine']}", "",
             "Fresh processes; run i answers SciFact query i first, then the same query again. `bare`: "
             "`open_published_retriever(..., warm=False)` (the CLI's one-shot door); `served`: `warm=True` "
             "(the serving warm-up the service runs before /readyz says ready). Page cache `cold`: the served "
             "files' pages dropped before the open. `service`: the service app in-process (`create_app`, "
             "`--service`): open s is the time until /readyz says ready, the queries are `POST /v1/search`.", "",
             "| open | page cache | runs | open s p50 (warm-up included) | first query ms p50 | first query ms max | "
             "same query again ms p50 | load 1 min p50 |", "|---|---|---|---|---|---|---|---|"]
    for kind, rows in rep["runs"].items():
        ok = [r for r in rows if "error" not in r]
        if not ok:
            continue
        med = {f: statistics.median(r[f] for r in ok) for f in ("open_s", "first_query_ms", "again_ms", "load_1min")}
        cells = [*kind.split("/"), str(len(ok)), f"{med['open_s']:.3f}", f"{med['first_query_ms']:.1f}",
                 f"{max(r['first_query_ms'] for r in ok):.1f}", f"{med['again_ms']:.2f}", f"{med['load_1min']:.2f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_io_args(ap)
    ap.add_argument("--copies", type=int, default=40)
    ap.add_argument("--cache", default=None, help="bench_open.py's warehouse cache (default: its own for --copies)")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--label", default="1m")
    ap.add_argument("--service", action="store_true", help="also the service app: ready, then POST /v1/search")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    data = use_data(args.data)
    if args.child:
        spec = json.loads(args.child)
        print(json.dumps((service_child if spec.get("service") else child)(**spec)), flush=True)
        return
    warehouse = Path(args.cache or default_cache(args.copies)) / "warehouse"
    library = library_name(args.copies)
    path = out_dir(args.out) / f"served_first_query_{args.label}"
    rep = json.loads(path.with_suffix(".json").read_text()) if path.with_suffix(".json").exists() else {}
    rep.update(command="python " + " ".join(sys.argv), copies=args.copies,
               machine={"cpus": os.cpu_count(), "python": sys.version.split()[0]})
    runs = rep.setdefault("runs", {f"{'served' if s else 'bare'}/{'cold' if c else 'warm'}": [] for s, c in KINDS})
    kinds = [*KINDS, *([("service", False)] if args.service else [])]
    for i in range(args.runs):
        for s, c in kinds:
            rows = runs.setdefault("service/warm" if s == "service" else
                                   f"{'served' if s else 'bare'}/{'cold' if c else 'warm'}", [])
            if len(rows) > i:
                continue  # resumed
            spec = {"warehouse": str(warehouse), "library": library, "data": str(data), "query": i,
                    "served": s is True, "cold": c, "service": s == "service"}
            p = subprocess.run(["nice", "-n", "10", sys.executable, __file__, "--child", json.dumps(spec)],
                               capture_output=True, text=True)
            rows.append(json.loads(p.stdout.strip().splitlines()[-1]) if p.returncode == 0
                        else {"error": p.stderr.strip().splitlines()[-1:]})
            print(f"[{time.strftime('%H:%M:%S')}] run {i} served={s} cold={c}: {rows[-1]}", flush=True)
            path.with_suffix(".json").write_text(json.dumps(rep, indent=1))
            path.with_suffix(".md").write_text(markdown(rep))
    print(markdown(rep))


if __name__ == "__main__":
    main()
