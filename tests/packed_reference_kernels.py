"""Exact reference kernels over packed postings that only the tests run: block-max WAND
(``wand_top_k``) and block-max MaxScore per document (``bmm_top_k``, Lucene's route).

Why here and not in the engine: neither serves a query (``bm25_packed_route`` picks the
term-at-a-time MaxScore kernel or the window kernel; ``bm25_packed_wand`` says why these
lost), but both walk the documents in a different order from the served kernels and must
still give their answers bit for bit, which makes them independent checks of the engine's
cursor helpers (``bm25_packed_wand``) and of the exactness argument below. Kept out of the
engine, nothing compiles them but the tests that call them (as before the move: the engine
never warmed them); ``cache=True`` keys the cache by this file's path, stable under
``tests/``.

Document at a time, block-max WAND:

- pivot (WAND): with cursors sorted by their current doc, the first cursor at which the
  sum of the term upper bounds so far can beat the k-th score; no document before the
  pivot doc can (only the cursors before it hold such documents).
- block max: each cursor up to the pivot is moved *shallowly* (its blocks' last-doc skip
  data only, nothing decoded) to the block that would hold the pivot doc; when the sum
  of those blocks' exact max ``w`` x scale cannot beat the k-th score either, every doc up
  to the first of those blocks' ends is skipped without decoding a block.
- otherwise the cursors are decoded up to the pivot doc and it is scored exactly.

A cursor moved shallowly holds a lower bound (``exact`` false), not a posting: enough for
pivot selection, which only needs "no posting of this term before cur".

Exactness: a pivot's score is summed over the distinct terms in ``_unique_terms`` order
(descending bound, repeats multiplying the scale), each ``w`` recomputed by ``_w`` from
the document's length code and multiplied by the scale: the very operations, in the very
order, that the MaxScore kernel's accumulator performs for that document, so the floats
are identical. Bounds are compared with the shared relative slack (``_SLACK``), and a
document enters a full heap only with a strictly greater score: documents come in
position order, so a tie goes to the lower position, as ``_take_top`` orders them.
"""

import numpy as np
from numba import njit

from ragspine_pipeline.retrieval.lexical.kernels.packed import _BLOCK, _unique_terms, _unpack
from ragspine_pipeline.retrieval.lexical.kernels.packed_wand import (
    _block_cursors,
    _seek,
    _shallow,
    _sort_by_bound,
)
from ragspine_pipeline.retrieval.lexical.kernels.selection import _SLACK, _drain, _push
from ragspine_pipeline.retrieval.lexical.kernels.weight import plain_w as _w


@njit(cache=True, nogil=True, inline="always")
def _query(pk, idf, wmax, qtids, wt, k):
    """What both kernels start from: the distinct terms (``_unique_terms``: ids, scales,
    bounds), the heap size and buffers, the end of the doc space and ``ar`` = (data, off,
    dbits, tbits, last) of ``pk``, unpacked once per query (reading ``pk`` per posting is
    slow)."""
    ut, scale, ub = _unique_terms(qtids, idf, pk[0], wmax, wt[2] + 1.0)
    kk = max(k, 1)
    return (ut, scale, ub, kk, np.empty(kk, np.float64), np.empty(kk, np.int64), np.int64(pk[13].shape[0]),
            (pk[7], pk[3], pk[4], pk[5], pk[2]))


@njit(cache=True, nogil=True, inline="always")
def _advance(ar, j, target, cur, blk, bend, b0, cnt, exact, dec, pos, docs, tfs, end_doc):
    """Cursor j exactly on its first posting >= target, decoding at most one block (the
    one holding it); past its list, cur = end_doc. ``ar`` = (data, off, dbits, tbits,
    last) of ``pk``, unpacked once per query (reading ``pk`` per posting is slow)."""
    data, off, dbits, tbits, last = ar
    b = _shallow(last, blk[j], bend[j], target)
    blk[j] = b
    if b >= bend[j]:
        cur[j] = end_doc
        exact[j] = False
        return
    if dec[j] != b:
        n = _BLOCK if b + 1 < bend[j] else cnt[j]
        _unpack(data, off, dbits, tbits, last, b, b == b0[j], n, docs[j], tfs[j])
        dec[j] = b
        pos[j] = 0
    p = pos[j]
    while docs[j, p] < target:  # the block's last doc is >= target: stops inside the block
        p += 1
    pos[j] = p
    cur[j] = docs[j, p]
    exact[j] = True


