"""The filtered numba BM25 route: ``mask_prepare`` (one pass over a filter mask) and
``search_filtered`` (N, df and avgdl over the survivors, MaxScore-pruned). See
``bm25_kernel``.
"""

import numpy as np
from numba import njit

from .bm25_numba_select import _SLACK, _distinct, _gallop, _kth_score, _prune, _take_top

_PACK = np.uint64(0x0102040810204080)  # 8 bool bytes x this >> 56 = their 8 bits (little order)
_SHIFT = np.uint64(56)


@njit(cache=True, nogil=True)
def mask_prepare(words, mask, doc_len, bits, surv):
    """One pass over a filter mask, for a filtered query: (survivors n, their summed length).

    ``words`` is the mask's first N//8 bytes read as uint64 (eight bools per word), so an
    all-false stretch costs one compare per eight documents and never reads their
    lengths. Fills ``bits`` (zeroed, uint8, little bit order: the packed mask the kernel
    tests instead of the eight-times-larger bool array, and the bitset popcounts read)
    and, while they fit, the survivors' positions into ``surv`` (``len(surv) - 1`` of
    them: the caller uses them only when n fits).
    """
    cap = surv.shape[0] - 1
    n = 0
    total = 0
    nw = words.shape[0]
    wi = 0
    while wi < nw and n <= cap:  # positions still fit: record them
        if words[wi] != 0:
            bits[wi] = np.uint8((words[wi] * _PACK) >> _SHIFT)
            base = wi * 8
            for i in range(8):
                d = base + i
                c = np.int64(mask[d])
                surv[min(n, cap)] = d
                n += c
                total += np.int64(doc_len[d]) * c
        wi += 1
    while wi < nw:  # many survivors: counts and bits only
        if words[wi] != 0:
            bits[wi] = np.uint8((words[wi] * _PACK) >> _SHIFT)
            base = wi * 8
            for i in range(8):
                c = np.int64(mask[base + i])
                n += c
                total += np.int64(doc_len[base + i]) * c
        wi += 1
    for d in range(nw * 8, mask.shape[0]):
        if mask[d]:
            bits[d >> 3] |= np.uint8(1 << (d & 7))
            surv[min(n, cap)] = d
            n += 1
            total += np.int64(doc_len[d])
    return n, total


@njit(cache=True, nogil=True, inline="always")
def _alive(bits, d):
    return (bits[d >> 3] >> (d & 7)) & 1


