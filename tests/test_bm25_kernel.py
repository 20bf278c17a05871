"""Both top-k kernels (compiled numba and pure numpy) equal the reference BM25 formula."""

import threading
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ragspine_pipeline.retrieval.lexical.index.bm25 import BM25Index, bm25_scores
from ragspine_pipeline.retrieval.lexical.kernels import loader as bm25_kernel

numba = pytest.importorskip("numba")
# "numba" takes the exhaustive route on these small corpora; "numba-maxscore" forces the
# MaxScore route of the same kernel (both must equal the reference).
KERNELS = ("numba", "numba-maxscore", "numpy")
SHARED_EVAL = Path(__file__).resolve().parents[1].parent / "shared" / "eval"
VOCAB = [f"t{i}" for i in range(10)] + ["营", "收"]
docs_st = st.lists(st.lists(st.sampled_from(VOCAB), max_size=20), min_size=1, max_size=60)
query_st = st.lists(st.sampled_from(VOCAB + ["absent"]), min_size=0, max_size=6)


def make(docs, kernel="numba", **kw) -> BM25Index:
    name, _, route = kernel.partition("-")
    idx = BM25Index(docs, kernel=name, **kw)
    if route == "maxscore":
        idx._exhaustive_docs = 0
    return idx


def expected_top_k(query, docs, k, k1=1.5, b=0.75):
    ref = bm25_scores(query, docs, k1=k1, b=b)
    order = sorted((i for i, s in enumerate(ref) if s > 0), key=lambda i: (-ref[i], i))[:k]
    return order, [ref[i] for i in order]


def assert_same(res, ids, scores):
    # The reference's own float rounding can split an exact tie by one ulp, so ids are
    # compared where the reference's scores differ by more than 1e-9; ties go by position.
    assert len(res.ids) == len(ids)
    assert np.allclose(res.scores, scores, atol=1e-9, rtol=0)
    got = res.ids.tolist()
    sc = res.scores.tolist()
    for i in range(len(got) - 1):  # ranked by score; exactly equal scores by position
        assert sc[i] > sc[i + 1] or (sc[i] == sc[i + 1] and got[i] < got[i + 1])
    for i, (a, b) in enumerate(zip(got, ids, strict=True)):
        if a != b:
            assert abs(scores[i] - res.scores[i]) <= 1e-9


@settings(max_examples=150, deadline=None)
@given(docs_st, query_st, st.integers(1, 20), st.floats(0.0, 3.0), st.floats(0.0, 1.0))
def test_both_kernels_equal_reference_with_ties_by_position(docs, query, k, k1, b):
    ids, scores = expected_top_k(query, docs, k, k1, b)
    for kernel in KERNELS:
        idx = make(docs, kernel, k1=k1, b=b)
        assert idx.kernel == kernel.split("-")[0]
        assert_same(idx.search(query, k=k), ids, scores)


def test_compiled_kernel_leaves_no_state_between_queries():
    # The reusable accumulator must be zero again after every query, or later scores drift.
    rng = np.random.default_rng(3)
    vocab = [f"w{i}" for i in range(300)]
    docs = [list(rng.choice(vocab, size=rng.integers(1, 40))) for _ in range(2000)]
    slow = BM25Index(docs, kernel="numpy")
    for fast in (make(docs, "numba"), make(docs, "numba-maxscore")):
        for _ in range(40):
            q = list(rng.choice(vocab, size=rng.integers(1, 6)))
            a, b = fast.search(q, k=25), slow.search(q, k=25)
            assert a.ids.tolist() == b.ids.tolist()
            assert np.allclose(a.scores, b.scores, atol=1e-9, rtol=0)
        assert not fast._scratch.acc.any()
        fast.search(["w1"], k=3, candidates=np.arange(0, 2000, 3))
        assert not fast._scratch.acc.any()


def test_compiled_kernel_is_safe_across_threads():
    rng = np.random.default_rng(5)
    vocab = [f"w{i}" for i in range(200)]
    docs = [list(rng.choice(vocab, size=rng.integers(1, 30))) for _ in range(3000)]
    queries = [list(rng.choice(vocab, size=3)) for _ in range(60)]
    idx = BM25Index(docs, kernel="numba")
    want = [idx.search(q, k=10).ids.tolist() for q in queries]
    got: dict[int, list] = {}
    start = threading.Barrier(4)

    def work(t):
        start.wait()
        got[t] = [idx.search(q, k=10).ids.tolist() for q in queries for _ in range(3)][::3]

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert all(got[t] == want for t in range(4))


