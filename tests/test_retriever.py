import json
from pathlib import Path

import pytest

from ragspine_pipeline.corpus import DEMO_ROOT, ingest_folder, list_libraries
from ragspine_pipeline.modes import RetrievalModeError, resolve_retrieval
from ragspine_pipeline.retrieval.chunking.chunk_store import ChunkStore
from ragspine_pipeline.retrieval.chunking.chunking import chunk_document
from ragspine_pipeline.retrieval.lexical.glossary import GlossaryQueryRewriter
from ragspine_pipeline.retrieval.lexical.hybrid import HybridRetriever
from ragspine_pipeline.retrieval.link.narrative_link import (
    NarrativeIndex,
    NarrativeIndexRetriever,
    build_narrative_retriever,
)
from ragspine_pipeline.retrieval.vector.embedding_backends import DeterministicHashBackend

GLOSSARY = DEMO_ROOT / "glossary.json"


@pytest.fixture(scope="module")
def demo_store(tmp_path_factory):
    store = ChunkStore(tmp_path_factory.mktemp("wh") / "chunks.duckdb")
    for lib in list_libraries():
        ingest_folder(store, DEMO_ROOT / lib)
    yield store
    store.close()


def test_demo_corpus_shape(demo_store):
    docs = demo_store.active_doc_ids()
    assert len(docs) >= 40
    chunks = list(demo_store.iter_chunks())
    assert {c.language for c in chunks} == {"zh", "en"}
    assert sum(c.sensitivity == "RESTRICTED" for c in chunks) >= 3


def test_demo_question_returns_cited_snippets(demo_store):
    r, store = build_narrative_retriever(demo_store, glossary=GLOSSARY)
    assert store is demo_store  # an open store is used as it is (the caller closes it)
    snippets = r.retrieve("为什么营收下滑", filters={"entity": "ACME_CN"}, top_k=5)
    assert len(snippets) == 5
    assert {s["entity"] for s in snippets} == {"ACME_CN"}
    assert "acme_reports/ar2023_cn_revenue" in [s["doc_id"] for s in snippets[:3]]
    required = {"text", "doc_id", "title", "source_locator", "chunk_id", "topic", "entity", "geography",
                "period", "language", "sensitivity", "scores", "valid_as_of", "version"}
    for s in snippets:
        assert required <= s.keys()
        assert set(s["scores"]) == {"bm25", "vector", "fused"} and s["scores"]["vector"] is None
        loc = s["source_locator"]
        source = Path(loc["source_path"]).read_text(encoding="utf-8")
        assert source[loc["start"]:loc["end"]] == s["text"]
    # Restricted board minutes about the same topic never come back.
    everything = r.retrieve("董事会 裁员 华辰地产 应收账款", top_k=50)
    assert all(s["sensitivity"] != "RESTRICTED" for s in everything)


def test_filters_apply_before_embedding_and_vectors_are_cached():
    chunks = []
    for i in range(20):
        chunks += chunk_document(f"revenue note {i}", doc_id=f"d{i:02d}", metadata={"entity": "A" if i < 5 else "B"})
    backend = DeterministicHashBackend()
    r = HybridRetriever(chunks, embedding_backend=backend)
    hits = r.search("revenue", filters={"entity": "A"}, top_k=10)
    assert {h.chunk.entity for h in hits} == {"A"}
    assert r.embedded_count == 5  # only the survivors were embedded
    first = backend.texts_embedded
    r.search("revenue note", filters={"entity": "A"}, top_k=10)
    assert backend.texts_embedded == first + 1  # only the query: survivors come from the cache
    assert all(h.vector is not None for h in hits)


def test_ties_break_by_chunk_id():
    chunks = []
    for name in ["zeta", "alpha", "mid"]:
        chunks += chunk_document("same words here", doc_id=name)
    hits = HybridRetriever(chunks).search("same words", top_k=3)
    ids = [h.chunk.chunk_id for h in hits]
    assert ids == sorted(ids)
    assert len({h.bm25 for h in hits}) == 1  # equal BM25: the channel orders them by chunk_id


