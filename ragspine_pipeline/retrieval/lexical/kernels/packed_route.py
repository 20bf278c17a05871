"""Which exact kernel answers an unfiltered query over packed postings, single or batched.

Why a router: the exact kernels win on different query shapes, and every one of them
returns the same answers bit for bit (``_unique_terms`` order of additions, ties to the
lower position), so the choice is only about speed:

- term-at-a-time MaxScore (``kernels.packed.search_one``) when the query's rare
  terms (each in under 1% of the documents) carry most of its weight and hold at least k
  documents: it scores their few documents first, the k-th score is high at once, and the
  long lists are only looked up at the candidates left;
- a lead-driven pass (``kernels.packed_lead``) first when the largest bound is a rare term's
  and the others' bounds sum to under ``LEAD_REST`` x it (the ``LEAD_*`` constants): it
  reads the lead's postings and looks the others up, nothing corpus-sized; when the lead
  turns out not to be required, term-at-a-time MaxScore answers;
- block-max MaxScore over windows (``kernels.packed_windows.window_top_k``) otherwise, above
  all when every term is long, where term-at-a-time reads every posting of every head
  term.

The cut (rare terms' summed upper bounds at least twice the others') was fitted on the
200 synthetic Zipf queries at 1M and 10M documents, timing both kernels per query: at
10M, TAAT alone took 4.8 s, the window kernel alone 0.73 s, this router 0.67 s, against
0.61 s for the best of the two per query (one process, a shared 2-core box).
The small-corpus exhaustive route stays inside the MaxScore kernel.
"""

from numba import njit

from .packed import search_one as maxscore_one
from .packed_lead import lead_top_k
from .packed_windows import MAX_TERMS, window_top_k
from .plain_unfiltered import batch_kernel, scratch
from .weight import stored_idf, term_bound, term_df, term_wmax

RARE_DF_FRACTION = 100  # a term is rare when df x this < the documents
RARE_WEIGHT = 2.0  # TAAT when the rare terms' bounds sum to at least this x the others'
# TAAT too when the largest bound is a rare term's holding at least LEAD_MIN_K x k documents
# and the others' bounds sum to under LEAD_REST x it: its k-th best weight is then close to
# its bound, so term at a time looks the others up right after it (issue 47: 2-3x faster
# than the window kernel's ~N/4096 windows on two or three mid-frequency terms at 1M). With
# fewer documents its k-th weight can be far below its bound and term at a time would scan
# the other lists whole (measured 1.2 ms against 0.1 ms for a 60-document lead).
LEAD_REST = 0.9
LEAD_MIN_K = 64


@njit(cache=True, nogil=True)
def _window_suits(indptr, idf, wmax, qtids, n_docs, k):
    """Whether the window kernel should answer: the query is short enough for its hit
    masks, and its rare terms (if any) do not carry most of its upper bound nor lead it
    (``LEAD_REST``), or hold fewer than k documents together (term at a time then has no
    k-th score after them and scores the long lists whole: measured 15-27 ms against ~3 ms
    here at 1M, for two common terms and one in 6 documents)."""
    if qtids.shape[0] > MAX_TERMS:
        return False
    rare = 0.0
    other = 0.0
    rare_postings = 0
    for x in range(qtids.shape[0]):
        t = qtids[x]
        ub = term_bound(stored_idf(idf, indptr, t), term_wmax(wmax, t))
        df = term_df(indptr, t)
        if df * RARE_DF_FRACTION < n_docs:
            rare += ub
            rare_postings += df
        else:
            other += ub
    if rare == 0.0 or (rare_postings < k and other > 0.0):
        return True
    if _lead(indptr, idf, wmax, qtids, n_docs, k):
        return False  # a rare lead term: read it, then look the others up
    return rare < RARE_WEIGHT * other


