"""One ranking across libraries weighs a query against the libraries of its language
(issue 43, item 1): unrelated libraries in another language leave a split library's
ranking as it is, nothing is dropped, and the query's language is told from a few words."""

import random

import pytest

from ragspine_pipeline.retrieval.chunking.chunking import chunk_document
from ragspine_pipeline.retrieval.link.language_scope import (
    library_groups,
    query_groups,
    stats_scope,
)
from ragspine_pipeline.retrieval.link.multi_index import MultiIndexRetriever
from ragspine_pipeline.retrieval.link.narrative_link import NarrativeIndex, NarrativeIndexRetriever


@pytest.mark.parametrize(("query", "groups"), [
    ("Wie viele Bälle fing Josh Norman ab?", {"latin"}),
    ("Wer gewann die erfolgreiche 2-Point Conversion?", {"latin"}),
    ("what is the effect of cross sectional shape on the flow", {"en"}),
    ("Incidence rates of cervical cancer have decreased.", {"en"}),
    ("Tesla patents", {"en", "latin"}),  # no function word: cannot tell, every Latin library
    ("Was ist Tesla?", {"en", "latin"}),  # "was" is English and German: one German word against it
    ("《宇宙奇兵》是什么？", {"cjk"}),
    ("MonoDevelop主要是用来开发什么的？", {"cjk"}),  # a Latin name borrowed into a Chinese question
    ("NFL ใครเป็นผู้ร้องเพลงชาติ", {"thai"}),
    ("من فاز بالسوبر بول 49؟", {"arabic"}),
    ("Кто выиграл Суперкубок XLIX?", {"cyrillic"}),
    ("who is 毛泽东", {"en", "cjk"}),
])
def test_query_language_from_a_few_words(query, groups):
    assert query_groups(query) == frozenset(groups)


def test_query_without_letters_has_no_language():
    assert query_groups("2024 / 50") is None


rnd = random.Random(5)
DE_WORDS = [f"wort{i}" for i in range(40)]
EN_WORDS = [f"term{i}" for i in range(40)]


def de_doc(i):
    return " ".join(["der", "die", "und", "ist", *rnd.sample(DE_WORDS, 6 + i % 5), "mit", "von"])


def en_doc(i):
    return " ".join(["the", "of", "and", "is", *rnd.sample(EN_WORDS, 6 + i % 5), "with", "from", "wort3"])


def library(docs, name, label="PUBLIC"):
    chunks = []
    for doc_id, text in docs:
        chunks += chunk_document(text, doc_id=doc_id, metadata={"sensitivity": label})
    return NarrativeIndexRetriever(NarrativeIndex.from_chunks(chunks, library_id=name, exclude_restricted=False))


GERMAN = [(f"de{i:03d}", de_doc(i)) for i in range(60)]
ENGLISH = [(f"en{i:03d}", en_doc(i) + (" quasar" if i == 7 else "")) for i in range(300)]


def libraries():
    return {"de0": library(GERMAN[0::2], "de0"), "de1": library(GERMAN[1::2], "de1"),
            "noise": library(ENGLISH, "noise")}


def fused_falls(out):
    return all(a["scores"]["fused"] >= b["scores"]["fused"] for a, b in zip(out, out[1:], strict=False))


def test_unrelated_language_library_leaves_the_split_ranking_as_one_library():
    one = library(GERMAN, "one")
    libs = libraries()
    parts = {lib: r.index.retriever for lib, r in libs.items()}
    assert library_groups(parts["de0"]) == {"latin"} and library_groups(parts["noise"]) == {"en"}
    scoped = MultiIndexRetriever(libs, fusion="global")
    split = MultiIndexRetriever({lib: libs[lib] for lib in ("de0", "de1")}, fusion="global")
    union = MultiIndexRetriever(libs, fusion="global", language_scope=False)
    moved = 0
    for q in ("Wie ist der wort5 und wort17?", "Wer ist die wort2 wort9 wort30 von wort3?", "Wo ist der wort1?"):
        assert stats_scope(parts, q, sorted(parts)) == ["de0", "de1"]
        ref = one.retrieve(q, top_k=10)
        out = scoped.retrieve(q, top_k=10)
        assert [s["doc_id"] for s in out] == [s["doc_id"] for s in split.retrieve(q, top_k=10)], q
        for a, b in zip(out, ref, strict=True):  # the one library's scores (ties may swap places)
            assert a["scores"]["bm25"] == pytest.approx(b["scores"]["bm25"], rel=1e-9)
        assert fused_falls(out) and scoped.last["bm25_scope"] == {q: ["de0", "de1"]}
        # Without the scope the English library's 300 documents move every idf of the query.
        old = union.retrieve(q, top_k=10)
        moved += any(a["scores"]["bm25"] != pytest.approx(b["scores"]["bm25"], rel=1e-6)
                     for a, b in zip(old, ref, strict=False))
    assert moved == 3


