"""The graph channel: cited rows, `ragspine graph …`, the RetrievalResource, beside the narrative."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from ragspine_pipeline import cli
from ragspine_pipeline.corpus import DEMO_ROOT
from ragspine_pipeline.graph.channel import GraphChannel, UncitedNumberError, query_rows, rows_of
from ragspine_pipeline.graph.queries import FactRow
from ragspine_pipeline.graph.step import (
    RELATION_GRAPH,
    build_relation_graph,
    load_relation_graph,
    resolve_dimensions,
)
from ragspine_pipeline.warehouse import pipeline as P
from ragspine_pipeline.warehouse.chunk_tables import active_chunks
from ragspine_pipeline.warehouse.versioned import VersionedTables

ROOT = Path(__file__).resolve().parents[1]
LIBS = ("acme_reports", "acme_policies")


@pytest.fixture(scope="module")
def wh_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("graph_channel_wh")
    w = VersionedTables(root)
    for lib in LIBS:
        P.build_raw_documents(w, DEMO_ROOT, lib)
        P.build_chunks(w, lib)
        P.build_lexical_index(w, lib)
        build_relation_graph(w, lib)
        P.publish_snapshot(w, lib)
    return root


@pytest.fixture(scope="module")
def chunk_by_id(wh_root):
    w = VersionedTables(wh_root)
    return {c.chunk_id: c for lib in LIBS for c in active_chunks(w, lib)}


def assert_row_cites(row, chunk_by_id):
    assert row["citations"], row
    for c in row["citations"]:
        ch = chunk_by_id[c["chunk_id"]]
        assert ch.doc_id == c["doc_id"] and ch.sensitivity != "RESTRICTED"
        lo = c["source_locator"]["start"] - ch.source_locator.start
        assert ch.text[lo:lo + c["source_locator"]["end"] - c["source_locator"]["start"]] == c["quote"]
        assert any(d.isdigit() for d in c["quote"])


def test_snapshot_names_the_graph_it_was_built_with(wh_root):
    w = VersionedTables(wh_root)
    snap = w.latest(P.SNAPSHOT, "acme_reports").manifest["metadata"]
    assert snap["relation_graph"] == w.latest(RELATION_GRAPH, "acme_reports").version


def test_channel_reads_questions_zh_and_en(wh_root):
    ch = GraphChannel(load_relation_graph(VersionedTables(wh_root), "acme_reports"), resolve_dimensions())
    r = ch.read("Roll up ACME Group's 2023 revenue by subsidiary")
    assert (r.kind, r.metric, r.entities, r.period) == ("rollup", "revenue", ("ACME_GROUP",), "2023")
    r = ch.read("艾克美中国2023年毛利率与同业相比如何")
    assert (r.kind, r.metric, r.entities, r.period) == ("peers", "gross_margin", ("ACME_CN",), "2023")
    assert ch.read("where does ACME EU's 2023 gross margin come from").kind == "trace"
    assert ch.read("ACME US 2023 revenue").kind == "facts"
    assert ch.ask("why did the Lyon plant close") == []  # no metric, no entity: no rows


def test_every_row_cites_and_the_planted_figure_is_flagged(wh_root, chunk_by_id):
    g = load_relation_graph(VersionedTables(wh_root), "acme_reports")
    for kind, ent, met in (("rollup", "ACME_GROUP", "revenue"), ("peers", "ACME_CN", "gross_margin"),
                           ("trace", "ACME_EU", "gross_margin"), ("facts", "ACME_US", "revenue")):
        rows = query_rows(g, kind, ent, met, "2023")
        assert rows
        for row in rows:
            assert row["channel"] == "graph"
            assert_row_cites(row, chunk_by_id)
    flagged = [r for r in query_rows(g, "trace", "ACME_EU", "gross_margin", "2023") if r.get("flagged")]
    assert [r["value"] for r in flagged] == [36.5]
    total = next(r for r in query_rows(g, "rollup", "ACME_GROUP", "revenue", "2023")
                 if r["kind"] == "rollup_total" and r["unit"] == "CNY")
    assert total["value"] == pytest.approx(128.4e8) and len(total["citations"]) == 3


def test_rows_refuse_an_uncited_number():
    with pytest.raises(UncitedNumberError):
        rows_of([FactRow("ACME_CN", "revenue", "2023", 1.0, "CNY", 0.5, ())])


def run_cli(argv, capsys):
    rc = cli.main(argv)
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_cli_graph_commands(wh_root, chunk_by_id, capsys):
    wh = ["--warehouse", str(wh_root)]
    rc, out, _ = run_cli(["graph", "rollup", "ACME_GROUP", "revenue", "2023", "--json", *wh], capsys)
    rows = json.loads(out)
    assert rc == 0 and rows and {r["library_id"] for r in rows} == {"acme_reports"}
    for r in rows:
        assert_row_cites(r, chunk_by_id)
    rc, out, _ = run_cli(["graph", "trace", "ACME_EU", "gross_margin", "2023", "--store", "networkx",
                          "--library", "acme_reports", *wh], capsys)
    assert rc == 0 and "flagged=True" in out and '"36.5%"' in out and "acme_reports/ar2023_group_segments" in out
    rc, out, _ = run_cli(["graph", "ask", "艾克美中国2023年毛利率与同业相比如何", "--json", *wh], capsys)
    peers = json.loads(out)
    assert rc == 0 and [r["entity"] for r in peers] == ["ACME_EU", "ACME_US", "ACME_CN"]
    rc, _, err = run_cli(["graph", "peers", "NOPE", "revenue", "2023", *wh], capsys)
    assert rc == 2 and "graph peers: the relation graph has no entity:NOPE" in err
    rc, _, err = run_cli(["graph", "facts", "ACME_CN", "revenue", "2023", "--store", "neo4j", *wh], capsys)
    assert rc == 2 and "unknown graph store" in err
    rc, _, err = run_cli(["graph", "facts", "ACME_CN", "revenue", "2023", "--warehouse",
                          str(wh_root / "nothing")], capsys)
    assert rc == 2 and "no relation graph" in err


def test_cli_identical_across_stores(wh_root, capsys):
    outs = []
    for store in ("memory", "networkx"):
        rc, out, _ = run_cli(["graph", "rollup", "ACME_GROUP", "gross_profit", "2023", "--json", "--store", store,
                              "--warehouse", str(wh_root)], capsys)
        assert rc == 0
        outs.append(out)
    assert outs[0] == outs[1]


@pytest.fixture
def resource(wh_root):
    pytest.importorskip("dagster")
    sys.path.insert(0, str(ROOT))
    from resources import RetrievalResource

    return RetrievalResource(warehouse_root=str(wh_root))


def test_resource_graph_query_and_both_channels(resource, chunk_by_id):
    rows = resource.graph_query("peers", "ACME_CN", "gross_margin", "2023")
    assert [r["entity"] for r in rows] == ["ACME_EU", "ACME_US", "ACME_CN"]
    assert all(r["library_id"] == "acme_reports" for r in rows)
    both = resource.ask_channels("Roll up ACME Group's 2023 revenue by subsidiary", top_k=3)
    assert both["graph"] and both["narrative"]
    assert {r["channel"] for r in both["graph"]} == {"graph"}
    assert {s["channel"] for s in both["narrative"]} == {"narrative"}
    for r in both["graph"]:
        assert_row_cites(r, chunk_by_id)
    for s in both["narrative"]:
        assert s["sensitivity"] != "RESTRICTED" and s["library_id"] in LIBS
    assert resource.ask_channels("travel policy hotel limits", top_k=2)["graph"] == []
    assert both["themes"] == []  # no communities in this graph
    assert resource.graph_libraries() == sorted(LIBS)


def test_resource_routes_across_libraries(resource, monkeypatch):
    r = resource.retriever()
    assert callable(r.router)
    assert r.route("why did gross margin fall at ACME US") == ["acme_reports"]
    assert r.route("why close the Lyon plant") == sorted(LIBS)  # nothing matched: every library
    out = resource.ask("travel policy hotel limits", top_k=3)
    assert out and {s["library_id"] for s in out} == {"acme_policies"}
    monkeypatch.setenv("RAGSPINE_ROUTER", "none")
    assert resource.retriever().router is None
    monkeypatch.setenv("RAGSPINE_ROUTER", "magic")
    import dagster as dg

    with pytest.raises(dg.Failure, match="unknown router"):
        resource.retriever()


def test_resource_offers_themes_when_the_graph_has_communities(resource, wh_root):
    w = VersionedTables(wh_root)
    build_relation_graph(w, "acme_reports", communities=True)
    P.publish_snapshot(w, "acme_reports")
    try:
        both = resource.ask_channels("艾克美中国 营业收入 2023", top_k=2)
        assert both["themes"] and all(t["channel"] == "graph_theme" and t["citable"] is False
                                      and t["is_synthesis"] is True for t in both["themes"])
        assert both["graph"] and all(r["channel"] == "graph" for r in both["graph"])
    finally:
        build_relation_graph(w, "acme_reports", communities=False)
        P.publish_snapshot(w, "acme_reports")
