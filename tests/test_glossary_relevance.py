"""Glossary relevance on English (issue #28 item 5).

With the demo glossary on, "revenue" used to rank ten Chinese reports above the English
"ACME US revenue ..." ones: each Chinese synonym made a ranking that voted as much as the
user's own words. The variants now carry weights (``glossary.QueryVariant``) that the
fusion applies (``fusion.fuse_runs``); the committed benchmark table shows the glossary
never lowers nDCG@10 on any measured set.
"""

from __future__ import annotations

import json
import math

import pytest

from benchmarks.bench_glossary import SETS, engine_applies_weights
from benchmarks.common import COMMITTED_RESULTS as COMMITTED
from ragspine_pipeline.paths import DEMO_GLOSSARY
from ragspine_pipeline.retrieval.hybrid.fusion import (
    FusionConfig,
    Run,
    convex_fuse,
    fuse_runs,
    rrf_fuse,
    weighted_best,
    weighted_rrf_fuse,
)
from ragspine_pipeline.retrieval.lexical.analysis.glossary import (
    GlossaryGroup,
    GlossaryQueryRewriter,
    QueryVariant,
    query_variants,
    term_script,
)
from ragspine_pipeline.retrieval.query.gate import GatedRewriter, SecurityGate
from ragspine_pipeline.serving import open_published_retriever

REVENUE_MARKS = ("ACME US revenue", "ACME US grew revenue")
TABLE = COMMITTED / "glossary.json"


def demo_rewriter(**kw) -> GlossaryQueryRewriter:
    return GlossaryQueryRewriter.from_file(DEMO_GLOSSARY, **kw)


# ------------------------------------------------------------------ the weights
def test_term_script_names_the_script_of_the_first_letter():
    assert [term_script(t) for t in ("营收", "revenue", "ACME_US", "выручка", "2023")] == \
        ["cjk", "latin", "latin", "cyrillic", "other"]


def test_revenue_variants_weigh_half_the_original_together_and_chinese_less_than_english():
    variants = demo_rewriter().variants("revenue")
    assert [v.text for v in variants] == ["revenue", "营收", "营业收入", "收入", "sales"]
    assert variants[0] == QueryVariant("revenue", 1.0, False)
    assert math.isclose(sum(v.weight for v in variants[1:]), 0.5)
    by_text = {v.text: v for v in variants}
    assert all(by_text[t].cross_language for t in ("营收", "营业收入", "收入"))
    assert not by_text["sales"].cross_language
    # the query's own language first: a same-language synonym weighs twice a cross-language one
    assert math.isclose(by_text["sales"].weight, 2 * by_text["营收"].weight)


def test_weights_scale_only_above_the_budget_and_rewrite_keeps_its_texts():
    rw = GlossaryQueryRewriter(groups=[GlossaryGroup(("ACME US", "ACME_US", "艾克美美国"))])
    assert [(v.text, v.weight) for v in rw.variants("ACME US revenue")] == \
        [("ACME US revenue", 1.0), ("acme_us revenue", 0.5 / 1.5), ("艾克美美国 revenue", 0.25 / 1.5)]
    roomy = GlossaryQueryRewriter(groups=rw.groups, variant_budget=2.0)
    assert [v.weight for v in roomy.variants("ACME US revenue")] == [1.0, 1.0, 0.5]  # under budget: as is
    assert rw.rewrite("ACME US revenue") == [v.text for v in rw.variants("ACME US revenue")]
    assert rw.variants("nothing here") == [QueryVariant("nothing here")]


@pytest.mark.parametrize("bad", [{"variant_budget": -1}, {"variant_budget": float("inf")},
                                 {"cross_language_weight": 1.5}, {"cross_language_weight": True}])
