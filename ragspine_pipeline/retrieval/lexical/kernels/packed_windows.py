"""Block-max MaxScore over doc windows with a window accumulator: exact top-k over packed
postings (``kernels.packed_route`` sends every query here but those carried by rare terms).

Why: term-at-a-time MaxScore (``kernels.packed.search_one``) reads every posting of
every term it cannot prune, into a corpus-sized accumulator, so a query of head terms at
10M documents reads tens of millions of postings at cache-miss cost. Per-document
block-max MaxScore (``bmm_top_k``, kept as a test reference in
tests/packed_reference_kernels.py) skips well but pays a cursor step per
document of every essential term. Here the corpus is walked in windows, as Lucene's
MaxScore bulk scorer does:

- a window starts where the walk is and ends at the nearest end of the blocks holding its
  start (one bound per term there); each term's bound is its block max x scale. With the
  terms sorted by bound, the smallest ones whose bounds together cannot beat the k-th
  score are *non-essential*; a window whose bounds all together cannot is skipped without
  decoding anything. With non-essential terms the window widens to the essential terms'
  nearest block end (at most ``WINDOW`` documents), the others' bounds taken over it;
- the essential terms' postings in the window are decoded block by block and scattered
  term at a time into a window-sized accumulator (sequential, cache-resident), each term's
  contribution kept apart. A posting whose weight plus every other term's bound cannot
  beat the k-th score marks its document dead;
- the documents left, in position order, take the non-essential terms (largest bound
  first) while their partial score plus the bounds left can still beat the k-th score:
  looked up with blocks unpacked only as far as the last candidate, or scattered when the
  candidates are many;
- the k-th score is seeded from the query's rarest term when it is rare (``_seed``), and
  while it is above the summed bounds of the lowest terms of the whole query, the walk
  jumps to the next block of the other terms that can still beat it.

Exactness: a document's score is summed over its terms in ``_unique_terms`` order, each
``w`` recomputed by ``_w`` and multiplied by the term's scale: the very operations, in the
very order, of the MaxScore kernel's accumulator, so the floats are identical. Bounds are
compared with the shared relative slack (``_SLACK``) and the seed is a lower bound of the
final k-th score, so nothing that can reach the top k is pruned; a document enters a full
heap only with a strictly greater score: documents come in position order, so a tie goes
to the lower position, as ``_take_top`` orders them. At most ``MAX_TERMS`` distinct terms
(one bit each in the window's hit mask); the router sends longer queries elsewhere.
"""

import numpy as np
from numba import njit

from .filter_stats import popcount64
from .packed import _BLOCK, _count, _match_block, _unpack
from .packed_wand import _block_cursors, _seek, _shallow, _sort_by_bound
from .plain_unfiltered import _unique_terms
from .selection import _SLACK, _drain, _gallop, _push, _suffix_sums
from .weight import kept, posting_bound, weigh
from .weight import plain_w as _w

WINDOW = 4096  # documents per window: the accumulator and hit masks stay in L1/L2
MAX_TERMS = 62  # distinct terms: one bit each in an int64 hit mask
DEAD = np.int64(-(2**63))  # a window document's hit mask once it cannot reach the top k
SEED_DF_FRACTION = 100  # seed the k-th score from the rarest term when df x this < documents
SEED_LOOKUPS = 8192  # at most this many seed documents have the other terms looked up


@njit(cache=True, nogil=True, inline="always")
def _widen(last, bmax, scale, blk, bend, m, ordm, ne, live, pre, lo, end_doc, theta):
    """Widen the window to the essential terms' nearest block end (at most ``WINDOW``):
    each non-essential term's bound becomes its largest block max over the window (skip
    data only), re-sorted with the prefix sums. Returns the window's last document."""
    hi = min(lo + WINDOW - 1, end_doc - 1)
    for i in range(ne, live):
        hi = min(hi, last[blk[ordm[i]]])
    for i in range(ne):
        j = ordm[i]
        b = blk[j]
        mx = bmax[b]
        while b + 1 < bend[j] and last[b] < hi:
            b += 1
            mx = max(mx, bmax[b])
        m[j] = mx * scale[j]
    _sort_by_bound(m, ordm, ne, pre)
    return hi