@njit(cache=True, nogil=True)
def search_filtered(indptr, indices, tf, doc_len, bits, surv, n, total, qtids, pre_df, k1, b, k, acc,
                    touched, wmax, avgdl_all):
    """Exact filtered top-k: N, df and avgdl over the mask's n survivors (the spec),
    MaxScore-pruned like ``search_one``. ``bits`` is the packed mask (``mask_prepare``).

    ``surv`` holds the survivors' positions when the caller found them few (else it is
    empty): a term whose list is much longer than that is then gathered by galloping
    each survivor into it. Every other term's survivor df is a branchless count over
    its list, and its postings are scored only while it can still change the top k;
    after that it is looked up for the remaining candidates alone. A term's bound is
    ``pre_df[x] >= 0`` is token x's survivor df, already known (a bitset popcount).
    idf over the survivors x (k1 + 1) x max(1, avgdl_f / avgdl) x its full-corpus
    max tf/(tf + norm): with the survivors' avgdl_f the factor can grow by at most that
    ratio. acc is zero on entry and exit.
    """
    empty_i = np.zeros(0, np.int64)
    empty_s = np.zeros(0, np.float64)
    if n == 0 or total == 0 or qtids.shape[0] == 0:
        return empty_i, empty_s
    avgdl = total / n
    can_gallop = surv.shape[0] == n
    ut, mult, first = _distinct(qtids)
    nu = ut.shape[0]
    known = pre_df[first]
    # Survivor df per term; short-survivor terms gathered into (g_doc, g_tf).
    dfs = np.zeros(nu, np.int64)
    gathered = np.zeros(nu, np.bool_)
    cap = 0
    for y in range(nu):
        df = indptr[ut[y] + 1] - indptr[ut[y]]
        if can_gallop and n * 16 < df and known[y] < 0:
            gathered[y] = True
            cap += min(df, n)
    g_doc = np.empty(cap, np.int32)
    g_tf = np.empty(cap, np.float64)
    g_lo = np.zeros(nu, np.int64)
    g = 0
    for y in range(nu):
        s0 = indptr[ut[y]]
        e0 = indptr[ut[y] + 1]
        if gathered[y]:
            g_lo[y] = g
            lo = s0
            for x in range(n):
                if lo >= e0:
                    break
                d = surv[x]
                lo = _gallop(indices, lo, e0, d)
                if lo < e0 and indices[lo] == d:
                    g_doc[g] = d
                    g_tf[g] = tf[lo]
                    g += 1
            dfs[y] = g - g_lo[y]
        elif known[y] >= 0:
            dfs[y] = known[y]
        else:
            c = 0
            for p in range(s0, e0):
                c += np.int64(_alive(bits, indices[p]))
            dfs[y] = c
    k1p1 = k1 + 1.0
    grow = max(1.0, avgdl / avgdl_all) if avgdl_all > 0 else 1.0
    scale = np.zeros(nu, np.float64)
    ub = np.zeros(nu, np.float64)
    for y in range(nu):
        if dfs[y] > 0:
            scale[y] = np.log1p((n - dfs[y] + 0.5) / (dfs[y] + 0.5)) * k1p1 * mult[y]
            ub[y] = scale[y] * wmax[ut[y]] * grow
    order = np.argsort(-ub, kind="mergesort")
    remaining = np.zeros(nu + 1, np.float64)
    for j in range(nu - 1, -1, -1):
        remaining[j] = remaining[j + 1] + ub[order[j]]
    kb = 1.0 - b
    bavg = b / avgdl
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
        if j > 0 and n_t >= k and remaining[j] * (1.0 + _SLACK) < top1 and 8 * dfs[y] >= n_t:
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
            for p in range(indptr[ut[y]], indptr[ut[y] + 1]):
                d = indices[p]
                if _alive(bits, d):
                    f = np.float64(tf[p])
                    v = acc[d]
                    if v == 0.0:
                        touched[n_t] = d
                        n_t += 1
                    v += sc * f / (f + k1 * (kb + bavg * doc_len[d]))
                    acc[d] = v
                    if v > top1:
                        top1 = v
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
            sc = scale[y]
            if gathered[y]:
                for q in range(g_lo[y], g_lo[y] + dfs[y]):
                    d = g_doc[q]
                    if acc[d] != 0.0:
                        f = g_tf[q]
                        acc[d] += sc * f / (f + k1 * (kb + bavg * doc_len[d]))
            else:
                lo = indptr[ut[y]]
                e0 = indptr[ut[y] + 1]
                df = e0 - lo
                if nc * (4 + 2 * np.log2(df / max(nc, 1) + 1.0)) < df:
                    for x in range(nc):
                        if lo >= e0:
                            break
                        d = cand[x]
                        lo = _gallop(indices, lo, e0, d)
                        if lo < e0 and indices[lo] == d:
                            f = np.float64(tf[lo])
                            acc[d] += sc * f / (f + k1 * (kb + bavg * doc_len[d]))
                else:
                    for p in range(lo, e0):
                        d = indices[p]
                        if acc[d] != 0.0:
                            f = np.float64(tf[p])
                            acc[d] += sc * f / (f + k1 * (kb + bavg * doc_len[d]))
        return _take_top(acc, cand, nc, k, hs, hi)
    return _take_top(acc, touched, n_t, k, hs, hi)
