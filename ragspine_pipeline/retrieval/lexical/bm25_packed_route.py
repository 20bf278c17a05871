"""Which exact kernel answers an unfiltered query over packed postings, single or batched.

Why a router: the exact kernels win on different query shapes, and every one of them
returns the same answers bit for bit (``_unique_terms`` order of additions, ties to the
lower position), so the choice is only about speed:

- the term-at-a-time MaxScore kernel (``bm25_packed_kernels.search_one``) when a query
  holds a rare term: it scores the rare term's few documents first, the k-th score is
  high at once, and the long lists are only looked up at those candidates;
- block-max MaxScore (``bm25_packed_wand.bmm_top_k``) for queries of dense terms only,
  where term-at-a-time reads every posting of every head term.

The small-corpus exhaustive route stays inside the MaxScore kernel.
"""

import numpy as np
from numba import njit

from .bm25_packed_kernels import search_one as maxscore_one
from .bm25_packed_wand import bmm_top_k

# Measured rule (1M synthetic Zipf, benchmarks/results/bm25_packed_1m.md): block-max
# MaxScore beats the TAAT kernel on queries of exactly two distinct terms that each
# occur in >= 1% of the documents (2x on those), and loses on rarer or longer ones.
DENSE_DF_FRACTION = 100  # a term is dense when df x this >= the documents


@njit(cache=True, nogil=True)
def _two_dense_terms(indptr, qtids, n_docs):
    """Whether the query has exactly two distinct terms, both dense."""
    a = qtids[0]
    b = -1
    for x in range(qtids.shape[0]):
        t = qtids[x]
        if t != a:
            if b < 0:
                b = t
            elif t != b:
                return False
    if b < 0:
        return False
    return ((indptr[a + 1] - indptr[a]) * DENSE_DF_FRACTION >= n_docs
            and (indptr[b + 1] - indptr[b]) * DENSE_DF_FRACTION >= n_docs)


@njit(cache=True, nogil=True)
def search_one(pk, idf, wmax, qtids, wt, k, acc, touched, exhaustive_docs):
    """``bm25_packed_kernels.search_one``'s signature and answers (bit-identical), by the
    kernel that is fastest for the query's shape (module docstring). acc must be all
    zeros on entry and is all zeros again on return."""
    n_docs = acc.shape[0]
    if n_docs > exhaustive_docs and _two_dense_terms(pk[0], qtids, n_docs):
        return bmm_top_k(pk, idf, wmax, qtids, wt, k)
    return maxscore_one(pk, idf, wmax, qtids, wt, k, acc, touched, exhaustive_docs)


@njit(cache=True, nogil=True)
def search_batch(pk, idf, wmax, q_flat, q_ptr, wt, k, n_docs, exhaustive_docs):
    """Top-k of queries q_ptr[i]:q_ptr[i+1] of q_flat (-1: unknown token), serially and
    without the GIL, each routed as ``search_one``: (ids[nq, k] padded with -1,
    scores[nq, k], counts)."""
    nq = q_ptr.shape[0] - 1
    out_i = np.full((nq, k), -1, np.int64)
    out_s = np.zeros((nq, k), np.float64)
    out_n = np.zeros(nq, np.int64)
    acc = np.zeros(max(n_docs, 1), np.float64)
    touched = np.empty(max(n_docs, 1), np.int32)
    for q in range(nq):
        q_t = q_flat[q_ptr[q]:q_ptr[q + 1]]
        m = 0
        for x in range(q_t.shape[0]):
            if q_t[x] >= 0:
                m += 1
        if m == 0:
            continue
        kept = np.empty(m, np.int64)
        m = 0
        for x in range(q_t.shape[0]):
            if q_t[x] >= 0:
                kept[m] = q_t[x]
                m += 1
        ids, sc = search_one(pk, idf, wmax, kept, wt, k, acc, touched, exhaustive_docs)
        n = ids.shape[0]
        out_n[q] = n
        out_i[q, :n] = ids
        out_s[q, :n] = sc
    return out_i, out_s, out_n
