"""The filtered numba BM25 route: ``search_filtered`` (N, df and avgdl over the survivors,
MaxScore- and block-bound-pruned). See ``kernels.loader``. The filter arrives packed
(``index.filter.prepare``).
"""

import numpy as np
from numba import njit

from ..format.raw import BLOCK_SIZE
from .filter_stats import known_df, popcount64, rank, remember_df, stack_scale
from .selection import (
    _SLACK,
    _distinct,
    _gallop_each,
    _kth_score,
    _narrow,
    _prune,
    _push,
    _suffix_sums,
    _take_top,
)
from .weight import filtered_max, term_bound
from .weight import filtered_part as _w

_BLOCK = BLOCK_SIZE  # postings per block of the block bounds (a compile-time constant)
# Few survivors (their positions known): a bitset term is read by rank over them when its
# list is this many times longer (a scan reads every posting; a rank is ~3 cache misses);
# a term without bitset is gathered by galloping when its list is this many times longer.
_RANK_MIN = 16
_GALLOP_MIN = 64
# A scanned term is read block by block with skipping while the documents touched before
# it (each looked up afterwards when its block was skipped) are this many times fewer than
# its postings.
_SKIP_MAX_TOUCHED = 32


@njit(cache=True, nogil=True, inline="always")
def _alive64(bits, d):
    return (bits[d >> 6] >> np.uint64(d & 63)) & np.uint64(1)


@njit(cache=True, nogil=True)
def _and_count(bits, row):
    c = 0
    for w in range(bits.shape[0]):
        c += popcount64(bits[w] & row[w])
    return c


@njit(cache=True, nogil=True, inline="always")
def _add(acc, touched, n_t, top1, d, x):
    # Add x to d's partial score, recording d as touched on its first contribution.
    v = acc[d]
    if v == 0.0:
        touched[n_t] = d
        n_t += 1
    v += x
    acc[d] = v
    return n_t, max(top1, v)


