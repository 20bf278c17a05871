"""The filtered numba route over packed postings: N, df and avgdl over the filter survivors.

The plain layout's filtered kernel (``bm25_numba_filtered``) is the model, term order and
arithmetic included, so each filtered answer is the plain layout's bit for bit. What the
packed layout changes is how a term's survivors are found:

* few survivors (their positions fit in ``surv``) and a much longer list: each survivor
  is galloped through the blocks' last doc ids and only the blocks holding one are
  unpacked; the matches (doc, tf) are gathered once and serve both the survivor df and
  the scoring;
* a long list with a bitset row (df >= N / ``PACKED_BITSET_FRACTION``): the survivor df
  is a popcount of (row & filter) over N/64 words, no unpacking;
* otherwise one pass unpacking the list and testing each doc's filter bit.

Scoring then follows MaxScore by descending term bound (the idf over the survivors x the
smaller of the full-corpus max w grown by avgdl'/avgdl and the term's max tf over its
shortest document); a scanned term is read block by block, skipping blocks whose bound
cannot bring a new document into the top k (``_scan_term``; a rare term with fewer than
k survivors then no longer forces a full scan of a long one); once the remaining terms
cannot change the top k, they are looked up for the remaining candidates.
"""

import numpy as np
from numba import njit

from .bm25_numba_select import _SLACK, _distinct, _gallop, _kth_score, _prune, _push, _take_top
from .bm25_packed_kernels import (
    _BLOCK,
    _ONE,
    _count,
    _lookup,
    _match_block,
    _skipped_block,
    _unpack,
)

_M1 = np.uint64(0x5555555555555555)
_M2 = np.uint64(0x3333333333333333)
_M4 = np.uint64(0x0F0F0F0F0F0F0F0F)
_H01 = np.uint64(0x0101010101010101)


