"""The document-at-a-time exact kernels over packed postings answer exactly as the MaxScore
kernel and the reference formula: block-max WAND and block-max MaxScore per document (the
tests' ``packed_reference_kernels``), and block-max MaxScore over windows (``bm25_packed_windows``, what
``bm25_packed_route`` sends dense queries to). Same top-k ids, bit-identical scores, ties
by lower position; repeated terms, single terms, k past the matches and long lists."""

import numpy as np
import pytest

from ragspine_pipeline.retrieval.lexical.index.packed_index import PackedBM25Index
from ragspine_pipeline.retrieval.lexical.index.packed_narrow import term_wmax
from ragspine_pipeline.retrieval.lexical.index.packed_tables import term_idf
from tests.test_bm25_mmap import zipf_corpus
from tests.test_bm25_packed import publish_both, ref_top

pytest.importorskip("numba")

from ragspine_pipeline.retrieval.lexical.kernels import packed as maxscore  # noqa: E402
from ragspine_pipeline.retrieval.lexical.kernels import packed_lead as lead  # noqa: E402
from ragspine_pipeline.retrieval.lexical.kernels import packed_route as route  # noqa: E402
from ragspine_pipeline.retrieval.lexical.kernels import packed_windows as windows  # noqa: E402
from tests import packed_reference_kernels as wand  # noqa: E402


def both(ix: PackedBM25Index, q: list[str], k: int):
    """(WAND answer, MaxScore answer) of one query on one packed index; block-max
    MaxScore (``bmm_top_k``) and the window kernel are checked against the same answer."""
    tids = np.array(ix._query_term_ids(q), np.int64)
    ids, sc = wand.wand_top_k(ix._pk, ix._idf, ix._w_max, tids, ix._weights(), k)
    for other in (wand.bmm_top_k, windows.window_top_k):
        b_ids, b_sc = other(ix._pk, ix._idf, ix._w_max, tids, ix._weights(), k)
        assert b_ids.tolist() == ids.tolist() and np.array_equal(b_sc, sc), (other.__name__, q, k)
    acc = np.zeros(ix.n_docs, np.float64)
    touched = np.empty(ix.n_docs, np.int32)
    m_ids, m_sc = maxscore.search_one(ix._pk, ix._idf, ix._w_max, tids, ix._weights(), k, acc, touched, 0)
    return (ids, sc), (m_ids, m_sc)


@pytest.mark.parametrize("seed", [1, 2])
def test_wand_equals_maxscore_and_reference_on_zipf(tmp_path, seed):
    docs, queries = zipf_corpus(4000, seed=seed)
    docs[9] = ["w1"] * 300  # tf > 255
    queries += [["w0"], ["w0", "w0", "w1"], ["w0", "w1", "w2", "w3", "w4", "w5", "w6", "w7"], ["w350", "w0"]]
    packed, _plain = publish_both(tmp_path, docs)
    for q in queries:
        for k in (1, 3, 10, 100, 5000):  # k > matches included
            (ids, sc), (m_ids, m_sc) = both(packed, q, k)
            assert ids.tolist() == m_ids.tolist(), (q, k)
            assert np.array_equal(sc, m_sc), (q, k)  # bit for bit: the same sums in the same order
        r_ids, r_sc = ref_top(q, docs, 10)
        (ids, sc), _ = both(packed, q, 10)
        assert ids.tolist() == r_ids and np.allclose(sc, r_sc, atol=1e-9, rtol=0)


def test_ties_go_to_the_lower_position(tmp_path):
    # Many identical documents: every score ties, so the answer is the lowest positions.
    docs = [["a", "b", "c"] for _ in range(700)] + [["a", "z"] for _ in range(300)] + [["q"]] * 200
    packed, _ = publish_both(tmp_path, docs)
    for q in (["a", "b"], ["a", "c", "b"], ["a"], ["a", "z", "a"]):
        for k in (1, 5, 128, 129, 900):
            (ids, sc), (m_ids, m_sc) = both(packed, q, k)
            assert ids.tolist() == m_ids.tolist() and np.array_equal(sc, m_sc)
            r_ids, _ = ref_top(q, docs, k)
            assert ids.tolist() == r_ids


def test_long_lists_skip_blocks_and_stay_exact(tmp_path):
    # 30k documents: head terms span hundreds of blocks, so block-max skipping runs.
    docs, _ = zipf_corpus(30_000, n_vocab=2000, seed=5, max_len=60)
    rng = np.random.default_rng(3)
    packed, _ = publish_both(tmp_path, docs)
    head = [f"w{i}" for i in range(12)]
    queries = [list(rng.choice(head, size=int(rng.integers(2, 7)))) for _ in range(25)]
    queries += [[f"w{i}" for i in range(0, 30, 3)], ["w0", "w1999"], ["w5", "w5", "w5"]]
    for q in queries:
        for k in (1, 10, 50):
            (ids, sc), (m_ids, m_sc) = both(packed, q, k)
            assert ids.tolist() == m_ids.tolist() and np.array_equal(sc, m_sc), (q, k)


