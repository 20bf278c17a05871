"""Filtered BM25 through the fast filter route (issue #27 item 4) equals the spec.

The spec: a filtered query computes N, df and avgdl over the filter survivors. The numpy
path (``kernel="numpy"``) is its executable form; the compiled route packs the filter,
takes survivor statistics from bit-sliced lengths and bitset popcounts, reads few
survivors by rank or galloping, and prunes with block bounds valid for any survivor
avgdl. Every selectivity, every way of giving the filter, and the memory-mapped index
must give the same top-k (ties by position) and the same scores to 1e-9.
"""

from __future__ import annotations

import numpy as np
import pytest

from ragspine_pipeline.retrieval.lexical.index import bm25
from ragspine_pipeline.retrieval.lexical.index import filter as bm25_filter
from ragspine_pipeline.retrieval.lexical.index.bm25 import BM25Index, PackedFilter, bm25_scores

pytest.importorskip("numba")

N_DOCS = 20_000
KEEPS = (0.5, 0.05, 0.001, 0.0001)


def _zipf_corpus(n_docs: int, vocab: int = 400, seed: int = 3) -> tuple[list[list[str]], list[list[str]]]:
    rng = np.random.default_rng(seed)
    p = 1.0 / np.arange(1, vocab + 1) ** 1.1
    p /= p.sum()
    lens = np.maximum(rng.poisson(25, n_docs), 1)
    toks = rng.choice(vocab, size=int(lens.sum()), p=p)
    docs, pos = [], 0
    for n in lens.tolist():
        docs.append([f"w{t}" for t in toks[pos:pos + n].tolist()])
        pos += n
    queries = [[f"w{t}" for t in rng.choice(vocab, size=int(m), p=p)] for m in rng.integers(1, 6, 40)]
    queries.append(["w0", "w0", "w399"])  # a repeated head term and a tail term
    return docs, queries


@pytest.fixture(scope="module")
def corpus():
    return _zipf_corpus(N_DOCS)


@pytest.fixture(scope="module")
def indexes(corpus):
    """(compiled, numpy) indexes with bitsets on their long lists (as a large corpus has)."""
    docs, _ = corpus
    mp = pytest.MonkeyPatch()
    mp.setattr(bm25, "BITSET_MIN_DOCS", 0)
    try:
        fast, spec = BM25Index(docs, kernel="numba"), BM25Index(docs, kernel="numpy")
    finally:
        mp.undo()
    assert (fast._bit_row >= 0).sum() > 5  # the popcount and rank routes are exercised
    return fast, spec


