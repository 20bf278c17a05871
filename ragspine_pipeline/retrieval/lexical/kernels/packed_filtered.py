"""The filtered numba route over packed postings: N, df and avgdl over the filter survivors.

The plain layout's filtered kernel (``kernels.plain_filtered``) is the model, term order and
arithmetic included, so each filtered answer is the plain layout's bit for bit. The filter
arrives prepared by ``index.filter.prepare`` (packed bits, survivor count and summed length,
the survivors' positions when few), so nothing here passes over N documents except a
popcount of N/64 words. What the packed layout changes is how a term's survivors are found
(``_plan``); each route but the last also gathers the surviving (doc, tf) pairs once, and
they serve both the survivor df and the scoring:

* few survivors (<= N / ``index.filter.FEW_SURVIVORS_DIV``): a term with a bitset row and
  a list much longer counts the survivors' bits in its row, and is scored by reading each
  survivor's tf at its rank (``rank_dir``: O(1)) straight from its block; a term without
  one has its postings at the survivors gathered, by galloping them through the blocks'
  last doc ids (only the blocks holding one unpacked) when its list is much longer, else
  by a branch-free pass unpacking it. An exhaustive pass over the survivors;
* more survivors: the survivor df only (a popcount of (row & filter) over N/64 words, or
  a pass decoding the list's gaps), and the term is scored by a pruned scan. (Gathering
  there too, as the plain layout's kernel does under a filter keeping up to a quarter,
  measured slower at 10M documents: every survivor's score then lands in an 80 MB
  accumulator at random, where the pruned scan skips most blocks.)

A filter keeping at least a quarter of the documents (and a query whose rare terms do not
carry it) is scored by the filtered window kernel instead (``kernels.packed_filtered_windows``:
block-max MaxScore over doc windows, the unfiltered router's kernel with the survivors'
statistics), from this plan and in this term order, so its answers are these bit for bit.
Otherwise scoring follows MaxScore by descending term bound (the idf over the survivors x the
smaller of the full-corpus max w grown by avgdl'/avgdl and the term's max tf over its
shortest document); a scanned term is read block by block, skipping blocks whose bound
(the same two, per block: ``blk_bmax`` / ``blk_maxtf`` / ``blk_minlen``, valid for any
survivor avgdl) cannot bring a new document into the top k (``_scan_term``); once the
remaining terms cannot change the top k, they are looked up for the remaining candidates.
"""

import numpy as np
from numba import njit

from .filter_stats import known_df, popcount64, rank, remember_df, stack_scale
from .packed import (
    _BLOCK,
    _ONE,
    _count,
    _lookup,
    _match_block,
    _run,
    _skipped_block,
    _unpack,
    bit_row_of,
)
from .packed_filter_weights import code_dens, tf1_tables
from .packed_filtered_windows import from_plan, windows_suit
from .packed_windows import MAX_TERMS
from .plain_filtered import _add
from .selection import (
    _SLACK,
    _distinct,
    _gallop,
    _kth_score,
    _narrow,
    _prune,
    _push,
    _suffix_sums,
    _take_top,
)
from .weight import (
    blk_bmax,
    blk_maxtf,
    blk_minlen,
    filtered_max,
    filtered_part,
    term_bound,
    term_df,
    term_wmax,
)

# Few survivors (their positions known): a term's postings at them are gathered by rank in
# its bitset row when its list is this many times longer than the survivors, or, without a
# row, by galloping them through the blocks' last doc ids when this many times longer.
_RANK_MIN = 16
_GALLOP_MIN = 16


@njit(cache=True, nogil=True, inline="always")
def _alive(bits, d):
    return (bits[d >> 6] >> np.uint64(d & 63)) & _ONE


@njit(cache=True, nogil=True)
def _and_count(bits, row):
    """Set bits of (bits & row): the survivor df of a bitset term."""
    c = 0
    for w in range(bits.shape[0]):
        c += popcount64(bits[w] & row[w])
    return c


@njit(cache=True, nogil=True)
def _gather(pk, t, surv, n, docs, tfs, g_doc, g_tf, g):
    """Append term t's postings at the survivors surv[:n] to (g_doc, g_tf) from g; returns
    the new end. Only blocks holding a survivor are read (``_match_block``)."""
    b0 = np.int64(pk[1][t])
    end = np.int64(pk[1][t + 1])
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