def test_dispatch_sends_dense_queries_to_the_window_kernel(tmp_path):
    docs, queries = zipf_corpus(2000, seed=4)
    queries += [["w0", "w1"], ["w1", "w0", "w1"], ["w0", "w399"], ["w0"], ["w0", "w1", "w2", "w3"]]
    packed, _ = publish_both(tmp_path, docs)
    acc = np.zeros(packed.n_docs, np.float64)
    touched = np.empty(packed.n_docs, np.int32)
    routed = 0
    for q in queries:
        tids = np.array(packed._query_term_ids(q), np.int64)
        if not len(tids):
            continue
        dense = route._window_suits(packed._pk[0], packed._idf, packed._w_max, tids, packed.n_docs, 10)
        routed += dense
        for exhaustive in (0, 10**9):
            ids, sc = route.search_one(packed._pk, packed._idf, packed._w_max, tids, packed._weights(), 10,
                                      acc, touched, exhaustive)
            m_ids, m_sc = maxscore.search_one(packed._pk, packed._idf, packed._w_max, tids, packed._weights(), 10,
                                              acc, touched, exhaustive)
            assert ids.tolist() == m_ids.tolist() and np.array_equal(sc, m_sc)
            assert not acc.any()  # the shared accumulator is left zeroed
        got = packed.search(q, k=10)  # through PackedBM25Index's dispatch
        r_ids, r_sc = ref_top(q, docs, 10)
        assert got.ids.tolist() == r_ids and np.allclose(got.scores, r_sc, atol=1e-9, rtol=0)
    assert routed >= 3
    args = packed._pk[0], packed._idf, packed._w_max
    rare = np.array([packed.vocab.get("w399"), packed.vocab.get("w0")], np.int64)  # w399 carries the weight
    assert packed.df[rare[0]] * route.RARE_DF_FRACTION < packed.n_docs
    assert not route._window_suits(*args, rare, 2000, 1)
    # Fewer than k documents in the rare terms: no early k-th score for term at a time.
    assert route._window_suits(*args, rare, 2000, int(packed.df[rare[0]]) + 1)
    assert not route._window_suits(*args, np.zeros(windows.MAX_TERMS + 1, np.int64), 2000, 10)


def test_window_kernel_seeds_from_a_rare_term_and_stays_exact(tmp_path):
    # A rare term (under 1% of 30k documents, at least k of them) seeds the k-th score, so
    # the window walk jumps between its documents; the answers stay the MaxScore kernel's.
    docs, _ = zipf_corpus(30_000, n_vocab=2000, seed=6, max_len=60)
    packed, _ = publish_both(tmp_path, docs)
    df = packed.df
    rare = [f"w{i}" for i in range(300, 2000) if 20 <= df[packed.vocab.get(f"w{i}")] < 300][:6]
    assert rare
    pk, wt = packed._pk, packed._weights()
    ar = (pk[7], pk[3], pk[4], pk[5], pk[2])
    for q in ([rare[0], "w0"], [rare[1], "w3", "w0", "w1"], [rare[2], rare[3], "w2"], [rare[4], "w10", "w11"]):
        tids = np.array(packed._query_term_ids(q), np.int64)
        ut, scale, ub = windows._unique_terms(tids, packed._idf, packed._pk[0], packed._w_max, wt[2] + 1.0)
        seed = windows._seed(pk, ar, ut, scale, ub, 10, pk[13], wt, None)  # no filter
        for k in (1, 10):
            (ids, sc), (m_ids, m_sc) = both(packed, q, k)
            assert ids.tolist() == m_ids.tolist() and np.array_equal(sc, m_sc), (q, k)
        assert 0.0 < seed <= m_sc[9], q  # a lower bound of the true 10th score


def test_routed_batch_equals_routed_single_queries(tmp_path):
    # One batch mixing window-kernel and MaxScore queries, unknown tokens (-1) and empty
    # queries: each row is search_one's answer bit for bit, whichever route allocated the
    # shared scratch first (or none: exhaustive 0 with only window queries).
    docs, queries = zipf_corpus(2000, seed=7)
    packed, _ = publish_both(tmp_path, docs)
    queries += [["w0", "w1"], ["nope"], [], ["w0", "nope", "w2"], ["w399", "w0"], ["w1", "w1", "w0"]]
    args, wt, n = (packed._pk, packed._idf, packed._w_max), packed._weights(), packed.n_docs
    tids = [[packed.vocab.get(t, -1) for t in q] for q in queries]
    dense = [q for q, t in zip(queries, tids, strict=True)
             if -1 not in t and t and route._window_suits(args[0][0], *args[1:], np.array(t, np.int64), n, 10)]
    assert dense and len(dense) < len(queries)
    acc, touched = np.zeros(n, np.float64), np.empty(n, np.int32)
    for batch in (queries, dense, queries[::-1]):
        t_batch = [[packed.vocab.get(t, -1) for t in q] for q in batch]
        flat = np.array([t for q in t_batch for t in q], np.int64)
        ptr = np.cumsum([0] + [len(q) for q in t_batch]).astype(np.int64)
        for exhaustive in (0, 10**9):
            ids, sc, cnt = route.search_batch(*args, flat, ptr, wt, 10, n, exhaustive)
            for i, q in enumerate(t_batch):
                known = np.array([t for t in q if t >= 0], np.int64)
                if not len(known):
                    assert cnt[i] == 0 and (ids[i] == -1).all()
                    continue
                w_ids, w_sc = route.search_one(*args, known, wt, 10, acc, touched, exhaustive)
                c = int(cnt[i])
                assert ids[i, :c].tolist() == w_ids.tolist() and np.array_equal(sc[i, :c], w_sc)
                assert (ids[i, c:] == -1).all()