def test_filtered_queries_keep_the_filtered_statistics_with_either_kernel():
    docs = [["a", "b"], ["a"], ["b", "b", "c"], ["c"], ["a", "c"]]
    mask = np.array([True, False, True, True, False])
    sub = [d for d, m in zip(docs, mask, strict=True) if m]
    ref = bm25_scores(["a", "c"], sub)
    for kernel in KERNELS:
        res = make(docs, kernel).search(["a", "c"], k=5, candidates=mask)
        pos = np.flatnonzero(mask)
        exp = sorted((i for i in range(len(sub)) if ref[i] > 0), key=lambda i: (-ref[i], i))
        assert res.ids.tolist() == [int(pos[i]) for i in exp]
        assert np.allclose(res.scores, [ref[i] for i in exp], atol=1e-9, rtol=0)


def test_kernel_choice_is_validated(monkeypatch):
    with pytest.raises(ValueError, match="unknown BM25 kernel"):
        BM25Index([["a"]], kernel="simd")
    monkeypatch.setattr(bm25_kernel, "load_kernels", lambda: None)  # numba missing
    with pytest.raises(RuntimeError, match="needs numba"):
        BM25Index([["a"]], kernel="numba")
    assert BM25Index([["a"]]).kernel == "numpy"  # auto falls back to the numpy path
    assert BM25Index([["a"]]).search(["a"], k=1).ids.tolist() == [0]


@pytest.mark.parametrize("name", sorted(p.name for p in SHARED_EVAL.iterdir() if (p / "corpus.jsonl").exists())
                         if SHARED_EVAL.is_dir() else [])
def test_every_shared_set_equals_reference_for_every_kernel(name):
    from ragspine_pipeline.eval.beir import load_beir
    from ragspine_pipeline.retrieval.lexical.analysis.analyzer import make_analyzer

    ds = load_beir(SHARED_EVAL / name)
    an = make_analyzer("unicode")
    docs = [an(f"{d.title}\n\n{d.text}") for d in ds.corpus.values()]
    queries = [an(ds.queries[q]) for q in ds.judged_queries[:8]]
    built = [make(docs, kernel) for kernel in KERNELS]
    for q in queries:
        ids, scores = expected_top_k(q, docs, 100)
        for idx in built:
            assert_same(idx.search(q, k=100), ids, scores)


def test_pruned_lookup_phase_equals_reference():
    # A rare, high-idf term then terms in every document: after the rare term, the bound
    # of the common terms is below theta, so the kernel switches to candidate lookups
    # (galloping and scanning) and must still give the reference's top-k exactly.
    rng = np.random.default_rng(11)
    docs = []
    for i in range(3000):
        d = ["common"] * int(rng.integers(1, 4)) + ["mid"] * int(rng.integers(0, 2)) + list(
            rng.choice([f"f{j}" for j in range(50)], size=int(rng.integers(1, 20))))
        if i % 97 == 0:
            d += ["rare"] * int(rng.integers(1, 4))
        docs.append(d)
    idx = make(docs, "numba-maxscore")
    for q, k in ((["rare", "common"], 3), (["rare", "mid", "common"], 5), (["common", "rare", "rare"], 10),
                 (["rare", "f3", "f7", "common", "mid"], 8), (["f1", "common"], 20)):
        ids, scores = expected_top_k(q, docs, k)
        assert_same(idx.search(q, k=k), ids, scores)


def test_batch_equals_single_query_for_both_kernels(monkeypatch):
    from ragspine_pipeline.retrieval.lexical.index import bm25

    monkeypatch.setattr(bm25, "_POSTINGS_PER_THREAD", 1)  # small batches split on threads too
    rng = np.random.default_rng(8)
    vocab = [f"w{i}" for i in range(400)]
    p = 1.0 / np.arange(1, 401) ** 1.1
    p /= p.sum()
    docs = [list(rng.choice(vocab, size=int(rng.integers(1, 40)), p=p)) for _ in range(2500)]
    queries = [list(rng.choice(vocab, size=int(rng.integers(0, 6)), p=p)) for _ in range(80)] + [["absent"], []]
    for kernel in KERNELS:
        idx = make(docs, kernel)
        for threads in (None, 1, 2):
            got = idx.search_batch(queries, k=7, threads=threads)
            assert len(got) == len(queries)
            ids, scores, counts = idx.search_batch_arrays(queries, k=7, threads=threads)
            assert ids.shape == scores.shape == (len(queries), 7)
            for i, (q, r) in enumerate(zip(queries, got, strict=True)):
                one = idx.search(q, k=7)
                assert r.ids.tolist() == one.ids.tolist()
                assert np.array_equal(r.scores, one.scores)
                n = int(counts[i])
                assert ids[i, :n].tolist() == one.ids.tolist() and (ids[i, n:] == -1).all()
                assert np.array_equal(scores[i, :n], one.scores) and not scores[i, n:].any()
    assert BM25Index(docs).search_batch([], k=3) == []


