"""A re-chunk with a structure-aware chunker through Dagster run config (chunks.config.chunker),
end to end: the checks stay green, the child fields reach the served snapshot, and the
published retriever expands children into prompt_text while text and citations stay put."""

import shutil
import sys
from pathlib import Path

import pytest

dg = pytest.importorskip("dagster")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import definitions  # noqa: E402
from ragspine_pipeline.retrieval.link.published import open_published_retriever  # noqa: E402
from ragspine_pipeline.warehouse import pipeline as P  # noqa: E402
from ragspine_pipeline.warehouse.versioned import VersionedTables  # noqa: E402
from resources import WarehouseResource  # noqa: E402

LIB = "acme_reports"


def test_backfill_with_parent_child_serves_prompt_text(tmp_path, monkeypatch):
    corpus = tmp_path / "corpus"
    shutil.copytree(ROOT / "data" / "demo" / LIB, corpus / LIB)
    wh_root = tmp_path / "warehouse"
    monkeypatch.setenv("RAGSPINE_WAREHOUSE", str(wh_root))
    monkeypatch.setenv("RAGSPINE_CORPUS_ROOT", str(corpus))
    monkeypatch.setenv("RAGSPINE_EMBEDDING_BACKEND", "none")
    warehouse = WarehouseResource(root=str(wh_root), corpus_root=str(corpus))
    instance = dg.DagsterInstance.ephemeral()
    res = definitions.materialize_library(LIB, instance, warehouse,
                                          {"ops": {"chunks": {"config": {"chunker": "parent_child:1200:200:20"}}}})
    assert res.success
    checks = [e for e in res.get_asset_check_evaluations() if e.asset_key.to_user_string() == "chunks"]
    assert checks and all(c.passed for c in checks), [(c.check_name, c.passed) for c in checks]
    wh = VersionedTables(wh_root)
    pub = wh.latest(P.CHUNKS, LIB)
    assert pub.manifest["metadata"]["chunker"] == "parent_child:1200:200:20"
    chunks = {c.chunk_id: c for c in P.active_chunks(wh, LIB, pub.version)}
    assert all(c.chunker == "parent_child" and c.parent_id and c.window_text for c in chunks.values())
    retriever = open_published_retriever(str(wh_root), LIB, mode="bm25", glossary=False)
    snips = retriever.retrieve("why was the Lyon plant closed", top_k=5)
    assert snips
    for s in snips:
        c = chunks[s["chunk_id"]]
        assert s["text"] == c.text and s["source_locator"] == c.source_locator.to_dict()
        assert s["prompt_text"] == c.window_text or (s["prompt_text"] == "" and s["prompt_text_ref"])
        assert s["sensitivity"] != "RESTRICTED"