@njit(cache=True, nogil=True)
def _scan_blocks(t, sc, rest, grow, indptr, indices, tf, doc_len, bits, bptr, bmax, blk_tf, blk_len, k1, kb, bavg, k,
                 acc, touched, n_t, top1, hs, hi):
    """Term t's surviving postings into acc, block by block, skipping blocks that cannot
    bring a new document into the top k. Returns (n_t, top1).

    A heap keeps k distinct documents' partial scores (those touched before, then each
    newly touched one with its first contribution): its root is at most the final k-th
    best. A document this term touches first scores at most the block's bound plus every
    later term's bound (``rest``), so when that is below the root the block is skipped
    (as search_one does for its first term). The documents touched before t that lie in a
    skipped block still get t's contribution: each is looked up afterwards (they are few:
    the caller takes this route only then). A block's bound at the survivors' avgdl is the
    smaller of its full-corpus max w x ``grow`` and its largest tf over its shortest doc.
    """
    s0 = indptr[t]
    e0 = indptr[t + 1]
    before = n_t
    nh = 0
    for x in range(before):
        d = touched[x]
        if nh < k or acc[d] > hs[0]:
            nh = _push(hs, hi, nh, k, acc[d], d)
    bound_sc = sc * (1.0 + _SLACK)
    rest = rest * (1.0 + _SLACK)
    b0 = bptr[t]
    skipped = np.zeros(bptr[t + 1] - b0, np.bool_)
    any_skipped = False
    for p0 in range(s0, e0, _BLOCK):
        bk = b0 + (p0 - s0) // _BLOCK
        if nh == k and filtered_max(bmax[bk], grow, blk_tf[bk], blk_len[bk], k1, kb, bavg) * bound_sc + rest < hs[0]:
            skipped[bk - b0] = True
            any_skipped = True
            continue
        for p in range(p0, min(p0 + _BLOCK, e0)):
            d = indices[p]
            if _alive64(bits, d):
                x = _w(sc, np.float64(tf[p]), k1, kb, bavg, doc_len[d])
                v = acc[d]
                if v == 0.0:
                    touched[n_t] = d
                    n_t += 1
                    if nh < k or x > hs[0]:
                        nh = _push(hs, hi, nh, k, x, d)
                v += x
                acc[d] = v
                top1 = max(top1, v)
    if any_skipped and before > 0:
        prev = np.sort(touched[:before])
        at = np.empty(before, np.int64)
        _gallop_each(indices, s0, e0, prev, before, at)
        for x in range(before):
            p = at[x]
            if p >= 0 and skipped[(p - s0) // _BLOCK]:
                d = prev[x]
                acc[d] += _w(sc, np.float64(tf[p]), k1, kb, bavg, doc_len[d])
                top1 = max(top1, acc[d])
    return n_t, top1


@njit(cache=True, nogil=True)
def _score_term(t, mode, sc, g_lo, dft, g_doc, g_tf, indptr, indices, tf, doc_len, bits, surv, n, term_bits, bit_row,
                rank_dir, coin, k1, kb, bavg, acc, touched, n_t, top1):
    """Every surviving posting of term t into acc (an essential term): from its gathered
    postings (mode 1), by rank over the few survivors (mode 2) or over the set bits of
    (filter & its bitset row) (mode 3), or by a scan of its list. Returns (n_t, top1)."""
    if mode == 1:
        for q in range(g_lo, g_lo + dft):
            d = g_doc[q]
            n_t, top1 = _add(acc, touched, n_t, top1, d, _w(sc, g_tf[q], k1, kb, bavg, doc_len[d]))
    elif mode == 2:
        row = term_bits[bit_row[t]]
        rdir = rank_dir[bit_row[t]]
        s0 = indptr[t]
        for x in range(n):
            d = surv[x]
            if _alive64(row, d):
                f = np.float64(tf[s0 + rank(row, rdir, d)])
                n_t, top1 = _add(acc, touched, n_t, top1, d, _w(sc, f, k1, kb, bavg, doc_len[d]))
    elif mode == 3:
        row = term_bits[bit_row[t]]
        s0 = indptr[t]
        for w in range(bits.shape[0]):  # s0 + run: the list position of word w's first doc
            x = bits[w] & row[w]
            r = row[w]
            while x != 0:
                low = x & (~x + np.uint64(1))
                d = w * 64 + popcount64(low - np.uint64(1))
                f = np.float64(tf[s0 + popcount64(r & (low - np.uint64(1)))])
                n_t, top1 = _add(acc, touched, n_t, top1, d, _w(sc, f, k1, kb, bavg, doc_len[d]))
                x ^= low
            s0 += popcount64(r)
    elif coin:
        n_t, top1 = _scan_branchless(indptr[t], indptr[t + 1], indices, tf, doc_len, bits, sc, k1, kb, bavg, acc,
                                     touched, n_t, top1)
    else:
        for p in range(indptr[t], indptr[t + 1]):
            d = indices[p]
            if _alive64(bits, d):
                n_t, top1 = _add(acc, touched, n_t, top1, d, _w(sc, np.float64(tf[p]), k1, kb, bavg, doc_len[d]))
    return n_t, top1


@njit(cache=True, nogil=True)
def _lookup_term(t, mode, sc, g_lo, dft, g_doc, g_tf, indptr, indices, tf, doc_len, cand, nc, term_bits, bit_row,
                 rank_dir, k1, kb, bavg, acc):
    """Term t's postings of the candidates cand[:nc] (sorted, partial scores in acc) added
    to acc: from its gathered postings, by rank in its bitset row, by galloping, or by a
    scan of its list, whichever reads least."""
    lo = indptr[t]
    e0 = indptr[t + 1]
    df = e0 - lo
    if mode == 1:
        for q in range(g_lo, g_lo + dft):
            d = g_doc[q]
            if acc[d] != 0.0:
                acc[d] += _w(sc, g_tf[q], k1, kb, bavg, doc_len[d])
    elif bit_row[t] >= 0 and nc * _RANK_MIN < df:
        row = term_bits[bit_row[t]]
        rdir = rank_dir[bit_row[t]]
        for x in range(nc):
            d = cand[x]
            if _alive64(row, d):
                acc[d] += _w(sc, np.float64(tf[lo + rank(row, rdir, d)]), k1, kb, bavg, doc_len[d])
    elif nc * (4 + 2 * np.log2(df / max(nc, 1) + 1.0)) < df:
        at = np.empty(nc, np.int64)
        _gallop_each(indices, lo, e0, cand, nc, at)
        for x in range(nc):
            if at[x] >= 0:
                d = cand[x]
                acc[d] += _w(sc, np.float64(tf[at[x]]), k1, kb, bavg, doc_len[d])
    else:
        for p in range(lo, e0):
            d = indices[p]
            if acc[d] != 0.0:
                acc[d] += _w(sc, np.float64(tf[p]), k1, kb, bavg, doc_len[d])


@njit(cache=True, nogil=True)
def _scan_branchless(s0, e0, indices, tf, doc_len, bits, sc, k1, kb, bavg, acc, touched, n_t, top1):
    """Score postings s0:e0 into acc without branching on survivorship: a non-survivor
    adds 0.0 and is not recorded as touched. Returns (n_t, top1)."""
    for p in range(s0, e0):
        d = indices[p]
        alive = np.float64(_alive64(bits, d))
        f = np.float64(tf[p])
        v = acc[d]
        nv = v + alive * _w(sc, f, k1, kb, bavg, doc_len[d])
        acc[d] = nv
        touched[n_t] = d
        n_t += np.int64((v == 0.0) & (nv != 0.0))
        top1 = max(top1, nv)
    return n_t, top1


@njit(cache=True, nogil=True)
def search_filtered(indptr, indices, tf, doc_len, bits, surv, n, total, qtids, bit_row, term_bits, rank_dir, k1, b,
                    k, acc, touched, wmax, avgdl_all, bptr, bmax, blk_tf, blk_len, t_maxtf, t_minlen, known, stack):
    """Exact filtered top-k: N, df and avgdl over the filter's n survivors (the spec),
    MaxScore-pruned like ``search_one``. ``bits`` is the packed filter (uint64 words).

    Survivor df: a term with a bitset row counts by popcount of (row & filter); a term
    without one by a branchless pass over its list, or, when the survivors are few
    (``surv`` holds their positions, else it is empty) and its list much longer, by
    galloping each survivor into it (its postings are gathered on the way). Scoring
    reads a bitset term's postings for few survivors by rank (``rank_dir``: the
    survivor's place in the list in O(1)) instead of scanning the list.

    A term's bound is its idf over the survivors x (k1 + 1) x a bound of its tf factor at
    the survivors' avgdl': the smaller of its full-corpus max w x max(1, avgdl'/avgdl)
    and its largest tf over its shortest document; per block the same with the block's
    max w, max tf and shortest document. The highest-bound term is scanned block by block,
    skipping blocks that cannot reach the k-th best; terms are scored by descending bound
    until the rest cannot change the top k, then looked up for the remaining candidates
    only. ``known`` (empty = none kept) is a reused filter's survivor df cache
    (``index.filter.df_cache``): a df counted by popcount or a pass is read back by later
    queries; a gathered term's df comes with its gathering.

    A stack (``stack`` not empty: its N, summed length, then df per position of ``qtids``;
    ``index.stats_query.stack_args``) scores with those N, df and avgdl instead: only idf,
    avgdl and the bounds built on them change; planning and routes keep the survivors'
    own counts (the df cache holds those). ``k == 0`` scores nothing and returns, as
    ids, the survivor df of each distinct term in first-seen order (``survivor_stats``:
    this kernel's counting routes and cache, no entry point more to load at open).
    acc is zero on entry and exit.
    """
    empty_i = np.zeros(0, np.int64)
    empty_s = np.zeros(0, np.float64)
    if n == 0 or total == 0 or qtids.shape[0] == 0:
        return empty_i, empty_s
    avgdl = total / n
    few = surv.shape[0] == n
    # Survivor tests that a branch predictor cannot learn (a filter keeping 20-90% of the
    # corpus) cost more as mispredicted branches than as arithmetic: scan those lists
    # without a branch on the survivor bit.
    coin = 5 * n >= acc.shape[0] and 10 * n <= 9 * acc.shape[0]
    ut, mult, first = _distinct(qtids)
    nu = ut.shape[0]
    # How each term's surviving postings are read (its survivor df comes on the way or by
    # popcount): 0 scan its list; 1 gathered into (g_doc, g_tf) once, by galloping the few
    # survivors into it or by one branchless pass over it, then read from there; 2 by rank
    # of each of the few survivors in its bitset row; 3 by rank of each set bit of
    # (filter & its bitset row). A broad filter (over a quarter of the corpus) scans.
    broad = 4 * n > acc.shape[0]
    dfs = np.zeros(nu, np.int64)
    mode = np.zeros(nu, np.int64)
    cap = 0
    for y in range(nu):
        t = ut[y]
        df = indptr[t + 1] - indptr[t]
        if bit_row[t] >= 0:
            if few and n * _RANK_MIN < df:
                mode[y] = 2
            elif not broad:
                mode[y] = 3
        elif (few and n * _GALLOP_MIN < df) or not broad:
            mode[y] = 1
            cap += min(df, n) + 1
    g_doc = np.empty(cap, np.int32)
    g_tf = np.empty(cap, np.float64)
    g_lo = np.zeros(nu, np.int64)
    g = 0
    at = np.empty(n if few and cap else 0, np.int64)
    for y in range(nu):
        t = ut[y]
        s0 = indptr[t]
        e0 = indptr[t + 1]
        if mode[y] == 1:
            g_lo[y] = g
            if few and n * _GALLOP_MIN < e0 - s0:
                _gallop_each(indices, s0, e0, surv, n, at)
                for x in range(n):
                    if at[x] >= 0:
                        g_doc[g] = surv[x]
                        g_tf[g] = tf[at[x]]
                        g += 1
            else:
                for p in range(s0, e0):  # write every posting, keep the survivors
                    d = indices[p]
                    g_doc[g] = d
                    g_tf[g] = tf[p]
                    g += np.int64(_alive64(bits, d))
            dfs[y] = g - g_lo[y]
        else:
            c = known_df(known, t)  # counted by an earlier query under this (reused) filter, or -1
            if c < 0:
                if bit_row[t] >= 0:
                    c = _and_count(bits, term_bits[bit_row[t]])
                else:
                    c = 0
                    for p in range(s0, e0):
                        c += np.int64(_alive64(bits, indices[p]))
                remember_df(known, t, c)
            dfs[y] = c
    if k == 0:
        return dfs, empty_s
    k1p1 = k1 + 1.0
    kb = 1.0 - b
    scale, avgdl = stack_scale(n, avgdl, dfs, mult, first, k1p1, stack)
    bavg = b / avgdl
    grow = max(1.0, avgdl / avgdl_all) if avgdl_all > 0 else 1.0
    ub = np.zeros(nu, np.float64)
    for y in range(nu):
        if dfs[y] > 0:
            t = ut[y]
            ub[y] = term_bound(scale[y], filtered_max(wmax[t], grow, t_maxtf[t], t_minlen[t], k1, kb, bavg))
    order = np.argsort(-ub, kind="mergesort")
    remaining = _suffix_sums(ub[order])
    hs = np.empty(max(k, 1), np.float64)
    hi = np.empty(max(k, 1), np.int64)
    n_t = 0
    top1 = 0.0
    theta = -1.0
    j = 0
    if nu > 0 and dfs[order[0]] > 0 and mode[order[0]] == 0:
        y = order[0]
        n_t, top1 = _scan_blocks(ut[y], scale[y], remaining[1], grow, indptr, indices, tf, doc_len, bits, bptr, bmax,
                                 blk_tf, blk_len, k1, kb, bavg, k, acc, touched, 0, 0.0, hs, hi)
        j = 1
    while j < nu:
        y = order[j]
        if dfs[y] == 0:
            break  # sorted by bound: every later term has no surviving posting either
        # Checking costs about n_t; only before a list at least that long (its scan reads
        # every posting, survivor or not).
        if j > 0 and n_t >= k and remaining[j] * (1.0 + _SLACK) < top1 and 8 * (
                indptr[ut[y] + 1] - indptr[ut[y]]) >= n_t:
            theta = _kth_score(acc, touched, n_t, k, hs, hi)
            if remaining[j] * (1.0 + _SLACK) < theta:
                break
        if mode[y] == 0 and n_t * _SKIP_MAX_TOUCHED < indptr[ut[y] + 1] - indptr[ut[y]]:
            n_t, top1 = _scan_blocks(ut[y], scale[y], remaining[j + 1], grow, indptr, indices, tf, doc_len, bits, bptr,
                                     bmax, blk_tf, blk_len, k1, kb, bavg, k, acc, touched, n_t, top1, hs, hi)
        else:
            n_t, top1 = _score_term(ut[y], mode[y], scale[y], g_lo[y], dfs[y], g_doc, g_tf, indptr, indices, tf,
                                    doc_len, bits, surv, n, term_bits, bit_row, rank_dir, coin, k1, kb, bavg, acc,
                                    touched, n_t, top1)
        j += 1
    if j < nu and dfs[order[j]] > 0:
        # Lookup phase: candidates that can still reach theta, remaining terms looked up.
        cand = np.empty(n_t, np.int32)
        nc = _prune(acc, touched, n_t, remaining[j] * (1.0 + _SLACK), theta, cand)
        cand = np.sort(cand[:nc])
        for jj in range(j, nu):
            y = order[jj]
            if dfs[y] == 0:
                break
            _lookup_term(ut[y], mode[y], scale[y], g_lo[y], dfs[y], g_doc, g_tf, indptr, indices, tf, doc_len,
                         cand, nc, term_bits, bit_row, rank_dir, k1, kb, bavg, acc)
            if jj + 1 < nu and nc > k and dfs[order[jj + 1]] > 0:  # as the unfiltered kernel
                nc = _narrow(acc, cand, nc, k, remaining[jj + 1] * (1.0 + _SLACK), hs, hi)
        return _take_top(acc, cand, nc, k, hs, hi)
    return _take_top(acc, touched, n_t, k, hs, hi)
