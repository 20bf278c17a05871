"""Compiled (numba) top-k kernel for unfiltered BM25 queries, with a clean fallback.

Why: the numpy path spends most of a short query in per-call overhead (concatenate,
argsort, reduceat, lexsort over every touched posting). One compiled loop that
scatter-adds the precomputed per-posting factors into a reusable accumulator and keeps
a k-sized heap of (score desc, doc asc) does the same arithmetic in a single pass.

numba is optional (the ``fast`` extra, included in ``dev``). ``load_kernel()`` returns
None when it is missing or compilation fails, and ``BM25Index`` then keeps its numpy
path; both give the reference formula's scores (to 1e-9) and the same ties by doc
position, which tests check for both.

The accumulator is corpus-sized and reused between queries, so it is kept per thread
(``threading.local``): concurrent searches on one index never share scratch memory.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import numpy as np

_LOCK = threading.Lock()
_KERNEL: Callable | None = None
_TRIED = False


def _compile() -> Callable:
    from numba import njit

    @njit(cache=True, nogil=True)
    def _worse(sa: float, ia: int, sb: float, ib: int) -> bool:
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
    def top_k_terms(indptr, indices, w, tids, scales, acc, touched, k):
        """Top-k (ids, scores) of sum_j scales[j] * w[postings of tids[j]].

        Terms are added in the given order (the reference's query-token order); acc
        must be all zeros on entry and is all zeros again on return.
        """
        n_t = 0
        for j in range(tids.shape[0]):
            t = tids[j]
            s = scales[j]
            for p in range(indptr[t], indptr[t + 1]):
                d = indices[p]
                if acc[d] == 0.0:
                    touched[n_t] = d
                    n_t += 1
                acc[d] += w[p] * s
        kk = min(k, n_t)
        hs = np.empty(kk, np.float64)
        hi = np.empty(kk, np.int64)
        n = 0
        for x in range(n_t):
            d = touched[x]
            sc = acc[d]
            acc[d] = 0.0
            if sc <= 0.0:
                continue
            if n < kk:
                # sift up
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
        # Pop worst-first into the tail: the output is best-first.
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

    return top_k_terms


def load_kernel() -> Callable | None:
    """The compiled kernel, or None when numba is not installed or cannot compile."""
    global _KERNEL, _TRIED
    if _TRIED:
        return _KERNEL
    with _LOCK:
        if not _TRIED:
            try:
                kernel = _compile()
                # Compile now (tiny input) so a failure falls back here, not mid-query.
                kernel(np.zeros(2, np.int64), np.zeros(0, np.int32), np.zeros(0, np.float64),
                       np.zeros(1, np.int64), np.ones(1, np.float64), np.zeros(1, np.float64),
                       np.zeros(1, np.int32), 1)
                _KERNEL = kernel
            except Exception:  # ImportError or any numba compile error: numpy path
                _KERNEL = None
            _TRIED = True
    return _KERNEL


class Scratch(threading.local):
    """Per-thread accumulator and touched-doc list for one index."""

    def __init__(self, n_docs: int) -> None:
        self.acc = np.zeros(max(n_docs, 1), np.float64)
        self.touched = np.zeros(max(n_docs, 1), np.int32)
