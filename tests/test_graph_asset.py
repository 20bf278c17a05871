"""The thin ``relation_graph`` Dagster asset, materialized in-process after raw_documents and chunks."""

import shutil
import sys
from pathlib import Path

import pytest

dg = pytest.importorskip("dagster")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from assets.graph_assets import GRAPH_ASSETS, relation_graph  # noqa: E402
from assets.library_assets import chunks, raw_documents  # noqa: E402
from ragspine_pipeline.graph import trace  # noqa: E402
from ragspine_pipeline.graph.step import load_relation_graph  # noqa: E402
from ragspine_pipeline.paths import DEMO_ROOT  # noqa: E402
from ragspine_pipeline.warehouse.versioned import VersionedTables  # noqa: E402
from resources import WarehouseResource  # noqa: E402
from tests.dagster_fixtures import copy_demo_vocabulary  # noqa: E402

LIB = "acme_reports"


def test_relation_graph_asset_materializes_and_reuses(tmp_path, monkeypatch):
    corpus = tmp_path / "corpus"
    shutil.copytree(DEMO_ROOT / LIB, corpus / LIB)
    copy_demo_vocabulary(corpus)  # the demo's glossary and dimensions, as this corpus's own
    wh_root = tmp_path / "warehouse"
    monkeypatch.setenv("RAGSPINE_WAREHOUSE", str(wh_root))
    monkeypatch.setenv("RAGSPINE_CORPUS_ROOT", str(corpus))
    resources = {"warehouse": WarehouseResource(root=str(wh_root), corpus_root=str(corpus))}
    instance = dg.DagsterInstance.ephemeral()
    instance.add_dynamic_partitions("library", [LIB])
    assert [relation_graph] == GRAPH_ASSETS
    first = dg.materialize([raw_documents, chunks, relation_graph], partition_key=LIB, resources=resources,
                           instance=instance)
    assert first.success

    def md(result):
        (ev,) = [e for e in result.get_asset_materialization_events()
                 if e.asset_key.to_user_string() == "relation_graph"]
        return {k: v.value for k, v in ev.step_materialization_data.materialization.metadata.items()}

    m = md(first)
    assert m["reused"] is False and m["node_counts"]["fact"] > 40 and m["edge_counts"]["subsidiary_of"] == 3
    checks = first.get_asset_check_evaluations()
    assert [c.check_name for c in checks if c.asset_key.to_user_string() == "relation_graph"] == \
        ["facts_cite_served_chunks"] and all(c.passed for c in checks)
    assert trace(load_relation_graph(VersionedTables(wh_root), LIB), "ACME_EU", "gross_margin", "2023").inconsistent
    again = dg.materialize([relation_graph], partition_key=LIB, resources=resources, instance=instance)
    assert again.success and md(again)["reused"] is True and md(again)["version"] == m["version"]


