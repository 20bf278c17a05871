"""Filtered queries over the packed layout take every filter form the plain layout takes
(a bool mask, positions in any order, a ``PackedFilter``) and answer exactly as the plain
layout's compiled kernel (bit for bit), its numpy path and the reference formula with N,
df and avgdl over the survivors, at every selectivity, with and without bitset rows
(issue #27 item 4)."""

import numpy as np
import pytest

from ragspine_pipeline.retrieval.lexical.index import (
    packed_filter_search as bm25_packed_filter_search,
)
from ragspine_pipeline.retrieval.lexical.index.filter import FEW_SURVIVORS_DIV, PackedFilter
from ragspine_pipeline.retrieval.lexical.index.mapped import open_index
from tests.test_bm25_mmap import zipf_corpus
from tests.test_bm25_packed import publish_both, ref_top, same

pytest.importorskip("numba")

KEEPS = (0.5, 0.05, 0.001, 0.0001)


def _forms(mask: np.ndarray, rng: np.random.Generator) -> dict[str, object]:
    """The same survivors in every accepted form (positions shuffled and repeated too)."""
    pos = np.flatnonzero(mask)
    shuffled = np.concatenate([pos, pos[: len(pos) // 3]])
    rng.shuffle(shuffled)
    return {"mask": mask, "positions": pos, "unsorted positions": shuffled.astype(np.int32),
            "packed": PackedFilter.from_mask(mask)}


def _check(tmp_path, monkeypatch, n_docs: int, n_queries: int, bitsets: bool, keeps=KEEPS) -> None:
    from ragspine_pipeline.retrieval.lexical.index import bm25

    # Long lists get bitset rows, or none (normally from 65,536 docs on).
    monkeypatch.setattr(bm25, "BITSET_MIN_DOCS", 0 if bitsets else 1 << 40)
    docs, queries = zipf_corpus(n_docs, n_vocab=300, seed=4, max_len=25)
    packed, plain = publish_both(tmp_path, docs)
    assert packed.kernel == "numba" and (packed._file.arrays["bits"].shape[0] > 0) == bitsets
    packed_np = open_index(packed.path, kernel="numpy")
    plain_np = open_index(plain.path, kernel="numpy")
    rng = np.random.default_rng(7)
    for keep in keeps:
        mask = rng.random(n_docs) < keep
        mask[[3, n_docs - 1]] = True  # the first word and the tail word hold a survivor
        pos = np.flatnonzero(mask)
        forms = _forms(mask, rng)
        for q in queries[:n_queries] + queries[-3:]:
            want = plain.search(q, k=10, candidates=mask)
            slow = packed_np.search(q, k=10, candidates=mask)  # the numpy path: same ids, scores to 1e-9
            same(slow, plain_np.search(q, k=10, candidates=mask))
            assert slow.ids.tolist() == want.ids.tolist() and np.allclose(slow.scores, want.scores, atol=1e-9, rtol=0)
            for name, f in forms.items():
                for route in (1, 0, 2):  # routed, term at a time, window kernel (dense filters)
                    monkeypatch.setattr(bm25_packed_filter_search, "WINDOWS", route)
                    got = packed.search(q, k=10, candidates=f)
                    assert got.ids.tolist() == want.ids.tolist(), (keep, name, route, q)
                    assert np.array_equal(got.scores, want.scores), (keep, name, route, q)
            r_ids, r_scores = ref_top(q, docs, 10, pos)  # N, df and avgdl over the survivors
            assert want.ids.tolist() == r_ids and np.allclose(want.scores, r_scores, atol=1e-9, rtol=0)


@pytest.mark.parametrize("bitsets", [False, True])
def test_every_form_at_every_selectivity(tmp_path, monkeypatch, bitsets):
    # 12,800 docs: N/64 = 200, so 0.1% and 0.01% take the few-survivor routes (rank, gallop).
    _check(tmp_path, monkeypatch, 12_800, 6, bitsets)


def test_edge_filters(tmp_path):
    docs, queries = zipf_corpus(3000, n_vocab=200, seed=9, max_len=20)
    packed, plain = publish_both(tmp_path, docs)
    q = queries[0]
    none = np.zeros(len(docs), bool)
    for f in (none, np.zeros(0, np.int64), PackedFilter.from_mask(none)):
        assert packed.search(q, k=5, candidates=f).ids.tolist() == []
    everyone = np.ones(len(docs), bool)
    same(packed.search(q, k=5, candidates=everyone), plain.search(q, k=5, candidates=everyone))
    one = np.array([len(docs) // 2])
    same(packed.search(q, k=5, candidates=one), plain.search(q, k=5, candidates=one))
    for bad in (np.ones(len(docs) + 1, bool), np.array([len(docs)]), np.array([-1]),
                PackedFilter(np.zeros(3, np.uint64)), np.array([[1, 2]])):
        with pytest.raises(ValueError):
            packed.search(q, k=5, candidates=bad)
        with pytest.raises(ValueError):  # a query of unknown words still checks the filter
            packed.search(["never-seen-token"], k=5, candidates=bad)
    # the positions buffer is clean after each query: the next filter is not polluted
    same(packed.search(q, k=5, candidates=np.array([1, 2])), plain.search(q, k=5, candidates=np.array([1, 2])))
    same(packed.search(q, k=5, candidates=np.array([7])), plain.search(q, k=5, candidates=np.array([7])))


@pytest.mark.slow
@pytest.mark.parametrize("bitsets", [False, True])
def test_every_form_on_a_larger_corpus(tmp_path, monkeypatch, bitsets):
    # 120,000 docs: N/64 = 1,875 survivors; 0.1% (120) takes the rank/gallop routes with
    # lists hundreds of times longer than the survivors, 5% gathers, 50% scans with skips.
    assert 120_000 // FEW_SURVIVORS_DIV == 1875
    _check(tmp_path, monkeypatch, 120_000, 25, bitsets)


def test_almost_all_filters_send_few_rare_documents_to_the_window_kernel():
    """Under a filter keeping almost every document, rare terms holding fewer than k
    surviving documents set no k-th score for term at a time: the window kernel answers
    (27 ms -> ~4 ms for ``w10 w11 unseen0`` on a refresh stack's base at 1M)."""
    from ragspine_pipeline.retrieval.lexical.kernels.packed_filtered_windows import windows_suit

    indptr = np.array([0, 600, 1100, 1103], np.int64)  # two common terms, one in 3 documents
    ut = np.arange(3, dtype=np.int64)
    dfs = np.array([597, 498, 3], np.int64)
    ub = np.array([1.0, 1.0, 9.0])
    assert windows_suit(indptr, ut, dfs, ub, 995, 1000, 10)  # 3 < k
    assert not windows_suit(indptr, ut, dfs, ub, 995, 1000, 2)  # the rare term sets the k-th score
    assert not windows_suit(indptr, ut, dfs, ub, 600, 1000, 10)  # not almost all: light query, term at a time
