"""Selection and search helpers shared by every numba BM25 kernel (``kernels.plain``).

A bounded min-heap on (score, position) rank, the k-th score, candidate pruning, the
final top-k pass, galloping search and distinct query terms: what both the unfiltered
(``kernels.plain_unfiltered``) and filtered (``kernels.plain_filtered``) routes call, written
once. Module-level ``cache=True`` functions, so numba caches their machine code on disk.

The passes over touched docs index with unsigned ints (``np.uint64``): numba gives every
access with a signed index a negative-index wraparound (a shift, an and, an add), paid per
doc in these memory-bound loops. Dropped here and in the plain posting loops: 1.07-1.17x
single-query qps on 1M synthetic Zipf docs (``benchmarks/ab_plain_kernels.py``), with the
same values added in the same order.
"""

import numpy as np
from numba import njit

from .weight import term_df

# Relative slack on upper bounds when pruning: float sums of a few terms are exact to
# ~1e-15 relative, so 1e-9 never drops a document that could tie or beat theta.
_SLACK = 1e-9


@njit(cache=True, nogil=True, inline="always")
def _worse(sa, ia, sb, ib):
    # a ranks below b: lower score, or the same score and a larger doc position.
    return sa < sb or (sa == sb and ia > ib)


@njit(cache=True, nogil=True)
def _sift_down(hs, hi, pos, n):
    # Min-heap on rank: the root is the worst of the kept top-k.
    while True:
        left = 2 * pos + 1
        if left >= n:
            return
        c = left
        right = left + 1
        if right < n and _worse(hs[right], hi[right], hs[left], hi[left]):
            c = right
        if _worse(hs[c], hi[c], hs[pos], hi[pos]):
            hs[pos], hs[c] = hs[c], hs[pos]
            hi[pos], hi[c] = hi[c], hi[pos]
            pos = c
        else:
            return


@njit(cache=True, nogil=True)
def _push(hs, hi, n, kk, sc, d):
    """Offer (sc, d) to a heap of n <= kk entries; returns the new size."""
    if n < kk:
        pos = n
        hs[pos] = sc
        hi[pos] = d
        n += 1
        while pos > 0:
            parent = (pos - 1) // 2
            if _worse(hs[pos], hi[pos], hs[parent], hi[parent]):
                hs[pos], hs[parent] = hs[parent], hs[pos]
                hi[pos], hi[parent] = hi[parent], hi[pos]
                pos = parent
            else:
                break
    elif _worse(hs[0], hi[0], sc, d):
        hs[0] = sc
        hi[0] = d
        _sift_down(hs, hi, 0, n)
    return n


@njit(cache=True, nogil=True)
def _drain(hs, hi, n):
    """Heap -> (ids, scores) best-first."""
    out_s = np.empty(n, np.float64)
    out_i = np.empty(n, np.int64)
    m = n
    while m > 0:
        out_s[m - 1] = hs[0]
        out_i[m - 1] = hi[0]
        m -= 1
        hs[0] = hs[m]
        hi[0] = hi[m]
        _sift_down(hs, hi, 0, m)
    return out_i, out_s


@njit(cache=True, nogil=True)
def _kth_score(acc, touched, n_t, k, hs, hi):
    """The k-th best accumulated score among the touched docs (n_t >= k)."""
    n = 0
    for x in range(np.uint64(n_t)):
        d = touched[x]
        v = acc[np.uint64(d)]
        if n < k or v >= hs[0]:  # most are below the root: one compare, no call
            n = _push(hs, hi, n, k, v, d)
    return hs[0]


@njit(cache=True, nogil=True)
def _prune(acc, src, n, bound, theta, dst):
    """Keep the docs of src[:n] whose partial score + bound can still reach theta, in
    order, into dst (which may be src); zero the others' acc. Returns how many were kept."""
    m = 0
    for x in range(np.uint64(n)):
        d = src[x]
        u = np.uint64(d)
        if acc[u] + bound >= theta:
            dst[np.uint64(m)] = d
            m += 1
        else:
            acc[u] = 0.0
    return m


