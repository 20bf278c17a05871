"""The numba kernels of ``bm25_kernel`` (see its docstring for what each one does).

Kept at module level, apart from the loader: numba caches compiled machine code on disk
(``cache=True``) only for module-level functions, so the kernels compile once per
machine, not on every process start. Importing this module needs numba; nothing is
compiled until a kernel is first called.
"""

import numpy as np
from numba import njit

# Postings per block of the block-max bounds (``BM25Index._bmax``; the same constant there).
_BLOCK = 128
# Relative slack on upper bounds when pruning: float sums of a few terms are exact to
# ~1e-15 relative, so 1e-9 never drops a document that could tie or beat theta.
_SLACK = 1e-9


@njit(cache=True, nogil=True, inline="always")
def _worse(sa, ia, sb, ib):
    # a ranks below b: lower score, or the same score and a larger doc position.
    return sa < sb or (sa == sb and ia > ib)


@njit(cache=True, nogil=True)
def _sift_down(hs, hi, pos, n):
    # Min-heap on rank: the root is the worst of the kept top-k.
    while True:
        left = 2 * pos + 1
        if left >= n:
            return
        c = left
        right = left + 1
        if right < n and _worse(hs[right], hi[right], hs[left], hi[left]):
            c = right
        if _worse(hs[c], hi[c], hs[pos], hi[pos]):
            hs[pos], hs[c] = hs[c], hs[pos]
            hi[pos], hi[c] = hi[c], hi[pos]
            pos = c
        else:
            return


@njit(cache=True, nogil=True)
def _push(hs, hi, n, kk, sc, d):
    """Offer (sc, d) to a heap of n <= kk entries; returns the new size."""
    if n < kk:
        pos = n
        hs[pos] = sc
        hi[pos] = d
        n += 1
        while pos > 0:
            parent = (pos - 1) // 2
            if _worse(hs[pos], hi[pos], hs[parent], hi[parent]):
                hs[pos], hs[parent] = hs[parent], hs[pos]
                hi[pos], hi[parent] = hi[parent], hi[pos]
                pos = parent
            else:
                break
    elif _worse(hs[0], hi[0], sc, d):
        hs[0] = sc
        hi[0] = d
        _sift_down(hs, hi, 0, n)
    return n


@njit(cache=True, nogil=True)
def _drain(hs, hi, n):
    """Heap -> (ids, scores) best-first."""
    out_s = np.empty(n, np.float64)
    out_i = np.empty(n, np.int64)
    m = n
    while m > 0:
        out_s[m - 1] = hs[0]
        out_i[m - 1] = hi[0]
        m -= 1
        hs[0] = hs[m]
        hi[0] = hi[m]
        _sift_down(hs, hi, 0, m)
    return out_i, out_s


@njit(cache=True, nogil=True)
def _kth_score(acc, touched, n_t, k, hs, hi):
    """The k-th best accumulated score among the touched docs (n_t >= k)."""
    n = 0
    for x in range(n_t):
        d = touched[x]
        v = acc[d]
        if n < k or v >= hs[0]:  # most are below the root: one compare, no call
            n = _push(hs, hi, n, k, v, d)
    return hs[0]


@njit(cache=True, nogil=True)
def _prune(acc, src, n, bound, theta, dst):
    """Keep the docs of src[:n] whose partial score + bound can still reach theta, in
    order, into dst (which may be src); zero the others' acc. Returns how many were kept."""
    m = 0
    for x in range(n):
        d = src[x]
        if acc[d] + bound >= theta:
            dst[m] = d
            m += 1
        else:
            acc[d] = 0.0
    return m


@njit(cache=True, nogil=True)
def _take_top(acc, docs, n, k, hs, hi):
    """Top-k of docs[:n] by (acc desc, position asc), zeroing their acc: the end of a query."""
    kk = min(k, n)
    c = 0
    for x in range(n):
        d = docs[x]
        sc = acc[d]
        acc[d] = 0.0
        if sc > 0.0 and (c < kk or sc >= hs[0]):
            c = _push(hs, hi, c, kk, sc, d)
    return _drain(hs, hi, c)


@njit(cache=True, nogil=True, inline="always")
def _gallop(post, lo, hi_, d):
    """First position p in post[lo:hi_] with post[p] >= d (exponential, then binary)."""
    step = 1
    p = lo
    while p < hi_ and post[p] < d:
        lo = p + 1
        p = lo + step
        step *= 2
    if p > hi_:
        p = hi_
    # post[lo-1] < d (or lo is the start); answer is in [lo, p]
    while lo < p:
        mid = (lo + p) // 2
        if post[mid] < d:
            lo = mid + 1
        else:
            p = mid
    return lo


