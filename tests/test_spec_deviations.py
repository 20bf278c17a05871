"""Spec probes for issue #26, item 3: user code written straight from the spec.

Each test uses only names the spec spells (its ``ragspine.`` is ``ragspine_pipeline.``
here) and checks the behaviour the spec promises where the engine used to differ:
``listwise_rerank`` never raises; ``MultiIndexRetriever`` fuses every selected library;
``ChunkStore(path)`` migrates an older SQLite chunk store additively (tests in
``test_chunk_store_sqlite.py``).
"""

import logging

import pytest

from ragspine_pipeline.retrieval.chunking.chunking import chunk_document
from ragspine_pipeline.retrieval.lexical.retrieval import HybridRetriever
from ragspine_pipeline.retrieval.link.multi_index import MultiIndexRetriever
from ragspine_pipeline.retrieval.link.narrative_link import NarrativeIndex, NarrativeIndexRetriever
from ragspine_pipeline.retrieval.rerank.listwise_rerank import DEFAULT_TOP_N, listwise_rerank

LOGGER = "ragspine_pipeline.retrieval.rerank.listwise_rerank"


def chunks(doc_id, text, sensitivity="INTERNAL"):
    return chunk_document(text, doc_id=doc_id, metadata={"sensitivity": sensitivity})


def hits():
    """RRF results as the spec hands them to the judge: the retriever's hits."""
    docs = [("a", "revenue fell revenue fell"), ("r", "revenue fell SECRET", "RESTRICTED"),
            ("b", "revenue fell in China"), ("c", "revenue and other words")]
    out = HybridRetriever([c for d in docs for c in chunks(*d)]).search("revenue fell", top_k=4)
    assert [h.chunk.doc_id for h in out] == ["a", "b", "r", "c"]
    return out


# ------------------------------------------------------------ listwise_rerank never raises
class NotAJudge:  # no judge(): e.g. a provider or a reranker passed by mistake
    def chat(self, messages, **options):
        raise AssertionError("never called")


class Raises:
    def __init__(self):
        self.shown = []

    def judge(self, query, candidates):
        self.shown.append(list(candidates))
        raise RuntimeError("model down")


class Answers:
    def __init__(self, answer):
        self.answer, self.shown = answer, []

    def judge(self, query, candidates):
        self.shown.append(list(candidates))
        return self.answer


@pytest.mark.parametrize("judge", [NotAJudge(), object(), None, "judge", Raises(),
                                   Answers("[2] > [1]"), Answers([0, 0, 1]), Answers([0, 1]),
                                   Answers([2, 1, 0, 3]), Answers([True, False, 2]), Answers(None),
                                   Answers([2.0, 1.0, 0.0]), Answers({"order": [2, 1, 0]})])
def test_listwise_rerank_never_raises_and_keeps_the_rrf_order(judge, caplog):
    results = hits()
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        out = listwise_rerank("why did revenue fall", results, judge)
    assert out == results  # the RRF order, every result kept
    assert any("RRF order is kept" in r.getMessage() for r in caplog.records if r.name == LOGGER)
    for shown in getattr(judge, "shown", []):
        assert all("SECRET" not in text for text in shown)  # exit #1 even when the judge fails


def test_a_non_judge_is_named_in_the_warning():
    class Provider:
        def chat(self, messages, **options):
            return "[1]"

    records = []
    handler = logging.Handler()
    handler.emit = records.append
    log = logging.getLogger(LOGGER)
    log.addHandler(handler)
    try:
        assert listwise_rerank("q", hits(), Provider()) == hits()
    finally:
        log.removeHandler(handler)
    (msg,) = [r.getMessage() for r in records]
    assert "Provider is not a ListwiseJudge" in msg and "ProviderListwiseJudge(provider)" in msg


