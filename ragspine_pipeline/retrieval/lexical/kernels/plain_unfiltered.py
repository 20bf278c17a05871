"""The unfiltered numba BM25 route: ``search_one`` (exhaustive or MaxScore with block-max
skipping) and ``search_batch`` (many queries without the GIL, through ``batch_kernel``, the
batch loop the packed route shares). See ``kernels.loader``.

The posting loops index with unsigned ints (``np.uint64`` positions and doc ids): with a
signed index numba adds a negative-index wraparound to every access (``kernels.selection``).
"""

from collections.abc import Callable

import numpy as np
from numba import njit

from ..format.raw import BLOCK_SIZE
from .selection import (
    _SLACK,
    _broad,
    _distinct,
    _drain,
    _gallop,
    _kth_score,
    _narrow,
    _prune,
    _push,
    _suffix_sums,
    _take_top,
)
from .weight import term_bound, term_scale, term_wmax

# Postings per block of the block-max bounds: the builder's constant (numba reads it as a
# compile-time constant), so the two can never disagree.
_BLOCK = BLOCK_SIZE


@njit(cache=True, nogil=True)
def _unique_terms(qtids, idf, wmax, k1p1):
    """Distinct query terms (repeats multiply the scale), by descending upper bound."""
    ut, mult, _first = _distinct(qtids)
    return _by_bound(ut, mult, idf[ut], wmax, k1p1)


@njit(cache=True, nogil=True)
def _by_bound(ut, mult, ut_idf, wmax, k1p1):
    """Distinct terms ``ut`` (idf ``ut_idf``, repeats ``mult``) with their scales and
    bounds, by descending bound (both layouts; the packed one finds idf its own way)."""
    nu = ut.shape[0]
    scale = np.empty(nu, np.float64)
    ub = np.empty(nu, np.float64)
    for y in range(nu):
        scale[y] = term_scale(ut_idf[y], k1p1, mult[y])
        ub[y] = term_bound(scale[y], term_wmax(wmax, ut[y]))
    order = np.argsort(-ub, kind="mergesort")
    return ut[order], scale[order], ub[order]


@njit(cache=True, nogil=True)
def _exhaustive(indptr, indices, w, idf, qtids, k1p1, k, acc):
    """Every posting scattered into the corpus-sized acc, then one ordered pass over acc.

    For a query whose postings cover much of a small corpus this is the cheapest exact
    route: no touched-list bookkeeping, no pruning checks, and the selection pass reads
    acc sequentially (zeroing it as it goes). Scanning docs in position order, a doc
    enters a full heap only with a strictly greater score (ties go to the lower position).
    """
    for j in range(qtids.shape[0]):  # per query token, in query order (as the reference)
        t = qtids[j]
        s = term_scale(idf[t], k1p1, 1.0)
        for p in range(indptr[t], indptr[t + 1]):
            acc[np.uint64(indices[p])] += w[p] * s
    kk = max(k, 1)
    hs = np.empty(kk, np.float64)
    hi = np.empty(kk, np.int64)
    n = 0
    thr = 0.0  # heap not yet full: any positive score enters
    for d in range(acc.shape[0]):
        v = acc[d]
        acc[d] = 0.0
        if v > thr:
            n = _push(hs, hi, n, kk, v, d)
            if n == kk:
                thr = hs[0]
    return _drain(hs, hi, n)


