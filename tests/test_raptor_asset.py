"""The ``raptor_tree`` Dagster asset: off by default (skips with metadata, the snapshot
names no tree), on by run config or RAGSPINE_RAPTOR (levels in Parquet, shape in the
metadata, checks green, named by the snapshot, served as built, reused when nothing
changed), and never holding a RESTRICTED chunk."""

import pytest

dg = pytest.importorskip("dagster")

from dagster_fixtures import demo_warehouse, materialized_metadata  # noqa: E402

import definitions  # noqa: E402
from ragspine_pipeline.retrieval.raptor import RaptorError  # noqa: E402
from ragspine_pipeline.sensitivity import is_restricted  # noqa: E402
from ragspine_pipeline.warehouse import pipeline as P  # noqa: E402
from ragspine_pipeline.warehouse.raptor_tables import RAPTOR, load_snapshot_raptor  # noqa: E402
from resources import RetrievalResource  # noqa: E402

LIB = "acme_reports"  # holds RESTRICTED board minutes
ON = {**definitions.QUIET, "ops": {"raptor_tree": {"config": {"enabled": "on", "threshold": 0.3}}}}


def test_off_by_default_the_asset_skips_and_the_snapshot_names_no_tree(tmp_path, monkeypatch):
    demo = demo_warehouse(tmp_path, monkeypatch)
    res = definitions.materialize_library(LIB, dg.DagsterInstance.ephemeral(), demo.resource(), definitions.QUIET)
    md = materialized_metadata(res, RAPTOR)
    assert md["enabled"] is False and "off" in md["note"]
    wh = demo.tables()
    assert wh.latest(RAPTOR, LIB) is None  # nothing written
    snap = wh.latest(P.SNAPSHOT, LIB).manifest["metadata"]
    assert "raptor_tree" not in snap and "contextual" not in snap and snap["chunker"] == "paragraph:480:80"
    checks = [c for c in res.get_asset_check_evaluations() if c.asset_key.to_user_string() == RAPTOR]
    assert {c.check_name for c in checks} == {"raptor_no_restricted", "raptor_lineage_union"}
    with pytest.raises(RaptorError, match="no RAPTOR tree"):
        load_snapshot_raptor(wh, LIB)


def test_on_the_tree_is_built_published_served_and_reused(tmp_path, monkeypatch):
    demo = demo_warehouse(tmp_path, monkeypatch)
    instance = dg.DagsterInstance.ephemeral()
    res = definitions.materialize_library(LIB, instance, demo.resource(), ON)
    checks = res.get_asset_check_evaluations()
    assert checks and all(c.passed for c in checks), [(c.check_name, c.passed) for c in checks]
    md = materialized_metadata(res, RAPTOR)
    wh = demo.tables()
    served = P.served_chunks(wh, LIB, wh.latest(P.CHUNKS, LIB).version)
    assert md["enabled"] is True and md["reused"] is False and md["threshold"] == 0.3
    assert md["nodes_per_level"][0] == len(served) == md["leaves"] and md["levels"] == len(md["nodes_per_level"])
    assert sum(md["synthesis_per_level"]) >= 1 and md["cluster_sizes"] and "| level |" in md["shape"]
    # Levels in Parquet, named by the snapshot.
    snap = wh.latest(P.SNAPSHOT, LIB).manifest["metadata"]
    assert snap["raptor_tree"] == md["version"]
    nodes = wh.read(RAPTOR, LIB, "nodes", md["version"])
    assert sorted(set(nodes.column("level").to_pylist())) == list(range(md["levels"]))
    restricted = {c.chunk_id for c in P.active_chunks(wh, LIB) if is_restricted(c.sensitivity)}
    assert restricted and not {m for ms in nodes.column("members").to_pylist() for m in ms} & restricted
    # Levels also in the catalog, for notebooks.
    import duckdb

    con = duckdb.connect(str(demo.root / "catalog.duckdb"), read_only=True)
    per_level = con.execute('SELECT level, count(*) FROM "raptor_nodes_acme_reports" GROUP BY level '
                            'ORDER BY level').fetchall()
    con.close()
    assert [n for _, n in per_level] == md["nodes_per_level"]
    # Served as built, by the engine and by the resource: syntheses cite their members.
    for retriever in (load_snapshot_raptor(wh, LIB, mode="internal"),
                      RetrievalResource(warehouse_root=str(demo.root)).raptor_retriever(LIB, "internal")):
        snips = retriever.retrieve("Lyon plant closure costs", top_k=5)
        assert snips and all(s["is_synthesis"] and s["cites"] and "doc_id" not in s for s in snips)
        assert all(not is_restricted(s["sensitivity"]) and not set(s["members"]) & restricted for s in snips)
    # Nothing changed: the next refresh reuses the tree and the snapshot.
    again = definitions.materialize_library(LIB, instance, demo.resource(), ON)
    md2 = materialized_metadata(again, RAPTOR)
    assert md2["reused"] is True and md2["version"] == md["version"]
    assert wh.latest(P.SNAPSHOT, LIB).manifest["metadata"]["snapshot_id"] == snap["snapshot_id"]


def test_the_environment_switch_and_a_small_refresh_keep_unchanged_summaries(tmp_path, monkeypatch):
    demo = demo_warehouse(tmp_path, monkeypatch)
    monkeypatch.setenv("RAGSPINE_RAPTOR", "on")
    monkeypatch.setenv("RAGSPINE_RAPTOR_THRESHOLD", "0.25")
    instance = dg.DagsterInstance.ephemeral()
    first = materialized_metadata(definitions.materialize_library(LIB, instance, demo.resource(), definitions.QUIET),
                                  RAPTOR)
    assert first["enabled"] is True and first["threshold"] == 0.25
    doc = next(p for p in sorted((demo.corpus / LIB).glob("*.md")) if "bm_" not in p.name)
    doc.write_text(doc.read_text(encoding="utf-8") + "\n\nOne more closing remark.\n", encoding="utf-8")
    res = definitions.materialize_library(LIB, instance, demo.resource(), definitions.QUIET)
    second = materialized_metadata(res, RAPTOR)
    assert second["reused"] is False and second["version"] != first["version"]
    assert second["reused_nodes"] >= 1 and second["resummarised_nodes"] < sum(first["synthesis_per_level"])
    assert "kept" in second["incremental"] or "reused" in second["incremental"]
    assert all(c.passed for c in res.get_asset_check_evaluations())


def test_a_bad_switch_fails_the_step_clearly(tmp_path, monkeypatch):
    demo = demo_warehouse(tmp_path, monkeypatch)
    monkeypatch.setenv("RAGSPINE_RAPTOR", "maybe")
    with pytest.raises(dg.Failure, match="RAGSPINE_RAPTOR=.maybe.: use on or off"):
        definitions.materialize_library(LIB, dg.DagsterInstance.ephemeral(), demo.resource(), definitions.QUIET)
