"""The relation graph on the demo corpus: cited facts, queries, stores, RESTRICTED, incremental."""

from __future__ import annotations

import dataclasses
import json
import shutil

import pytest

from ragspine_pipeline.corpus import DEMO_ROOT
from ragspine_pipeline.graph import (
    DimensionsError,
    Extractor,
    GraphQueryError,
    GraphStoreError,
    MemoryGraphStore,
    NetworkxGraphStore,
    build_graph,
    compare_peers,
    graph_from_tables,
    graph_tables,
    load_dimensions,
    make_graph_store,
    parse_dimensions,
    rollup,
    trace,
)
from ragspine_pipeline.graph.build import GraphBuildError
from ragspine_pipeline.graph.step import (
    RELATION_GRAPH,
    build_relation_graph,
    load_relation_graph,
    resolve_dimensions,
)
from ragspine_pipeline.warehouse import pipeline as P
from ragspine_pipeline.warehouse.chunk_tables import active_chunks, served_chunks
from ragspine_pipeline.warehouse.versioned import VersionedTables

LIB = "acme_reports"


@pytest.fixture(scope="module")
def wh(tmp_path_factory):
    w = VersionedTables(tmp_path_factory.mktemp("graph_wh"))
    P.build_raw_documents(w, DEMO_ROOT, LIB)
    P.build_chunks(w, LIB)
    build_relation_graph(w, LIB)
    return w


@pytest.fixture(scope="module")
def chunk_by_id(wh):
    return {c.chunk_id: c for c in active_chunks(wh, LIB)}


@pytest.fixture(params=["memory", "networkx"])
def graph(request, wh):
    return load_relation_graph(wh, LIB, store=request.param)


def assert_cites(citation, chunk_by_id, number: str) -> None:
    """The citation names a real chunk whose text at the locator reads the quoted figure."""
    c = chunk_by_id[citation.chunk_id]
    assert c.doc_id == citation.doc_id
    lo = citation.start - c.source_locator.start
    span = c.text[lo:lo + citation.end - citation.start]
    assert span == citation.quote and number in span
    doc = (DEMO_ROOT / f"{citation.doc_id}.md").read_text(encoding="utf-8")
    assert doc[citation.start:citation.end] == citation.quote  # source_locator coordinates


def test_rollup_group_revenue_by_subsidiary(graph, chunk_by_id):
    ans = rollup(graph, "ACME_GROUP", "revenue", "2023")
    cny = next(t for t in ans.totals if t.unit == "CNY")
    assert cny.complete and cny.missing == ()
    assert cny.total == pytest.approx(128.4e8)
    assert [r.value for r in cny.reported] == [pytest.approx(128.4e8)] and cny.consistent is True
    by_entity = {r.entity: r for r in ans.rows if r.unit == "CNY"}
    for ent, num in (("ACME_CN", "48.6"), ("ACME_US", "52.3"), ("ACME_EU", "27.5")):
        for cit in by_entity[ent].citations:
            assert_cites(cit, chunk_by_id, num)
    assert len(cny.citations) == 3
    for cit in cny.reported[0].citations:
        assert_cites(cit, chunk_by_id, "12")  # 128.4亿元 / RMB 12.84 billion
    # Other currencies are never converted: USD and EUR are partial, with no parent figure.
    usd = next(t for t in ans.totals if t.unit == "USD")
    assert not usd.complete and set(usd.missing) == {"ACME_CN", "ACME_EU"} and usd.consistent is None


def test_peer_comparison_gross_margin(graph, chunk_by_id):
    ans = compare_peers(graph, "ACME_CN", "gross_margin", "2023")
    assert [(r.entity, r.value) for r in ans.rows] == [("ACME_EU", 36.5), ("ACME_US", 35.9), ("ACME_CN", 26.9)]
    assert ans.rank == 3
    for r in ans.rows:
        assert r.citations and all(r.unit == "%" for r in ans.rows)
        for cit in r.citations:
            assert_cites(cit, chunk_by_id, f"{r.value:g}")
    cn_docs = {c.doc_id for c in ans.rows[2].citations}
    assert cn_docs == {f"{LIB}/ar2023_cn_revenue", f"{LIB}/ar2023_group_segments"}  # zh report and segment note agree


def test_derivation_trace_consistent(graph, chunk_by_id):
    t = trace(graph, "ACME_CN", "gross_margin", "2023")
    assert t.derived == pytest.approx(13.1 / 48.6 * 100, abs=1e-4)
    assert not t.inconsistent and t.reported and all(c.consistent for c in t.reported)
    assert_cites(t.numerator.citations[0], chunk_by_id, "13.1")
    assert_cites(t.denominator.citations[0], chunk_by_id, "48.6")


