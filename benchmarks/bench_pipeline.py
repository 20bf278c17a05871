"""Pipeline benchmark: full materialization vs an incremental refresh after changing 1%.

    python benchmarks/bench_pipeline.py            # demo corpus + every ../shared/eval corpus

Each corpus becomes one library folder (one .txt per document); every asset is
materialized in-process with Dagster, then 1% of the documents are edited and the
library is refreshed. The figure is refresh time / full-build time (target <= 5%).
It measures the lexical pipeline (``RAGSPINE_EMBEDDING=none`` unless set): with a dense
model the embeddings asset dominates both builds and is reported by bench_dense.py.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

os.environ.setdefault("RAGSPINE_EMBEDDING", "none")

import dagster as dg  # noqa: E402

import definitions  # noqa: E402
from ragspine_pipeline.eval.beir import load_beir  # noqa: E402
from resources import WarehouseResource  # noqa: E402

SHARED_EVAL = ROOT.parent / "shared" / "eval"
RESULTS = ROOT / "benchmarks" / "results"


def write_library(folder: Path, name: str) -> int:
    if name == "demo":
        shutil.copytree(ROOT / "data" / "demo" / "acme_reports", folder, dirs_exist_ok=True)
        return len(list(folder.glob("*.md")))
    ds = load_beir(SHARED_EVAL / name)
    folder.mkdir(parents=True)
    for i, d in enumerate(ds.corpus.values()):
        (folder / f"d{i:06d}.txt").write_text(f"{d.title}\n\n{d.text}\n", encoding="utf-8")
    return len(ds.corpus)


def timed(lib: str, instance, warehouse) -> tuple[float, dict]:
    t0 = time.perf_counter()
    res = definitions.materialize_library(lib, instance, warehouse, definitions.QUIET)
    dt = time.perf_counter() - t0
    steps = {e.asset_key.to_user_string(): {k: v.value for k, v in
                                            e.step_materialization_data.materialization.metadata.items()
                                            if k in ("seconds", "new", "changed", "unchanged", "chunks_analyzed", "reused")}
             for e in res.get_asset_materialization_events()}
    return dt, steps


def main() -> None:
    rows = []
    for name in ["demo", "cmrc2018-trial", "cranfield", "scifact"]:
        with tempfile.TemporaryDirectory() as tmp:
            tmp = Path(tmp)
            lib = name.replace("-", "_")
            n = write_library(tmp / "corpus" / lib, name)
            wh = WarehouseResource(root=str(tmp / "wh"), corpus_root=str(tmp / "corpus"))
            instance = dg.DagsterInstance.ephemeral()
            full, full_steps = timed(lib, instance, wh)
            noop, _ = timed(lib, instance, wh)
            files = sorted(p for p in (tmp / "corpus" / lib).iterdir() if p.suffix in (".txt", ".md"))
            k = max(1, len(files) // 100)
            for p in files[:: max(1, len(files) // k)][:k]:
                p.write_text(p.read_text(encoding="utf-8") + "\n\nRevised paragraph appended for the benchmark.\n",
                             encoding="utf-8")
            inc, inc_steps = timed(lib, instance, wh)
            rows.append({"corpus": name, "documents": n, "changed_documents": k, "full_s": full, "noop_refresh_s": noop,
                         "incremental_s": inc, "incremental_ratio": inc / full, "full_steps": full_steps,
                         "incremental_steps": inc_steps})
            print(json.dumps({k2: v for k2, v in rows[-1].items() if not k2.endswith("steps")}), file=sys.stderr, flush=True)
    cmd = "python benchmarks/bench_pipeline.py"
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "pipeline_refresh.json").write_text(json.dumps({"command": cmd, "cpu_count": os.cpu_count(),
                                                               "rows": rows}, indent=2, default=str))
    lines = ["# Pipeline: full materialization vs 1% incremental refresh\n", f"Command: `{cmd}` (cpu_count={os.cpu_count()}, "
             "in-process executor, Dagster ephemeral instance)\n",
             "| corpus | documents | changed | full build s | no-op refresh s | 1% refresh s | refresh / full |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['corpus']} | {r['documents']} | {r['changed_documents']} | {r['full_s']:.2f} | "
                     f"{r['noop_refresh_s']:.2f} | {r['incremental_s']:.2f} | {100 * r['incremental_ratio']:.1f}% |")
    (RESULTS / "pipeline_refresh.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
