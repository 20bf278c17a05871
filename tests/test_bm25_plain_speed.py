"""The plain unfiltered kernel indexes acc with unsigned ints (no negative-index
wraparound per access: 1.07-1.17x qps at 1M docs): the same additions in the same order, so the
answers are the numpy kernel's, and acc is left all zeros."""

import numpy as np
import pytest

from ragspine_pipeline.retrieval.lexical.index.bm25 import BM25Index

pytest.importorskip("numba")


def test_maxscore_phases_equal_the_numpy_kernel():
    # A rare term, then long lists: the first-term loop, term-at-a-time lists, and lookup
    # scans and gallops with pruning between them (every loop whose indices are unsigned).
    rng = np.random.default_rng(17)
    vocab = [f"c{j}" for j in range(6)] + [f"f{j}" for j in range(200)]
    p = np.r_[np.full(6, 0.08), np.full(200, 0.52 / 200)]
    docs = [list(rng.choice(vocab, size=int(rng.integers(3, 30)), p=p)) for _ in range(6000)]
    for i in range(0, 6000, 7):
        docs[i] += ["rare"] * int(rng.integers(1, 3))
    fast = BM25Index(docs, kernel="numba")
    fast._exhaustive_docs = 0  # the MaxScore route
    slow = BM25Index(docs, kernel="numpy")
    for _ in range(60):
        q = ["rare", *rng.choice(vocab[:6], size=int(rng.integers(1, 6))).tolist(), *rng.choice(vocab, size=2).tolist()]
        k = int(rng.integers(1, 30))
        a, b = fast.search(q, k=k), slow.search(q, k=k)
        assert a.ids.tolist() == b.ids.tolist()
        assert np.allclose(a.scores, b.scores, atol=1e-9, rtol=0)
    assert not fast._scratch.acc.any()
