"""RESTRICTED never reaches a judge prompt nor a snippet, whatever the corpus, filter or judge."""

import json

from hypothesis import given
from hypothesis import strategies as st

from ragspine_pipeline.llm.provider import ScriptedProvider
from ragspine_pipeline.retrieval.chunking.chunking import chunk_document
from ragspine_pipeline.retrieval.link.narrative_link import (
    NarrativeIndex,
    NarrativeIndexRetriever,
    retriever_for_index,
)
from ragspine_pipeline.retrieval.rerank.listwise_rerank import (
    ListwiseReranker,
    ProviderListwiseJudge,
    listwise_rerank,
)
from ragspine_pipeline.retrieval.vector.embedding_backends import DeterministicHashBackend
from ragspine_pipeline.sensitivity import RESTRICTED_SENSITIVITY, is_restricted

WORDS = ["revenue", "margin", "why", "fell", "营收", "下滑", "tariff", "plant"]
LABELS = ["RESTRICTED", "restricted ", " Restricted", "PUBLIC", "INTERNAL", "", "CONFIDENTIAL",
          # odd spellings and types fail closed (counted as RESTRICTED by is_restricted)
          "RESTRI\u200bCTED", "\ufeffRESTRICTED", "RESTRICTED\x00", "ＲＥＳＴＲＩＣＴＥＤ", "\u0420UBLIC",
          "PUBLIC?", ["PUBLIC"], {"label": "PUBLIC"}, 1, True]


@st.composite
def corpora(draw):
    n = draw(st.integers(1, 12))
    docs = []
    for i in range(n):
        words = draw(st.lists(st.sampled_from(WORDS), min_size=1, max_size=8))
        label = draw(st.sampled_from(LABELS))
        marker = f"SECRET{i}X" if is_restricted(label) else f"open{i}x"
        docs.append((f"d{i}", " ".join(words) + f" {marker}", label,
                     draw(st.sampled_from(["A", "B"]))))
    return docs


def judges():
    def garbage(prompt):
        return "I cannot rank these 🙃 [99] [0] [-3]"

    def raiser(prompt):
        raise RuntimeError("judge down")

    def reverse(prompt):
        n = prompt.count("\n[")
        return " > ".join(f"[{i}]" for i in range(n, 0, -1))

    return st.sampled_from([garbage, raiser, reverse, lambda p: "", lambda p: "[1] > [1] > [2]"])


def build(docs, provider, dense):
    chunks = []
    for doc_id, text, label, ent in docs:
        chunks += chunk_document(text, doc_id=doc_id, metadata={"sensitivity": label, "entity": ent})
    index = NarrativeIndex.from_chunks(chunks, embedding_backend=DeterministicHashBackend() if dense else None)
    return retriever_for_index(index, provider)


@given(corpora(), judges(), st.sampled_from([None, {"entity": "A"}, {"entity": {"ne": "A"}}]),
       st.sampled_from(WORDS), st.booleans(), st.integers(1, 20))
def test_restricted_never_in_prompt_or_snippet(docs, judge_fn, filters, query, dense, top_k):
    provider = ScriptedProvider(judge_fn)
    retriever = build(docs, provider, dense)
    snippets = retriever.retrieve(query, filters=filters, top_k=top_k)
    blob = json.dumps(snippets, ensure_ascii=False)
    for prompt in provider.prompts:
        assert "SECRET" not in prompt
    assert "SECRET" not in blob
    assert all(not is_restricted(s["sensitivity"]) for s in snippets)
    open_docs = {d for d, _, label, _ in docs if not is_restricted(label)}
    assert {s["doc_id"] for s in snippets} <= open_docs
    assert len(snippets) <= top_k


def test_judge_not_called_when_all_restricted():
    provider = ScriptedProvider(["[2] > [1]"])
    docs = [(f"d{i}", f"revenue fell SECRET{i}X", "RESTRICTED", "A") for i in range(4)]
    retriever = build(docs, provider, dense=False)
    assert retriever.retrieve("revenue") == []
    assert provider.prompts == []


