"""The filtered kernels' tf-1 weight tables (``bm25_packed_filter_weights``) hold, per term
and length code, the very float the kernels compute per posting, and a packed filtered
query that reads them answers bit for bit as the plain layout's kernel, on every route
(issue #27 item 4: a dense filter no slower than no filter)."""

import numpy as np
import pytest

from ragspine_pipeline.retrieval.lexical.index import (
    packed_filter_search as bm25_packed_filter_search,
)
from ragspine_pipeline.retrieval.lexical.index.filter import PackedFilter
from ragspine_pipeline.retrieval.lexical.index.packed_filter_support import support
from tests.test_bm25_mmap import zipf_corpus
from tests.test_bm25_packed import publish_both

pytest.importorskip("numba")

from ragspine_pipeline.retrieval.lexical.kernels.packed_filter_weights import (
    TAB_CODES,
    TAB_MIN,
    code_dens,
    tf1_tables,
    window_tables,
)


def test_tables_hold_the_per_posting_floats():
    rng = np.random.default_rng(3)
    clen = np.sort(rng.choice(np.arange(1, 400), 60, replace=False)).astype(np.uint32)
    k1, b, avgdl = 1.2, 0.75, float(rng.uniform(10, 90))
    kb, bavg = 1.0 - b, b / avgdl
    scale = rng.uniform(0.1, 9.0, 4)
    dfs = np.array([5, 0, 7, 9])
    postings = np.array([TAB_MIN * 60, 10**6, TAB_MIN * 60 - 1, 10**6])
    den = code_dens(clen, k1, kb, bavg)
    tab, row = tf1_tables(postings, dfs, scale, den)
    assert row.tolist() == [0, -1, -1, 1] and tab.shape == (2, 60)  # no survivors, or a short list: no row
    f = 1.0
    for y, r in ((0, 0), (3, 1)):
        # The kernels' expression, written as they write it, element by element.
        want = [scale[y] * f / (f + k1 * (kb + bavg * float(n))) for n in clen]
        assert tab[r].tolist() == want
    wt = window_tables(scale, den)
    assert wt.shape == (4, 60) and np.array_equal(wt[0], tab[0]) and np.array_equal(wt[3], tab[1])
    assert window_tables(scale, np.zeros(TAB_CODES + 1)).shape == (4, 0)  # too many codes: none
    assert tf1_tables(postings, dfs, scale, np.zeros(0))[1].tolist() == [-1] * 4  # no codes


def test_tabled_filtered_queries_equal_the_plain_kernel(tmp_path, monkeypatch):
    docs, queries = zipf_corpus(20_000, n_vocab=400, seed=11, max_len=30)
    packed, plain = publish_both(tmp_path, docs)
    nc = support(packed).code_lengths().shape[0]
    assert nc > 0 and max(len(packed.indptr) - 1, 0) > 0
    longest = int(np.diff(np.asarray(packed.indptr)).max())
    assert longest >= TAB_MIN * nc  # the head terms' tf-1 parts come from the tables
    rng = np.random.default_rng(5)
    for keep in (0.5, 1.0, 0.3):
        mask = rng.random(len(docs)) < keep
        filt = PackedFilter.from_mask(mask)
        for q in queries[:12]:
            want = plain.search(q, k=10, candidates=mask)
            for route in (1, 0, 2):
                monkeypatch.setattr(bm25_packed_filter_search, "WINDOWS", route)
                for _ in range(2):  # the reused filter's remembered statistics too
                    got = packed.search(q, k=10, candidates=filt)
                    assert got.ids.tolist() == want.ids.tolist(), (keep, route, q)
                    assert np.array_equal(got.scores, want.scores), (keep, route, q)
