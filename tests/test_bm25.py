import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ragspine_pipeline.retrieval.hybrid.fusion import rrf_fuse
from ragspine_pipeline.retrieval.lexical.index.bm25 import BM25Index, bm25_scores

VOCAB = [f"t{i}" for i in range(12)] + ["营", "收", "营收"]
docs_st = st.lists(st.lists(st.sampled_from(VOCAB), max_size=25), min_size=1, max_size=40)
query_st = st.lists(st.sampled_from(VOCAB + ["absent"]), min_size=0, max_size=6)


def test_reference_matches_hand_computation():
    docs = [["a", "b", "a"], ["b"], ["c"]]
    k1, b = 1.5, 0.75
    avgdl = 5 / 3
    idf_a = math.log(1 + (3 - 1 + 0.5) / (1 + 0.5))
    expect = idf_a * (2 * (k1 + 1)) / (2 + k1 * (1 - b + b * 3 / avgdl))
    got = bm25_scores(["a"], docs)
    assert got[0] == pytest.approx(expect, abs=1e-12)
    assert got[1] == 0.0 and got[2] == 0.0
    # A repeated query token counts twice.
    assert bm25_scores(["a", "a"], docs)[0] == pytest.approx(2 * expect, abs=1e-12)


@given(docs_st, query_st, st.floats(0.0, 3.0), st.floats(0.0, 1.0))
def test_index_equals_reference_on_full_corpus(docs, query, k1, b):
    idx = BM25Index(docs, k1=k1, b=b)
    ref = bm25_scores(query, docs, k1=k1, b=b)
    assert np.allclose(idx.get_scores(query), ref, atol=1e-9, rtol=0)


@given(docs_st, query_st, st.data())
def test_index_equals_reference_on_filtered_subset(docs, query, data):
    mask = np.array(data.draw(st.lists(st.booleans(), min_size=len(docs), max_size=len(docs))))
    idx = BM25Index(docs)
    sub = [d for d, m in zip(docs, mask, strict=True) if m]
    ref = bm25_scores(query, sub)
    got = idx.get_scores(query, candidates=mask)
    assert np.allclose(got[mask], ref, atol=1e-9, rtol=0)
    assert not got[~mask].any()  # nothing outside the candidates is scored


@given(docs_st, query_st, st.integers(1, 15))
def test_search_is_deterministic_and_ordered(docs, query, k):
    idx = BM25Index(docs)
    res = idx.search(query, k=k)
    scores = idx.get_scores(query)
    expect = sorted((i for i in range(len(docs)) if scores[i] > 0), key=lambda i: (-scores[i], i))[:k]
    assert res.ids.tolist() == expect
    assert idx.search(query, k=k).ids.tolist() == expect


def test_sparse_and_dense_accumulation_agree():
    rng = np.random.default_rng(0)
    vocab = [f"w{i}" for i in range(400)]
    docs = [list(rng.choice(vocab, size=rng.integers(1, 30))) for _ in range(3000)]
    idx = BM25Index(docs)
    for q in (["w1", "w2"], list(vocab[:120])):  # sparse path, dense path
        assert np.allclose(idx.get_scores(q), bm25_scores(q, docs), atol=1e-9, rtol=0)


def test_bad_parameters_rejected():
    with pytest.raises(ValueError):
        BM25Index([["a"]], b=1.5)


def test_rrf_hand_values_and_ties():
    fused = rrf_fuse([["a", "b"], ["b", "c"]], k=60)
    assert type(fused) is dict
    assert fused["a"] == pytest.approx(1 / 61)
    assert fused["b"] == pytest.approx(1 / 62 + 1 / 61)
    assert fused["c"] == pytest.approx(1 / 62)
    assert list(fused) == ["b", "a", "c"]  # iteration order = fused rank
    assert list(rrf_fuse([["y"], ["x"]])) == ["x", "y"]  # tie -> id order
    assert rrf_fuse([["a", "a"]])["a"] == pytest.approx(1 / 61)
    assert rrf_fuse([]) == {} and rrf_fuse([["a"]], k=0) == {"a": 1.0}
    for bad in (-1, "60", None, True):
        with pytest.raises(ValueError):
            rrf_fuse([["a"]], k=bad)


def test_maxscore_pruned_search_equals_exhaustive(monkeypatch):
    """Queries mixing head and rare terms take the pruned path; results must not change."""
    rng = np.random.default_rng(1)
    vocab = [f"w{i}" for i in range(300)]
    p = 1.0 / np.arange(1, 301) ** 1.1
    p /= p.sum()
    docs = [list(rng.choice(vocab, size=rng.integers(1, 40), p=p)) for _ in range(4000)]
    import ragspine_pipeline.retrieval.lexical.index.bm25 as bm25_mod

    monkeypatch.setattr(bm25_mod, "MAXSCORE_MIN_DOCS", 0)
    idx = BM25Index(docs)
    pruned = 0
    for _ in range(60):
        q = list(rng.choice(vocab, size=rng.integers(2, 6), p=p)) + [vocab[rng.integers(50, 300)]]
        pruned += idx._maxscore(q, 10) is not None
        scores = idx.get_scores(q)
        for k in (1, 10, 50):
            expect = sorted((i for i in range(len(docs)) if scores[i] > 0), key=lambda i: (-scores[i], i))[:k]
            res = idx.search(q, k=k)
            assert res.ids.tolist() == expect
            assert np.allclose(res.scores, scores[expect], atol=1e-9, rtol=0)
    assert pruned > 30  # the pruned path really ran