def test_a_rare_lead_term_goes_term_at_a_time(tmp_path):
    # Issue 47: short queries of mid-frequency terms lost to Lucene when a rare term (under
    # 1% of the documents) carried the largest bound but less than twice the others': the
    # window kernel walked the corpus in 4,096-document windows (~N/4096 of them, each with
    # its fixed cost), where term at a time reads the rare term's few postings and looks the
    # others up (2-3x faster at 1M). Such a query now goes term at a time, same answers.
    docs, _ = zipf_corpus(30_000, n_vocab=2000, seed=6, max_len=60)
    packed, _ = publish_both(tmp_path, docs)
    args = packed._pk[0], packed._idf, packed._w_max
    n = packed.n_docs
    every = np.arange(packed.n_terms)
    ub = term_idf(packed._idf, packed.df, every) * term_wmax(*packed._w_max, every)
    df = packed.df
    tid = {f"w{i}": packed.vocab.get(f"w{i}") for i in range(2000) if packed.vocab.get(f"w{i}") is not None}
    k = 1  # a lead needs LEAD_MIN_K x k documents; rare ones here hold under 300
    rare = [w for w, t in tid.items() if df[t] >= route.LEAD_MIN_K * k and df[t] * route.RARE_DF_FRACTION < n]
    mid = [w for w, t in tid.items() if df[t] * route.RARE_DF_FRACTION >= n]
    pairs = [(r, m) for r in rare[:40] for m in mid
             if ub[tid[r]] / route.RARE_WEIGHT < ub[tid[m]] < route.LEAD_REST * ub[tid[r]]][:5]
    assert pairs
    pk, wt = packed._pk, packed._weights()
    acc = np.zeros(n, np.float64)
    touched = np.empty(n, np.int32)
    exacts = 0
    for q in pairs:
        tids = np.array(packed._query_term_ids(list(q)), np.int64)
        assert not route._window_suits(*args, tids, n, k), q  # the old rule (rare >= 2x others) said window
        # Too few documents for a k of 10: the window kernel keeps it.
        assert route._window_suits(*args, tids, n, 10), q
        ids, sc = route.search_one(pk, packed._idf, packed._w_max, tids, wt, k, acc, touched, 0)
        w_ids, w_sc = windows.window_top_k(pk, packed._idf, packed._w_max, tids, wt, k)
        assert ids.tolist() == w_ids.tolist() and np.array_equal(sc, w_sc), q
        r_ids, r_sc = ref_top(list(q), docs, k)
        assert ids.tolist() == r_ids and np.allclose(sc, r_sc, atol=1e-9, rtol=0)
        for kk in (1, 3, 10):  # the lead kernel: exact and bit-identical, or it says it is not
            l_ids, l_sc, exact = lead.lead_top_k(pk, packed._idf, packed._w_max, tids, wt, kk)
            m_ids, m_sc = maxscore.search_one(pk, packed._idf, packed._w_max, tids, wt, kk, acc, touched, 0)
            assert not exact or (l_ids.tolist() == m_ids.tolist() and np.array_equal(l_sc, m_sc)), (q, kk)
            exacts += exact
    assert exacts > 0
    # A rare lead whose others' bounds pass LEAD_REST x its own stays with the window kernel;
    # the lead kernel on it says whether it is exact, and is right when it says so.
    r, m = pairs[0]
    third = next(w for w in mid if w != m and ub[tid[w]] + ub[tid[m]] >= ub[tid[r]]
                 and ub[tid[r]] < route.RARE_WEIGHT * (ub[tid[w]] + ub[tid[m]]))
    tids = np.array([tid[r], tid[m], tid[third]], np.int64)
    assert route._window_suits(*args, tids, n, k)
    l_ids, l_sc, exact = lead.lead_top_k(pk, packed._idf, packed._w_max, tids, wt, 10)
    m_ids, m_sc = maxscore.search_one(pk, packed._idf, packed._w_max, tids, wt, 10, acc, touched, 0)
    assert not exact or (l_ids.tolist() == m_ids.tolist() and np.array_equal(l_sc, m_sc))
