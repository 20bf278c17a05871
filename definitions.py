"""The RAGSpine code location: one Definitions object (``dagster dev`` from the repo root).

Also runnable: ``python definitions.py`` materializes every asset for every library of
the demo corpus in-process and answers the sample questions (``ragspine demo`` calls it).
"""

import json
import sys
from pathlib import Path

import dagster as dg

sys.path.insert(0, str(Path(__file__).resolve().parent))

from assets import (  # noqa: E402
    LIBRARY_ASSETS,
    RERANK_ASSETS,
    ask,
    build_refresh_schedule,
    library_partitions,
    library_sensor,
    refresh_job,
)
from resources import RetrievalResource, WarehouseResource  # noqa: E402
from resources.instance_storage import secure_instance_storage  # noqa: E402

defs = dg.Definitions(
    assets=[*LIBRARY_ASSETS, *RERANK_ASSETS],
    jobs=[refresh_job, ask],
    sensors=[library_sensor],
    schedules=[build_refresh_schedule()],  # RAGSPINE_REFRESH_* read now, not at import
    # warm=False: each run of the `ask` job is its own process answering one question, where a
    # warm-up (the library's files read, the heaviest terms checked) costs more than it saves;
    # a process that holds the resource for many questions (the demo, a notebook) keeps the default.
    resources={"warehouse": WarehouseResource(), "retrieval": RetrievalResource(warm=False)},
    executor=dg.in_process_executor,
)


def materialize_library(library: str, instance: dg.DagsterInstance, warehouse: WarehouseResource | None = None,
                        run_config: dict | None = None) -> dg.ExecuteInProcessResult:
    """Materialize every asset of one library partition in-process (registers the partition).
    The instance's run storage and compute logs are owner-only before and after the run."""
    secure_instance_storage(instance)
    if library not in instance.get_dynamic_partitions(library_partitions.name):
        instance.add_dynamic_partitions(library_partitions.name, [library])
    try:
        return dg.materialize(LIBRARY_ASSETS, partition_key=library, instance=instance,
                              resources={"warehouse": warehouse or WarehouseResource()}, run_config=run_config,
                              raise_on_error=True)
    finally:
        secure_instance_storage(instance)  # what the run wrote at its end


QUIET = {"loggers": {"console": {"config": {"log_level": "WARNING"}}}}


def run_demo(questions: int = 4, top_k: int = 3) -> int:
    from ragspine_pipeline.corpus import load_golden
    from ragspine_pipeline.snippet_format import format_snippet

    warehouse = WarehouseResource()
    instance = dg.DagsterInstance.get() if _has_home() else dg.DagsterInstance.ephemeral()
    failed_libraries = []
    for lib in warehouse.libraries_on_disk():
        try:  # one bad library never stops the others
            result = materialize_library(lib, instance, warehouse, QUIET)
        except Exception as exc:  # noqa: BLE001 - reported, then the next library runs
            failed_libraries.append(lib)
            print(f"  {lib}: FAILED ({type(exc).__name__}: {str(exc)[:300]})")
            continue
        mats = {e.asset_key.to_user_string(): e.step_materialization_data.materialization.metadata
                for e in result.get_asset_materialization_events()}
        ch = mats["chunks"]
        checks = result.get_asset_check_evaluations()
        failed = [c.check_name for c in checks if not c.passed]
        golden = mats["retrieval_snapshot"]["golden"].value
        ndcg = golden.get("ndcg@10")
        print(f"  {lib}: golden questions nDCG@10={f'{ndcg:.4f}' if isinstance(ndcg, int | float) else 'n/a'} "
              f"over {golden.get('queries', 0)}")
        print(f"  {lib}: {ch['new'].value} new, {ch['changed'].value} changed, {ch['unchanged'].value} unchanged, "
              f"{ch['withdrawn'].value} withdrawn; chunks {ch['version'].value}; "
              f"{len(checks) - len(failed)}/{len(checks)} checks passed" + (f" (FAILED: {failed})" if failed else ""))
        if "relation_graph" in mats:
            g = mats["relation_graph"]
            print(f"  {lib}: relation graph {g['version'].value}: nodes {g['node_counts'].value}, "
                  f"edges {g['edge_counts'].value}")
    if failed_libraries:
        print(f"libraries that failed: {failed_libraries}")
    retrieval = RetrievalResource()
    print(f"catalog: {warehouse.catalog_path()}  (duckdb.connect(path, read_only=True))")
    for g in load_golden()[:questions]:
        flt = g.get("filters")
        print(f"\nQ: {g['query']}" + (f"   filters={json.dumps(flt, ensure_ascii=False)}" if flt else ""))
        for s in retrieval.ask(g["query"], filters=flt, top_k=top_k):
            print(format_snippet(s))
    return 0


def index_libraries(corpus_root: str, libraries: list[str], warehouse_root: str = ""):
    """``ragspine index`` in a checkout: materialize every asset of each library folder of
    ``corpus_root`` into the warehouse (empty: RAGSPINE_WAREHOUSE), one run per library
    (recorded in DAGSTER_HOME when set). Yields ``(library, {asset: {key: value}},
    {check: passed}, error)`` as each library finishes; a failed library never stops the others."""
    warehouse = WarehouseResource(root=warehouse_root, corpus_root=corpus_root)
    instance = dg.DagsterInstance.get() if _has_home() else dg.DagsterInstance.ephemeral()
    for lib in libraries:
        try:
            result = materialize_library(lib, instance, warehouse, QUIET)
        except Exception as exc:  # noqa: BLE001 - reported, then the next library runs
            yield lib, {}, {}, f"{type(exc).__name__}: {str(exc)[:300]}"
            continue
        mats = {e.asset_key.to_user_string(): {k: v.value for k, v in
                                                e.step_materialization_data.materialization.metadata.items()}
                for e in result.get_asset_materialization_events()}
        yield lib, mats, {c.check_name: bool(c.passed) for c in result.get_asset_check_evaluations()}, ""


def _has_home() -> bool:
    import os

    return bool(os.environ.get("DAGSTER_HOME"))


if __name__ == "__main__":
    raise SystemExit(run_demo())