def _mask(keep: float, seed: int = 11) -> np.ndarray:
    mask = np.random.default_rng(seed).random(N_DOCS) < keep
    if not mask.any():
        mask[N_DOCS // 2] = True
    return mask


def assert_same(got, want) -> None:
    """Same top-k and scores to 1e-9; ids may differ only inside a tie closer than 1e-9."""
    assert len(got.ids) == len(want.ids)
    assert np.allclose(got.scores, want.scores, rtol=0, atol=1e-9)
    for i, (a, b) in enumerate(zip(got.ids.tolist(), want.ids.tolist(), strict=True)):
        if a != b:
            assert abs(got.scores[i] - want.scores[i]) <= 1e-9
    sc, ids = got.scores.tolist(), got.ids.tolist()
    for i in range(len(ids) - 1):
        assert sc[i] > sc[i + 1] or (sc[i] == sc[i + 1] and ids[i] < ids[i + 1])


@pytest.mark.parametrize("keep", KEEPS)
def test_every_selectivity_equals_the_numpy_path_as_mask_and_as_positions(indexes, corpus, keep):
    fast, spec = indexes
    _, queries = corpus
    mask = _mask(keep)
    pos = np.flatnonzero(mask)
    shuffled = np.random.default_rng(5).permutation(np.concatenate([pos, pos[: len(pos) // 3]]))
    for q in queries:
        for k in (1, 10, 200):
            want = spec.search(q, k, candidates=mask)
            assert_same(fast.search(q, k, candidates=mask), want)
            assert_same(fast.search(q, k, candidates=pos), want)
            assert_same(fast.search(q, k, candidates=pos.astype(np.int32)), want)
            assert_same(fast.search(q, k, candidates=shuffled), want)  # unsorted, repeated
            assert_same(fast.search(q, k, candidates=PackedFilter.from_mask(mask)), want)
            assert_same(spec.search(q, k, candidates=PackedFilter.from_mask(mask)), want)
    assert not fast._scratch.pos_bits.any()  # positions leave the scratch clean


def test_filtered_scores_are_the_reference_over_the_survivors(indexes, corpus):
    fast, _ = indexes
    docs, queries = corpus
    mask = _mask(0.05)
    kept = [docs[i] for i in np.flatnonzero(mask)]
    back = np.flatnonzero(mask)
    for q in queries[:8]:
        ref = np.asarray(bm25_scores(q, kept))
        order = sorted((i for i in range(len(kept)) if ref[i] > 0), key=lambda i: (-ref[i], i))[:10]
        got = fast.search(q, 10, candidates=mask)
        assert np.allclose(got.scores, ref[order], rtol=0, atol=1e-9)
        assert set(got.ids.tolist()) <= set(back.tolist())


def test_empty_all_true_one_survivor_and_k_beyond_survivors(indexes, corpus):
    fast, spec = indexes
    _, queries = corpus
    none = np.zeros(N_DOCS, bool)
    for q in queries[:10]:
        assert len(fast.search(q, 10, candidates=none).ids) == 0
        assert len(fast.search(q, 10, candidates=np.zeros(0, np.int64)).ids) == 0
        everything = np.ones(N_DOCS, bool)
        assert_same(fast.search(q, 10, candidates=everything), spec.search(q, 10, candidates=everything))
        assert_same(fast.search(q, 10, candidates=everything), spec.search(q, 10))  # N, df, avgdl unchanged
    hit = int(fast.indices[fast.indptr[fast.vocab["w3"]]])  # a document holding w3
    one = fast.search(["w3", "w7"], 5, candidates=np.array([hit]))
    assert one.ids.tolist() == [hit] and one.scores[0] > 0
    assert_same(one, spec.search(["w3", "w7"], 5, candidates=np.array([hit])))
    few = np.flatnonzero(_mask(0.001))
    for q in queries[:10]:
        res = fast.search(q, 10_000, candidates=few)
        assert len(res.ids) <= len(few)
        assert_same(res, spec.search(q, 10_000, candidates=few))


def test_malformed_filters_are_clear_errors_and_leave_no_trace(indexes, corpus):
    fast, spec = indexes
    _, queries = corpus
    with pytest.raises(ValueError, match="one entry per indexed document"):
        fast.search(["w1"], 5, candidates=np.ones(N_DOCS - 1, bool))
    for bad in (np.array([3, N_DOCS]), np.array([-1, 4]), np.array([5, 2, N_DOCS + 7])):
        with pytest.raises(ValueError, match="must lie in"):
            fast.search(["w1"], 5, candidates=bad)
        with pytest.raises(ValueError, match="must lie in"):
            spec.search(["w1"], 5, candidates=bad)
        with pytest.raises(ValueError, match="must lie in"):
            fast.search(["absent-token"], 5, candidates=bad)  # checked even when nothing matches
    assert not fast._scratch.pos_bits.any()
    with pytest.raises(ValueError, match="uint64 words"):
        fast.search(["w1"], 5, candidates=PackedFilter(np.zeros(3, np.uint64)))
    stray = PackedFilter.from_mask(np.zeros(N_DOCS, bool))
    stray.words[-1] = np.uint64(1) << np.uint64(63)  # N_DOCS % 64 != 0: past the last document
    for idx in (fast, spec):
        with pytest.raises(ValueError, match="past the last indexed document"):
            idx.search(["w1"], 5, candidates=stray)
    pos = np.flatnonzero(_mask(0.05))
    assert_same(fast.search(queries[0], 10, candidates=pos), spec.search(queries[0], 10, candidates=pos))


def test_filter_support_is_lazy_and_its_bounds_hold(indexes, corpus):
    fast, _ = indexes
    sup = bm25_filter.support(fast)
    t = fast.vocab["w0"]
    sup.ensure_terms(fast._kernels, np.array([t]))
    b0, b1 = int(fast._bptr[t]), int(fast._bptr[t + 1])
    s0 = int(fast.indptr[t])
    for blk in range(b0, b1):
        lo, hi = s0 + (blk - b0) * bm25.BLOCK_SIZE, min(s0 + (blk - b0 + 1) * bm25.BLOCK_SIZE, int(fast.indptr[t + 1]))
        assert sup.blk_tf[blk] == fast.tf[lo:hi].max()
        assert sup.blk_len[blk] == fast._doc_len32[fast.indices[lo:hi]].min()
    slices = sup.slices()
    mask = _mask(0.5)
    packed = np.packbits(np.concatenate([mask, np.zeros(-N_DOCS % 64, bool)]), bitorder="little").view(np.uint64)
    total = sum(int(np.bitwise_count(packed & slices[s]).sum()) << s for s in range(len(slices)))
    assert total == int(fast._doc_len32[mask].sum())


def test_mapped_index_filters_equal_the_numpy_path(tmp_path, indexes, corpus):
    from ragspine_pipeline.retrieval.lexical.index.mapped import open_index
    from ragspine_pipeline.retrieval.lexical.refresh.publish import write_index

    fast, spec = indexes
    _, queries = corpus
    mapped = open_index(write_index(fast, tmp_path / "f.bm25"))
    assert mapped.kernel == "numba"
    for keep in KEEPS:
        mask = _mask(keep, seed=17)
        for q in queries[:15]:
            want = spec.search(q, 10, candidates=mask)
            assert_same(mapped.search(q, 10, candidates=mask), want)
            assert_same(mapped.search(q, 10, candidates=np.flatnonzero(mask)), want)
