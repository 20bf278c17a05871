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

from .packed import _BLOCK
from .packed_filter_weights import code_dens, window_tables
from .packed_route import RARE_DF_FRACTION, RARE_WEIGHT
from .packed_seed import _seed
from .packed_wand import _block_cursors, _seek, _shallow
from .packed_windows import WINDOW, _jump, _score_window
from .selection import _drain, _suffix_sums
from .weight import block_bound as _bound
from .weight import den_of as _den
from .weight import part, term_df

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
    # (``kernels.packed_seed._seed`` with the filtered weigher: the survivors' parts.)
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
    jump cursor, blocks passed for good, apart from ``blk``); returns the heap's size. The
    jump and a window's scoring are the unfiltered walk's (``kernels.packed_windows._jump``,
    ``_score_window``) under the filtered weigher; what is the filtered walk's own is a
    window's bounds: a sparse block's from its surviving postings.

    Compiled without the runtime's reference counting (``_nrt=False``: it allocates
    nothing): with it, the arrays handed to the inlined helpers cost an atomic increment
    and decrement each per call, which measured most of a dense filtered query's time."""
    end_doc = np.int64(dcode.shape[0])
    nu = scale.shape[0]
    nh = 0
    ar = (data, off, dbits, tbits, last)
    wg = (den, k1, kb, bavg, grow)
    bd = (bmax, maxtf, minlen)
    cur = (b0, bend, cnt, blk, dec, pos, nb, docs, tfs)
    win = (wc, whit, wacc, wlist, keys, hit_key, hit_tf, wset)
    lo = np.int64(0)
    while lo < end_doc:
        if theta > 0.0:
            lo = _jump(ar, wg, bmax, maxtf, minlen, scale, ub, gsuf, theta, lo, end_doc, jb, b0, bend, cnt, dec, pos,
                       nb, docs, tfs)
            if lo >= end_doc:
                break
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
                _seek(ar, j, b, lo, b0, bend, cnt, dec, pos, nb, docs, tfs)
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
        if live > 0:
            nh, theta, hi = _score_window(ar, wg, tab, bits, bd, dcode, scale, theta, lo, hi, cap, cur, win, m, ordm,
                                          live, pre, hs, hi_, nh)
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
        df = term_df(indptr, ut[y])
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
        if term_df(indptr, t) * RARE_DF_FRACTION < n_docs:
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