@njit(cache=True, nogil=True, inline="always")
def _tf_at(pk, t, i):
    """The tf of term t's i-th posting, read from its block without unpacking it."""
    blk = np.int64(pk[1][t]) + i // _BLOCK
    tw = np.int64(pk[5][blk])
    if tw == 0:
        return 1
    nn = _count(pk, t, blk)
    pos = (np.int64(pk[3][blk]) + ((nn * np.int64(pk[4][blk]) + 31) >> 5)) * 32 + (i % _BLOCK) * tw
    data = pk[7]
    both = np.uint64(data[pos >> 5]) | (np.uint64(data[(pos >> 5) + 1]) << np.uint64(32))
    return np.int64((both >> np.uint64(pos & 31)) & ((_ONE << np.uint64(tw)) - _ONE)) + 1


@njit(cache=True, nogil=True)
def _gather_scan(pk, t, bits, docs, tfs, g_doc, g_tf, g):
    """Append term t's surviving postings by unpacking every block (each posting written,
    the end advanced only for a survivor: no branch a 5-50% filter would mispredict)."""
    b0 = np.int64(pk[1][t])
    for blk in range(b0, np.int64(pk[1][t + 1])):
        nn = _count(pk, t, blk)
        _unpack(pk[7], pk[3], pk[4], pk[5], pk[2], blk, blk == b0, nn, docs, tfs)
        for i in range(nn):
            d = docs[i]
            g_doc[g] = d
            g_tf[g] = np.float64(tfs[i])
            g += np.int64(_alive(bits, d))
    return g


@njit(cache=True, nogil=True)
def _count_alive(pk, t, bits, docs):
    """Term t's postings whose filter bit is set: every block's gaps decoded (its tfs are
    not), each doc's bit added without a branch."""
    b0 = np.int64(pk[1][t])
    c = 0
    for blk in range(b0, np.int64(pk[1][t + 1])):
        nn = _count(pk, t, blk)
        d = np.int64(-1) if blk == b0 else np.int64(pk[2][blk - 1])
        dw = np.int64(pk[4][blk])
        if dw == 0:
            for i in range(nn):
                docs[i] = d + 1 + i
        else:
            _run(pk[7], np.int64(pk[3][blk]), dw, nn, docs, d, True)
        for i in range(nn):
            c += np.int64(_alive(bits, docs[i]))
    return c


@njit(cache=True, nogil=True)
def _count_in_row(row, surv, n):
    """How many of the survivors surv[:n] are set in a bitset row."""
    c = 0
    for x in range(n):
        c += np.int64(_alive(row, surv[x]))
    return c


@njit(cache=True, nogil=True)
def _ranked(pk, t, row, rdir, cand, nc, acc, touched, n_t, top1, sc, add_new, k1, kb, bavg, lens):
    """The bitset term t's part added to the documents cand[:nc] it holds (its tf read at
    the document's rank in its row, from its block): to every one (``add_new``, an
    essential term over the few survivors), else to those already scored (a lookup).
    Returns (n_t, top1)."""
    for x in range(nc):
        d = cand[x]
        if _alive(row, d):
            v = acc[d]
            if v == 0.0 and not add_new:
                continue
            f = np.float64(_tf_at(pk, t, rank(row, rdir, d)))
            n_t, top1 = _add(acc, touched, n_t, top1, d, filtered_part(sc, f, k1, kb, bavg, lens[d]))
    return n_t, top1


@njit(cache=True, nogil=True)
def _scan_term(pk, t, bits, lens, acc, touched, n_t, top1, sc, rest, skip, k, hs, hi, grow, k1, kb, bavg, docs,
               tfs, tab, y, row):
    """Add term t's surviving postings to acc (``sc`` x its tf factor; its tf-1 parts from
    row ``row[y]`` of ``tab`` when it has one: ``kernels.packed_filter_weights``); returns (n_t, top1).

    With ``skip``, the term is read block by block with a heap of the k best documents of
    this scan (distinct, their partial scores: lower bounds of their final ones): a block
    whose bound x ``sc`` plus ``rest`` (the later terms' bounds) is below the k-th of them
    cannot bring in a document not touched yet, and is skipped; documents touched before
    the scan that lie in skipped blocks then get the term from those blocks alone (each
    document still sums its terms in term order). A block's bound holds for any survivor
    avgdl: the smaller of its max w grown by avgdl'/avgdl and its max tf over its shortest
    document (``blk_maxtf`` / ``blk_minlen``)."""
    last = pk[2]
    dcode = pk[13]
    r = row[y]  # its tf-1 parts' row in tab, or -1
    b0 = np.int64(pk[1][t])
    b1 = np.int64(pk[1][t + 1])
    n_before = n_t
    skipped = np.empty(b1 - b0 if skip and n_before > 0 else 0, np.int64)
    nsk = 0
    nh = 0
    for blk in range(b0, b1):
        if skip and nh == k and filtered_max(blk_bmax(pk[6], blk), grow, blk_maxtf(pk[9], blk), blk_minlen(pk[10], blk), k1, kb,
                                                     bavg) * sc * (1.0 + _SLACK) + rest < hs[0]:
            if n_before > 0:
                skipped[nsk] = blk
                nsk += 1
            continue
        nn = _count(pk, t, blk)
        _unpack(pk[7], pk[3], pk[4], pk[5], last, blk, blk == b0, nn, docs, tfs)
        for i in range(nn):
            d = docs[i]
            if _alive(bits, d):
                v = acc[d]
                if v == 0.0:
                    touched[n_t] = d
                    n_t += 1
                tf = tfs[i]
                if tf == 1 and r >= 0:  # written out: a helper taking arrays costs refcounts per call
                    v += tab[r, dcode[d]]
                else:
                    f = np.float64(tf)
                    v += filtered_part(sc, f, k1, kb, bavg, lens[d])
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
                acc[d] += filtered_part(sc, f, k1, kb, bavg, lens[d])
    return n_t, top1


