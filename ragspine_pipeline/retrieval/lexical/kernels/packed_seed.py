"""The k-th score seeded before a window walk, both weightings (``kernels.packed_windows``,
``kernels.packed_filtered_windows``) and the lead route's first step (``kernels.packed_lead``).

Why: a window walk prunes only once it knows a lower bound of the k-th score. When the
query's rarest term is rare, its documents are few: the k best of its parts, then the other
terms looked up at the documents that can still beat them, give a true k-th score of real
documents before the walk starts (``_seed``). Written once for the unfiltered weigher and the
filtered one (``weight.weigh`` / ``posting_bound`` / ``kept`` resolve at compile time), so
both walks seed alike.
"""

import numpy as np
from numba import njit

from .packed import _BLOCK, _count, _match_block, _unpack
from .selection import _SLACK, _gallop, _push
from .weight import kept, posting_bound, term_df, weigh

SEED_DF_FRACTION = 100  # seed the k-th score from the rarest term when df x this < documents
SEED_LOOKUPS = 8192  # at most this many seed documents have the other terms looked up


@njit(cache=True, nogil=True, inline="always")
def _above(rd, score, n, rest, floor):
    """Keep, in order, the documents rd[:n] whose score plus ``rest`` can still reach
    ``floor``; returns how many."""
    m = 0
    for i in range(n):
        if (score[i] + rest) * (1.0 + _SLACK) >= floor:
            rd[m] = rd[i]
            score[m] = score[i]
            m += 1
    return m


@njit(cache=True, nogil=True, inline="always")
def _add_at(pk, ar, t, s, rd, nc, score, dcode, wg, bd, bt):
    """score[i] += term t's part (scale s, weigher ``wg``: ``weight.weigh``) at each sorted
    document rd[i] (i < nc) that holds it, reading only the blocks that hold one
    (``_match_block``; bd/bt its scratch)."""
    data, off, dbits, tbits, last = ar
    b = pk[1][t]
    bend = pk[1][t + 1]
    y = 0
    while y < nc and b < bend:
        if last[b] < rd[y]:
            b = _gallop(last, b, bend, rd[y])
            continue
        y, m = _match_block(data, off, dbits, tbits, last, b, b == pk[1][t], _count(pk, t, b), rd, y, nc, bd, bt)
        for h in range(m):
            score[bd[h]] += weigh(wg, s, bt[h], dcode[rd[bd[h]]])
        b += 1


@njit(cache=True, nogil=True, inline="always")
def _lead_candidates(pk, ar, t, s, rest, k, hs, hi, bits, dcode, wg, rd, score, bd, bt):
    """Term t's documents (those ``bits`` keeps; None: all) whose part (scale s) plus
    ``rest`` can still reach the k-th best of its parts so far, into rd/score[:nc], with
    those k best in the heap hs/hi; a block whose bound (``weight.posting_bound``) plus
    ``rest`` cannot is not decoded. Returns (heap size, nc). The first step of the seeds
    (``_seed``, both window walks) and of ``kernels.packed_lead``."""
    data, off, dbits, tbits, last = ar
    bmax, maxtf, minlen = pk[6], pk[9], pk[10]
    nh = 0
    nc = 0
    for b in range(pk[1][t], pk[1][t + 1]):
        if nh == k and (posting_bound(wg, bmax, maxtf, minlen, b, s) + rest) * (1.0 + _SLACK) < hs[0]:
            continue
        n = _count(pk, t, b)
        _unpack(data, off, dbits, tbits, last, b, b == pk[1][t], n, bd, bt)
        for i in range(n):
            d = bd[i]
            if not kept(bits, d):
                continue
            c = weigh(wg, s, bt[i], dcode[d])
            if nh < k or c > hs[0]:
                nh = _push(hs, hi, nh, k, c, d)
            if nh < k or (c + rest) * (1.0 + _SLACK) >= hs[0]:
                rd[nc] = d
                score[nc] = c
                nc += 1
    return nh, nc


@njit(cache=True, nogil=True, inline="always")
def _raise_floor(pk, ar, ut, scale, ub, r, limit, k, rd, nc, score, floor, rest, dcode, wg, bd, bt):
    """The candidates rd/score[:nc] of term r (``_lead_candidates``) that can still reach
    ``floor`` take the other terms, largest bound first (the candidates thin out fastest),
    while they number at most ``limit``; ``floor`` rises to the k-th best of their partial
    scores (a lower bound of the final k-th score: k documents have at least that).
    Returns (floor, nc)."""
    nc = _above(rd, score, nc, rest, floor)
    for j in range(ut.shape[0]):
        if j == r:
            continue
        if nc > limit:
            break
        _add_at(pk, ar, ut[j], scale[j], rd, nc, score, dcode, wg, bd, bt)
        if nc >= k:
            floor = max(floor, np.partition(score[:nc], nc - k)[nc - k])
        rest -= ub[j]
        nc = _above(rd, score, nc, max(rest, 0.0), floor)
    return floor, nc


@njit(cache=True, nogil=True)
def _seed(pk, ar, ut, scale, ub, k, dcode, wg, bits):
    """A lower bound of the final k-th score, or 0, from the rarest term when it holds at
    least k documents (survivors, under the filter ``bits``; None: none) and under
    1/``SEED_DF_FRACTION`` of the corpus, as term-at-a-time MaxScore starts: the k-th best
    of its parts (blocks that cannot beat it with the other terms' bounds are not decoded),
    then the other terms, largest bound first, looked up at the documents that can still
    beat it, raising it to the k-th best of their partial scores; less a relative margin
    for summation order. ``wg``: the weigher (``weight.weigh``), unfiltered or filtered.

    Why: the window walk starts with nothing in its heap, so without a seed it scores
    the first windows of the long lists in full, and cannot jump to the rare term's
    documents. Every document of the final top k scores at least this (k documents do),
    so pruning strictly below it stays exact, and the walk finds and scores the seed
    documents again."""
    indptr = pk[0]
    nu = ut.shape[0]
    r = -1
    best = dcode.shape[0] // SEED_DF_FRACTION
    for j in range(nu):
        df = term_df(indptr, ut[j])
        if df < best:
            best = df
            r = j
    if r < 0 or nu < 2 or best < k:
        return 0.0
    rest = 0.0
    for j in range(nu):
        if j != r:
            rest += ub[j]
    rd = np.empty(best, np.int64)
    score = np.empty(best, np.float64)
    bd = np.empty(_BLOCK, np.int64)
    bt = np.empty(_BLOCK, np.int64)
    hs = np.empty(k, np.float64)
    hi = np.empty(k, np.int64)
    nh, nc = _lead_candidates(pk, ar, ut[r], scale[r], rest, k, hs, hi, bits, dcode, wg, rd, score, bd, bt)
    if nh < k:
        return 0.0  # a filter left under k survivors
    floor, nc = _raise_floor(pk, ar, ut, scale, ub, r, SEED_LOOKUPS, k, rd, nc, score, hs[0], rest, dcode, wg, bd,
                             bt)
    return floor * (1.0 - 4.0 * _SLACK)
