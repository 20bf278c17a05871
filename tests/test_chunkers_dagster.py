"""Re-chunking through Dagster run config (chunks.config.chunker), end to end: the checks
stay green, the child fields reach the served snapshot, the published retriever expands
children into prompt_text while text and citations stay put, and the previous chunking
stays published side by side (``ragspine query --chunker``, ``RetrievalResource.chunker``)."""

import json

import duckdb
import pytest

dg = pytest.importorskip("dagster")

from dagster_fixtures import demo_warehouse  # noqa: E402

import definitions  # noqa: E402
from ragspine_pipeline.cli import main  # noqa: E402
from ragspine_pipeline.serving import open_published_retriever  # noqa: E402
from ragspine_pipeline.warehouse import pipeline as P  # noqa: E402
from resources import RetrievalResource  # noqa: E402

LIB = "acme_reports"
PC = "parent_child:1200:200:20"


def _rechunk(chunker: str, **ops) -> dict:
    return {**definitions.QUIET, "ops": {"chunks": {"config": {"chunker": chunker}}, **ops}}


def test_backfill_with_parent_child_serves_prompt_text(tmp_path, monkeypatch):
    demo = demo_warehouse(tmp_path, monkeypatch)
    res = definitions.materialize_library(LIB, dg.DagsterInstance.ephemeral(), demo.resource(), _rechunk(PC))
    assert res.success
    checks = [e for e in res.get_asset_check_evaluations() if e.asset_key.to_user_string() == "chunks"]
    assert checks and all(c.passed for c in checks), [(c.check_name, c.passed) for c in checks]
    wh = demo.tables()
    pub = wh.latest(P.CHUNKS, LIB)
    assert pub.manifest["metadata"]["chunker"] == PC
    chunks = {c.chunk_id: c for c in P.active_chunks(wh, LIB, pub.version)}
    assert all(c.chunker == "parent_child" and c.parent_id and c.window_text for c in chunks.values())
    retriever = open_published_retriever(str(demo.root), LIB, mode="bm25", glossary=False)
    snips = retriever.retrieve("why was the Lyon plant closed", top_k=5)
    assert snips
    for s in snips:
        c = chunks[s["chunk_id"]]
        assert s["text"] == c.text and s["source_locator"] == c.source_locator.to_dict()
        assert s["prompt_text"] == c.window_text or (s["prompt_text"] == "" and s["prompt_text_ref"])
        assert s["sensitivity"] != "RESTRICTED"


def _cli(capsys, root, *args):
    rc = main(["query", "--warehouse", str(root), "--mode", "bm25", "--json", *args])
    out = capsys.readouterr()
    return rc, (json.loads(out.out) if rc == 0 else out.err)


def test_a_rechunk_keeps_the_previous_chunking_queryable_side_by_side(tmp_path, monkeypatch, capsys):
    demo = demo_warehouse(tmp_path, monkeypatch)
    instance = dg.DagsterInstance.ephemeral()
    # Aggressive pruning: one version kept, no retention window. The other chunking survives.
    warehouse = demo.resource(keep_versions=1, retain_for_seconds=0)
    assert definitions.materialize_library(LIB, instance, warehouse, definitions.QUIET).success
    wh = demo.tables()
    para = wh.latest(P.SNAPSHOT, LIB)
    para_ids = {c.chunk_id for c in P.active_chunks(wh, LIB, para.manifest["metadata"]["chunks"])}
    res = definitions.materialize_library(LIB, instance, warehouse,
                                          _rechunk(PC, lexical_index={"config": {"contextual": "on"}}))
    assert all(c.passed for c in res.get_asset_check_evaluations())
    snap = wh.latest(P.SNAPSHOT, LIB)
    assert snap.manifest["metadata"]["chunker"] == PC and snap.manifest["metadata"]["contextual"]
    pc_ids = {c.chunk_id for c in P.active_chunks(wh, LIB, snap.manifest["metadata"]["chunks"])}
    assert pc_ids and para_ids and pc_ids != para_ids
    assert {k: s.version for k, s in P.published_chunkings(wh, LIB).items()} == \
        {"paragraph:480:80": para.version, PC: snap.version}

    q = "why was the Lyon plant closed"
    rc, old = _cli(capsys, demo.root, "--chunker", "paragraph", q)
    assert rc == 0 and old and {s["chunk_id"] for s in old} <= para_ids
    rc, new = _cli(capsys, demo.root, "--chunker", "parent_child", q)
    assert rc == 0 and new and {s["chunk_id"] for s in new} <= pc_ids
    rc, default = _cli(capsys, demo.root, q)
    assert rc == 0 and [s["chunk_id"] for s in default] == [s["chunk_id"] for s in new]
    rc, err = _cli(capsys, demo.root, "--chunker", "semantic", q)
    assert rc == 2 and "no published chunking 'semantic'" in err and "paragraph:480:80" in err and PC in err

    got = RetrievalResource(warehouse_root=str(demo.root), chunker="paragraph").ask(q, top_k=5)
    assert got and {s["chunk_id"] for s in got} <= para_ids
    with pytest.raises(dg.Failure, match="available: paragraph:480:80, parent_child"):
        RetrievalResource(warehouse_root=str(demo.root), chunker="book").ask(q)

    # As of their time: the catalog keeps the paragraph rows, superseded when the re-chunk landed.
    con = duckdb.connect(str(demo.root / "catalog.duckdb"), read_only=True)
    rows = dict(con.execute('SELECT chunker, count(*) FILTER (WHERE NOT active AND superseded_at IS NOT NULL) '
                            'FROM "chunks_acme_reports" GROUP BY chunker').fetchall())
    con.close()
    assert rows.get("paragraph", 0) > 0

    # A relabel to RESTRICTED reaches the older chunking too: it stops serving that document.
    side = demo.corpus / LIB / "pr_eu_lyon.meta.json"
    side.write_text(json.dumps({**json.loads(side.read_text(encoding="utf-8")), "sensitivity": "RESTRICTED"}),
                    encoding="utf-8")
    assert definitions.materialize_library(LIB, instance, warehouse, _rechunk(PC)).success
    for chunker in ("paragraph", "parent_child"):
        rc, snips = _cli(capsys, demo.root, "--chunker", chunker, "--top-k", "20", "Lyon plant closure")
        assert rc == 0 and not [s for s in snips if s["doc_id"].endswith("pr_eu_lyon")]
        assert all(s["sensitivity"] != "RESTRICTED" for s in snips)