@njit(cache=True, nogil=True)
def search_one(indptr, indices, w, idf, wmax, qtids, k1p1, k, acc, touched, exhaustive_docs, bptr, bmax):
    """Exact unfiltered top-k (see the module docstring).

    On a corpus of at most ``exhaustive_docs`` documents, when the query's postings
    number at least a quarter of the corpus, every posting is scored (``_exhaustive``);
    otherwise term-at-a-time MaxScore. acc must be all zeros on entry and is all zeros
    again on return.
    """
    n_docs = acc.shape[0]
    if n_docs <= exhaustive_docs and _broad(indptr, qtids, n_docs):  # a broad query: score everything
        return _exhaustive(indptr, indices, w, idf, qtids, k1p1, k, acc)
    ut, scale, ub = _unique_terms(qtids, idf, wmax, k1p1)
    nu = ut.shape[0]
    remaining = _suffix_sums(ub)  # remaining[j] = sum ub[j:]
    hs = np.empty(max(k, 1), np.float64)
    hi = np.empty(max(k, 1), np.int64)
    n_t = 0
    j = 0
    theta = -1.0
    top1 = 0.0  # best partial so far: theta <= top1, a free necessary test
    if nu > 0 and k > 0:
        # The first (highest-bound) term, block by block. acc is still empty, so a doc's
        # final score is at most its block's max w x scale + the other terms' bounds;
        # once k docs are seen, a block whose bound is below the k-th best so far cannot
        # hold a top-k doc and is skipped whole (its docs may still be touched by later
        # terms: their partial then lacks this term, and stays below a true top-k score).
        t = ut[0]
        s = scale[0]
        rest = remaining[1] * (1.0 + _SLACK)
        s0 = indptr[t]
        e0 = indptr[t + 1]
        b = bptr[t]
        nh = 0
        for p0 in range(s0, e0, _BLOCK):
            if nh == k and bmax[b] * s * (1.0 + _SLACK) + rest < hs[0]:
                b += 1
                continue
            b += 1
            for p in range(np.uint64(p0), np.uint64(min(p0 + _BLOCK, e0))):
                d = indices[p]
                v = w[p] * s
                touched[np.uint64(n_t)] = d
                n_t += 1
                acc[np.uint64(d)] = v
                if v > top1:
                    top1 = v
                if nh < k or v > hs[0]:
                    nh = _push(hs, hi, nh, k, v, d)
        j = 1
    while j < nu:
        t = ut[j]
        s0 = indptr[t]
        e0 = indptr[t + 1]
        if j > 0 and n_t >= k and remaining[j] * (1.0 + _SLACK) < top1 and 8 * (e0 - s0) >= n_t:
            # Checking costs about n_t; only do it before a list at least that long.
            theta = _kth_score(acc, touched, n_t, k, hs, hi)
            if remaining[j] * (1.0 + _SLACK) < theta:
                break
        s = scale[j]
        for p in range(np.uint64(s0), np.uint64(e0)):
            d = indices[p]
            u = np.uint64(d)
            v = acc[u]
            if v == 0.0:
                touched[np.uint64(n_t)] = d
                n_t += 1
            v += w[p] * s
            acc[u] = v
            if v > top1:
                top1 = v
        j += 1
    if j == nu:
        return _take_top(acc, touched, n_t, k, hs, hi)
    # Lookup phase. Candidates keep their partial score in acc (everyone else is
    # zeroed); after each remaining term, theta is re-taken and candidates that can
    # no longer reach it are dropped, so later (longer, lower-bound) lists see few.
    cand = np.empty(n_t, np.int64)
    nc = _prune(acc, touched, n_t, remaining[j] * (1.0 + _SLACK), theta, cand)
    is_sorted = False  # galloping needs sorted candidates; sort only when it is chosen
    for jj in range(j, nu):
        t = ut[jj]
        s = scale[jj]
        lo = indptr[t]
        e0 = indptr[t + 1]
        df = e0 - lo
        if nc * (4 + 2 * np.log2(df / max(nc, 1) + 1.0)) < df:
            if not is_sorted:
                cand[:nc] = np.sort(cand[:nc])
                is_sorted = True
            for x in range(nc):
                if lo >= e0:
                    break
                d = cand[x]
                lo = _gallop(indices, lo, e0, d)
                if lo < e0 and indices[lo] == d:
                    acc[d] += w[lo] * s
        else:
            for p in range(np.uint64(lo), np.uint64(e0)):
                u = np.uint64(indices[p])
                if acc[u] != 0.0:
                    acc[u] += w[p] * s
        if jj + 1 < nu and nc > k:
            nc = _narrow(acc, cand, nc, k, remaining[jj + 1] * (1.0 + _SLACK), hs, hi)
    return _take_top(acc, cand, nc, k, hs, hi)