@njit(cache=True, nogil=True, inline="always")
def _next(last, j, cur, blk, bend, cnt, exact, pos, docs, end_doc):
    """Cursor j (exact) past its current posting: the next one in its decoded block, or a
    lower bound (the block's last doc + 1) in the next block, left undecoded."""
    p = pos[j] + 1
    b = blk[j]
    if p < (_BLOCK if b + 1 < bend[j] else cnt[j]):
        pos[j] = p
        cur[j] = docs[j, p]
        return
    b += 1
    blk[j] = b
    cur[j] = end_doc if b >= bend[j] else last[b - 1] + 1
    exact[j] = False


@njit(cache=True, nogil=True)
def wand_top_k(pk, idf, wmax, qtids, wt, k):
    """Exact top-k (ids, scores best-first; ties by lower position) of the query term ids
    qtids over the packed postings ``pk``, document at a time with block-max WAND."""
    ut, scale, ub, kk, hs, hi, end_doc, ar = _query(pk, idf, wmax, qtids, wt, k)
    nu = ut.shape[0]
    nh = 0
    if nu == 0 or k <= 0:
        return _drain(hs, hi, 0)
    last, bmax, dcode = pk[2], pk[6], pk[13]
    b0, bend, cnt, blk, dec, pos, _nb, docs, tfs = _block_cursors(pk, ut)
    cur = np.where(blk < bend, 0, end_doc)  # a lower bound of the cursor's next doc
    exact = np.zeros(nu, np.bool_)
    order = np.arange(nu)
    sb = np.empty(nu, np.int64)
    theta = 0.0
    while True:
        # Cursors by current doc (insertion sort: few terms, nearly sorted each round).
        for i in range(1, nu):
            x = order[i]
            c = cur[x]
            y = i - 1
            while y >= 0 and cur[order[y]] > c:
                order[y + 1] = order[y]
                y -= 1
            order[y + 1] = x
        full = nh == kk
        # Pivot: the first cursor whose bound prefix can beat theta.
        bound = 0.0
        p = -1
        for i in range(nu):
            j = order[i]
            if cur[j] >= end_doc:
                break
            bound += ub[j]
            if not full or bound * (1.0 + _SLACK) >= theta:
                p = i
                break
        if p < 0:
            break
        pd = cur[order[p]]
        while p + 1 < nu and cur[order[p + 1]] == pd:
            p += 1
        if full:
            # Block-max check on the blocks that would hold pd (skip data only).
            bsum = 0.0
            for i in range(p + 1):
                j = order[i]
                b = _shallow(last, blk[j], bend[j], pd)
                sb[i] = b
                if b < bend[j]:
                    bsum += bmax[b] * scale[j]
            if bsum * (1.0 + _SLACK) < theta:
                # No doc in [pd, nxt) can beat theta: each term holds such docs only in
                # its block sb[i], and later cursors start at nxt or beyond.
                nxt = end_doc
                for i in range(p + 1):
                    j = order[i]
                    if sb[i] < bend[j]:
                        nxt = min(nxt, last[sb[i]] + 1)
                if p + 1 < nu:
                    nxt = min(nxt, cur[order[p + 1]])
                for i in range(p + 1):
                    j = order[i]
                    b = _shallow(last, sb[i], bend[j], nxt)
                    blk[j] = b
                    cur[j] = nxt if b < bend[j] else end_doc
                    exact[j] = False
                continue
        ready = True
        for i in range(p + 1):
            j = order[i]
            if not exact[j] or cur[j] != pd:
                _advance(ar, j, pd, cur, blk, bend, b0, cnt, exact, dec, pos, docs, tfs, end_doc)
                if cur[j] != pd:
                    ready = False
        if not ready:
            continue
        # Score pd exactly, in _unique_terms order (the MaxScore accumulator's order).
        ln = dcode[pd]
        sc = 0.0
        for j in range(nu):
            if cur[j] == pd:
                sc += _w(tfs[j, pos[j]], ln, wt) * scale[j]
        if sc > 0.0 and (nh < kk or sc > hs[0]):
            nh = _push(hs, hi, nh, kk, sc, pd)
            if nh == kk:
                theta = hs[0]
        for j in range(nu):
            if cur[j] == pd:
                _next(last, j, cur, blk, bend, cnt, exact, pos, docs, end_doc)
    return _drain(hs, hi, nh)