def test_bad_weights_are_errors(bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        GlossaryQueryRewriter(**bad)


def test_query_variants_of_any_rewriter():
    class TextsOnly:
        def rewrite(self, q):
            return [q, q + " x"]

    assert query_variants(None, "q") == [QueryVariant("q")]
    assert query_variants(TextsOnly(), "q") == [QueryVariant("q"), QueryVariant("q x")]  # unweighted: all 1
    assert query_variants(demo_rewriter(), "revenue") == demo_rewriter().variants("revenue")


def test_the_gate_keeps_the_weights_of_the_variants_it_lets_through():
    inner = GlossaryQueryRewriter(groups=[GlossaryGroup(("revenue", "sales", "RivalCo revenue"))])
    gated = GatedRewriter(inner, SecurityGate(competitors=["RivalCo"]))
    kept = gated.variants("revenue")
    assert [v.text for v in kept] == ["revenue", "sales"]
    assert kept[1] == inner.variants("revenue")[1]
    assert gated.rewrite("revenue") == ["revenue", "sales"]


# ------------------------------------------------------------------ the fusion
RANKS = [Run([3, 1, 2], [9.0, 5.0, 1.0]), Run([2, 4], [7.0, 3.0]), Run([1, 5, 3], [0.9, 0.5, 0.1])]


def test_unit_weights_fuse_exactly_as_before():
    rrf = FusionConfig()
    assert fuse_runs(RANKS[:2], RANKS[2:], rrf, top_k=10) == \
        list(rrf_fuse([r.ids for r in RANKS]).items())
    assert fuse_runs(RANKS[:1], [], rrf, top_k=2) == [(3, 1 / 61), (1, 1 / 62)]
    w = FusionConfig(method="weighted_rrf", dense_weight=0.5)
    assert fuse_runs(RANKS[:2], RANKS[2:], w, top_k=10) == \
        list(weighted_rrf_fuse([(RANKS[0].ids, 1.0), (RANKS[1].ids, 1.0), (RANKS[2].ids, 0.5)]).items())
    convex = FusionConfig(method="convex", dense_weight=0.3)
    bm25_best = {3: 9.0, 1: 5.0, 2: 7.0, 4: 3.0}
    dense_best = {1: 0.9, 5: 0.5, 3: 0.1}
    assert fuse_runs(RANKS[:2], RANKS[2:], convex, top_k=10) == list(convex_fuse(bm25_best, dense_best, 0.3).items())


def test_variant_weights_enter_every_fusion():
    original, variant = Run([1, 2], [4.0, 3.0]), Run([3, 2], [8.0, 1.0], weight=0.25)
    assert fuse_runs([original, variant], [], FusionConfig(), top_k=3) == \
        list(weighted_rrf_fuse([([1, 2], 1.0), ([3, 2], 0.25)]).items())
    assert weighted_best([original, variant], positive_only=True) == {1: 4.0, 2: 3.0, 3: 2.0}
    w = FusionConfig(method="weighted_rrf", dense_weight=0.5)
    assert fuse_runs([original], [variant], w, top_k=3) == \
        list(weighted_rrf_fuse([([1, 2], 1.0), ([3, 2], 0.125)]).items())
    with pytest.raises(ValueError, match="one score per id"):
        weighted_best([Run([1, 2], [1.0])])


def test_a_document_only_the_variants_find_stays_below_the_originals_top_61():
    """The budget's guarantee under RRF (k=60): variants weighing 0.5 together put a
    document they alone find (even first in every one) below the original's 61st."""
    variants = demo_rewriter().variants("revenue")
    original = Run(list(range(100, 161)), [1.0] * 61)
    runs = [original] + [Run([7], [50.0], v.weight) for v in variants[1:]]
    fused = [i for i, _ in fuse_runs(runs, [], FusionConfig(), top_k=100)]
    assert fused.index(7) == 61


# ------------------------------------------------------------------ end to end
# The weights take effect where HybridRetriever fuses its per-variant rankings; until its
# ``_fused`` calls ``query_variants`` and ``fuse_runs`` these fail (strictly expected).
needs_weighted_fusion = pytest.mark.xfail(
    not engine_applies_weights(), strict=True,
    reason="HybridRetriever._fused does not apply the variant weights yet (see fusion.fuse_runs)")


@pytest.fixture
def demo_env(monkeypatch):
    for var in ("RAGSPINE_GLOSSARY", "RAGSPINE_ROUTER", "RAGSPINE_FUSION", "RAGSPINE_FUSION_DENSE_WEIGHT",
                "RAGSPINE_LIBRARY_MIN_STRENGTH", "RAGSPINE_QUERY_TRANSFORM"):
        monkeypatch.delenv(var, raising=False)


def _top(retriever, **kw) -> tuple[list[int], list[int], list[tuple[str, str]]]:
    top = retriever.retrieve("revenue", top_k=10, **kw)
    us = [i for i, s in enumerate(top) if any(m in s["text"] for m in REVENUE_MARKS)]
    zh = [i for i, s in enumerate(top) if s["language"] == "zh"]
    return us, zh, [(s["doc_id"], s["language"]) for s in top]


@needs_weighted_fusion
@pytest.mark.parametrize("mode", ["bm25", "hybrid"])
def test_revenue_ranks_the_english_acme_us_reports_above_chinese_ones(published_demo, demo_env, mode):
    """The issue's example in the library that holds the reports, glossary on (the
    default): every English "ACME US revenue" report in the top 8, above every Chinese one
    (before: ten Chinese reports first, the US ones 11th and later)."""
    us, zh, shown = _top(open_published_retriever(published_demo, "acme_reports", mode=mode))
    assert len(us) == 2 and max(us) < 8, shown
    assert not zh or max(us) < min(zh), shown


@needs_weighted_fusion
def test_revenue_through_the_cli_door_keeps_english_first(published_demo, demo_env):
    """Both libraries, as ``ragspine query revenue --mode bm25`` serves them. Libraries are
    fused by rank (``MultiIndexRetriever``), so the policies library's second hit -- a
    Chinese policy only a glossary variant finds -- may sit third; the reports' Chinese
    hits come after their English ones (before: seven Chinese snippets in the top 8)."""
    from ragspine_pipeline.cli import open_retriever

    us, zh, shown = _top(open_retriever(published_demo, mode="bm25", embedding=None, progress=False))
    assert len(us) == 2 and max(us) < 8, shown
    assert min(us) < min(zh, default=10) and len([i for i in zh if i < 8]) <= 1, shown


def test_cross_language_recall_is_kept_when_the_original_finds_nothing(published_demo, demo_env):
    """Weights rank; they never drop a variant: an English word over Chinese documents
    only still finds the Chinese revenue reports through the glossary."""
    on = open_published_retriever(published_demo, "acme_reports", mode="bm25")
    off = open_published_retriever(published_demo, "acme_reports", mode="bm25", glossary=False)
    zh_only = {"language": "zh"}
    assert [s for s in off.retrieve("revenue", filters=zh_only, top_k=5) if not s["filters_relaxed"]] == []
    found = on.retrieve("revenue", filters=zh_only, top_k=5)
    assert found and all(s["language"] == "zh" and not s["filters_relaxed"] for s in found)
    assert all("营业收入" in s["text"] or "营收" in s["text"] or "收入" in s["text"] for s in found)


# ------------------------------------------------------------------ the committed table
def test_committed_table_shows_the_glossary_never_lowers_ndcg():
    report = json.loads(TABLE.read_text(encoding="utf-8"))
    rows = report["rows"]
    sets = {r["set"] for r in rows}
    assert set(SETS) <= sets and any(s.startswith("golden:") for s in sets)
    assert "bm25" in {r["mode"] for r in rows}
    assert report["weights_applied"] is True  # measured with the weighted fusion in place
    for r in rows:
        assert r["after"] >= r["off"], r
    bm25 = report["revenue"]["bm25"]
    assert bm25["before"].split()[:8].count("ZH") > bm25["after"].split()[:8].count("ZH")
    assert (COMMITTED / "glossary.md").read_text(encoding="utf-8").count("| ") > len(rows)