@pytest.mark.parametrize("bitsets", [False, True])
@pytest.mark.parametrize("frac", [0.5, 0.05, 0.002])
def test_filtered_kernel_uses_survivor_statistics(frac, bitsets, monkeypatch):
    from ragspine_pipeline.retrieval.lexical.index import bm25

    if bitsets:  # long lists' survivor df by popcount (normally only on corpora >= 65,536 docs)
        monkeypatch.setattr(bm25, "BITSET_MIN_DOCS", 0)
    # Both the mask scan and the survivor-galloping branch (few survivors, long lists).
    rng = np.random.default_rng(int(frac * 1000))
    vocab = [f"w{i}" for i in range(60)]
    p = 1.0 / np.arange(1, 61)
    p /= p.sum()
    docs = [list(rng.choice(vocab, size=int(rng.integers(1, 25)), p=p)) for _ in range(4000)]
    mask = rng.random(len(docs)) < frac
    mask[0] = True
    pos = np.flatnonzero(mask)
    sub = [docs[i] for i in pos]
    assert (BM25Index(docs)._bits.shape[0] > 0) == bitsets
    for q in (["w0", "w1"], ["w0", "w5", "w0"], ["w30", "w2", "w59"], ["absent", "w3"]):
        ref_ids, ref_scores = expected_top_k(q, sub, 10)
        for kernel in KERNELS:
            res = make(docs, kernel).search(q, k=10, candidates=mask)
            assert_same(res, [int(pos[i]) for i in ref_ids], ref_scores)
        # Candidates given as positions mean the same filter.
        res_ids = BM25Index(docs, kernel="numba").search(q, k=10, candidates=pos)
        assert res_ids.ids.tolist() == res.ids.tolist()


@settings(max_examples=150, deadline=None)
@given(docs_st, query_st, st.integers(1, 20), st.floats(0.0, 3.0), st.floats(0.0, 1.0), st.data())
def test_filtered_kernels_equal_reference_over_survivors(docs, query, k, k1, b, data):
    # Random filters, including all-pass and none-pass ones: the pruned filtered kernel
    # (with and without bitsets) and the numpy path equal the reference over the survivors.
    from ragspine_pipeline.retrieval.lexical.index import bm25

    mask = np.array(data.draw(st.lists(st.booleans(), min_size=len(docs), max_size=len(docs))), dtype=bool)
    pos = np.flatnonzero(mask)
    ref_ids, ref_scores = expected_top_k(query, [docs[i] for i in pos], k, k1, b) if len(pos) else ([], [])
    want = [int(pos[i]) for i in ref_ids]
    for min_docs in (bm25.BITSET_MIN_DOCS, 0):
        old = bm25.BITSET_MIN_DOCS
        bm25.BITSET_MIN_DOCS = min_docs
        try:
            built = [make(docs, kernel, k1=k1, b=b) for kernel in KERNELS]
        finally:
            bm25.BITSET_MIN_DOCS = old
        for idx in built:
            assert_same(idx.search(query, k=k, candidates=mask), want, ref_scores)


def test_block_max_bounds_cover_every_posting():
    # The kernel skips a block of a long list when its max w cannot reach the top k: the
    # stored maxima must be exact, and the block size the kernel strides by must match.
    from ragspine_pipeline.retrieval.lexical.index import bm25
    from ragspine_pipeline.retrieval.lexical.kernels import plain as bm25_numba

    assert bm25.BLOCK_SIZE == bm25_numba._BLOCK
    rng = np.random.default_rng(2)
    docs = [list(rng.choice(["a", "b", "c", "d"], size=int(rng.integers(1, 30)))) for _ in range(1000)]
    idx = BM25Index(docs)
    for t in range(len(idx.vocab)):
        seg = idx.w[idx.indptr[t]:idx.indptr[t + 1]]
        want = [seg[i:i + bm25.BLOCK_SIZE].max() for i in range(0, len(seg), bm25.BLOCK_SIZE)]
        assert idx._bmax[idx._bptr[t]:idx._bptr[t + 1]].tolist() == want
    # Long lists, single- and multi-term queries, k from 1 to past the list length.
    for q, k in ((["a"], 1), (["a"], 10), (["b", "a"], 7), (["d", "c", "b", "a"], 50), (["c"], 2000)):
        ids, scores = expected_top_k(q, docs, k)
        assert_same(make(docs, "numba-maxscore").search(q, k=k), ids, scores)