def test_relation_graph_in_the_code_location_snapshot_and_catalog(tmp_path, monkeypatch):
    """Registered in the one Definitions and the refresh job; the snapshot names it; the
    catalog has views of it; run config picks the relation extractor."""
    import duckdb

    import definitions
    from assets import refresh_job

    corpus = tmp_path / "corpus"
    shutil.copytree(DEMO_ROOT / LIB, corpus / LIB)
    copy_demo_vocabulary(corpus)  # the demo's glossary and dimensions, as this corpus's own
    wh_root = tmp_path / "warehouse"
    monkeypatch.setenv("RAGSPINE_WAREHOUSE", str(wh_root))
    monkeypatch.setenv("RAGSPINE_CORPUS_ROOT", str(corpus))
    warehouse = WarehouseResource(root=str(wh_root), corpus_root=str(corpus))
    repo = definitions.defs.get_repository_def()
    assert dg.AssetKey("relation_graph") in repo.asset_graph.get_all_asset_keys()
    assert dg.AssetKey("relation_graph") in set(repo.get_job(refresh_job.name).asset_layer.executable_asset_keys)
    instance = dg.DagsterInstance.ephemeral()
    first = definitions.materialize_library(LIB, instance, warehouse, definitions.QUIET)
    wh = VersionedTables(wh_root)
    graph = wh.latest("relation_graph", LIB)
    snap = wh.latest("retrieval_snapshot", LIB).manifest["metadata"]
    assert snap["relation_graph"] == graph.version
    with duckdb.connect(str(warehouse.catalog_path()), read_only=True) as con:
        facts = con.execute(f'SELECT count(*) FROM "graph_nodes_{LIB}" WHERE type = \'fact\'').fetchone()[0]
        assert facts == graph.manifest["metadata"]["node_counts"]["fact"]
        assert con.execute(f'SELECT count(*) FROM "graph_edges_{LIB}"').fetchone()[0] == \
            graph.manifest["metadata"]["n_edges"]
    (ev,) = [e for e in first.get_asset_materialization_events() if e.asset_key.to_user_string() == "relation_graph"]
    md = ev.step_materialization_data.materialization.metadata
    assert md["relation_extractor"].value == "none" and "co_occurs_with" not in md["edge_counts"].value
    cfg = {**definitions.QUIET, "ops": {"relation_graph": {"config": {"relation_extractor": "cooccurrence"}}}}
    second = definitions.materialize_library(LIB, instance, warehouse, cfg)
    (ev,) = [e for e in second.get_asset_materialization_events() if e.asset_key.to_user_string() == "relation_graph"]
    md = ev.step_materialization_data.materialization.metadata
    assert md["relation_extractor"].value == "cooccurrence" and md["edge_counts"].value["co_occurs_with"] > 0
    assert wh.latest("retrieval_snapshot", LIB).manifest["metadata"]["relation_graph"] == md["version"].value
    with duckdb.connect(str(warehouse.catalog_path()), read_only=True) as con:
        assert con.execute(f'SELECT count(*) FROM "graph_edges_{LIB}" WHERE type = \'co_occurs_with\'').fetchone()[0] \
            == md["edge_counts"].value["co_occurs_with"]


def test_redacted_catalog_leaves_out_graph_rows_of_hidden_documents(tmp_path, monkeypatch):
    """The redacted catalog hides more than the served set (a document with any restricted
    stored row, or hidden since): no graph node or edge may cite such a document there."""
    import duckdb

    import definitions
    from ragspine_pipeline.warehouse import catalog as C
    from ragspine_pipeline.warehouse import pipeline as P

    corpus = tmp_path / "corpus"
    shutil.copytree(DEMO_ROOT / LIB, corpus / LIB)
    copy_demo_vocabulary(corpus)  # the demo's glossary and dimensions, as this corpus's own
    wh_root = tmp_path / "warehouse"
    warehouse = WarehouseResource(root=str(wh_root), corpus_root=str(corpus))
    definitions.materialize_library(LIB, dg.DagsterInstance.ephemeral(), warehouse, definitions.QUIET)
    wh = VersionedTables(wh_root)
    path = tmp_path / "catalog.duckdb"
    P.build_catalog(wh, [LIB], path)
    with duckdb.connect(str(path), read_only=True) as con:
        target, n_facts = con.execute(
            f"SELECT json_extract_string(attrs, '$.doc_id') d, count(*) FROM \"graph_nodes_{LIB}\" "
            "WHERE type = 'fact' GROUP BY d ORDER BY d LIMIT 1").fetchone()
        total_facts = con.execute(f"SELECT count(*) FROM \"graph_nodes_{LIB}\" WHERE type = 'fact'").fetchone()[0]
    real = P.redacted_doc_ids
    monkeypatch.setattr(C, "redacted_doc_ids", lambda *a, **k: real(*a, **k) | {target})
    path.with_suffix(".json").unlink()  # same snapshots: force the rebuild
    P.build_catalog(wh, [LIB], path)
    with duckdb.connect(str(path), read_only=True) as con:
        nodes = con.execute(f'SELECT id, type, attrs FROM "graph_nodes_{LIB}"').fetchall()
        edges = con.execute(f'SELECT src, dst, attrs FROM "graph_edges_{LIB}"').fetchall()
    assert sum(t == "fact" for _, t, _ in nodes) == total_facts - n_facts
    assert not any(target in (a or "") for _, _, a in nodes) and not any(target in s + d + (a or "")
                                                                          for s, d, a in edges)