@njit(cache=True, nogil=True)
def _distinct(qtids):
    """(distinct term ids in first-seen order, how often each occurs, the query position
    of each one's first occurrence). Queries are short: a linear scan beats hashing."""
    m = qtids.shape[0]
    ut = np.empty(m, np.int64)
    mult = np.zeros(m, np.float64)
    first = np.empty(m, np.int64)
    nu = 0
    for x in range(m):
        t = qtids[x]
        found = -1
        for y in range(nu):
            if ut[y] == t:
                found = y
                break
        if found < 0:
            ut[nu] = t
            mult[nu] = 1.0
            first[nu] = x
            nu += 1
        else:
            mult[found] += 1.0
    return ut[:nu], mult[:nu], first[:nu]


@njit(cache=True, nogil=True)
def _unique_terms(qtids, idf, wmax, k1p1):
    """Distinct query terms (repeats multiply the scale), by descending upper bound."""
    ut, mult, _first = _distinct(qtids)
    nu = ut.shape[0]
    scale = np.empty(nu, np.float64)
    ub = np.empty(nu, np.float64)
    for y in range(nu):
        scale[y] = idf[ut[y]] * k1p1 * mult[y]
        ub[y] = scale[y] * wmax[ut[y]]
    order = np.argsort(-ub, kind="mergesort")
    return ut[order], scale[order], ub[order]


@njit(cache=True, nogil=True)
def _exhaustive(indptr, indices, w, idf, qtids, k1p1, k, acc):
    """Every posting scattered into the corpus-sized acc, then one ordered pass over acc.

    For a query whose postings cover much of a small corpus this is the cheapest exact
    route: no touched-list bookkeeping, no pruning checks, and the selection pass reads
    acc sequentially (zeroing it as it goes). Scanning docs in position order, a doc
    enters a full heap only with a strictly greater score (ties go to the lower position).
    """
    for j in range(qtids.shape[0]):  # per query token, in query order (as the reference)
        t = qtids[j]
        s = idf[t] * k1p1
        for p in range(indptr[t], indptr[t + 1]):
            acc[indices[p]] += w[p] * s
    kk = max(k, 1)
    hs = np.empty(kk, np.float64)
    hi = np.empty(kk, np.int64)
    n = 0
    thr = 0.0  # heap not yet full: any positive score enters
    for d in range(acc.shape[0]):
        v = acc[d]
        acc[d] = 0.0
        if v > thr:
            n = _push(hs, hi, n, kk, v, d)
            if n == kk:
                thr = hs[0]
    return _drain(hs, hi, n)


