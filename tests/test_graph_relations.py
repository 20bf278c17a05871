"""The relation extractor slot and the GraphRAG community skeleton, on the demo corpus."""

from __future__ import annotations

import json

import pytest
from chat_server import ChatServer, answer, server_error, user_of

from ragspine_pipeline.corpus import DEMO_ROOT
from ragspine_pipeline.graph import build_graph, graph_tables, rollup
from ragspine_pipeline.graph.communities import add_communities, detect_communities, themes
from ragspine_pipeline.graph.relations import (
    CO_OCCURS,
    LLM_RELATION,
    CooccurrenceExtractor,
    LLMRelationExtractor,
    RelationExtractorError,
    make_relation_extractor,
)
from ragspine_pipeline.graph.step import (
    RELATION_GRAPH,
    build_relation_graph,
    load_relation_graph,
    resolve_dimensions,
)
from ragspine_pipeline.llm.provider import OpenAICompatibleProvider, ScriptedProvider
from ragspine_pipeline.retrieval.query.gate import SecurityGate
from ragspine_pipeline.warehouse import pipeline as P
from ragspine_pipeline.warehouse.chunk_tables import active_chunks, served_chunks
from ragspine_pipeline.warehouse.versioned import VersionedTables

LIB = "acme_reports"
SECRETS = ("青鸟", "华辰地产已书面通知", "裁减约420人")


@pytest.fixture(scope="module")
def wh(tmp_path_factory):
    w = VersionedTables(tmp_path_factory.mktemp("graph_rel_wh"))
    P.build_raw_documents(w, DEMO_ROOT, LIB)
    P.build_chunks(w, LIB)
    build_relation_graph(w, LIB, relation_extractor="none", communities=False)
    return w


@pytest.fixture(scope="module")
def served(wh):
    return served_chunks(wh, LIB, wh.latest("chunks", LIB).version)


@pytest.fixture(scope="module")
def everything(wh):
    """Every active chunk, the RESTRICTED board minutes included (what an extractor must survive)."""
    chunks = active_chunks(wh, LIB)
    assert any(s in c.text for c in chunks for s in SECRETS)
    return chunks


def test_default_extractor_is_none_and_graph_byte_identical(wh, monkeypatch):
    monkeypatch.delenv("RAGSPINE_RELATION_EXTRACTOR", raising=False)
    monkeypatch.delenv("RAGSPINE_GRAPH_COMMUNITIES", raising=False)
    assert make_relation_extractor() is None and make_relation_extractor("none") is None
    base = wh.latest(RELATION_GRAPH, LIB)
    again = build_relation_graph(wh, LIB)  # the environment's default: none, no communities
    assert again.metadata["reused"] and again.published.version == base.version
    assert "relation_extractor" not in base.manifest["metadata"]
    nodes, edges = graph_tables(build_graph(served_chunks(wh, LIB, base.manifest["metadata"]["chunks_version"]),
                                            resolve_dimensions()))
    assert nodes.equals(wh.read(RELATION_GRAPH, LIB, "nodes", base.version))
    assert edges.equals(wh.read(RELATION_GRAPH, LIB, "edges", base.version))


def test_factory_errors_are_typed(monkeypatch):
    monkeypatch.setenv("RAGSPINE_RELATION_EXTRACTOR", "spacy")
    with pytest.raises(RelationExtractorError, match="unknown relation extractor"):
        make_relation_extractor()
    monkeypatch.setenv("RAGSPINE_RELATION_EXTRACTOR", "cooccurrence")
    assert isinstance(make_relation_extractor(), CooccurrenceExtractor)
    monkeypatch.delenv("RAGSPINE_LLM_BASE_URL", raising=False)
    with pytest.raises(RelationExtractorError, match="needs an LLM provider"):
        make_relation_extractor("llm")


def test_cooccurrence_edges_cite_chunks_where_both_appear(wh, everything):
    dims = resolve_dimensions()
    edges = CooccurrenceExtractor().extract(everything, dims)
    assert edges and {e.type for e in edges} == {CO_OCCURS}
    by_id = {c.chunk_id: c for c in everything}
    aliases = {e.id: [a.lower() for a in (*e.aliases, e.name_en, e.name_zh) if a] for e in dims.entities}
    restricted_docs = {c.doc_id for c in everything} - {c.doc_id for c in served_chunks(
        wh, LIB, wh.latest("chunks", LIB).version)}
    for e in edges:
        a, b = e.src.split(":", 1)[1], e.dst.split(":", 1)[1]
        assert a < b and e.attrs["count"] == len(e.attrs["chunks"]) > 0
        for cid in e.attrs["chunks"]:
            text = by_id[cid].text.lower()
            assert any(x in text for x in aliases[a]) and any(x in text for x in aliases[b])
        assert not set(e.attrs["doc_ids"]) & restricted_docs  # the minutes never give provenance
    # Through the step: the edges are in the published graph, reused when asked again.
    res = build_relation_graph(wh, LIB, relation_extractor="cooccurrence")
    assert not res.metadata["reused"] and res.metadata["relations_added"] == len(edges)
    g = load_relation_graph(wh, LIB)
    assert len([e for e in g.edges() if e.type == CO_OCCURS]) == len(edges)
    assert build_relation_graph(wh, LIB, relation_extractor="cooccurrence").metadata["reused"]
    build_relation_graph(wh, LIB, relation_extractor="none")