def test_a_query_the_scope_cannot_answer_is_weighed_against_every_library():
    """Nothing is dropped: a German question whose best match is in the English library
    (its German words are only function words) is answered by the union, and one whose
    words only the English library holds gets the English documents."""
    libs = libraries()
    m = MultiIndexRetriever(libs, fusion="global")
    out = m.retrieve("Wo ist der quasar?", top_k=5)
    assert out[0]["doc_id"] == "en007" and fused_falls(out)
    assert [s["doc_id"] for s in out] == [s["doc_id"] for s in MultiIndexRetriever(
        libs, fusion="global", language_scope=False).retrieve("Wo ist der quasar?", top_k=5)]
    assert m.last["bm25_scope"] == {}  # the union answered
    out = m.retrieve("quasar wird term7", top_k=5)
    assert out[0]["doc_id"] == "en007" and {s["library_id"] for s in out} == {"noise"}
    # A query whose language no library holds (Thai) is weighed against all of them.
    parts = {lib: r.index.retriever for lib, r in libs.items()}
    assert stats_scope(parts, "ใครเป็น wort3", sorted(parts)) == sorted(parts)
    out = MultiIndexRetriever(libs, fusion="global").retrieve("ใครเป็น wort3", top_k=10)
    assert {s["library_id"] for s in out} >= {"noise"}


def test_same_language_libraries_stay_in_one_scope():
    """An English query over English libraries: every library is in scope (the union)."""
    libs = {"a": library(ENGLISH[:150], "a"), "b": library(ENGLISH[150:], "b"), "de": library(GERMAN, "de")}
    parts = {lib: r.index.retriever for lib, r in libs.items()}
    assert stats_scope(parts, "what is the term4 of term8", sorted(parts)) == ["a", "b"]
    one = library(ENGLISH, "one")
    q = "what is the term4 of term8"
    ref = one.retrieve(q, top_k=10)
    out = MultiIndexRetriever(libs, fusion="global").retrieve(q, top_k=10)
    assert [s["doc_id"] for s in out] == [s["doc_id"] for s in ref]


def test_restricted_chunks_do_not_decide_a_library_language():
    """The scope is read from open chunks only: a library whose German text is all
    RESTRICTED is not a German library (its restricted text cannot steer a ranking)."""
    hidden = library(GERMAN[:20], "hidden", label="RESTRICTED").index.retriever
    assert library_groups(hidden) == frozenset()


def test_libraries_of_different_models_answer_dense_in_the_query_language():
    """``auto`` embeds a German library with one model and an English one with another,
    and may fuse them differently: the question's language decides which library's model
    answers the dense channel and whose fusion holds (``last["dense_scope"]``), as it
    decides the BM25 statistics; a German question then ranks as the German library alone."""
    from ragspine_pipeline.retrieval.hybrid.fusion import FusionConfig
    from ragspine_pipeline.retrieval.link.global_rank import rank_union
    from ragspine_pipeline.retrieval.vector.embedding_backends import DeterministicHashBackend

    def build(docs, name, dim, fusion):
        chunks = [c for d, t in docs for c in chunk_document(t, doc_id=d, metadata={"sensitivity": "PUBLIC"})]
        ix = NarrativeIndex.from_chunks(chunks, library_id=name, embedding_backend=DeterministicHashBackend(dim=dim))
        ix.retriever.fusion = fusion
        return ix

    convex = FusionConfig(method="convex", dense_weight=0.7, source="auto:latin")
    de = build(GERMAN, "de", 16, convex)
    en = build(ENGLISH[:60], "en", 24, FusionConfig(method="convex", dense_weight=0.5, source="auto:en"))
    parts = {"de": de.retriever, "en": en.retriever}
    q = "Wie ist der wort5 und wort17?"
    report: dict = {}
    hits = rank_union(parts, q, None, 10, report=report)
    assert report["dense_scope"] == ["de"]
    assert {h.library_id for h in hits} == {"de"} and all(h.hit.fusion["dense"] == "raw_cosine" for h in hits)
    assert all(h.hit.fusion["method"] == "convex" and h.hit.fusion["dense_weight"] == 0.7 for h in hits)
    alone = rank_union({"de": de.retriever}, q, None, 10)
    assert [(h.hit.position, h.hit.fused) for h in hits] == [(h.hit.position, h.hit.fused) for h in alone]
    report = {}
    rank_union(parts, "What is the term5 of the term17?", None, 10, report=report)
    assert report["dense_scope"] == ["en"]
    # No function word, so no language: the text it matches best decides (the German library).
    report = {}
    rank_union(parts, "wort5 wort17", None, 10, report=report)
    assert report["dense_scope"] == ["de"]
    report = {}
    rank_union(parts, "term5 term17", None, 10, report=report)
    assert report["dense_scope"] == ["en"]
    # One model and one fusion everywhere: the union's rule, no scope.
    report = {}
    rank_union({"de": de.retriever, "de2": de.retriever}, q, None, 10, report=report)
    assert "dense_scope" not in report