@njit(cache=True, nogil=True)
def search_one(indptr, indices, w, idf, wmax, qtids, k1p1, k, acc, touched, exhaustive_docs, bptr, bmax):
    """Exact unfiltered top-k (see the module docstring).

    On a corpus of at most ``exhaustive_docs`` documents, when the query's postings
    number at least a quarter of the corpus, every posting is scored (``_exhaustive``);
    otherwise term-at-a-time MaxScore. acc must be all zeros on entry and is all zeros
    again on return.
    """
    n_docs = acc.shape[0]
    if n_docs <= exhaustive_docs:
        total = 0
        longest = 0
        for j in range(qtids.shape[0]):
            df = indptr[qtids[j] + 1] - indptr[qtids[j]]
            total += df
            longest = max(longest, df)
        # Broad query (postings >= a quarter of the corpus) and no single list holding
        # half of them (that one MaxScore would mostly skip): score everything.
        if 4 * total >= n_docs and 2 * longest < total:
            return _exhaustive(indptr, indices, w, idf, qtids, k1p1, k, acc)
    ut, scale, ub = _unique_terms(qtids, idf, wmax, k1p1)
    nu = ut.shape[0]
    remaining = np.zeros(nu + 1, np.float64)  # remaining[j] = sum ub[j:]
    for j in range(nu - 1, -1, -1):
        remaining[j] = remaining[j + 1] + ub[j]
    hs = np.empty(max(k, 1), np.float64)
    hi = np.empty(max(k, 1), np.int64)
    n_t = 0
    j = 0
    theta = -1.0
    top1 = 0.0  # best partial so far: theta <= top1, a free necessary test
    if nu > 0 and k > 0:
        # The first (highest-bound) term, block by block. acc is still empty, so a doc's
        # final score is at most its block's max w x scale + the other terms' bounds;
        # once k docs are seen, a block whose bound is below the k-th best so far cannot
        # hold a top-k doc and is skipped whole (its docs may still be touched by later
        # terms: their partial then lacks this term, and stays below a true top-k score).
        t = ut[0]
        s = scale[0]
        rest = remaining[1] * (1.0 + _SLACK)
        s0 = indptr[t]
        e0 = indptr[t + 1]
        b = bptr[t]
        nh = 0
        for p0 in range(s0, e0, _BLOCK):
            if nh == k and bmax[b] * s * (1.0 + _SLACK) + rest < hs[0]:
                b += 1
                continue
            b += 1
            for p in range(p0, min(p0 + _BLOCK, e0)):
                d = indices[p]
                v = w[p] * s
                touched[n_t] = d
                n_t += 1
                acc[d] = v
                if v > top1:
                    top1 = v
                if nh < k or v > hs[0]:
                    nh = _push(hs, hi, nh, k, v, d)
        j = 1
    while j < nu:
        t = ut[j]
        s0 = indptr[t]
        e0 = indptr[t + 1]
        if j > 0 and n_t >= k and remaining[j] * (1.0 + _SLACK) < top1 and 8 * (e0 - s0) >= n_t:
            # Checking costs about n_t; only do it before a list at least that long.
            theta = _kth_score(acc, touched, n_t, k, hs, hi)
            if remaining[j] * (1.0 + _SLACK) < theta:
                break
        s = scale[j]
        for p in range(s0, e0):
            d = indices[p]
            v = acc[d]
            if v == 0.0:
                touched[n_t] = d
                n_t += 1
            v += w[p] * s
            acc[d] = v
            if v > top1:
                top1 = v
        j += 1
    if j == nu:
        return _take_top(acc, touched, n_t, k, hs, hi)
    # Lookup phase. Candidates keep their partial score in acc (everyone else is
    # zeroed); after each remaining term, theta is re-taken and candidates that can
    # no longer reach it are dropped, so later (longer, lower-bound) lists see few.
    cand = np.empty(n_t, np.int64)
    nc = _prune(acc, touched, n_t, remaining[j] * (1.0 + _SLACK), theta, cand)
    is_sorted = False  # galloping needs sorted candidates; sort only when it is chosen
    for jj in range(j, nu):
        t = ut[jj]
        s = scale[jj]
        lo = indptr[t]
        e0 = indptr[t + 1]
        df = e0 - lo
        if nc * (4 + 2 * np.log2(df / max(nc, 1) + 1.0)) < df:
            if not is_sorted:
                cand[:nc] = np.sort(cand[:nc])
                is_sorted = True
            for x in range(nc):
                if lo >= e0:
                    break
                d = cand[x]
                lo = _gallop(indices, lo, e0, d)
                if lo < e0 and indices[lo] == d:
                    acc[d] += w[lo] * s
        else:
            for p in range(lo, e0):
                d = indices[p]
                if acc[d] != 0.0:
                    acc[d] += w[p] * s
        if jj + 1 < nu and nc > k:
            theta = _kth_score(acc, cand, nc, k, hs, hi)
            nc = _prune(acc, cand, nc, remaining[jj + 1] * (1.0 + _SLACK), theta, cand)
    return _take_top(acc, cand, nc, k, hs, hi)


@njit(cache=True, nogil=True)
def search_batch(indptr, indices, w, idf, wmax, q_flat, q_ptr, k1p1, k, n_docs, exhaustive_docs, bptr, bmax):
    """Top-k of queries q_ptr[i]:q_ptr[i+1] of q_flat, serially and without the GIL
    (callers run chunks on threads): (ids[nq, k] padded with -1, scores[nq, k], counts).

    numba's ``parallel=True`` was measured here and not used: its OpenMP/TBB pools
    busy-wait at barriers, which on a shared 2-core machine cost 20-50 ms per call.
    """
    nq = q_ptr.shape[0] - 1
    out_i = np.full((nq, k), -1, np.int64)
    out_s = np.zeros((nq, k), np.float64)
    out_n = np.zeros(nq, np.int64)
    acc = np.zeros(max(n_docs, 1), np.float64)
    touched = np.empty(max(n_docs, 1), np.int32)
    for q in range(nq):
        q_t = q_flat[q_ptr[q] : q_ptr[q + 1]]
        m = 0
        for x in range(q_t.shape[0]):  # tokens outside the vocabulary arrive as -1
            if q_t[x] >= 0:
                m += 1
        if m == 0:
            continue
        if m < q_t.shape[0]:
            kept = np.empty(m, np.int64)
            m = 0
            for x in range(q_t.shape[0]):
                if q_t[x] >= 0:
                    kept[m] = q_t[x]
                    m += 1
            q_t = kept
        ids, sc = search_one(indptr, indices, w, idf, wmax, q_t, k1p1, k, acc, touched, exhaustive_docs, bptr, bmax)
        n = ids.shape[0]
        out_n[q] = n
        out_i[q, :n] = ids
        out_s[q, :n] = sc
    return out_i, out_s, out_n


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