def test_without_backend_output_is_pure_bm25_and_byte_identical(demo_store):
    chunks = list(demo_store.iter_chunks())
    rw = GlossaryQueryRewriter.from_file(GLOSSARY)
    a = NarrativeIndexRetriever(NarrativeIndex.from_chunks(chunks, rewriter=rw))
    backend, channels = resolve_retrieval("bm25")
    b = NarrativeIndexRetriever(NarrativeIndex.from_chunks(chunks, rewriter=rw, embedding_backend=backend,
                                                           channels=channels))
    backend_auto, ch_auto = resolve_retrieval("auto", "none")
    c = NarrativeIndexRetriever(NarrativeIndex.from_chunks(chunks, rewriter=rw, embedding_backend=backend_auto,
                                                           channels=ch_auto))
    for q in ["为什么营收下滑", "why close the Lyon plant", "tariffs gross margin"]:
        out = [json.dumps(x.retrieve(q, top_k=10), ensure_ascii=False, default=str) for x in (a, b, c)]
        assert out[0] == out[1] == out[2]


def test_lexical_modes_build_no_backend(monkeypatch):
    import ragspine_pipeline.modes as modes

    def boom(spec=None):
        raise AssertionError("the embedding factory must not be called in a lexical mode")

    monkeypatch.setattr(modes, "make_embedding_backend", boom)
    monkeypatch.setenv("RAGSPINE_EMBEDDING", "deterministic")
    for m in ("economy", "bm25", "lexical"):
        assert modes.resolve_retrieval(m) == (None, ("bm25",))


def test_vector_modes():
    backend, ch = resolve_retrieval("hybrid", "deterministic")
    assert backend is not None and ch == ("bm25", "dense")
    assert resolve_retrieval("vector", "deterministic")[1] == ("dense",)
    with pytest.raises(RetrievalModeError):
        resolve_retrieval("hybrid", "none")
    with pytest.raises(RetrievalModeError):
        resolve_retrieval("turbo")


def test_retry_without_filters_marks_relaxed():
    chunks = chunk_document("revenue fell sharply", doc_id="d1", metadata={"entity": "A"})
    r = NarrativeIndexRetriever(NarrativeIndex.from_chunks(chunks))
    out = r.retrieve("revenue", filters={"entity": "Z"})
    assert [s["doc_id"] for s in out] == ["d1"] and out[0]["filters_relaxed"] is True
    strict = NarrativeIndexRetriever(NarrativeIndex.from_chunks(chunks), retry_without_filters=False)
    assert strict.retrieve("revenue", filters={"entity": "Z"}) == []
    assert r.retrieve("revenue", filters={"entity": "A"})[0]["filters_relaxed"] is False


def test_top_k_open_results_survive_restricted_heavy_ranking():
    chunks = []
    for i in range(30):
        chunks += chunk_document("revenue revenue revenue" if i < 20 else "revenue", doc_id=f"d{i:02d}",
                                 metadata={"sensitivity": "RESTRICTED" if i < 20 else "PUBLIC"})
    out = NarrativeIndexRetriever(NarrativeIndex.from_chunks(chunks)).retrieve("revenue", top_k=5)
    assert len(out) == 5 and all(s["sensitivity"] == "PUBLIC" for s in out)


def test_glossary_rewriter():
    rw = GlossaryQueryRewriter.from_file(GLOSSARY, max_queries=5)
    out = rw.rewrite("为什么营收下滑")
    assert out[0] == "为什么营收下滑" and len(out) == 5 and len(set(out)) == 5
    assert "为什么营收下降" in out  # the second matched group gets a slot
    assert GlossaryQueryRewriter.from_file(GLOSSARY, max_queries=1).rewrite("营收") == ["营收"]
    assert rw.rewrite("nothing matches") == ["nothing matches"]
    # ASCII terms match on word boundaries only.
    assert rw.rewrite("EVERYTHING") == ["EVERYTHING"]


def test_with_channels_views_share_embedded_vectors():
    chunks = []
    for i in range(6):
        chunks += chunk_document(f"revenue note {i}", doc_id=f"d{i}")
    backend = DeterministicHashBackend()
    base = HybridRetriever(chunks, embedding_backend=backend)
    dense = base.with_channels(("dense",))
    dense.search("revenue", top_k=3)
    embedded = backend.texts_embedded
    assert base.embedded_count == 6
    hits = base.search("revenue", top_k=3)  # the base retriever reuses the view's vectors
    assert backend.texts_embedded == embedded + 1 and all(h.vector is not None for h in hits)
    assert [h.bm25 for h in dense.search("revenue", top_k=3)] == [0.0, 0.0, 0.0]
