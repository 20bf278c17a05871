"""Filtered block-max MaxScore over doc windows: the dense-filter route of the packed
filtered kernel (``kernels.packed_filtered.search_filtered``; issue #27 item 4).

Why: under a filter keeping many documents, the term-at-a-time route reads every surviving
posting of the long lists it cannot prune into a corpus-sized accumulator at cache-miss
cost; a heavy query then takes tens of milliseconds at 10M documents (mean 35 ms under a
50% filter, against 8.8 ms here: ``windows_suit`` says which queries come here). This is
the unfiltered window kernel (``kernels.packed_windows``, whose docstring explains windows,
dead documents, non-essential look-ups, window skips and jumps) with the filter and the
survivors' statistics:

- a posting counts only when its filter bit is set; its weight is the filtered formula
  (N, df and avgdl over the survivors): scale x tf / (tf + den), den = k1 (1 - b + b len /
  avgdl') computed with the filtered kernel's very operations (per length code once per
  query, or from the length itself);
- a block's bound holds for the survivors' avgdl: the smaller of its stored max w (at the
  weights' avgdl) grown by avgdl' / avgdl and its largest tf over its shortest document
  (``_bound``); a sparse block (spanning more than a window) is bounded by its surviving
  postings in the window instead, and the seed comes from the rarest term's survivors.

Exactness: the caller passes the terms in the filtered kernel's scoring order (by
descending term bound), and a document's score is its contributions summed in that order
from 0.0: the additions the filtered kernel makes to its accumulator, in the same order,
so the floats are identical. Bounds are compared with the shared relative slack;
documents come in position order and enter a full heap only with a strictly greater
score, so ties go to the lower position.
"""

import numpy as np
from numba import njit

from .packed import _BLOCK, _match_block
from .packed_filter_weights import code_dens, part_by_code, window_tables
from .packed_route import RARE_DF_FRACTION, RARE_WEIGHT
from .packed_wand import _block_cursors, _seek, _shallow, _sort_by_bound
from .packed_windows import (
    DEAD,
    WINDOW,
    _drain_bitmap,
    _keep,
    _postings_in,
    _seed,
)
from .selection import _SLACK, _drain, _gallop, _push, _suffix_sums
from .weight import block_bound as _bound
from .weight import den_of as _den
from .weight import part

DENSE_DIV = 4  # the window route serves filters keeping at least 1 / this of the documents
HEAVY_POSTINGS = 2  # ... and queries whose lists hold at least this x N postings
# A filter keeping almost every document (>= ALMOST_ALL_NUM / ALMOST_ALL_DEN: a refresh stack's
# live rows, or all of them) routes here also lighter queries (lists >= LIGHT_POSTINGS_TENTHS / 10
# x N postings) when every term is common (df >= N / COMMON_DF_DIV): term at a time then scans
# whole lists before the k-th score rises (10M, 99% kept, `w13 w3 w24 w34`: 1.4 s, here 32 ms,
# unfiltered 30 ms). Fitted on the 200 synthetic queries at 1M, 99% kept: p50 0.89x unfiltered
# (term at a time alone 0.92x), mean 1.41x (3.27x).
ALMOST_ALL_NUM, ALMOST_ALL_DEN = 9, 10
COMMON_DF_DIV = 20
LIGHT_POSTINGS_TENTHS = 3


@njit(cache=True, nogil=True, inline="always")
def _move(pos, docs, j, lo):
    """Term j's cursor, in its decoded block whose last document is >= lo, onto its first
    posting >= lo; returns that document."""
    p = pos[j]
    while docs[j, p] < lo:
        p += 1
    pos[j] = p
    return docs[j, p]