def test_derivation_trace_flags_planted_inconsistency(graph, chunk_by_id):
    t = trace(graph, "ACME_EU", "gross_margin", "2023")
    assert t.inconsistent
    (check,) = t.reported
    assert check.row.value == 36.5 and not check.consistent
    assert check.difference == pytest.approx(36.5 - 8.9 / 27.5 * 100, abs=1e-4)
    assert abs(check.difference) > check.tolerance
    assert_cites(check.row.citations[0], chunk_by_id, "36.5")
    assert_cites(t.numerator.citations[0], chunk_by_id, "8.9")
    assert_cites(t.denominator.citations[0], chunk_by_id, "27.5")


def test_no_uncited_number_in_any_answer(graph):
    answers = [rollup(graph, "ACME_GROUP", "revenue", "2023"), compare_peers(graph, "ACME_US", "gross_margin", "2023")]
    answers += [trace(graph, e, "gross_margin", "2023") for e in ("ACME_CN", "ACME_US", "ACME_EU")]

    def walk(x):
        if isinstance(x, dict):
            if {"value", "unit"} <= x.keys():
                assert x["citations"], x
            if "total" in x:
                assert x["citations"], x
            for v in x.values():
                walk(v)
        elif isinstance(x, list | tuple):
            for v in x:
                walk(v)
    for a in answers:
        walk(a.to_dict())


def test_stores_give_identical_answers(wh):
    mem = load_relation_graph(wh, LIB, store="memory")
    nx = load_relation_graph(wh, LIB, store="networkx")
    assert isinstance(mem, MemoryGraphStore) and isinstance(nx, NetworkxGraphStore)
    assert mem.nodes() == nx.nodes() and mem.edges() == nx.edges()
    for q in (lambda g: rollup(g, "ACME_GROUP", "revenue", "2023"),
              lambda g: rollup(g, "ACME_GROUP", "gross_margin", "2023"),
              lambda g: compare_peers(g, "ACME_EU", "revenue", "2023"),
              lambda g: trace(g, "ACME_US", "gross_margin", "2023")):
        assert q(mem) == q(nx)
    t_mem, e_mem = graph_tables(mem)
    t_nx, e_nx = graph_tables(nx)
    assert t_mem.equals(t_nx) and e_mem.equals(e_nx)


def test_store_factory_reads_env(monkeypatch):
    monkeypatch.setenv("RAGSPINE_GRAPH_STORE", "networkx")
    assert isinstance(make_graph_store(), NetworkxGraphStore)
    monkeypatch.setenv("RAGSPINE_GRAPH_STORE", "neo4j")
    with pytest.raises(GraphStoreError, match="unknown graph store"):
        make_graph_store()
    monkeypatch.delenv("RAGSPINE_GRAPH_STORE")
    assert isinstance(make_graph_store(), MemoryGraphStore)


@pytest.mark.parametrize("name", ["memory", "networkx"])
def test_store_rejects_edge_to_missing_node(name):
    g = make_graph_store(name)
    g.add_node("a", "entity", {})
    with pytest.raises(GraphStoreError, match="missing node"):
        g.add_edge("a", "b", "peer_of")


def test_restricted_chunks_contribute_no_facts(wh, graph):
    restricted = {c.doc_id for c in active_chunks(wh, LIB)} - {c.doc_id for c in served_chunks(
        wh, LIB, wh.latest("chunks", LIB).version)}
    assert f"{LIB}/bm_cn_2023q3" in restricted  # the demo's RESTRICTED board minutes (收入环比下降18%, 2.3亿元)
    facts = graph.nodes("fact")
    assert facts
    assert not {a["doc_id"] for _, a in facts} & restricted
    assert not {nid for nid, _ in graph.nodes("document")} & {f"doc:{d}" for d in restricted}
    text = json.dumps([a for _, a in graph.nodes()], ensure_ascii=False)
    assert "青鸟" not in text and "华辰地产已书面通知" not in text


def test_builder_refuses_a_restricted_chunk(wh):
    dims = resolve_dimensions()
    chunk = next(c for c in active_chunks(wh, LIB) if c.doc_id == f"{LIB}/bm_cn_2023q3")
    with pytest.raises(GraphBuildError, match="RESTRICTED"):
        build_graph([chunk], dims)
    odd = dataclasses.replace(served_chunks(wh, LIB, wh.latest("chunks", LIB).version)[0], sensitivity="Secret-ish")
    with pytest.raises(GraphBuildError):  # an odd label counts as RESTRICTED
        build_graph([odd], dims)