def test_listwise_rerank_bad_inputs_do_not_raise():
    class Reverse:
        def judge(self, query, candidates):
            return list(range(len(candidates)))[::-1]

    assert listwise_rerank("q", None, Reverse()) == []  # not iterable
    assert listwise_rerank("q", [], NotAJudge()) == []
    never = Raises()  # objects without a sensitivity fail closed: never shown to a judge
    assert listwise_rerank("q", [1, 2, 3], never) == [1, 2, 3] and never.shown == []
    dicts = [{"chunk_id": str(i), "text": f"t{i}", "sensitivity": "PUBLIC"} for i in range(3)]
    assert [d["chunk_id"] for d in listwise_rerank("q", dicts, Reverse())] == ["2", "1", "0"]
    results = hits()
    assert listwise_rerank("q", results, Reverse(), top_n="ten") == results  # a bad top_n
    assert DEFAULT_TOP_N == 10


def test_exit_1_still_holds_with_a_working_judge():
    judge = Answers([2, 1, 0])
    out = listwise_rerank("why did revenue fall", hits(), judge)
    assert judge.shown == [["revenue fell revenue fell", "revenue fell in China", "revenue and other words"]]
    assert [h.chunk.doc_id for h in out] == ["c", "b", "r", "a"]  # RESTRICTED keeps its RRF slot
    restricted_only = [h for h in hits() if h.chunk.doc_id == "r"]
    never = Raises()
    assert listwise_rerank("q", restricted_only, never) == restricted_only and never.shown == []


# ------------------------------------------------ MultiIndexRetriever fuses every library
def library(name, docs):
    return NarrativeIndexRetriever(NarrativeIndex.from_chunks(
        [c for d, text in docs for c in chunks(f"{name}/{d}", text)], library_id=name))


@pytest.fixture()
def strong_and_weak():
    """``policies`` matches the question weakly: under half of ``reports``' best BM25."""
    filler = [(f"f{i}", f"unrelated filler text number {i} about weather") for i in range(6)]
    reports = library("reports", [("r1", "lyon plant closure energy costs lyon"), ("r2", "lyon plant closure")]
                      + filler)
    policies = library("policies", [("p1", "a long travel policy that mentions a plant once among very many "
                                           "other words about hotels flights meals receipts and approvals")]
                       + filler)
    best = {n: r.retrieve("lyon plant closure", top_k=1)[0]["scores"]["bm25"]
            for n, r in (("reports", reports), ("policies", policies))}
    assert best["policies"] < 0.5 * best["reports"]
    return {"reports": reports, "policies": policies}


def test_multi_index_fuses_every_selected_library_by_default(strong_and_weak):
    retriever = MultiIndexRetriever(strong_and_weak)
    snippets = retriever.retrieve("lyon plant closure", top_k=10)
    assert {s["library_id"] for s in snippets} == {"reports", "policies"}
    assert "policies/p1" in {s["doc_id"] for s in snippets}
    assert [s["rank"] for s in snippets] == list(range(1, len(snippets) + 1))
    assert retriever.min_relative_strength == 0.0


def test_strength_gate_is_opt_in_by_argument_or_variable(strong_and_weak, monkeypatch):
    gated = MultiIndexRetriever(strong_and_weak, min_relative_strength=0.5)
    assert {s["library_id"] for s in gated.retrieve("lyon plant closure", top_k=10)} == {"reports"}
    monkeypatch.setenv("RAGSPINE_LIBRARY_MIN_STRENGTH", "0.5")
    from_env = MultiIndexRetriever(strong_and_weak)
    assert from_env.min_relative_strength == 0.5
    assert {s["library_id"] for s in from_env.retrieve("lyon plant closure", top_k=10)} == {"reports"}
    # the argument wins over the variable
    assert {s["library_id"] for s in MultiIndexRetriever(strong_and_weak, min_relative_strength=0.0)
            .retrieve("lyon plant closure", top_k=10)} == {"reports", "policies"}
    monkeypatch.setenv("RAGSPINE_LIBRARY_MIN_STRENGTH", "")
    assert MultiIndexRetriever(strong_and_weak).min_relative_strength == 0.0


@pytest.mark.parametrize("bad", ["half", "1.5", "-0.1", "nan"])
def test_a_bad_gate_value_names_the_variable(strong_and_weak, monkeypatch, bad):
    monkeypatch.setenv("RAGSPINE_LIBRARY_MIN_STRENGTH", bad)
    with pytest.raises(ValueError, match=rf"RAGSPINE_LIBRARY_MIN_STRENGTH='{bad}': use a number in \[0, 1\]"):
        MultiIndexRetriever(strong_and_weak)
