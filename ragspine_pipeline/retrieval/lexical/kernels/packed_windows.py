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
``w`` recomputed by ``weight.plain_w`` and multiplied by the term's scale: the very operations, in the
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
from .packed import _BLOCK, _match_block, _unique_terms
from .packed_seed import _seed
from .packed_wand import _block_cursors, _seek, _shallow, _sort_by_bound
from .selection import _SLACK, _drain, _gallop, _push, _suffix_sums
from .weight import blk_bmax, kept, posting_bound, weigh_coded

WINDOW = 4096  # documents per window: the accumulator and hit masks stay in L1/L2
MAX_TERMS = 62  # distinct terms: one bit each in an int64 hit mask
DEAD = np.int64(-(2**63))  # a window document's hit mask once it cannot reach the top k


@njit(cache=True, nogil=True, inline="always")
def _widen(last, wg, bmax, maxtf, minlen, scale, blk, bend, m, ordm, ne, live, pre, lo, cap):
    """Widen the window to the essential terms' nearest block end (at most ``WINDOW``,
    ending by ``cap``): each non-essential term's bound becomes its largest block bound
    over the window (skip data only, ``weight.posting_bound`` of the weigher ``wg``),
    re-sorted with the prefix sums. Returns the window's last document. Both weightings:
    the unfiltered bound is the block max x scale, whose largest over blocks is the
    largest max x scale (a product by a positive scale keeps the order: the same float)."""
    hi = min(lo + WINDOW - 1, cap)
    for i in range(ne, live):
        hi = min(hi, last[blk[ordm[i]]])
    for i in range(ne):
        j = ordm[i]
        b = blk[j]
        mx = posting_bound(wg, bmax, maxtf, minlen, b, scale[j])
        while b + 1 < bend[j] and last[b] < hi:
            b += 1
            mx = max(mx, posting_bound(wg, bmax, maxtf, minlen, b, scale[j]))
        m[j] = mx
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
def _scatter(ar, j, lo, hi, blk, b0, bend, cnt, dec, pos, nb, docs, tfs, bits, dcode, wg, tab, s, wc, whit, wacc,
             wset, nw, only_alive, floor, cut):
    """Term j's postings in [lo, hi] that pass the filter ``bits`` (None: no filter; a
    candidate has passed it already), term at a time, into the window: its contribution
    apart (wc), its bit (whit) and the partial sum (wacc); new documents counted in nw and
    set in the window's bitmap wset (a bit per document: read back in position order with
    no sort). With ``only_alive``, only documents already in the window (candidates) take
    it. Otherwise a posting whose weight plus ``floor`` (every other term's bound) cannot
    beat ``cut`` (0: none) marks its document dead (``DEAD``): its whole score is below
    the k-th, whichever terms it holds, so it is dropped with no further work. The weight
    is ``weight.weigh_coded`` of the weigher ``wg`` (``tab``: the filtered tf-1 table).
    Returns the new count."""
    bit = np.int64(1) << np.int64(j)
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
                    c = weigh_coded(wg, tab, j, s, tfs[j, p], dcode[d])
                    whit[x] = h | bit
                    wc[j, x] = c
                    wacc[x] += c
            elif h >= 0 and kept(bits, d):
                c = weigh_coded(wg, tab, j, s, tfs[j, p], dcode[d])
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
def _look_up(ar, j, lo, blk, b0, bend, cnt, dcode, wg, tab, s, wc, whit, wacc, wlist, nw, keys, hit_key, hit_tf):
    """Term j looked up at each candidate wlist[:nw] (ascending), through its block skip
    data: a block holding candidates has its gaps unpacked only as far as the last of
    them, and a tf only for a hit (``_match_block``); other blocks are not read. Both
    weightings (``weight.weigh_coded``)."""
    data, off, dbits, tbits, last = ar
    bit = np.int64(1) << np.int64(j)
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
            c = weigh_coded(wg, tab, j, s, hit_tf[h], dcode[lo + x])
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
def _jump(ar, wg, bmax, maxtf, minlen, scale, ub, gsuf, theta, lo, end_doc, jb, b0, bend, cnt, dec, pos, nb, docs,
          tfs):
    """Where the walk goes next when theta > 0 (both weightings): terms ge.. cannot beat
    theta together, nor can a block of another term whose bound plus every other term's
    bound; the next document that can (``end_doc``: none). ``jb`` only moves on: lo and
    theta only rise, so a block passed stays passed."""
    nu = scale.shape[0]
    ge = nu
    while ge > 0 and gsuf[ge - 1] * (1.0 + _SLACK) < theta:
        ge -= 1
    if ge == 0:
        return end_doc
    last = ar[4]
    nxt = end_doc
    for j in range(ge):
        b = _shallow(last, jb[j], bend[j], lo)
        others = gsuf[0] - ub[j]
        while b < bend[j] and (posting_bound(wg, bmax, maxtf, minlen, b, scale[j]) + others) * (1.0 + _SLACK) < theta:
            b += 1
        jb[j] = b
        if b >= bend[j]:
            continue
        start = lo if b == b0[j] else max(lo, last[b - 1] + 1)
        if start > lo:
            nxt = min(nxt, start)  # the block's start: a bound, nothing decoded
        elif last[b] - lo < WINDOW:
            return lo  # a short block holds lo: no jump worth a decode
        else:
            nxt = min(nxt, _seek(ar, j, b, lo, b0, bend, cnt, dec, pos, nb, docs, tfs))
    return nxt


