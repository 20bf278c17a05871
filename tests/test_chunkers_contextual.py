"""Contextual retrieval (RAGSPINE_CONTEXTUAL / make_index_text_fn): a metadata-only header
on what BM25 indexes and the dense channel embeds; snippets and citations unchanged."""

from __future__ import annotations

import pytest

from ragspine_pipeline.corpus import make_chunker
from ragspine_pipeline.ingest.documents import Document
from ragspine_pipeline.retrieval.chunking.contextual import contextual_header, make_index_text_fn
from ragspine_pipeline.retrieval.link.narrative_link import NarrativeIndex, NarrativeIndexRetriever
from ragspine_pipeline.retrieval.vector.embedding_backends import DeterministicHashBackend

DOCS = [
    Document("lib/zeta", "Zeta Logistics annual filing", "# Results\n\nRevenue rose by four percent.",
             {"entity": "Zeta Logistics", "period": "2023"}),
    Document("lib/omega", "Omega Foods annual filing", "# Results\n\nRevenue fell by two percent.",
             {"entity": "Omega Foods", "period": "2022"}),
]


def _chunks():
    chunker = make_chunker("layout")
    return [c for d in DOCS for c in chunker(d)]


def test_off_by_default_the_index_text_is_the_chunk_text(monkeypatch):
    monkeypatch.delenv("RAGSPINE_CONTEXTUAL", raising=False)
    c = _chunks()[0]
    assert make_index_text_fn()(c) == c.text
    assert make_index_text_fn("off")(c) == c.text


def test_header_is_built_from_metadata_only():
    c = _chunks()[0]
    assert contextual_header(c) == "Zeta Logistics annual filing · Zeta Logistics · 2023 · Results"
    assert make_index_text_fn("on")(c) == f"{contextual_header(c)}\n\n{c.text}"
    assert make_index_text_fn("title,heading")(c).startswith("Zeta Logistics annual filing · Results\n\n")
    bare = c.with_(title="", entity="", period="", heading="")
    assert make_index_text_fn("on")(bare) == bare.text  # nothing to say: nothing invented
    with pytest.raises(ValueError, match="RAGSPINE_CONTEXTUAL"):
        make_index_text_fn("title,summary")


def test_bm25_finds_a_chunk_by_its_header_and_the_snippet_is_unchanged(monkeypatch):
    chunks = _chunks()
    monkeypatch.delenv("RAGSPINE_CONTEXTUAL", raising=False)
    plain = NarrativeIndexRetriever(NarrativeIndex.from_chunks(chunks), retry_without_filters=False)
    assert plain.retrieve("Omega", top_k=1) == []  # the entity is only in the metadata
    monkeypatch.setenv("RAGSPINE_CONTEXTUAL", "on")
    ctx = NarrativeIndexRetriever(NarrativeIndex.from_chunks(chunks), retry_without_filters=False)
    hit = ctx.retrieve("Omega", top_k=1)
    assert [s["doc_id"] for s in hit] == ["lib/omega"]
    omega = next(c for c in chunks if c.doc_id == "lib/omega")
    assert hit[0]["text"] == omega.text and hit[0]["source_locator"] == omega.source_locator.to_dict()
    assert "prompt_text" not in hit[0]


class _Spy(DeterministicHashBackend):
    def __init__(self) -> None:
        super().__init__(dim=32)
        self.seen: list[str] = []

    def embed_texts(self, texts):
        self.seen.extend(texts)
        return super().embed_texts(texts)


@pytest.mark.parametrize("mode,prefixed", [("off", False), ("on", True)])
def test_the_dense_channel_embeds_the_same_contextual_text(monkeypatch, mode, prefixed):
    monkeypatch.setenv("RAGSPINE_CONTEXTUAL", mode)
    spy = _Spy()
    chunks = _chunks()
    NarrativeIndexRetriever(NarrativeIndex.from_chunks(chunks, embedding_backend=spy),
                            retry_without_filters=False).retrieve("revenue", top_k=2)
    docs = [t for t in spy.seen if "Revenue" in t]
    assert len(docs) == len(chunks)
    assert all(t.startswith(("Zeta", "Omega")) for t in docs) is prefixed