@njit(cache=True, nogil=True)
def _plan(pk, ut, rows, bits, surv, n, few, docs, tfs, known):
    """Survivor df of each distinct term and how it is scored (the module docstring's
    routes): mode 0 by a pruned scan of its list, 1 from its surviving postings gathered
    into (g_doc, g_tf) on the way, 2 by rank of the few survivors in its bitset row.
    ``known`` (``index.filter.df_cache``; empty = none kept) is a reused filter's: a df
    counted once (modes 0 and 2, a pass over the list or a popcount of its row) is
    read back by later queries; a gathered term's df is its gathering, needed anyway.
    ``rows``: each term's bit-set row or -1 (``bit_row_of``). Returns (dfs, mode, g_lo,
    g_doc, g_tf)."""
    nu = ut.shape[0]
    term_bits = pk[12]
    n_words = bits.shape[0]
    mode = np.zeros(nu, np.int64)
    cap = 0
    for y in range(nu):
        t = ut[y]
        df = term_df(pk[0], t)
        if rows[y] >= 0:
            if few and n * _RANK_MIN < df:
                mode[y] = 2
        elif few:
            mode[y] = 1
            cap += min(df, n) if n * _GALLOP_MIN < df else df
    g_doc = np.empty(cap, np.int64)
    g_tf = np.empty(cap, np.float64)
    g_lo = np.zeros(nu + 1, np.int64)
    dfs = np.zeros(nu, np.int64)
    g = 0
    for y in range(nu):
        t = ut[y]
        g_lo[y] = g
        row = rows[y]
        if mode[y] == 1:
            if few and n * _GALLOP_MIN < term_df(pk[0], t):
                g = _gather(pk, t, surv, n, docs, tfs, g_doc, g_tf, g)
            else:
                g = _gather_scan(pk, t, bits, docs, tfs, g_doc, g_tf, g)
            dfs[y] = g - g_lo[y]
        else:
            c = known_df(known, t)  # counted by an earlier query under this (reused) filter, or -1
            if c < 0:
                if row >= 0:
                    # A bit test per survivor (a cache miss each) or a popcount per word.
                    c = _count_in_row(term_bits[row], surv, n) if few and 8 * n < n_words else _and_count(
                        bits, term_bits[row])
                else:
                    c = _count_alive(pk, t, bits, docs)
                remember_df(known, t, c)
            dfs[y] = c
    g_lo[nu] = g
    return dfs, mode, g_lo, g_doc, g_tf