def test_step_is_incremental_and_tables_roundtrip(wh, tmp_path):
    pub = wh.latest(RELATION_GRAPH, LIB)
    again = build_relation_graph(wh, LIB)
    assert again.metadata["reused"] and again.published.version == pub.version
    md = pub.manifest["metadata"]
    assert md["node_counts"]["entity"] == 4 and md["node_counts"]["fact"] > 40
    assert md["edge_counts"]["subsidiary_of"] == 3
    nodes = wh.read(RELATION_GRAPH, LIB, "nodes")
    edges = wh.read(RELATION_GRAPH, LIB, "edges")
    g = graph_from_tables(nodes, edges)
    n2, e2 = graph_tables(g)
    assert n2.equals(nodes) and e2.equals(edges)
    # Other dimensions: a new graph version, same chunks version.
    raw = json.loads(load_dimensions_path().read_text(encoding="utf-8"))
    raw["peer_groups"] = []
    p = tmp_path / "dims.json"
    p.write_text(json.dumps(raw), encoding="utf-8")
    res = build_relation_graph(wh, LIB, dimensions=p)
    assert not res.metadata["reused"] and res.published.version != pub.version
    assert res.checks["facts_cite_served_chunks"].passed
    with pytest.raises(GraphQueryError, match="no peers"):
        compare_peers(load_relation_graph(wh, LIB), "ACME_CN", "gross_margin", "2023")
    build_relation_graph(wh, LIB)  # back to the shipped dimensions for the other tests


def load_dimensions_path():
    from ragspine_pipeline.graph.dimensions import DEFAULT_DIMENSIONS
    return DEFAULT_DIMENSIONS


def test_graph_follows_a_changed_document(tmp_path):
    corpus = tmp_path / "corpus"
    shutil.copytree(DEMO_ROOT / LIB, corpus / LIB)
    w = VersionedTables(tmp_path / "wh")
    P.build_raw_documents(w, corpus, LIB)
    P.build_chunks(w, LIB)
    build_relation_graph(w, LIB)
    assert trace(load_relation_graph(w, LIB), "ACME_EU", "gross_margin", "2023").inconsistent
    seg = corpus / LIB / "ar2023_group_segments.md"
    seg.write_text(seg.read_text(encoding="utf-8").replace("毛利率36.5%", "毛利率32.4%"), encoding="utf-8")
    P.build_raw_documents(w, corpus, LIB)
    P.build_chunks(w, LIB)
    res = build_relation_graph(w, LIB)
    assert not res.metadata["reused"]
    t = trace(load_relation_graph(w, LIB), "ACME_EU", "gross_margin", "2023")
    assert not t.inconsistent and [c.row.value for c in t.reported] == [32.4]


def test_query_errors_are_typed(graph):
    with pytest.raises(GraphQueryError, match="no entity:NOPE"):
        rollup(graph, "NOPE", "revenue", "2023")
    with pytest.raises(GraphQueryError, match="no subsidiaries"):
        rollup(graph, "ACME_CN", "revenue", "2023")
    with pytest.raises(GraphQueryError, match="no derivation"):
        trace(graph, "ACME_CN", "revenue", "2023")
    with pytest.raises(GraphQueryError, match="no metric:ebitda"):
        compare_peers(graph, "ACME_CN", "ebitda", "2023")


def test_dimensions_validation(tmp_path):
    with pytest.raises(DimensionsError, match="unknown parent"):
        parse_dimensions({"entities": [{"id": "A", "parent": "B"}], "metrics": []})
    with pytest.raises(DimensionsError, match="kind"):
        parse_dimensions({"entities": [], "metrics": [{"id": "m", "kind": "count"}]})
    with pytest.raises(DimensionsError, match="unknown entities"):
        parse_dimensions({"entities": [{"id": "A"}], "metrics": [], "peer_groups": [{"members": ["A", "Z"]}]})
    with pytest.raises(DimensionsError, match="not found"):
        load_dimensions(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{", encoding="utf-8")
    with pytest.raises(DimensionsError, match="not valid JSON"):
        load_dimensions(bad)


def test_glossary_adds_aliases():
    dims = resolve_dimensions()
    cn = next(e for e in dims.entities if e.id == "ACME_CN")
    assert "ACME_CN" in cn.aliases
    net = next(m for m in dims.metrics if m.id == "net_profit")
    assert "net income" in {a.lower() for a in net.aliases}


def test_extractor_examples():
    x = Extractor(resolve_dimensions())
    got = [(f.metric, f.kind, f.value, f.unit, f.period, f.quote) for f in x.text_facts(
        "Gross margin fell from 38.2% to 35.9%.", entity="ACME_US", period="2023")]
    assert got == [("gross_margin", "value", 38.2, "%", "2022", "38.2%"), ("gross_margin", "value", 35.9, "%", "2023", "35.9%")]
    got = [(f.metric, f.kind, f.value, f.unit) for f in x.text_facts("营业收入48.6亿元，同比下降12.4%。",
                                                                     entity="ACME_CN", period="2023")]
    assert got == [("revenue", "value", 48.6e8, "CNY"), ("revenue", "change", -12.4, "%")]
    # a share of revenue, a target, a per-share amount: no facts
    assert not [f for f in x.text_facts("占收入比重8.4%。", entity="ACME_CN", period="2023")]
    assert not x.text_facts("目标是将毛利率恢复到29%以上。", entity="ACME_CN", period="2023")
    assert not x.text_facts("The board proposes a dividend of RMB 0.18 per share.", entity="ACME_GROUP", period="2023")