@njit(cache=True, nogil=True, inline="always")
def _widen(last, bmax, maxtf, minlen, scale, grow, k1, kb, bavg, blk, bend, m, ordm, ne, live, pre, lo, cap):
    """``kernels.packed_windows._widen`` with the filtered block bounds: the window widened to
    the essential terms' nearest block end, each non-essential term's bound its largest
    over the window, the window ending by ``cap`` (the blocks of sparse terms without a
    surviving posting in it). Returns its last document."""
    hi = min(lo + WINDOW - 1, cap)
    for i in range(ne, live):
        hi = min(hi, last[blk[ordm[i]]])
    for i in range(ne):
        j = ordm[i]
        b = blk[j]
        mx = _bound(bmax, maxtf, minlen, b, scale[j], grow, k1, kb, bavg)
        while b + 1 < bend[j] and last[b] < hi:
            b += 1
            mx = max(mx, _bound(bmax, maxtf, minlen, b, scale[j], grow, k1, kb, bavg))
        m[j] = mx
    _sort_by_bound(m, ordm, ne, pre)
    return hi


@njit(cache=True, nogil=True, inline="always")
def _scatter(ar, last, j, lo, hi, b0, bend, cnt, blk, dec, pos, nb, docs, tfs, bits, dcode, den, s, k1, kb, bavg,
             wc, whit, wacc, wset, nw, only_alive, floor, cut, tab):
    """``kernels.packed_windows._scatter`` over the survivors: term j's surviving postings in
    [lo, hi] into the window (its contribution apart in wc, its bit in whit, the partial
    sum in wacc), a new document's slot set in the window's bitmap ``wset``; a posting
    whose weight plus ``floor`` cannot beat ``cut`` marks its document dead. With
    ``only_alive``, only candidates take it (they are survivors). Returns the new count
    of documents in the window."""
    bit = np.int64(1) << np.int64(j)
    b = blk[j]
    while b < bend[j] and (b == b0[j] or last[b - 1] < hi):
        if dec[j] != b:
            _seek(ar, j, b, lo, b0, bend, cnt, dec, pos, nb, docs, tfs)
        else:
            _move(pos, docs, j, lo)
        p = pos[j]
        n = nb[j]
        while p < n and docs[j, p] <= hi:
            d = docs[j, p]
            p += 1
            x = d - lo
            h = whit[x]
            if only_alive:
                if h > 0:
                    c = part_by_code(s, tfs[j, p - 1], dcode[d], tab, j, den, k1, kb, bavg)
                    whit[x] = h | bit
                    wc[j, x] = c
                    wacc[x] += c
            elif h >= 0 and (bits[d >> 6] >> np.uint64(d & 63)) & np.uint64(1):
                c = part_by_code(s, tfs[j, p - 1], dcode[d], tab, j, den, k1, kb, bavg)
                if h == 0:
                    wset[x >> 6] |= np.uint64(1) << np.uint64(x & 63)
                    nw += 1
                if (c + floor) * (1.0 + _SLACK) < cut:
                    whit[x] = DEAD
                    continue
                whit[x] = h | bit
                wc[j, x] = c
                wacc[x] += c
        pos[j] = p
        if p < n:
            break
        b += 1
    blk[j] = min(b, bend[j])
    return nw


@njit(cache=True, nogil=True, inline="always")
def _look_up(data, off, dbits, tbits, last, j, lo, b0, bend, cnt, blk, dcode, den, s, k1, kb, bavg, wc, whit, wacc,
             wlist, nw, keys, hit_key, hit_tf, tab):
    """``kernels.packed_windows._look_up`` with the filtered weight: term j at each candidate
    wlist[:nw] (ascending), only blocks holding one read, gaps only as far as needed."""
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
            c = part_by_code(s, hit_tf[h], dcode[lo + x], tab, j, den, k1, kb, bavg)
            wc[j, x] = c
            whit[x] |= bit
            wacc[x] += c
        if y < nw:
            b += 1
    blk[j] = min(b, bend[j])