@njit(cache=True, nogil=True, inline="always")
def _score_window(ar, wg, tab, bits, bd, dcode, scale, theta, lo, hi, cap, cur, win, m, ordm, live, pre, hs, hi_, nh):
    """One window [lo, hi] whose ``live`` terms (``ordm``) have their bounds in ``m``, both
    weightings: sorted by bound, skipped when they cannot beat theta together, else the
    non-essential ones split off (the window widened over them, by ``cap``), the essential
    ones scattered, the candidates left taking the others (largest bound first) while
    they can still beat theta, then the survivors' exact scores pushed on the heap (the
    hits summed in scoring order from 0.0, as the term-at-a-time kernels' accumulator).
    Returns (heap size, theta, the window's last document). The block bounds ``bd``, the
    cursors ``cur`` and the window's state ``win`` come as tuples: an inlined call takes at
    most 30 arguments (past that Python passes them as *args, which numba's inliner refuses)."""
    bmax, maxtf, minlen = bd
    b0, bend, cnt, blk, dec, pos, nb, docs, tfs = cur
    wc, whit, wacc, wlist, keys, hit_key, hit_tf, wset = win
    last = ar[4]
    nu = scale.shape[0]
    kk = hs.shape[0]
    _sort_by_bound(m, ordm, live, pre)
    if theta > 0.0 and pre[live] * (1.0 + _SLACK) < theta:
        return nh, theta, hi
    ne = 0
    if theta > 0.0:
        while ne < live and pre[ne + 1] * (1.0 + _SLACK) < theta:
            ne += 1
    if ne > 0:
        hi = _widen(last, wg, bmax, maxtf, minlen, scale, blk, bend, m, ordm, ne, live, pre, lo, cap)
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
        # A posting whose weight plus every other term's bound cannot beat theta kills
        # its document.
        j = ordm[i]
        nw = _scatter(ar, j, lo, hi, blk, b0, bend, cnt, dec, pos, nb, docs, tfs, bits, dcode, wg, tab, scale[j],
                      wc, whit, wacc, wset, nw, False, total - m[j], theta)
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
            _scatter(ar, j, lo, hi, blk, b0, bend, cnt, dec, pos, nb, docs, tfs, bits, dcode, wg, tab, scale[j],
                     wc, whit, wacc, wset, 0, True, 0.0, 0.0)
        else:
            _look_up(ar, j, lo, blk, b0, bend, cnt, dcode, wg, tab, scale[j], wc, whit, wacc, wlist, nw,
                     keys, hit_key, hit_tf)
        nw = _keep(wlist, nw, wacc, whit, pre[i], theta)
    for y in range(nw):
        x = wlist[y]
        hb = whit[x]
        sc = 0.0
        for j in range(nu):
            if (hb >> np.int64(j)) & 1:
                sc += wc[j, x]
        if sc > 0.0 and (nh < kk or sc > hs[0]):
            nh = _push(hs, hi_, nh, kk, sc, lo + x)
            if nh == kk:
                theta = max(theta, hs[0])
        whit[x] = 0
        wacc[x] = 0.0
    return nh, theta, hi



@njit(cache=True, nogil=True)
def window_top_k(pk, idf, wmax, qtids, wt, k):
    """Exact top-k (ids, scores), identical to ``kernels.packed.search_one``'s (module
    docstring). ``qtids`` holds at most ``MAX_TERMS`` distinct terms. Allocates the walk's
    state, seeds the k-th score and runs ``_walk``."""
    k1p1 = wt[2] + 1.0
    ut, scale, ub = _unique_terms(qtids, idf, pk[0], wmax, k1p1)
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
    documents in play); returns the heap's size. A window's bounds are its blocks' maxes;
    the jump and the window's scoring are the filtered walk's (``_jump``, ``_score_window``).

    Compiled without the runtime's reference counting (``_nrt=False``: it allocates
    nothing), as ``kernels.packed_filtered_windows._walk`` is: with it, every array handed to
    the inlined helpers costs an atomic increment and decrement per call, which perf put
    at about a third of an unfiltered query loop's samples."""
    end_doc = np.int64(dcode.shape[0])
    nu = scale.shape[0]
    nh = 0
    ar = (data, off, dbits, tbits, last)
    bd = (bmax, bmax, bmax)  # the unfiltered bound reads the block max only
    cur = (b0, bend, cnt, blk, dec, pos, nb, docs, tfs)
    win = (wc, whit, wacc, wlist, keys, hit_key, hit_tf, wset)
    lo = np.int64(0)
    while lo < end_doc:
        if theta > 0.0:
            lo = _jump(ar, wt, bmax, bmax, bmax, scale, ub, gsuf, theta, lo, end_doc, jb, b0, bend, cnt, dec, pos, nb,
                       docs, tfs)
            if lo >= end_doc:
                break
        # The window: up to the nearest end of the blocks holding lo (each term has one
        # bound there), at most WINDOW documents.
        hi = min(lo + WINDOW - 1, end_doc - 1)
        live = 0
        for j in range(nu):
            b = _shallow(last, blk[j], bend[j], lo)
            blk[j] = b
            if b < bend[j]:
                hi = min(hi, last[b])
                m[j] = blk_bmax(bmax, b) * scale[j]
                ordm[live] = j
                live += 1
        if live == 0:
            break
        nh, theta, hi = _score_window(ar, wt, wc, None, bd, dcode, scale, theta, lo, hi, end_doc - 1, cur, win, m, ordm,
                                      live, pre, hs, hi_, nh)
        lo = hi + 1
    return nh