def test_llm_extractor_stamps_gates_and_never_sends_restricted(everything):
    def script(body):
        text = user_of(body)
        rels = []
        if "艾克美中国" in text or "ACME China" in text:
            rels = [{"src": "ACME China", "relation": "supplies", "dst": "ACME Group"},
                    {"src": "Globex", "relation": "competes_with", "dst": "ACME China"},
                    {"src": "ACME China", "relation": "partners_with", "dst": "Initrode"}]
        return answer(json.dumps(rels))

    with ChatServer() as srv:
        srv.script = script
        ex = LLMRelationExtractor(OpenAICompatibleProvider(base_url=srv.url, model="m1"),
                                  gate=SecurityGate(competitors=["Globex"]))
        edges = ex.extract(everything, resolve_dimensions())
        bodies = list(srv.bodies)
    assert bodies and ex.report["sent"] == len(bodies)
    for b in bodies:
        assert not any(s in b for s in SECRETS)  # RESTRICTED text never reached the model
    assert edges and all(e.type == LLM_RELATION for e in edges)
    for e in edges:
        assert e.attrs["model_derived"] is True and e.attrs["verified"] is False and e.attrs["model"] == "m1"
        assert (e.src, e.dst, e.attrs["relation"]) == ("entity:ACME_CN", "entity:ACME_GROUP", "supplies")
        assert e.attrs["chunks"]
    assert ex.report["refused"] and all("Globex" in r["variant"] for r in ex.report["refused"])
    assert ex.report["unknown_endpoints"] > 0  # Initrode is no entity of the graph


def test_llm_extractor_failure_adds_nothing(everything):
    with ChatServer() as srv:
        srv.script = lambda body: server_error()
        ex = LLMRelationExtractor(OpenAICompatibleProvider(base_url=srv.url, model="m", timeout=10),
                                  gate=SecurityGate())
        assert ex.extract(everything, resolve_dimensions()) == []
    assert ex.report["failed"] == ex.report["sent"] > 0
    garbage = LLMRelationExtractor(ScriptedProvider(["not json", '{"src": 1}']), gate=SecurityGate())
    assert garbage.extract(everything, resolve_dimensions()) == []


def test_llm_extractor_through_the_step(wh, monkeypatch):
    with ChatServer() as srv:
        srv.script = lambda body: answer(json.dumps([{"src": "ACME US", "relation": "reports_to", "dst": "ACME Group"}])
                                         if "ACME US" in user_of(body) else "[]")
        monkeypatch.setenv("RAGSPINE_LLM_BASE_URL", srv.url)
        monkeypatch.setenv("RAGSPINE_RELATION_EXTRACTOR", "llm")
        res = build_relation_graph(wh, LIB)
    assert res.metadata["relation_extractor"] == "llm" and res.metadata["relations_added"] >= 1
    g = load_relation_graph(wh, LIB)
    (e,) = [e for e in g.edges() if e.type == LLM_RELATION]
    assert e.attrs["model_derived"] is True and e.attrs["verified"] is False
    monkeypatch.delenv("RAGSPINE_RELATION_EXTRACTOR")
    build_relation_graph(wh, LIB)


@pytest.mark.parametrize("store", ["memory", "networkx"])
def test_communities_are_seeded_synthesis_themes_never_facts(wh, served, everything, store):
    g1 = load_relation_graph(wh, LIB, store=store)
    before = rollup(g1, "ACME_GROUP", "revenue", "2023")
    c1 = detect_communities(g1, everything, seed=7)
    c2 = detect_communities(load_relation_graph(wh, LIB, store="memory"), served, seed=7)
    assert c1 == c2 and len(c1) >= 2  # deterministic; restricted chunks are skipped, not summarized
    for c in c1:
        assert c.summarizer == "extractive" and c.summary and c.doc_ids
        assert not any(s in c.summary for s in SECRETS)
        assert set(c.chunk_ids) <= {x.chunk_id for x in served}
    add_communities(g1, c1)
    assert rollup(g1, "ACME_GROUP", "revenue", "2023") == before  # facts untouched
    nodes = g1.nodes("community")
    assert nodes and all(a["is_synthesis"] is True and a["citable"] is False for _, a in nodes)
    found = themes(g1, "艾克美中国 营业收入", top_k=2)
    assert found and found[0]["channel"] == "graph_theme" and found[0]["citable"] is False
    assert "doc:acme_reports/ar2023_cn_revenue" in found[0]["members"]
    assert themes(g1, "zzzz qqqq") == []


def test_community_summaries_with_a_provider(served, wh, everything):
    p = ScriptedProvider(["Theme: regional revenue and margins."])
    cs = detect_communities(load_relation_graph(wh, LIB), everything, provider=p)
    assert cs and all(c.summarizer == "llm" for c in cs)
    assert p.prompts and not any(s in prompt for prompt in p.prompts for s in SECRETS)
    failing = ScriptedProvider(lambda prompt: (_ for _ in ()).throw(RuntimeError("down")))
    assert all(c.summarizer == "extractive" for c in detect_communities(load_relation_graph(wh, LIB), served,
                                                                        provider=failing))


def test_communities_through_the_step(wh):
    res = build_relation_graph(wh, LIB, communities=True)
    assert res.metadata["communities"] == res.metadata["node_counts"]["community"] >= 2
    assert res.checks["facts_cite_served_chunks"].passed
    build_relation_graph(wh, LIB, communities=False)
