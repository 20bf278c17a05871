"""The raptor_tree warehouse step: served chunks only, Parquet levels, shape metadata,
reuse when nothing changed, and summaries reused after a small refresh."""

from __future__ import annotations

import shutil

from ragspine_pipeline.paths import DEMO_ROOT
from ragspine_pipeline.warehouse import pipeline as P
from ragspine_pipeline.warehouse.raptor_tables import RAPTOR, build_raptor_step, load_tree
from ragspine_pipeline.warehouse.versioned import VersionedTables

LIB = "acme_reports"  # holds RESTRICTED board minutes


def test_raptor_step_builds_from_served_chunks_and_reuses(tmp_path):
    corpus = tmp_path / "corpus"
    shutil.copytree(DEMO_ROOT / LIB, corpus / LIB)
    wh = VersionedTables(tmp_path / "wh")
    P.build_raw_documents(wh, corpus, LIB)
    ch = P.build_chunks(wh, LIB)
    restricted = {c.chunk_id for c in P.active_chunks(wh, LIB, ch.published.version) if c.sensitivity == "RESTRICTED"}
    assert restricted  # the demo library has restricted documents
    res = build_raptor_step(wh, LIB, threshold=0.3, max_depth=3)
    assert all(o.passed for o in res.checks.values()), res.checks
    md = res.metadata
    assert md["nodes_per_level"][0] == len(P.served_chunks(wh, LIB, ch.published.version))
    assert md["chunks_version"] == ch.published.version and not md["reused"]
    table = wh.read(RAPTOR, LIB, "nodes")
    members = {m for ms in table.column("members").to_pylist() for m in ms}
    assert not members & restricted and "RESTRICTED" not in set(table.column("sensitivity").to_pylist())
    tree = load_tree(res.published, wh)
    assert [len(lv) for lv in tree.levels] == md["nodes_per_level"]
    assert build_raptor_step(wh, LIB, threshold=0.3, max_depth=3).metadata["reused"] is True
    # A small edit: one document changes; unchanged clusters keep their summaries.
    doc = next(p for p in sorted((corpus / LIB).glob("*.md")) if "bm_" not in p.name)
    doc.write_text(doc.read_text(encoding="utf-8") + "\n\nOne more closing remark.\n", encoding="utf-8")
    P.build_raw_documents(wh, corpus, LIB)
    P.build_chunks(wh, LIB)
    again = build_raptor_step(wh, LIB, threshold=0.3, max_depth=3)
    assert not again.metadata["reused"] and all(o.passed for o in again.checks.values())
    if md["synthesis_per_level"] and sum(md["synthesis_per_level"]) > 1:
        assert again.metadata["reused_nodes"] > 0