@njit(cache=True, nogil=True)
def _lead(indptr, idf, wmax, qtids, n_docs, k):
    """Whether the largest bound is a rare term's, holding at least ``LEAD_MIN_K`` x k
    documents, with the other terms' bounds summing to under ``LEAD_REST`` x it."""
    top = 0.0
    top_df = 0
    total = 0.0
    for x in range(qtids.shape[0]):
        t = qtids[x]
        ub = term_bound(stored_idf(idf, indptr, t), term_wmax(wmax, t))
        total += ub
        if ub > top:
            top = ub
            top_df = term_df(indptr, t)
    return top_df * RARE_DF_FRACTION < n_docs and top_df >= LEAD_MIN_K * k and total - top < LEAD_REST * top


@njit(cache=True, nogil=True)
def _use_window(pk, idf, wmax, qtids, n_docs, exhaustive_docs, k):
    """Whether the window kernel answers the top-k query on a corpus of n_docs documents
    (the small-corpus exhaustive route stays with the MaxScore kernel)."""
    return n_docs > exhaustive_docs and _window_suits(pk[0], idf, wmax, qtids, n_docs, k)


@njit(cache=True, nogil=True)
def _use_lead(pk, idf, wmax, qtids, n_docs, exhaustive_docs, k):
    """Whether the lead kernel (``kernels.packed_lead``) tries the query first."""
    return n_docs > exhaustive_docs and qtids.shape[0] <= MAX_TERMS and _lead(pk[0], idf, wmax, qtids, n_docs, k)


@njit(cache=True, nogil=True)
def search_one(pk, idf, wmax, qtids, wt, k, acc, touched, exhaustive_docs):
    """``kernels.packed.search_one``'s signature and answers (bit-identical), by the
    kernel that is fastest for the query's shape (module docstring). acc must be all
    zeros on entry and is all zeros again on return."""
    if _use_lead(pk, idf, wmax, qtids, acc.shape[0], exhaustive_docs, k):
        ids, sc, exact = lead_top_k(pk, idf, wmax, qtids, wt, k)
        if exact:
            return ids, sc
    if _use_window(pk, idf, wmax, qtids, acc.shape[0], exhaustive_docs, k):
        return window_top_k(pk, idf, wmax, qtids, wt, k)
    return maxscore_one(pk, idf, wmax, qtids, wt, k, acc, touched, exhaustive_docs)


@njit(cache=True, nogil=True, inline="always")
def _routed_query(ctx, qtids, k, acc, touched, n_docs):
    """One query of the batch, routed as ``search_one`` (``batch_kernel``'s ``query``): the
    corpus-sized scratch is allocated only when a query takes the MaxScore kernel."""
    pk, idf, wmax, wt, exhaustive_docs = ctx
    if _use_lead(pk, idf, wmax, qtids, max(n_docs, 1), exhaustive_docs, k):
        ids, sc, exact = lead_top_k(pk, idf, wmax, qtids, wt, k)
        if exact:
            return ids, sc, acc, touched
    if _use_window(pk, idf, wmax, qtids, max(n_docs, 1), exhaustive_docs, k):
        ids, sc = window_top_k(pk, idf, wmax, qtids, wt, k)
        return ids, sc, acc, touched
    acc, touched = scratch(acc, touched, n_docs)
    ids, sc = maxscore_one(pk, idf, wmax, qtids, wt, k, acc, touched, exhaustive_docs)
    return ids, sc, acc, touched


_routed_batch = batch_kernel(_routed_query)


@njit(cache=True, nogil=True)
def search_batch(pk, idf, wmax, q_flat, q_ptr, wt, k, n_docs, exhaustive_docs):
    """Top-k of queries q_ptr[i]:q_ptr[i+1] of q_flat (-1: unknown token), serially and
    without the GIL, each routed as ``search_one`` (``kernels.plain_unfiltered.batch_kernel``,
    the plain batch's loop): (ids[nq, k] padded with -1, scores[nq, k], counts)."""
    return _routed_batch((pk, idf, wmax, wt, exhaustive_docs), q_flat, q_ptr, k, n_docs)
