"""Spec probes (#26 item 3, the parts the assembly owns), written as user code straight
from the spec's text:

* ``build_narrative_retriever`` honours ``RAGSPINE_RERANKER`` and the query-layer
  variables, as the spec's opt-in section says ("環境変数を設定してサービスに配線させます"),
  exactly as it already did ``RAGSPINE_POSTPROCESSOR`` / ``RAGSPINE_CONTEXTUAL``;
* ``NarrativeIndex(..., embedding_backend=b)``: the spec injects the backend "with the
  embedding_backend= keyword of HybridRetriever, NarrativeIndex and build_narrative_retriever".
"""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from test_rerankers import write_token_embedder  # noqa: E402

from ragspine_pipeline.corpus import DEMO_ROOT, ingest_folder  # noqa: E402
from ragspine_pipeline.llm.provider import ScriptedProvider  # noqa: E402
from ragspine_pipeline.retrieval.chunking.chunk_store import ChunkStore  # noqa: E402
from ragspine_pipeline.retrieval.chunking.chunking import chunk_document  # noqa: E402
from ragspine_pipeline.retrieval.query import LayeredRetriever  # noqa: E402
from ragspine_pipeline.retrieval.rerank.late_interaction import LateInteractionReranker  # noqa: E402
from ragspine_pipeline.retrieval.vector.embedding_backends import DeterministicHashBackend  # noqa: E402


@pytest.fixture
def chunks_db(tmp_path, monkeypatch):
    with ChunkStore(tmp_path / "data" / "chunks.db") as s:
        ingest_folder(s, DEMO_ROOT / "acme_reports")
    monkeypatch.chdir(tmp_path)
    return "data/chunks.db"


def test_build_narrative_retriever_honours_reranker_and_query_transform(chunks_db, tmp_path, monkeypatch):
    folder, _ = write_token_embedder(tmp_path / "colbert-tiny")
    monkeypatch.setenv("RAGSPINE_COLBERT_MODEL", str(folder))  # a tiny local model, no download
    monkeypatch.setenv("RAGSPINE_RERANKER", "colbert")
    monkeypatch.setenv("RAGSPINE_QUERY_TRANSFORM", "hyde")
    from ragspine_pipeline.retrieval.link.narrative_link import build_narrative_retriever

    provider = ScriptedProvider(lambda prompt: "Revenue fell because property demand weakened in China.")
    retriever, store = build_narrative_retriever(chunks_db, provider)
    try:
        snippets = retriever.retrieve("为什么营收下滑", filters={"entity": "ACME_CN"}, top_k=5)
    finally:
        store.close()
    assert isinstance(retriever, LayeredRetriever), "a plain retriever: the variables were ignored"
    assert retriever.layer_names == ["security_gate", "hyde"]
    assert isinstance(retriever.reranker, LateInteractionReranker)  # the base's reranker, through the layers
    assert snippets and all(s["reranker"] == retriever.reranker.name for s in snippets)
    assert all("hyde" in s["layers"] and s["entity"] == "ACME_CN" for s in snippets)
    assert len(provider.prompts) == 1  # the hypothetical document, written once by the given provider


@pytest.mark.parametrize("env, layers", [
    ({"RAGSPINE_QUERY_DECOMPOSE": "llm"}, ["security_gate", "decompose"]),
    ({"RAGSPINE_ADAPTIVE": "on"}, ["security_gate", "adaptive"]),
    ({"RAGSPINE_CORRECTIVE": "on"}, ["security_gate", "corrective"]),
    ({"RAGSPINE_AUTO_FILTERS": "on"}, ["security_gate", "auto_filters"]),
])
def test_build_narrative_retriever_honours_each_query_layer_variable(chunks_db, monkeypatch, env, layers):
    for var, value in env.items():
        monkeypatch.setenv(var, value)
    from ragspine_pipeline.retrieval.link.narrative_link import build_narrative_retriever

    retriever, store = build_narrative_retriever(chunks_db, ScriptedProvider(lambda prompt: "1. revenue"))
    store.close()
    assert isinstance(retriever, LayeredRetriever) and [n.split(":")[0] for n in retriever.layer_names] == layers


def test_build_narrative_retriever_with_nothing_set_is_the_plain_chain(chunks_db):
    from ragspine_pipeline.retrieval.link.narrative_link import (
        NarrativeIndexRetriever,
        build_narrative_retriever,
    )

    retriever, store = build_narrative_retriever(chunks_db)
    store.close()
    assert type(retriever) is NarrativeIndexRetriever and retriever.reranker is None


def test_narrative_index_takes_embedding_backend_as_the_spec_writes_it():
    from ragspine_pipeline.retrieval.hybrid.retriever import HybridRetriever
    from ragspine_pipeline.retrieval.link.narrative_link import (
        NarrativeIndex,
        NarrativeIndexRetriever,
    )

    chunks = (chunk_document("revenue fell as tariffs rose", doc_id="a")
              + chunk_document("the Lyon plant closed", doc_id="b")
              + chunk_document("secret layoffs", doc_id="s", metadata={"sensitivity": "RESTRICTED"}))
    b = DeterministicHashBackend()
    index = NarrativeIndex(chunks, embedding_backend=b)
    assert index.retriever.embedding_backend is b and len(index) == 2  # RESTRICTED left out, as from_chunks does
    built = NarrativeIndex.from_chunks(chunks, embedding_backend=DeterministicHashBackend())
    q = "why did revenue fall"
    assert NarrativeIndexRetriever(index).retrieve(q) == NarrativeIndexRetriever(built).retrieve(q)
    assert NarrativeIndexRetriever(index).retrieve(q)[0]["scores"]["vector"] is not None
    # The older form (an index already built) still works, and mixing the two is a clear error.
    h = HybridRetriever(chunks[:2])
    assert NarrativeIndex(h, "lib").retriever is h
    with pytest.raises(TypeError, match="embedding_backend"):
        NarrativeIndex(h, embedding_backend=b)
    with pytest.raises(TypeError, match="chunks"):
        NarrativeIndex("not chunks")