@njit(cache=True, nogil=True)
def window_top_k_filtered(pk, bits, ut, scale, ub, k, grow, k1, kb, bavg, den):
    """Exact filtered top-k (ids, scores) of the distinct terms ``ut`` (in scoring order:
    by descending term bound ``ub``; each with a surviving posting; at most
    ``kernels.packed_windows.MAX_TERMS``), ``scale`` their idf' (k1 + 1) x repeats; identical to
    ``search_filtered``'s term-at-a-time answer (module docstring). Allocates the walk's
    state and runs ``_walk``."""
    nu = ut.shape[0]
    kk = max(k, 1)
    hs = np.empty(kk, np.float64)
    hi_ = np.empty(kk, np.int64)
    if nu == 0 or k <= 0:
        return _drain(hs, hi_, 0)
    b0, bend, cnt, blk, dec, pos, nb, docs, tfs = _block_cursors(pk, ut)
    # gsuf[j]: the term bounds of j.. summed (the scoring order is by descending bound).
    gsuf = _suffix_sums(ub)
    # A lower bound of the k-th score from the rarest term's survivors, when it is rare.
    # (``kernels.packed_windows._seed`` with the filtered weigher: the survivors' parts.)
    theta = _seed(pk, (pk[7], pk[3], pk[4], pk[5], pk[2]), ut, scale, ub, k, pk[13], (den, k1, kb, bavg, grow), bits)
    tab = window_tables(scale, den)
    nh = _walk(pk[7], pk[3], pk[4], pk[5], pk[2], pk[6], pk[9], pk[10], pk[13], bits, scale, ub, grow, k1, kb, bavg,
               den, theta, b0, bend, cnt, blk, dec, pos, nb, docs, tfs, b0.copy(), gsuf,
               np.zeros((nu, WINDOW), np.float64), np.zeros(WINDOW, np.int64), np.zeros(WINDOW, np.float64),
               np.empty(WINDOW, np.int64), np.empty(WINDOW, np.int64), np.empty(_BLOCK, np.int64),
               np.empty(_BLOCK, np.int64), np.zeros(nu, np.float64), np.empty(nu, np.int64),
               np.zeros(nu + 1, np.float64), hs, hi_, np.zeros(WINDOW // 64, np.uint64), tab)
    return _drain(hs, hi_, nh)


@njit(cache=True, nogil=True, _nrt=False)
def _walk(data, off, dbits, tbits, last, bmax, maxtf, minlen, dcode, bits, scale, ub, grow, k1, kb, bavg, den, theta,
          b0, bend, cnt, blk, dec, pos, nb, docs, tfs, jb, gsuf, wc, whit, wacc, wlist, keys, hit_key, hit_tf, m, ordm,
          pre, hs, hi_, wset, tab):
    """The window walk of ``window_top_k_filtered`` over preallocated state (``jb``: the
    jump cursor, blocks passed for good, apart from ``blk``); returns the heap's size.

    Compiled without the runtime's reference counting (``_nrt=False``: it allocates
    nothing): with it, the arrays handed to the inlined helpers cost an atomic increment
    and decrement each per call, which measured most of a dense filtered query's time."""
    end_doc = np.int64(dcode.shape[0])
    nu = scale.shape[0]
    kk = hs.shape[0]
    nh = 0
    ar = (data, off, dbits, tbits, last)
    lo = np.int64(0)
    while lo < end_doc:
        if theta > 0.0:
            # Terms ge.. cannot beat theta together, nor can a block of another term whose
            # bound plus every other term's bound: jump to the next document that can.
            ge = nu
            while ge > 0 and gsuf[ge - 1] * (1.0 + _SLACK) < theta:
                ge -= 1
            if ge == 0:
                break
            nxt = end_doc
            for j in range(ge):
                b = _shallow(last, jb[j], bend[j], lo)
                others = gsuf[0] - ub[j]
                while b < bend[j] and (_bound(bmax, maxtf, minlen, b, scale[j], grow, k1, kb, bavg)
                                       + others) * (1.0 + _SLACK) < theta:
                    b += 1
                jb[j] = b
                if b >= bend[j]:
                    continue
                start = lo if b == b0[j] else max(lo, last[b - 1] + 1)
                if start > lo:
                    nxt = min(nxt, start)
                elif last[b] - lo < WINDOW:
                    nxt = lo
                    break
                else:
                    nxt = min(nxt, _seek(ar, j, b, lo, b0, bend, cnt, dec, pos, nb, docs, tfs) if dec[j] != b
                              else _move(pos, docs, j, lo))
            if nxt >= end_doc:
                break
            lo = nxt
        hi = min(lo + WINDOW - 1, end_doc - 1)
        cap = end_doc - 1
        live = 0
        left = 0  # terms with postings from lo on
        for j in range(nu):
            b = _shallow(last, blk[j], bend[j], lo)
            blk[j] = b
            if b >= bend[j]:
                continue
            left += 1
            hi = min(hi, last[b])
            if last[b] - (last[b - 1] if b > b0[j] else -1) > WINDOW:
                # A sparse block (spanning more than a window): the exact bound of its
                # surviving postings over the widest window this can be replaces the
                # block's. A rare term whose one block spans the corpus would otherwise
                # keep every window from being skipped, and under a filter fewer than k of
                # its documents may survive, so no seed lifts the k-th score past the long
                # lists.
                if dec[j] != b:
                    _seek(ar, j, b, lo, b0, bend, cnt, dec, pos, nb, docs, tfs)
                else:
                    _move(pos, docs, j, lo)
                mj = 0.0
                lim = min(lo + WINDOW - 1, last[b])
                p = pos[j]
                while p < nb[j] and docs[j, p] <= lim:
                    d = docs[j, p]
                    if (bits[d >> 6] >> np.uint64(d & 63)) & np.uint64(1):
                        f = np.float64(tfs[j, p])
                        mj = max(mj, part(scale[j], f, _den(den, dcode[d], k1, kb, bavg)))
                    p += 1
                if mj == 0.0:
                    cap = min(cap, last[b])  # not in this window, which must end by its block's end
                    continue
                m[j] = mj
            else:
                m[j] = _bound(bmax, maxtf, minlen, b, scale[j], grow, k1, kb, bavg)
            ordm[live] = j
            live += 1
        if left == 0:
            break
        if live == 0:
            lo = hi + 1
            continue
        _sort_by_bound(m, ordm, live, pre)
        if theta > 0.0 and pre[live] * (1.0 + _SLACK) < theta:
            lo = hi + 1
            continue
        ne = 0
        if theta > 0.0:
            while ne < live and pre[ne + 1] * (1.0 + _SLACK) < theta:
                ne += 1
        if ne > 0:
            hi = _widen(last, bmax, maxtf, minlen, scale, grow, k1, kb, bavg, blk, bend, m, ordm, ne, live, pre, lo,
                        cap)
            while ne > 0 and pre[ne] * (1.0 + _SLACK) >= theta:
                ne -= 1
                hi = min(hi, last[blk[ordm[ne]]])
        nw = 0
        total = pre[ne]
        for i in range(ne, live):
            total += m[ordm[i]]
        for i in range(ne, live):
            j = ordm[i]
            nw = _scatter(ar, last, j, lo, hi, b0, bend, cnt, blk, dec, pos, nb, docs, tfs, bits, dcode, den, scale[j],
                          k1, kb, bavg, wc, whit, wacc, wset, nw, False, total - m[j], theta, tab)
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
                _scatter(ar, last, j, lo, hi, b0, bend, cnt, blk, dec, pos, nb, docs, tfs, bits, dcode, den, scale[j],
                         k1, kb, bavg, wc, whit, wacc, wset, 0, True, 0.0, 0.0, tab)
            else:
                _look_up(data, off, dbits, tbits, last, j, lo, b0, bend, cnt, blk, dcode, den, scale[j], k1, kb, bavg,
                         wc, whit, wacc, wlist, nw, keys, hit_key, hit_tf, tab)
            nw = _keep(wlist, nw, wacc, whit, pre[i], theta)
        for y in range(nw):
            x = wlist[y]
            # The exact score: the hits summed in scoring order from 0.0, as the filtered acc.
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
        lo = hi + 1
    return nh


@njit(cache=True, nogil=True)
def windows_suit(indptr, ut, dfs, ub, n, n_docs, k):
    """Whether this kernel should answer a filtered query of at most ``MAX_TERMS`` distinct
    terms: the filter keeps at least 1 / ``DENSE_DIV`` of the documents, the query's lists
    hold at least ``HEAVY_POSTINGS`` x N postings (or, under a filter keeping almost all,
    ``LIGHT_POSTINGS_TENTHS`` / 10 x N with every term common), and the rare terms
    (full list under 1 / ``RARE_DF_FRACTION`` of the documents) do not carry most of the
    summed bounds (as the unfiltered router, ``kernels.packed_route._window_suits``, decides:
    term-at-a-time scores their few documents first, and the k-th score is high at once).

    Why only dense filters: measured per query on the 200 synthetic Zipf queries (one
    process, best of 2-3), under a filter keeping 5% the term-at-a-time route wins the
    median at 1M and 10M documents (it touches the accumulator only for the few
    survivors: 0.27 vs 0.93 ms at 1M, 3.5 vs 6.9 ms at 10M), while keeping 50% the window
    kernel cuts the summed time 2-4x (218 vs 526 ms at 1M, 2.2 vs 8.8 s at 10M) but not
    the median (the same run of ``bench_bm25_packed_filters``, every dense query routed
    here: p50 0.54 vs 0.44 ms at 1M, 3.9 vs 3.8 ms at 10M; mean 1.4 vs 2.6 ms, 8.8 vs 35
    ms). Light queries (their lists under ``HEAVY_POSTINGS`` x N postings) stay term at a
    time: the fit on those queries kept the median within ~5-10% and most of the gain in
    the sum."""
    if n * DENSE_DIV < n_docs:
        return False
    nu = ut.shape[0]
    postings = 0
    uncommon = 0  # surviving postings of the terms under 1 / COMMON_DF_DIV of the documents
    for y in range(nu):
        df = indptr[ut[y] + 1] - indptr[ut[y]]
        postings += df
        if df * COMMON_DF_DIV < n_docs:
            uncommon += dfs[y]
    # Almost every document kept, and no rare term to raise the k-th score early: none has
    # a surviving posting, or together they hold fewer than k (term at a time would then
    # have no k-th score after them and score the common lists whole: 27 ms against ~3 ms
    # here on a refresh stack's base at 1M, two common terms and one in 6 documents).
    if (n * ALMOST_ALL_DEN >= ALMOST_ALL_NUM * n_docs and uncommon < max(k, 1)
            and postings * 10 >= LIGHT_POSTINGS_TENTHS * n_docs):
        return True
    if postings < HEAVY_POSTINGS * n_docs:
        return False
    rare = 0.0
    other = 0.0
    for y in range(nu):
        if dfs[y] == 0:
            continue
        t = ut[y]
        if (indptr[t + 1] - indptr[t]) * RARE_DF_FRACTION < n_docs:
            rare += ub[y]
        else:
            other += ub[y]
    return rare == 0.0 or rare < RARE_WEIGHT * other


@njit(cache=True, nogil=True)
def from_plan(pk, bits, ut, dfs, scale, ub, order, k, grow, k1, kb, bavg, clen):
    """``window_top_k_filtered`` of ``search_filtered``'s plan: the terms with a surviving
    posting in its scoring ``order``, and the per-code denominators (``clen``: the file's
    length of each code, empty when ``pk[13]`` holds the lengths themselves)."""
    m = 0
    for i in range(order.shape[0]):
        if dfs[order[i]] > 0:
            m += 1
    t = np.empty(m, np.int64)
    s = np.empty(m, np.float64)
    u = np.empty(m, np.float64)
    m = 0
    for i in range(order.shape[0]):
        y = order[i]
        if dfs[y] > 0:
            t[m] = ut[y]
            s[m] = scale[y]
            u[m] = ub[y]
            m += 1
    return window_top_k_filtered(pk, bits, t, s, u, k, grow, k1, kb, bavg, code_dens(clen, k1, kb, bavg))