@njit(cache=True, nogil=True)
def _narrow(acc, cand, nc, k, bound, hs, hi):
    """Between two look-up terms (nc > k): keep, in order, the candidates cand[:nc] whose
    partial score + ``bound`` (the later terms' bounds) can still reach the k-th best
    partial score among them, zeroing the others' acc (``_prune``); returns how many. The
    k-th partial score is a lower bound of the final k-th, so nothing of the top k goes."""
    return _prune(acc, cand, nc, bound, _kth_score(acc, cand, nc, k, hs, hi), cand)


@njit(cache=True, nogil=True)
def _take_top(acc, docs, n, k, hs, hi):
    """Top-k of docs[:n] by (acc desc, position asc), zeroing their acc: the end of a query."""
    kk = min(k, n)
    c = 0
    for x in range(np.uint64(n)):
        d = docs[x]
        u = np.uint64(d)
        sc = acc[u]
        acc[u] = 0.0
        if sc > 0.0 and (c < kk or sc >= hs[0]):
            c = _push(hs, hi, c, kk, sc, d)
    return _drain(hs, hi, c)


@njit(cache=True, nogil=True, inline="always")
def _gallop(post, lo, hi_, d):
    """First position p in post[lo:hi_] with post[p] >= d (exponential, then binary)."""
    step = 1
    p = lo
    while p < hi_ and post[p] < d:
        lo = p + 1
        p = lo + step
        step *= 2
    if p > hi_:
        p = hi_
    # post[lo-1] < d (or lo is the start); answer is in [lo, p]
    while lo < p:
        mid = (lo + p) // 2
        if post[mid] < d:
            lo = mid + 1
        else:
            p = mid
    return lo


@njit(cache=True, nogil=True)
def _gallop_each(post, lo, hi_, docs, n, out):
    """For each of the ascending docs[:n]: its index in post[lo:hi_], or -1 when absent
    (galloping forward from the previous hit). Returns how many were found."""
    found = 0
    for x in range(n):
        if lo >= hi_:
            out[x] = -1
            continue
        d = docs[x]
        lo = _gallop(post, lo, hi_, d)
        if lo < hi_ and post[lo] == d:
            out[x] = lo
            found += 1
        else:
            out[x] = -1
    return found


@njit(cache=True, nogil=True)
def _distinct(qtids):
    """(distinct term ids in first-seen order, how often each occurs, the query position
    of each one's first occurrence). Queries are short: a linear scan beats hashing."""
    m = qtids.shape[0]
    ut = np.empty(m, np.int64)
    mult = np.zeros(m, np.float64)
    first = np.empty(m, np.int64)
    nu = 0
    for x in range(m):
        t = qtids[x]
        found = -1
        for y in range(nu):
            if ut[y] == t:
                found = y
                break
        if found < 0:
            ut[nu] = t
            mult[nu] = 1.0
            first[nu] = x
            nu += 1
        else:
            mult[found] += 1.0
    return ut[:nu], mult[:nu], first[:nu]



@njit(cache=True, nogil=True, inline="always")
def _suffix_sums(ub):
    """out[j] = ub[j] + ub[j + 1] + ... (out[len] = 0), added from the end: the bounds of the
    terms not read yet, as every MaxScore-style kernel keeps them (the same additions in the
    same order everywhere, so the routes prune alike)."""
    nu = ub.shape[0]
    out = np.zeros(nu + 1, np.float64)
    for j in range(nu - 1, -1, -1):
        out[j] = out[j + 1] + ub[j]
    return out


@njit(cache=True, nogil=True, inline="always")
def _broad(indptr, qtids, n_docs):
    """Whether a query's postings number at least a quarter of the corpus with no single
    list holding half of them (that one MaxScore would mostly skip): the exhaustive route's
    test, both layouts."""
    total = 0
    longest = 0
    for j in range(qtids.shape[0]):
        df = term_df(indptr, qtids[j])
        total += df
        longest = max(longest, df)
    return 4 * total >= n_docs and 2 * longest < total