@njit(cache=True, nogil=True)
def prepare_mask(mask, doc_len, bits, surv):
    """(survivors, their summed length) of a bool mask; sets their bits in ``bits``
    (zeroed uint64 words) and records their positions in ``surv`` while they fit
    (``len(surv) - 1`` of them, the last slot a scratch; the caller uses the positions
    only when all fitted).

    Eight documents at a time: an all-false stretch (a selective filter) costs one test;
    otherwise the eight are added without a branch (a filter keeping 5-50% is a coin flip
    per document for a branch predictor)."""
    n = 0
    total = 0
    cap = surv.shape[0] - 1
    nd = mask.shape[0]
    eights = mask[:nd // 8 * 8].view(np.uint64)
    for e in range(eights.shape[0]):
        if eights[e] != 0:
            base = e * 8
            for d in range(base, base + 8):
                c = np.int64(mask[d])
                bits[d >> 6] |= np.uint64(c) << np.uint64(d & 63)
                surv[min(n, cap)] = d
                n += c
                total += c * np.int64(doc_len[d])
    for d in range(nd // 8 * 8, nd):
        if mask[d]:
            bits[d >> 6] |= _ONE << np.uint64(d & 63)
            surv[min(n, cap)] = d
            n += 1
            total += np.int64(doc_len[d])
    return n, total


@njit(cache=True, nogil=True, inline="always")
def _alive(bits, d):
    return (bits[d >> 6] >> np.uint64(d & 63)) & _ONE


@njit(cache=True, nogil=True)
def _and_count(bits, row):
    """Set bits of (bits & row): SWAR popcount per word."""
    c = np.uint64(0)
    for w in range(bits.shape[0]):
        x = bits[w] & row[w]
        x = x - ((x >> np.uint64(1)) & _M1)
        x = (x & _M2) + ((x >> np.uint64(2)) & _M2)
        x = (x + (x >> np.uint64(4))) & _M4
        c += (x * _H01) >> np.uint64(56)
    return np.int64(c)


@njit(cache=True, nogil=True, inline="always")
def _tf_bound(f, ln, k1, kb, bavg):
    """tf / (tf + k1 (kb + bavg len)): grows with tf, shrinks with len."""
    return f / (f + k1 * (kb + bavg * ln))


@njit(cache=True, nogil=True)
def _gather(pk, t, surv, n, docs, tfs, g_doc, g_tf, g):
    """Append term t's postings at the survivors surv[:n] to (g_doc, g_tf) from g; returns
    the new end. Only blocks holding a survivor are read (``_match_block``)."""
    b0 = pk[1][t]
    end = pk[1][t + 1]
    last = pk[2]
    blk = b0
    x = 0
    while x < n and blk < end:
        if last[blk] < surv[x]:
            blk = _gallop(last, blk, end, surv[x])
            continue
        nn = _count(pk, t, blk)
        x, m = _match_block(pk[7], pk[3], pk[4], pk[5], last, blk, blk == b0, nn, surv, x, n, docs, tfs)
        for h in range(m):
            g_doc[g] = surv[docs[h]]
            g_tf[g] = np.float64(tfs[h])
            g += 1
        blk += 1
    return g


@njit(cache=True, nogil=True)
def _count_alive(pk, t, bits, docs, tfs):
    """Term t's postings whose filter bit is set, by unpacking every block."""
    c = 0
    for blk in range(pk[1][t], pk[1][t + 1]):
        nn = _count(pk, t, blk)
        _unpack(pk[7], pk[3], pk[4], pk[5], pk[2], blk, blk == pk[1][t], nn, docs, tfs)
        for i in range(nn):
            c += np.int64(_alive(bits, docs[i]))
    return c


@njit(cache=True, nogil=True)
def _term_tf_bound(pk, t, k1, kb, bavg):
    """The tf-factor bound of term t from its blocks' max tf and min length."""
    maxtf = 0
    minlen = np.int64(0xFFFFFFFF)
    for blk in range(pk[1][t], pk[1][t + 1]):
        maxtf = max(maxtf, np.int64(pk[9][blk]))
        minlen = min(minlen, np.int64(pk[10][blk]))
    return _tf_bound(np.float64(maxtf), np.float64(minlen), k1, kb, bavg)


@njit(cache=True, nogil=True)
def _scan_term(pk, t, bits, acc, touched, n_t, top1, sc, rest, skip, k, hs, hi, grow, k1, kb, bavg, docs, tfs):
    """Add term t's surviving postings to acc (``sc`` x its tf factor); returns (n_t, top1).

    With ``skip``, the term is read block by block with a heap of the k best documents of
    this scan (distinct, their partial scores: lower bounds of their final ones): a block
    whose bound x ``sc`` plus ``rest`` (the later terms' bounds) is below the k-th of them
    cannot bring in a document not touched yet, and is skipped; documents touched before
    the scan that lie in skipped blocks then get the term from those blocks alone (each
    document still sums its terms in term order)."""
    doc_len = pk[8]
    last = pk[2]
    b0 = pk[1][t]
    b1 = pk[1][t + 1]
    n_before = n_t
    skipped = np.empty(b1 - b0 if skip and n_before > 0 else 0, np.int64)
    nsk = 0
    nh = 0
    for blk in range(b0, b1):
        if skip and nh == k and min(pk[6][blk] * grow, _tf_bound(np.float64(pk[9][blk]), np.float64(pk[10][blk]),
                                                                 k1, kb, bavg)) * sc * (1.0 + _SLACK) + rest < hs[0]:
            if n_before > 0:
                skipped[nsk] = blk
                nsk += 1
            continue
        nn = _count(pk, t, blk)
        _unpack(pk[7], pk[3], pk[4], pk[5], last, blk, blk == b0, nn, docs, tfs)
        for i in range(nn):
            d = docs[i]
            if _alive(bits, d):
                f = np.float64(tfs[i])
                v = acc[d]
                if v == 0.0:
                    touched[n_t] = d
                    n_t += 1
                v += sc * f / (f + k1 * (kb + bavg * doc_len[d]))
                acc[d] = v
                if v > top1:
                    top1 = v
                if skip and (nh < k or v > hs[0]):
                    nh = _push(hs, hi, nh, k, v, d)
    if nsk > 0:
        before = np.sort(touched[:n_before])
        x = 0
        for z in range(nsk):
            x, m = _skipped_block(pk, t, last, b0, skipped[z], before, x, n_before, docs, tfs)
            for h in range(m):
                d = before[docs[h]]
                f = np.float64(tfs[h])
                acc[d] += sc * f / (f + k1 * (kb + bavg * doc_len[d]))
    return n_t, top1


@njit(cache=True, nogil=True)
def search_filtered(pk, bits, surv, n, total, qtids, wt, k, acc, touched, wmax, avgdl_all):
    """Exact filtered top-k over packed postings (see the module docstring); ``bits`` is
    the filter as uint64 words (``prepare_mask``); k1 and b are ``wt``'s. acc is zero on
    entry and exit."""
    k1 = wt[2]
    b = wt[3]
    if n == 0 or total == 0 or qtids.shape[0] == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.float64)
    doc_len, bit_row, term_bits = pk[8], pk[11], pk[12]
    docs = np.empty(_BLOCK, np.int64)
    tfs = np.empty(_BLOCK, np.int64)
    avgdl = total / n
    few = surv.shape[0] == n
    ut, mult, _first = _distinct(qtids)
    nu = ut.shape[0]
    gathered = np.zeros(nu, np.bool_)
    cap = 0
    for y in range(nu):
        df = pk[0][ut[y] + 1] - pk[0][ut[y]]
        if few and n * 16 < df:
            gathered[y] = True
            cap += min(df, n)
    g_doc = np.empty(cap, np.int64)
    g_tf = np.empty(cap, np.float64)
    g_lo = np.zeros(nu + 1, np.int64)
    dfs = np.zeros(nu, np.int64)
    g = 0
    for y in range(nu):
        t = ut[y]
        g_lo[y] = g
        if gathered[y]:
            g = _gather(pk, t, surv, n, docs, tfs, g_doc, g_tf, g)
            dfs[y] = g - g_lo[y]
        elif bit_row[t] >= 0:
            dfs[y] = _and_count(bits, term_bits[bit_row[t]])
        else:
            dfs[y] = _count_alive(pk, t, bits, docs, tfs)
    k1p1 = k1 + 1.0
    kb = 1.0 - b
    bavg = b / avgdl
    grow = max(1.0, avgdl / avgdl_all) if avgdl_all > 0 else 1.0
    scale = np.zeros(nu, np.float64)
    ub = np.zeros(nu, np.float64)
    for y in range(nu):
        if dfs[y] > 0:
            t = ut[y]
            scale[y] = np.log1p((n - dfs[y] + 0.5) / (dfs[y] + 0.5)) * k1p1 * mult[y]
            ub[y] = scale[y] * min(wmax[t] * grow, _term_tf_bound(pk, t, k1, kb, bavg))
    order = np.argsort(-ub, kind="mergesort")
    remaining = np.zeros(nu + 1, np.float64)
    for j in range(nu - 1, -1, -1):
        remaining[j] = remaining[j + 1] + ub[order[j]]
    hs = np.empty(max(k, 1), np.float64)
    hi = np.empty(max(k, 1), np.int64)
    n_t = 0
    top1 = 0.0
    theta = -1.0
    j = 0
    while j < nu:
        y = order[j]
        if dfs[y] == 0:
            break  # sorted by bound: every later term has no surviving posting either
        t = ut[y]
        if n_t >= k and remaining[j] * (1.0 + _SLACK) < top1 and 8 * (pk[0][t + 1] - pk[0][t]) >= n_t:
            theta = _kth_score(acc, touched, n_t, k, hs, hi)
            if remaining[j] * (1.0 + _SLACK) < theta:
                break
        sc = scale[y]
        if gathered[y]:
            for q in range(g_lo[y], g_lo[y] + dfs[y]):
                d = g_doc[q]
                f = g_tf[q]
                v = acc[d]
                if v == 0.0:
                    touched[n_t] = d
                    n_t += 1
                v += sc * f / (f + k1 * (kb + bavg * doc_len[d]))
                acc[d] = v
                if v > top1:
                    top1 = v
        else:
            # Block skipping needs the documents touched before, sorted: only when they are
            # few against the list (always for the first term).
            skip = 8 * n_t < pk[0][t + 1] - pk[0][t]
            n_t, top1 = _scan_term(pk, t, bits, acc, touched, n_t, top1, sc, remaining[j + 1] * (1.0 + _SLACK),
                                   skip, k, hs, hi, grow, k1, kb, bavg, docs, tfs)
        j += 1
    if j < nu and dfs[order[j]] > 0:
        # Lookup phase: candidates that can still reach theta; remaining terms looked up.
        cand = np.empty(n_t, np.int64)
        nc = _prune(acc, touched, n_t, remaining[j] * (1.0 + _SLACK), theta, cand)
        cand[:nc] = np.sort(cand[:nc])
        for jj in range(j, nu):
            y = order[jj]
            if dfs[y] == 0:
                break
            if gathered[y]:
                for q in range(g_lo[y], g_lo[y] + dfs[y]):
                    d = g_doc[q]
                    if acc[d] != 0.0:
                        f = g_tf[q]
                        acc[d] += scale[y] * f / (f + k1 * (kb + bavg * doc_len[d]))
            else:
                _lookup(pk, ut[y], cand, nc, acc, scale[y], wt, k1, docs, tfs, kb, bavg)
        return _take_top(acc, cand, nc, k, hs, hi)
    return _take_top(acc, touched, n_t, k, hs, hi)