@njit(cache=True, nogil=True, inline="always")
def _postings_in(last, b, bend, hi):
    """Postings (in whole blocks) of a term from its block b up to the window's end."""
    n = 0
    while b < bend:
        n += _BLOCK
        if last[b] >= hi:
            break
        b += 1
    return n


@njit(cache=True, nogil=True, inline="always")
def _scatter(ar, j, lo, hi, blk, b0, bend, cnt, dec, pos, nb, docs, tfs, dcode, wt, scale, wc, whit, wacc,
             wset, nw, only_alive, floor, cut):
    """Term j's postings in [lo, hi], term at a time, into the window: its contribution
    apart (wc), its bit (whit) and the partial sum (wacc); new documents counted in nw and
    set in the window's bitmap wset (a bit per document: read back in position order with
    no sort). With ``only_alive``, only documents already in the window (candidates) take
    it. Otherwise a posting whose weight plus ``floor`` (every other term's bound) cannot
    beat ``cut`` (0: none) marks its document dead (``DEAD``): its whole score is below
    the k-th, whichever terms it holds, so it is dropped with no further work. Returns
    the new count."""
    bit = np.int64(1) << np.int64(j)
    s = scale[j]
    last = ar[4]
    b = blk[j]
    while b < bend[j] and (b == b0[j] or last[b - 1] < hi):
        _seek(ar, j, b, lo, b0, bend, cnt, dec, pos, nb, docs, tfs)
        p = pos[j]
        n = nb[j]
        while p < n and docs[j, p] <= hi:
            d = docs[j, p]
            x = d - lo
            h = whit[x]
            if only_alive:
                if h > 0:
                    c = _w(tfs[j, p], dcode[d], wt) * s
                    whit[x] = h | bit
                    wc[j, x] = c
                    wacc[x] += c
            elif h >= 0:
                c = _w(tfs[j, p], dcode[d], wt) * s
                if h == 0:
                    wset[x >> 6] |= np.uint64(1) << np.uint64(x & 63)
                    nw += 1
                if (c + floor) * (1.0 + _SLACK) < cut:
                    whit[x] = DEAD
                    p += 1
                    continue
                whit[x] = h | bit
                wc[j, x] = c
                wacc[x] += c
            p += 1
        pos[j] = p
        if p < n:
            break
        b += 1
    blk[j] = min(b, bend[j])
    return nw


@njit(cache=True, nogil=True, inline="always")
def _look_up(ar, j, lo, blk, b0, bend, cnt, dcode, wt, scale, wc, whit, wacc, wlist, nw, keys, hit_key, hit_tf):
    """Term j looked up at each candidate wlist[:nw] (ascending), through its block skip
    data: a block holding candidates has its gaps unpacked only as far as the last of
    them, and a tf only for a hit (``_match_block``); other blocks are not read."""
    data, off, dbits, tbits, last = ar
    bit = np.int64(1) << np.int64(j)
    s = scale[j]
    for y in range(nw):
        keys[y] = lo + wlist[y]
    b = blk[j]
    y = 0
    while y < nw and b < bend[j]:
        if last[b] < keys[y]:
            b = _gallop(last, b, bend[j], keys[y])
            continue
        n = _BLOCK if b + 1 < bend[j] else cnt[j]
        y, m = _match_block(data, off, dbits, tbits, last, b, b == b0[j], n, keys, y, nw, hit_key, hit_tf)
        for h in range(m):
            x = wlist[hit_key[h]]
            c = _w(hit_tf[h], dcode[lo + x], wt) * s
            wc[j, x] = c
            whit[x] |= bit
            wacc[x] += c
        if y < nw:
            b += 1
    # The block of the last candidate may hold documents of the next windows.
    blk[j] = min(b, bend[j])


@njit(cache=True, nogil=True, inline="always")
def _drain_bitmap(wset, words, wlist):
    """The set bits of wset[:words] as window slots, ascending, into wlist, clearing the
    words; returns how many. A bit per document gives the candidates in position order
    without sorting them or passing over every slot of the window."""
    n = 0
    for w in range(words):
        z = wset[w]
        wset[w] = np.uint64(0)
        while z != np.uint64(0):
            low = z & (~z + np.uint64(1))
            wlist[n] = (w << 6) + popcount64(low - np.uint64(1))
            n += 1
            z ^= low
    return n


