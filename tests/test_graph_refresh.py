"""A relation graph refresh extracts only new chunks and still equals a full build, row for row."""

from __future__ import annotations

import json
import shutil

import pytest

from ragspine_pipeline.corpus import DEMO_ROOT
from ragspine_pipeline.graph import build_graph, graph_tables
from ragspine_pipeline.graph.build import GraphBuildError
from ragspine_pipeline.graph.fact_cache import FACTS_TABLE, served_facts
from ragspine_pipeline.graph.step import RELATION_GRAPH, build_relation_graph, resolve_dimensions
from ragspine_pipeline.warehouse import pipeline as P
from ragspine_pipeline.warehouse.chunk_tables import (
    active_chunk_table,
    served_chunk_table,
    served_chunks,
)
from ragspine_pipeline.warehouse.versioned import VersionedTables

LIB = "acme_reports"


def _refresh(wh: VersionedTables, root):
    P.build_raw_documents(wh, root, LIB)
    P.build_chunks(wh, LIB)
    return build_relation_graph(wh, LIB, relation_extractor="none", communities=False)


def _full(wh: VersionedTables, version: str):
    return graph_tables(build_graph(served_chunks(wh, LIB, version), resolve_dimensions()))


@pytest.fixture()
def library(tmp_path):
    root = tmp_path / "corpus"
    shutil.copytree(DEMO_ROOT / LIB, root / LIB)
    return root, VersionedTables(tmp_path / "wh")


def test_refresh_reuses_unchanged_chunks_and_equals_a_full_build(library):
    root, wh = library
    first = _refresh(wh, root)
    assert first.metadata["chunks_reused"] == 0 and first.metadata["chunks_extracted"] == first.metadata["served_chunks"]
    docs = root / LIB
    # a new fact in one document, one document gone, one relabelled RESTRICTED, one retitled
    with open(docs / "ar2022_cn_revenue.md", "a", encoding="utf-8") as fh:
        fh.write("\n\n2022年，艾克美中国研发投入为4.2亿元。\n")
    (docs / "ar2023_cn_rd.md").unlink()
    (docs / "ar2023_cn_rd.meta.json").unlink()
    meta = json.loads((docs / "ar2023_us_results.meta.json").read_text(encoding="utf-8"))
    (docs / "ar2023_us_results.meta.json").write_text(json.dumps({**meta, "sensitivity": "RESTRICTED"}),
                                                     encoding="utf-8")
    meta = json.loads((docs / "ar2024h1_eu.meta.json").read_text(encoding="utf-8"))
    (docs / "ar2024h1_eu.meta.json").write_text(json.dumps({**meta, "period": "2024H2"}), encoding="utf-8")
    second = _refresh(wh, root)
    md = second.metadata
    assert not md["reused"] and 0 < md["chunks_extracted"] < md["served_chunks"]
    assert md["chunks_reused"] + md["chunks_extracted"] == md["served_chunks"]
    version = md["chunks_version"]
    nodes, edges = _full(wh, version)
    assert nodes.equals(wh.read(RELATION_GRAPH, LIB, "nodes", md["version"]))
    assert edges.equals(wh.read(RELATION_GRAPH, LIB, "edges", md["version"]))
    assert any("4.2亿元" in a for a in nodes.column("attrs").to_pylist())
    # the relabelled and the deleted documents left no fact, no cached row
    kept = set(wh.read(RELATION_GRAPH, LIB, FACTS_TABLE, md["version"]).column("chunk_id").to_pylist())
    assert kept == set(served_chunk_table(wh, LIB, version).column("chunk_id").to_pylist())
    served_docs = set(served_chunk_table(wh, LIB, version).column("doc_id").to_pylist())
    graph_docs = {json.loads(a)["doc_id"] for a, t in zip(nodes.column("attrs").to_pylist(),
                                                           nodes.column("type").to_pylist(), strict=True)
                  if t in ("document", "fact")}
    assert graph_docs <= served_docs
    assert not any(d.endswith(("ar2023_cn_rd", "ar2023_us_results")) for d in graph_docs)

def test_other_dimensions_extract_everything_again(library, tmp_path):
    root, wh = library
    _refresh(wh, root)
    with open(root / LIB / "ar2022_cn_revenue.md", "a", encoding="utf-8") as fh:
        fh.write("\n\nAppended.\n")
    P.build_raw_documents(wh, root, LIB)
    P.build_chunks(wh, LIB)
    glossary = tmp_path / "glossary.json"
    glossary.write_text(json.dumps({"groups": [{"kind": "metric", "terms": ["营收", "营业收入"]}]}), encoding="utf-8")
    res = build_relation_graph(wh, LIB, relation_extractor="none", communities=False, glossary=glossary)
    assert res.metadata["chunks_reused"] == 0


def test_a_restricted_row_is_refused(library):
    root, wh = library
    P.build_raw_documents(wh, root, LIB)
    P.build_chunks(wh, LIB)
    table = active_chunk_table(wh.latest("chunks", LIB))
    with pytest.raises(GraphBuildError, match="RESTRICTED"):
        served_facts(table, resolve_dimensions(), None)
