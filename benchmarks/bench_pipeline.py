"""Pipeline benchmark: full materialization vs an incremental refresh after changing 1%.

    python benchmarks/bench_pipeline.py                 # every row below (~8 min on 2 cores)
    python benchmarks/bench_pipeline.py --only scifact  # rows whose name starts with it

Each corpus becomes one library folder (one .txt per document). Every asset is
materialized in-process with Dagster (``definitions.materialize_library``, the same
call ``ragspine demo`` makes, asset checks included) into an empty warehouse: the full
build. Then a refresh with nothing changed, then three refreshes that each append a
paragraph to a different 1% of the documents; the figure is the median of those three
refresh times over the full-build time (target <= 5%), measured in one process.

Rows:
* lexical (``RAGSPINE_EMBEDDING=none``): the demo corpus and the ``../shared/eval``
  corpora, plus ``scifact-x10`` (SciFact's documents written ten times under distinct
  ids: 51,830 documents) for the trend with size;
* hybrid (``RAGSPINE_EMBEDDING=auto``: multilingual-e5 when [embed-onnx] is installed,
  the product's default): demo, CMRC and Cranfield (SciFact's 25k chunks take ~17 min to
  embed on 2 cores; run ``--only scifact --embedding auto`` for it). The model is loaded
  once per process (as in a long-lived code server); its load time is reported on its own.

Besides wall time it reports the work that does not depend on the machine: files
parsed, chunks analyzed, texts embedded and bytes written by the refresh vs the build.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import dagster as dg  # noqa: E402

import definitions  # noqa: E402
from benchmarks.common import add_io_args, data_root, out_dir, require_sets, say_written, use_data  # noqa: E402
from ragspine_pipeline.eval.beir import load_beir  # noqa: E402
from ragspine_pipeline.paths import DEMO_ROOT  # noqa: E402
from resources import WarehouseResource  # noqa: E402

SHARED_EVAL = data_root()  # set from --data in main()
ROWS = [("demo", "none"), ("cmrc2018-trial", "none"), ("cranfield", "none"), ("scifact", "none"),
        ("scifact-x10", "none"), ("demo", "auto"), ("cmrc2018-trial", "auto"), ("cranfield", "auto")]
WORK_KEYS = {"raw_documents": ("parsed", "bytes_written"), "chunks": ("rows_written", "bytes_written"),
             "lexical_index": ("chunks_analyzed", "bytes_written"), "embeddings": ("embedded", "bytes_written")}


def write_library(folder: Path, name: str) -> int:
    if name == "demo":
        shutil.copytree(DEMO_ROOT / "acme_reports", folder, dirs_exist_ok=True)
        return len(list(folder.glob("*.md")))
    base, _, times = name.partition("-x")
    ds = load_beir(SHARED_EVAL / base)
    folder.mkdir(parents=True)
    copies = int(times) if times else 1
    n = 0
    for k in range(copies):
        for i, d in enumerate(ds.corpus.values()):
            (folder / (f"c{k}_d{i:06d}.txt" if copies > 1 else f"d{i:06d}.txt")).write_text(
                f"{d.title}\n\n{d.text}\n", encoding="utf-8")
            n += 1
    return n


def timed(lib: str, instance, warehouse) -> tuple[float, dict]:
    t0 = time.perf_counter()
    res = definitions.materialize_library(lib, instance, warehouse, definitions.QUIET)
    dt = time.perf_counter() - t0
    steps = {e.asset_key.to_user_string(): {k: v.value for k, v in
                                            e.step_materialization_data.materialization.metadata.items()
                                            if k in ("seconds", "new", "changed", "unchanged", "parsed",
                                                     "rows_written", "chunks_analyzed", "embedded",
                                                     "bytes_written", "reused", "segments")}
             for e in res.get_asset_materialization_events()}
    # Time inside the asset bodies (Dagster's STEP_SUCCESS durations): wall time minus the
    # orchestrator's own per-run cost (run setup, event log, step bookkeeping).
    durations = {e.step_key: round(e.event_specific_data.duration_ms / 1000, 3) for e in res.all_events
                 if e.event_type_value == "STEP_SUCCESS"}
    steps["_step_s"] = sum(durations.values())
    steps["_durations"] = durations  # seconds inside each asset body, by step
    failed = [c.check_name for c in res.get_asset_check_evaluations() if not c.passed]
    if failed:
        raise SystemExit(f"{lib}: checks failed: {failed}")
    return dt, steps


def work(steps: dict) -> dict:
    out = {"bytes_written": 0}
    out["step_s"] = round(steps.get("_step_s", 0.0), 3)
    for asset, keys in WORK_KEYS.items():
        md = steps.get(asset, {})
        out[keys[0] if asset != "chunks" else "chunk_rows_written"] = md.get(keys[0], 0)
        out["bytes_written"] += int(md.get("bytes_written", 0) or 0)
    return out


def edit_one_percent(files: list[Path], round_no: int) -> int:
    k = max(1, len(files) // 100)
    step = max(1, len(files) // k)
    for p in files[round_no::step][:k]:
        with open(p, "a", encoding="utf-8") as fh:
            fh.write(f"\n\nRevised paragraph {round_no} appended for the benchmark.\n")
    return k


def model_load_seconds(spec: str) -> float | None:
    """Cold start of the embedding backend (imports, ONNX session, first batch) in a fresh process."""
    if spec == "none":
        return None
    code = ("import time; t0 = time.perf_counter()\n"
            "from ragspine_pipeline.retrieval.vector.embedding_backends import make_embedding_backend\n"
            f"b = make_embedding_backend({spec!r})\n"
            "b is not None and b.embed_texts(['warm up'])\n"
            "print(round(time.perf_counter() - t0, 3) if b is not None else '')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    return float(out.stdout.strip()) if out.stdout.strip() else None


def orchestrator_floor_seconds(runs: int = 5) -> float:
    """Dagster's own cost of one run of six no-op assets partitioned like ours (median)."""
    parts = dg.DynamicPartitionsDefinition(name="floor_library")
    assets, prev = [], None
    for name in ("a1", "a2", "a3", "a4", "a5", "a6"):
        def body(context) -> dg.MaterializeResult:  # unannotated: this module defers annotations
            return dg.MaterializeResult(metadata={"seconds": 0.0})
        a = dg.asset(name=name, partitions_def=parts, deps=[prev] if prev else None)(body)
        assets.append(a)
        prev = a
    instance = dg.DagsterInstance.ephemeral()
    instance.add_dynamic_partitions(parts.name, ["lib"])
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        dg.materialize(assets, partition_key="lib", instance=instance, run_config=definitions.QUIET)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def run_row(name: str, embedding: str) -> dict:
    os.environ["RAGSPINE_EMBEDDING"] = embedding
    load_s = model_load_seconds(embedding)  # a cold start, measured apart from the timed runs
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        lib = name.replace("-", "_")
        n = write_library(tmp / "corpus" / lib, name)
        wh = WarehouseResource(root=str(tmp / "wh"), corpus_root=str(tmp / "corpus"))
        instance = dg.DagsterInstance.ephemeral()
        full, full_steps = timed(lib, instance, wh)
        noop, noop_steps = timed(lib, instance, wh)
        files = sorted(p for p in (tmp / "corpus" / lib).iterdir() if p.suffix in (".txt", ".md"))
        incs, inc_steps, k = [], [], 0
        for r in range(3):
            k = edit_one_percent(files, r)
            dt, steps = timed(lib, instance, wh)
            incs.append(dt)
            inc_steps.append(steps)
        inc = statistics.median(incs)
        mid = inc_steps[incs.index(inc)]
    return {"corpus": name, "embedding": embedding, "documents": n, "changed_documents": k,
            "full_s": round(full, 3), "noop_refresh_s": round(noop, 3), "incremental_s": round(inc, 3),
            "incremental_runs_s": [round(x, 3) for x in incs], "incremental_ratio": inc / full,
            "step_ratio": work(mid)["step_s"] / max(1e-9, work(full_steps)["step_s"]),
            "model_load_s": load_s, "full_work": work(full_steps), "incremental_work": work(mid),
            "noop_work": work(noop_steps), "full_steps": full_steps, "incremental_steps": mid}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default="", help="run the rows whose corpus name starts with this")
    ap.add_argument("--embedding", default="", help="run only the rows with this embedding spec (none, auto)")
    add_io_args(ap)
    args = ap.parse_args()
    global SHARED_EVAL
    SHARED_EVAL = use_data(args.data)
    selected = [(n, e) for n, e in ROWS
                if not ((args.only and not n.startswith(args.only)) or (args.embedding and e != args.embedding))]
    if not selected:
        from benchmarks.common import fail

        fail(f"no row matches --only {args.only!r} --embedding {args.embedding!r}; rows: {ROWS}")
    require_sets(SHARED_EVAL, sorted({n.partition("-x")[0] for n, _ in selected if n != "demo"}))
    RESULTS = out_dir(args.out)
    floor = orchestrator_floor_seconds()
    cmd = "python benchmarks/bench_pipeline.py" + (f" --only {args.only}" if args.only else "") + (
        f" --embedding {args.embedding}" if args.embedding else "")
    # Rows of earlier runs stay (a run of some rows replaces those rows only); each row is
    # written as soon as it is measured, so a run cut short keeps what it finished.
    path = RESULTS / "pipeline_refresh.json"
    old = json.loads(path.read_text()) if path.is_file() else {}
    rows = {(r["corpus"], r["embedding"]): r for r in old.get("rows", [])}
    for name, emb in selected:
        row = run_row(name, emb)
        row["command"], row["load"] = cmd, round(os.getloadavg()[0], 1)
        rows[(name, emb)] = row
        print(json.dumps({k: v for k, v in row.items() if not k.endswith("steps")}), file=sys.stderr, flush=True)
        write_results(RESULTS, rows, floor)