def batch_kernel(query: Callable[..., tuple]) -> Callable[..., tuple]:
    """The batch loop shared by the unfiltered routes (plain here, packed in
    ``kernels.packed_route``), compiled around ``query``: ``loop(ctx, q_flat, q_ptr, k,
    n_docs)`` answers queries q_ptr[i]:q_ptr[i+1] of q_flat (-1: a token outside the
    vocabulary, dropped) serially and without the GIL (callers run chunks on threads), as
    (ids[nq, k] padded with -1, scores[nq, k], counts).

    ``query(ctx, qtids, k, acc, touched, n_docs)`` answers one query with known terms and
    returns (ids, scores, acc, touched): the corpus-sized scratch starts empty and a route
    that needs it allocates it (``scratch``) and hands it back for the next query, so a
    batch whose queries all take a route without it (the packed window kernel) never
    allocates N floats per thread.

    Why a closure and not ``query`` as an argument: numba cannot cache a function that
    passes a jitted function as an argument ("uses dynamic globals"), so every process
    would recompile the batch entry points; a closure's ``query`` is a compile-time global
    and the entry points' ``cache=True`` holds (they link the loop in). The loop itself
    is not cached: its cache key pickles ``query``, which differs per process, so each
    compile would only add a file that is never read. The loop and the ``query`` functions
    are inlined (numba IR) into the entry point: every separately compiled layer
    re-optimizes the kernels it links, which took a cold compile of the packed batch
    from 4.9 s to 11.4 s on 2 cores before they were.

    numba's ``parallel=True`` was measured here and not used: its OpenMP/TBB pools
    busy-wait at barriers, which on a shared 2-core machine cost 20-50 ms per call.
    """

    @njit(nogil=True, inline="always")
    def loop(ctx, q_flat, q_ptr, k, n_docs):
        nq = q_ptr.shape[0] - 1
        out_i = np.full((nq, k), -1, np.int64)
        out_s = np.zeros((nq, k), np.float64)
        out_n = np.zeros(nq, np.int64)
        acc = np.zeros(0, np.float64)
        touched = np.empty(0, np.int32)
        for q in range(nq):
            q_t = _known_terms(q_flat[q_ptr[q] : q_ptr[q + 1]])
            if q_t.shape[0] == 0:
                continue
            ids, sc, acc, touched = query(ctx, q_t, k, acc, touched, n_docs)
            n = ids.shape[0]
            out_n[q] = n
            out_i[q, :n] = ids
            out_s[q, :n] = sc
        return out_i, out_s, out_n

    return loop


@njit(cache=True, nogil=True)
def _known_terms(q_t):
    """The query's term ids without the -1s of tokens outside the vocabulary (q_t itself
    when it has none)."""
    m = 0
    for x in range(q_t.shape[0]):
        if q_t[x] >= 0:
            m += 1
    if m == q_t.shape[0]:
        return q_t
    kept = np.empty(m, q_t.dtype)
    m = 0
    for x in range(q_t.shape[0]):
        if q_t[x] >= 0:
            kept[m] = q_t[x]
            m += 1
    return kept


@njit(cache=True, nogil=True)
def scratch(acc, touched, n_docs):
    """The corpus-sized accumulator (zeros) and touched list of a batch: (acc, touched) as
    given once allocated, else new ones of max(n_docs, 1) entries."""
    if acc.shape[0] == 0:
        acc = np.zeros(max(n_docs, 1), np.float64)
        touched = np.empty(max(n_docs, 1), np.int32)
    return acc, touched


@njit(cache=True, nogil=True, inline="always")
def _plain_query(ctx, qtids, k, acc, touched, n_docs):
    """One query of the plain batch: ``search_one`` (``batch_kernel``'s ``query``)."""
    indptr, indices, w, idf, wmax, k1p1, exhaustive_docs, bptr, bmax = ctx
    acc, touched = scratch(acc, touched, n_docs)
    ids, sc = search_one(indptr, indices, w, idf, wmax, qtids, k1p1, k, acc, touched, exhaustive_docs, bptr, bmax)
    return ids, sc, acc, touched


_plain_batch = batch_kernel(_plain_query)


@njit(cache=True, nogil=True)
def search_batch(indptr, indices, w, idf, wmax, q_flat, q_ptr, k1p1, k, n_docs, exhaustive_docs, bptr, bmax):
    """Top-k of queries q_ptr[i]:q_ptr[i+1] of q_flat, serially and without the GIL
    (callers run chunks on threads; ``batch_kernel``): (ids[nq, k] padded with -1,
    scores[nq, k], counts)."""
    ctx = (indptr, indices, w, idf, wmax, k1p1, exhaustive_docs, bptr, bmax)
    return _plain_batch(ctx, q_flat, q_ptr, k, n_docs)