@njit(cache=True, nogil=True)
def bmm_top_k(pk, idf, wmax, qtids, wt, k):
    """Exact top-k as ``wand_top_k``, by block-max MaxScore over windows (Lucene's route):
    a window runs from ``lo`` to the nearest end of the blocks holding ``lo``, so each term
    has one block there and one bound (its block max x scale). Terms whose window bounds
    sum below the k-th score are non-essential: only the documents of the essential terms
    are candidates, and a candidate looks the others up (largest bound first) only while
    its partial score plus their bounds can still beat the k-th score. A window whose
    bounds all together cannot is skipped without decoding anything."""
    ut, scale, _ub, kk, hs, hi_, end_doc, ar = _query(pk, idf, wmax, qtids, wt, k)
    nu = ut.shape[0]
    nh = 0
    if nu == 0 or k <= 0:
        return _drain(hs, hi_, 0)
    last, bmax, dcode = pk[2], pk[6], pk[13]
    b0, bend, cnt, blk, dec, pos, nb, docs, tfs = _block_cursors(pk, ut)
    m = np.zeros(nu, np.float64)
    ordm = np.empty(nu, np.int64)
    pre = np.zeros(nu + 1, np.float64)
    ess = np.empty(nu, np.int64)
    c = np.zeros(nu, np.float64)
    hit = np.zeros(nu, np.bool_)
    theta = 0.0
    lo = np.int64(0)
    while lo < end_doc:
        hi = end_doc - 1
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
        _sort_by_bound(m, ordm, live, pre)  # live terms by ascending window bound
        full = nh == kk
        if full and pre[live] * (1.0 + _SLACK) < theta:
            lo = hi + 1
            continue
        ne = 0
        if full:
            while ne < live and pre[ne + 1] * (1.0 + _SLACK) < theta:
                ne += 1
        if ne > 0:
            # Widen the window to the essential terms' nearest block end: a non-essential
            # term's bound there is its largest block max over the window (skip data only).
            hi = end_doc - 1
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
            # Wider bounds may make the largest ones essential again: their docs must lie
            # in their current block, so the window ends there at the latest.
            while ne > 0 and pre[ne] * (1.0 + _SLACK) >= theta:
                ne -= 1
                hi = min(hi, last[blk[ordm[ne]]])
        n_ess = live - ne
        for i in range(n_ess):
            j = ordm[ne + i]
            ess[i] = j
            _seek(ar, j, blk[j], lo, b0, bend, cnt, dec, pos, nb, docs, tfs)
        while True:
            d = hi + 1
            for i in range(n_ess):
                j = ess[i]
                if pos[j] < nb[j] and docs[j, pos[j]] < d:
                    d = docs[j, pos[j]]
            if d > hi:
                break
            partial = 0.0
            ln = dcode[d]
            for i in range(n_ess):
                j = ess[i]
                if pos[j] < nb[j] and docs[j, pos[j]] == d:
                    c[j] = _w(tfs[j, pos[j]], ln, wt) * scale[j]
                    hit[j] = True
                    partial += c[j]
                    pos[j] += 1
            keep = True
            for i in range(ne - 1, -1, -1):
                if nh == kk and (partial + pre[i + 1]) * (1.0 + _SLACK) < theta:
                    keep = False
                    break
                j = ordm[i]
                b = _shallow(last, blk[j], bend[j], d)
                if b >= bend[j]:
                    continue
                blk[j] = b
                if _seek(ar, j, b, d, b0, bend, cnt, dec, pos, nb, docs, tfs) == d:
                    c[j] = _w(tfs[j, pos[j]], ln, wt) * scale[j]
                    hit[j] = True
                    partial += c[j]
            if keep:
                # The exact score: the hits summed in _unique_terms order, as MaxScore's acc.
                sc = 0.0
                for j in range(nu):
                    if hit[j]:
                        sc += c[j]
                if sc > 0.0 and (nh < kk or sc > hs[0]):
                    nh = _push(hs, hi_, nh, kk, sc, d)
                    if nh == kk:
                        theta = hs[0]
            for j in range(nu):
                hit[j] = False
        lo = hi + 1
    return _drain(hs, hi_, nh)