@njit(cache=True, nogil=True, inline="always")
def _keep(wlist, nw, wacc, whit, bound, theta):
    """Keep, in order, the candidates not dead whose partial score plus ``bound`` (the
    bounds of the terms not added yet) can still beat theta; the others' window slots are
    cleared."""
    if theta <= 0.0:
        return nw
    m = 0
    for y in range(nw):
        x = wlist[y]
        if whit[x] < 0 or (wacc[x] + bound) * (1.0 + _SLACK) < theta:
            whit[x] = 0
            wacc[x] = 0.0
        else:
            wlist[m] = x
            m += 1
    return m



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
    (``_seed``, ``kernels.packed_filtered_windows._seed``) and of ``kernels.packed_lead``."""
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
        df = indptr[ut[j] + 1] - indptr[ut[j]]
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


@njit(cache=True, nogil=True)
def window_top_k(pk, idf, wmax, qtids, wt, k):
    """Exact top-k (ids, scores), identical to ``kernels.packed.search_one``'s (module
    docstring). ``qtids`` holds at most ``MAX_TERMS`` distinct terms. Allocates the walk's
    state, seeds the k-th score and runs ``_walk``."""
    k1p1 = wt[2] + 1.0
    ut, scale, ub = _unique_terms(qtids, idf, wmax, k1p1)
    nu = ut.shape[0]
    kk = max(k, 1)
    hs = np.empty(kk, np.float64)
    hi_ = np.empty(kk, np.int64)
    if nu == 0 or k <= 0:
        return _drain(hs, hi_, 0)
    ar = (pk[7], pk[3], pk[4], pk[5], pk[2])
    b0, bend, cnt, blk, dec, pos, nb, docs, tfs = _block_cursors(pk, ut)
    # gsuf[j]: the upper bounds of terms j.. summed (terms are by descending bound).
    gsuf = _suffix_sums(ub)
    # A lower bound of the k-th score from the rarest term's documents, when it is rare.
    theta = _seed(pk, ar, ut, scale, ub, k, pk[13], wt, None)
    nh = _walk(pk[7], pk[3], pk[4], pk[5], pk[2], pk[6], pk[13], wt, scale, ub, theta, b0, bend, cnt, blk, dec, pos,
               nb, docs, tfs, b0.copy(), gsuf, np.zeros((nu, WINDOW), np.float64),
               np.zeros(WINDOW, np.int64), np.zeros(WINDOW, np.float64), np.empty(WINDOW, np.int64),
               np.empty(WINDOW, np.int64), np.empty(_BLOCK, np.int64), np.empty(_BLOCK, np.int64),
               np.zeros(nu, np.float64), np.empty(nu, np.int64), np.zeros(nu + 1, np.float64), hs, hi_,
               np.zeros(WINDOW // 64, np.uint64))
    return _drain(hs, hi_, nh)


@njit(cache=True, nogil=True, _nrt=False)
def _walk(data, off, dbits, tbits, last, bmax, dcode, wt, scale, ub, theta, b0, bend, cnt, blk, dec, pos, nb, docs, tfs,
          jb, gsuf, wc, whit, wacc, wlist, keys, hit_key, hit_tf, m, ordm, pre, hs, hi_, wset):
    """The window walk of ``window_top_k`` over preallocated state (``jb``: the jump
    cursor, blocks passed for good, apart from ``blk``; ``wset``: the window's bitmap of
    documents in play); returns the heap's size.

    Compiled without the runtime's reference counting (``_nrt=False``: it allocates
    nothing), as ``kernels.packed_filtered_windows._walk`` is: with it, every array handed to
    the inlined helpers costs an atomic increment and decrement per call, which perf put
    at about a third of an unfiltered query loop's samples."""
    end_doc = np.int64(dcode.shape[0])
    nu = scale.shape[0]
    kk = hs.shape[0]
    nh = 0
    ar = (data, off, dbits, tbits, last)
    lo = np.int64(0)
    while lo < end_doc:
        if theta > 0.0:
            # Terms ge.. cannot beat theta together, nor can a block of another term whose
            # max plus every other term's bound: jump to the next document that can.
            ge = nu
            while ge > 0 and gsuf[ge - 1] * (1.0 + _SLACK) < theta:
                ge -= 1
            if ge == 0:
                break
            nxt = end_doc
            for j in range(ge):
                # jb only moves on: lo and theta only rise, so a block passed stays passed.
                b = _shallow(last, jb[j], bend[j], lo)
                others = gsuf[0] - ub[j]
                while b < bend[j] and (bmax[b] * scale[j] + others) * (1.0 + _SLACK) < theta:
                    b += 1
                jb[j] = b
                if b >= bend[j]:
                    continue
                start = lo if b == b0[j] else max(lo, last[b - 1] + 1)
                if start > lo:
                    nxt = min(nxt, start)  # the block's start: a bound, nothing decoded
                elif last[b] - lo < WINDOW:
                    nxt = lo  # a short block holds lo: no jump worth a decode
                    break
                else:
                    nxt = min(nxt, _seek(ar, j, b, lo, b0, bend, cnt, dec, pos, nb, docs, tfs))
            if nxt >= end_doc:
                break
            lo = nxt
        # The window: up to the nearest end of the blocks holding lo (each term has one
        # bound there), at most WINDOW documents.
        hi = min(lo + WINDOW - 1, end_doc - 1)
        live = 0
        for j in range(nu):
            b = _shallow(last, blk[j], bend[j], lo)
            blk[j] = b
            if b < bend[j]:
                hi = min(hi, last[b])
                m[j] = bmax[b] * scale[j]
                ordm[live] = j
                live += 1
        if live == 0:
            break
        _sort_by_bound(m, ordm, live, pre)
        if theta > 0.0 and pre[live] * (1.0 + _SLACK) < theta:
            lo = hi + 1
            continue
        ne = 0
        if theta > 0.0:
            while ne < live and pre[ne + 1] * (1.0 + _SLACK) < theta:
                ne += 1
        if ne > 0:
            hi = _widen(last, bmax, scale, blk, bend, m, ordm, ne, live, pre, lo, end_doc, theta)
            while ne > 0 and pre[ne] * (1.0 + _SLACK) >= theta:
                # Wider bounds made the largest non-essential term essential again: its
                # documents must lie in its current block, so the window ends there.
                ne -= 1
                hi = min(hi, last[blk[ordm[ne]]])
        nw = 0
        total = pre[ne]
        for i in range(ne, live):
            total += m[ordm[i]]
        for i in range(ne, live):
            # A posting whose weight plus every other term's bound cannot beat theta
            # kills its document.
            nw = _scatter(ar, ordm[i], lo, hi, blk, b0, bend, cnt, dec, pos, nb, docs, tfs, dcode, wt, scale,
                          wc, whit, wacc, wset, nw, False, total - m[ordm[i]], theta)
        # Candidates in position order, from the window's bitmap (a word per 64 documents:
        # no sort, no pass over the window's slots), which is cleared on the way.
        if nw > 0:
            nw = _drain_bitmap(wset, ((hi - lo) >> 6) + 1, wlist)
        nw = _keep(wlist, nw, wacc, whit, pre[ne], theta)
        for i in range(ne - 1, -1, -1):
            if nw == 0:
                break
            j = ordm[i]
            if 8 * nw >= _postings_in(last, blk[j], bend[j], hi):
                _scatter(ar, j, lo, hi, blk, b0, bend, cnt, dec, pos, nb, docs, tfs, dcode, wt, scale,
                         wc, whit, wacc, wset, 0, True, 0.0, 0.0)
            else:
                _look_up(ar, j, lo, blk, b0, bend, cnt, dcode, wt, scale, wc, whit, wacc, wlist, nw,
                         keys, hit_key, hit_tf)
            nw = _keep(wlist, nw, wacc, whit, pre[i], theta)
        for y in range(nw):
            x = wlist[y]
            # The exact score: the hits summed in _unique_terms order, as MaxScore's acc.
            bits = whit[x]
            sc = 0.0
            for j in range(nu):
                if (bits >> np.int64(j)) & 1:
                    sc += wc[j, x]
            if sc > 0.0 and (nh < kk or sc > hs[0]):
                nh = _push(hs, hi_, nh, kk, sc, lo + x)
                if nh == kk:
                    theta = max(theta, hs[0])
            whit[x] = 0
            wacc[x] = 0.0
        lo = hi + 1
    return nh