def write_results(RESULTS: Path, by_key: dict, floor: float) -> None:
    order = {key: i for i, key in enumerate(ROWS)}
    rows = sorted(by_key.values(), key=lambda r: order.get((r["corpus"], r["embedding"]), len(order)))
    cmds = sorted({r.get("command", "python benchmarks/bench_pipeline.py") for r in rows})
    (RESULTS / "pipeline_refresh.json").write_text(json.dumps({"commands": cmds, "cpu_count": os.cpu_count(),
                                                               "dagster_floor_s": round(floor, 3), "rows": rows},
                                                              indent=2, default=str))
    lines = ["# Pipeline: full materialization vs 1% incremental refresh\n",
             "Commands: " + ", ".join(f"`{c}`" for c in cmds) + f" (cpu_count={os.cpu_count()}, in-process "
             "executor, Dagster ephemeral instance, asset checks included; refresh = median of three 1% refreshes; "
             "a row keeps the command that measured it)\n",
             "| corpus | embedding | documents | changed | full build s | no-op refresh s | 1% refresh s | "
             "refresh / full | in asset steps: refresh / full | bytes written refresh / full | files parsed | "
             "chunks analyzed | texts embedded |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        fw, iw = r["full_work"], r["incremental_work"]
        lines.append(
            f"| {r['corpus']} | {r['embedding']} | {r['documents']} | {r['changed_documents']} | {r['full_s']:.2f} | "
            f"{r['noop_refresh_s']:.2f} | {r['incremental_s']:.2f} | **{100 * r['incremental_ratio']:.1f}%** | "
            f"{iw['step_s']:.2f} / {fw['step_s']:.2f} s = {100 * r['step_ratio']:.1f}% | "
            f"{100 * iw['bytes_written'] / max(1, fw['bytes_written']):.2f}% | {iw['parsed']} / {fw['parsed']} | "
            f"{iw['chunks_analyzed']} / {fw['chunks_analyzed']} | {iw['embedded']} / {fw['embedded']} |")
    timed_rows = [r for r in rows if "_durations" in r["incremental_steps"]]
    if timed_rows:
        steps = list(dict.fromkeys(k for r in timed_rows for k in r["full_steps"]["_durations"]))
        lines += ["\nSeconds inside each asset body, full build / the median 1% refresh (rows measured with "
                  "per-step times):\n", "| corpus | embedding | load | " + " | ".join(steps) + " |",
                  "|---|---|---|" + "---:|" * len(steps)]
        for r in timed_rows:
            f, i = r["full_steps"]["_durations"], r["incremental_steps"]["_durations"]
            lines.append(f"| {r['corpus']} | {r['embedding']} | {r.get('load', '')} | "
                         + " | ".join(f"{f.get(k, 0):.2f} / {i.get(k, 0):.2f}" for k in steps) + " |")
    lines.append(f"\nDagster's own floor, measured in the same process: {floor:.3f} s per run of six no-op assets "
                 "partitioned the same way (run setup, event log, step bookkeeping); every refresh pays it.")
    loads = sorted({r["model_load_s"] for r in rows if r["model_load_s"]})
    if loads:
        lines.append(f"Embedding model cold start (fresh process: imports, ONNX session, first batch; not in the "
                     f"timings, paid once per long-lived process): {', '.join(f'{x:.2f} s' for x in loads)}.")
    (RESULTS / "pipeline_refresh.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    say_written([RESULTS / "pipeline_refresh.json", RESULTS / "pipeline_refresh.md"])


if __name__ == "__main__":
    main()
