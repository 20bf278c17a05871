"""Exact top-k over packed postings driven by a required rare lead term (issue 47).

Why: a short query whose largest bound is a rare term's (``kernels.packed_route``'s lead rule)
is answered fastest by reading the lead's postings and looking the other terms up at its
documents, as Lucene's MaxScore does once only the lead is essential. The window kernel
walks ~N/4,096 windows for it, and term-at-a-time MaxScore scatters the lead into a
corpus-sized accumulator (a cache miss per posting on a cold query). Here nothing is
corpus-sized:

- the lead's blocks are read in order (a block whose max plus the other terms' bounds
  cannot beat the k-th best lead weight so far is not decoded); a document is kept while
  its lead weight plus the others' bounds can still beat it;
- the other terms, largest bound first, are looked up at the kept documents
  (``_match_block``: blocks unpacked only as far as the last candidate), the floor raised
  to the k-th best partial score and the candidates that cannot reach it dropped;
- the answer is exact when the other terms' bounds together cannot beat the final floor
  (every top-k document then holds the lead); otherwise the caller answers another way.

Scores are summed lead first, then in ``_unique_terms`` order, as the MaxScore kernel's
accumulator when the lead is its first term, so the floats are identical; documents come
in position order and enter a full heap only with a strictly greater score, so ties go to
the lower position.
"""

import numpy as np
from numba import njit

from .packed import _BLOCK, _unique_terms
from .packed_seed import _lead_candidates, _raise_floor
from .selection import _SLACK, _drain, _push
from .weight import term_df


@njit(cache=True, nogil=True)
def lead_top_k(pk, idf, wmax, qtids, wt, k):
    """(ids, scores, exact): the top-k when the query's largest-bound term is required;
    ``exact`` False (and nothing else meaningful) when it is not, or holds under k documents."""
    k1p1 = wt[2] + 1.0
    ut, scale, ub = _unique_terms(qtids, idf, pk[0], wmax, k1p1)
    nu = ut.shape[0]
    kk = max(k, 1)
    hs = np.empty(kk, np.float64)
    hi = np.empty(kk, np.int64)
    t = ut[0] if nu > 0 else 0
    df = term_df(pk[0], t) if nu > 0 else 0
    if nu < 2 or k <= 0 or df < k:
        return np.empty(0, np.int64), np.empty(0, np.float64), False
    data, off, dbits, tbits, last, dcode = pk[7], pk[3], pk[4], pk[5], pk[2], pk[13]
    others = 0.0
    for j in range(1, nu):
        others += ub[j]
    rd = np.empty(df, np.int64)
    score = np.empty(df, np.float64)
    bd = np.empty(_BLOCK, np.int64)
    bt = np.empty(_BLOCK, np.int64)
    # The lead's documents that can reach the k-th best of its parts with the others' bounds,
    # then every other term looked up at them (as the window kernel's seed, without a limit).
    ar = (data, off, dbits, tbits, last)
    _, nc = _lead_candidates(pk, ar, t, scale[0], others, kk, hs, hi, None, dcode, wt, rd, score, bd, bt)
    floor, nc = _raise_floor(pk, ar, ut, scale, ub, 0, df, kk, rd, nc, score, hs[0], others, dcode, wt, bd, bt)
    if others * (1.0 + _SLACK) >= floor:
        return np.empty(0, np.int64), np.empty(0, np.float64), False
    nh = 0
    for i in range(nc):
        if score[i] > 0.0 and (nh < kk or score[i] > hs[0]):
            nh = _push(hs, hi, nh, kk, score[i], rd[i])
    ids, sc = _drain(hs, hi, nh)
    return ids, sc, True