@njit(cache=True, nogil=True)
def search_filtered(pk, bits, surv, n, total, qtids, wt, k, acc, touched, wmax, lens, t_maxtf, t_minlen,
                    rank_dir, clen, windows, known, stack):
    """Exact filtered top-k over packed postings (see the module docstring). ``bits`` is
    the filter as uint64 words, ``surv`` the survivors' ascending positions when few
    (else empty), ``n`` / ``total`` their count and summed length (``index.filter.prepare``);
    ``lens`` the document lengths (any unsigned width), ``t_maxtf`` / ``t_minlen`` per
    term and ``rank_dir`` per bitset row (``index.packed_filter_support``); k1 and b are
    ``wt``'s, whose avgdl (``wt[4]``) the stored block maxima were computed at. ``clen``:
    the file's length of each length code (empty without codes); ``windows``: 1 routes a
    dense filter to the window kernel when it suits the query, 0 never, 2 always (tests);
    ``known``: the filter's survivor df cache (``_plan``; ``index.filter.remembered``);
    ``stack`` (empty: none) a stack's statistics and ``k == 0`` the
    survivor df alone, as ``kernels.plain_filtered.search_filtered`` takes them.
    acc is zero on entry and exit."""
    k1 = wt[2]
    b = wt[3]
    if n == 0 or total == 0 or qtids.shape[0] == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.float64)
    docs = np.empty(_BLOCK, np.int64)
    tfs = np.empty(_BLOCK, np.int64)
    avgdl = total / n
    few = surv.shape[0] == n
    ut, mult, first = _distinct(qtids)
    nu = ut.shape[0]
    rows = np.empty(nu, np.int64)
    for y in range(nu):
        rows[y] = bit_row_of(pk[11], ut[y])
    dfs, mode, g_lo, g_doc, g_tf = _plan(pk, ut, rows, bits, surv, n, few, docs, tfs, known)
    if k == 0:
        return dfs, np.zeros(0, np.float64)
    kb = 1.0 - b
    scale, avgdl = stack_scale(n, avgdl, dfs, mult, first, k1 + 1.0, stack)
    bavg = b / avgdl
    grow = max(1.0, avgdl / wt[4])  # the weights' avgdl: the one the stored maxima were computed at
    ub = np.zeros(nu, np.float64)
    for y in range(nu):
        if dfs[y] > 0:
            t = ut[y]
            ub[y] = term_bound(scale[y], filtered_max(term_wmax(wmax, t), grow, t_maxtf[t], t_minlen[t], k1, kb, bavg))
    order = np.argsort(-ub, kind="mergesort")
    if not few and nu <= MAX_TERMS and (windows == 2 or windows == 1 and windows_suit(pk[0], ut, dfs, ub, n,
                                                                                   pk[13].shape[0], k)):
        return from_plan(pk, bits, ut, dfs, scale, ub, order, k, grow, k1, kb, bavg, clen)
    # Tables for the scanned terms only (mode 0): gathered and ranked terms never read them.
    scanned = np.zeros(nu, np.int64)
    for y in range(nu):
        if mode[y] == 0:
            scanned[y] = term_df(pk[0], ut[y])
    tab, trow = tf1_tables(scanned, dfs, scale,
                           code_dens(clen, k1, kb, bavg))
    remaining = _suffix_sums(ub[order])
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
        reads = term_df(pk[0], t) if mode[y] == 0 else n if mode[y] == 2 else dfs[y]
        if n_t >= k and remaining[j] * (1.0 + _SLACK) < top1 and 8 * reads >= n_t:
            theta = _kth_score(acc, touched, n_t, k, hs, hi)
            if remaining[j] * (1.0 + _SLACK) < theta:
                break
        sc = scale[y]
        if mode[y] == 2:
            row = rows[y]
            n_t, top1 = _ranked(pk, t, pk[12][row], rank_dir[row], surv, n, acc, touched, n_t, top1, sc, True, k1,
                                kb, bavg, lens)
        elif mode[y] == 1:
            for q in range(g_lo[y], g_lo[y] + dfs[y]):
                d = g_doc[q]
                f = g_tf[q]
                n_t, top1 = _add(acc, touched, n_t, top1, d, filtered_part(sc, f, k1, kb, bavg, lens[d]))
        else:
            # Block skipping needs the documents touched before, sorted: only when they are
            # few against the list (always for the first term).
            skip = 8 * n_t < term_df(pk[0], t)
            n_t, top1 = _scan_term(pk, t, bits, lens, acc, touched, n_t, top1, sc,
                                   remaining[j + 1] * (1.0 + _SLACK), skip, k, hs, hi, grow, k1, kb, bavg, docs, tfs,
                                   tab, y, trow)
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
            row = rows[y]
            if mode[y] == 1:
                for q in range(g_lo[y], g_lo[y] + dfs[y]):
                    d = g_doc[q]
                    if acc[d] != 0.0:
                        f = g_tf[q]
                        acc[d] += filtered_part(scale[y], f, k1, kb, bavg, lens[d])
            elif row >= 0:
                _ranked(pk, ut[y], pk[12][row], rank_dir[row], cand, nc, acc, touched, 0, 0.0, scale[y], False, k1,
                        kb, bavg, lens)
            else:
                _lookup(pk, ut[y], cand, nc, acc, scale[y], wt, k1, docs, tfs, kb, bavg, lens)
            if jj + 1 < nu and nc > k and dfs[order[jj + 1]] > 0:  # as the unfiltered kernel
                nc = _narrow(acc, cand, nc, k, remaining[jj + 1] * (1.0 + _SLACK), hs, hi)
        return _take_top(acc, cand, nc, k, hs, hi)
    return _take_top(acc, touched, n_t, k, hs, hi)