def test_listwise_rerank_keeps_restricted_positions_and_hides_them():
    results = [
        {"chunk_id": "a", "text": "open a", "sensitivity": "PUBLIC"},
        {"chunk_id": "r", "text": "SECRET", "sensitivity": RESTRICTED_SENSITIVITY},
        {"chunk_id": "b", "text": "open b", "sensitivity": "PUBLIC"},
        {"chunk_id": "c", "text": "open c", "sensitivity": "INTERNAL"},
    ]
    seen = []

    class Judge:
        def judge(self, query, passages):
            seen.append(list(passages))
            return [2, 1, 0]

    out = listwise_rerank("q", results, Judge())
    assert [r["chunk_id"] for r in out] == ["c", "r", "b", "a"]
    assert seen == [["open a", "open b", "open c"]]


def test_listwise_rerank_identity_on_failure_and_never_raises():
    results = [{"chunk_id": str(i), "text": f"t{i}", "sensitivity": "PUBLIC"} for i in range(5)]

    class Bad:
        def __init__(self, answer):
            self.answer = answer

        def judge(self, query, passages):
            if isinstance(self.answer, Exception):
                raise self.answer
            return self.answer

    for answer in (RuntimeError("x"), [0, 0, 1, 2, 3], [0, 1], None, "0 1 2 3 4", [4.0, 3, 2, 1, 0],
                   [True, False, 2, 3, 4], [5, 4, 3, 2, 1]):
        assert listwise_rerank("q", results, Bad(answer)) == results
    assert [r["chunk_id"] for r in listwise_rerank("q", results, Bad([4, 3, 2, 1, 0]), top_n=5)] == ["4", "3", "2", "1", "0"]
    assert listwise_rerank("q", [], Bad([0])) == []
    # Beyond top_n the order is untouched.
    out = listwise_rerank("q", results, Bad([1, 0]), top_n=2)
    assert [r["chunk_id"] for r in out] == ["1", "0", "2", "3", "4"]


def test_guarded_rerank_for_any_reranker():
    """A local reranker that would leak or drop items is ignored; restricted stay hidden."""
    docs = [("d0", "revenue fell open0x", "PUBLIC", "A"), ("d1", "revenue fell SECRET1X", "RESTRICTED", "A"),
            ("d2", "revenue open2x", "PUBLIC", "A")]
    shown = []

    class Local:
        def rerank(self, query, candidates):
            shown.extend(c["text"] for c in candidates)
            return list(reversed(candidates))

    chunks = []
    for doc_id, text, label, _ent in docs:
        chunks += chunk_document(text, doc_id=doc_id, metadata={"sensitivity": label})
    r = NarrativeIndexRetriever(NarrativeIndex.from_chunks(chunks), reranker=Local())
    out = r.retrieve("revenue fell")
    assert all("SECRET" not in t for t in shown) and shown
    assert [s["doc_id"] for s in out] == ["d2", "d0"]

    class Dropper:
        def rerank(self, query, candidates):
            return candidates[:1]

    r2 = NarrativeIndexRetriever(NarrativeIndex.from_chunks(chunks), reranker=Dropper())
    assert [s["doc_id"] for s in r2.retrieve("revenue fell")] == ["d0", "d2"]


def test_provider_judge_end_to_end_reorders():
    docs = [(f"d{i}", f"revenue report {i} open{i}x", "PUBLIC", "A") for i in range(3)]
    provider = ScriptedProvider(["[3] > [2] > [1]"])
    plain = [s["doc_id"] for s in build(docs, None, False).retrieve("revenue report")]
    ranked = [s["doc_id"] for s in build(docs, provider, False).retrieve("revenue report")]
    assert ranked == list(reversed(plain))
    assert len(provider.prompts) == 1
    assert isinstance(build(docs, provider, False).reranker, ListwiseReranker)
    assert isinstance(build(docs, provider, False).reranker.judge, ProviderListwiseJudge)
