"""numba kernels over packed postings (``index.packed``): exact top-k and filtered (batches: ``kernels.packed_route``).

The same algorithms as the plain layout's kernels (``kernels.plain_unfiltered`` /
``kernels.plain_filtered``, whose docstrings explain them), with each posting list read block
by block: a block's gaps and tfs are unpacked into two 128-entry buffers and ``w`` is
recomputed from the document length with the build's operations (``_w``), so each
addition into the accumulator is the plain kernel's, in the same order, and the answers
are identical. What packing changes is how a list is skipped: the lookup phase (a few
candidates against a long list) walks the blocks' last doc ids and unpacks only the
blocks that hold a candidate, whichever of the plain kernel's two lookup routes it would
have taken (both add the same terms to the same candidates).

Arrays are passed as ``pk``: the tuple ((bptr, last_count), bptr, blk_last, blk_off,
blk_dbits, blk_tbits, blk_bmax, data, length of each code, blk_maxtf, blk_minlen, bit-set
terms, bits, doc length codes) of ``PackedBM25Index._pk``; ``idf`` as ``weight.stored_idf``
reads it, ``wmax`` as ``weight.term_wmax``. Without length codes the codes are the lengths
themselves and slot 8 holds them too. The bit-set terms are sorted (``bit_row_of``: a
term's row of ``bits``). The per-term and per-block arrays are the narrowed ones
(``index.packed_narrow``): uint32 block pointers and offsets (cast to int64 where they are
loaded: numba turns uint arithmetic into uint64, which mixed with int64 gives floats), df
from slot 0 (``weight.term_df``), the bounds decoded by ``weight.blk_bmax`` /
``blk_maxtf`` / ``blk_minlen`` (slot 10 is (codes, length of each code) with codes).
"""

import numpy as np
from numba import njit

from ..format.raw import BLOCK_SIZE
from .filter_stats import popcount64
from .plain_unfiltered import _by_bound
from .selection import (
    _SLACK,
    _broad,
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
    BMAX_STEP,
    MAXTF_SAT,
    blk_bmax,
    blk_minlen,
    filtered_part,
    stored_idf,
    term_df,
    term_scale,
)
from .weight import plain_w as _w

_BLOCK = BLOCK_SIZE
_ONE = np.uint64(1)


@njit(cache=True, nogil=True, inline="always")
def _run(data, wi, width, n, out, start, chain):
    """n fields of ``width`` bits from word wi into out[:n]: with ``chain``, doc positions
    (each field a gap - 1 after ``start``), else tfs (each field tf - 1).

    Fields are read through a 64-bit buffer refilled a word at a time (a field of at most
    32 bits always fits once the buffer holds fewer bits than it): one load per word, one
    shift and mask per field."""
    mask = (_ONE << np.uint64(width)) - _ONE
    buf = np.uint64(0)
    have = 0
    v = start
    for i in range(n):
        if have < width:
            buf |= np.uint64(data[wi]) << np.uint64(have)
            wi += 1
            have += 32
        x = np.int64(buf & mask) + 1
        buf >>= np.uint64(width)
        have -= width
        v = v + x if chain else x
        out[i] = v


@njit(cache=True, nogil=True, inline="always")
def _unpack(data, off, dbits, tbits, last, blk, first, n, docs, tfs):
    """Block ``blk`` (n postings; ``first``: whether it opens its term) into docs/tfs[:n].

    The arrays come one by one (pk[7], pk[3], pk[4], pk[5], pk[2]), not as the ``pk``
    tuple: measured, reading them through the tuple inside the loop was ~9x slower."""
    dw = np.int64(dbits[blk])
    tw = np.int64(tbits[blk])
    d = np.int64(-1) if first else np.int64(last[blk - 1])
    if dw == 0:
        for i in range(n):
            d += 1
            docs[i] = d
    else:
        _run(data, np.int64(off[blk]), dw, n, docs, d, True)
    if tw == 0:
        for i in range(n):
            tfs[i] = 1
    else:
        _run(data, np.int64(off[blk]) + ((n * dw + 31) >> 5), tw, n, tfs, np.int64(0), False)


@njit(cache=True, nogil=True, inline="always")
def bit_row_of(terms, t):
    """Term t's row of the bit sets, or -1: its index in the sorted bit-set terms
    (``pk[11]``: a few dozen at most, searched once per query term, never per posting)."""
    i = np.searchsorted(terms, t)
    return np.int64(i) if i < terms.shape[0] and terms[i] == t else np.int64(-1)


@njit(cache=True, nogil=True)
def _unique_terms(qtids, idf, indptr, wmax, k1p1):
    """``kernels.plain_unfiltered._unique_terms`` for a packed file's idf (``stored_idf``)."""
    ut, mult, _first = _distinct(qtids)
    ut_idf = np.empty(ut.shape[0], np.float64)
    for y in range(ut.shape[0]):
        ut_idf[y] = stored_idf(idf, indptr, ut[y])
    return _by_bound(ut, mult, ut_idf, wmax, k1p1)


@njit(cache=True, nogil=True, inline="always")
def _count(pk, t, blk):
    """Postings in block ``blk`` of term t."""
    return _BLOCK if blk + 1 < np.int64(pk[1][t + 1]) else np.int64(pk[0][1][t])


@njit(cache=True, nogil=True, inline="always")
def _match_block(data, off, dbits, tbits, last, blk, first, n, keys, x, nk, hit_key, hit_tf):
    """Which of the sorted keys[x:] up to the block's last doc the block holds: their
    indices into hit_key and tfs into hit_tf. Gaps are unpacked only as far as the last
    key needs, a tf only for a hit (read directly at its index). Returns (next x, hits)."""
    dw = np.int64(dbits[blk])
    tw = np.int64(tbits[blk])
    d = np.int64(-1) if first else np.int64(last[blk - 1])
    wi = np.int64(off[blk])
    tf_bit = (wi + ((n * dw + 31) >> 5)) * 32
    dmask = (_ONE << np.uint64(dw)) - _ONE
    tmask = (_ONE << np.uint64(tw)) - _ONE
    buf = np.uint64(0)
    have = 0
    i = -1
    m = 0
    bl = last[blk]
    while x < nk and keys[x] <= bl:
        key = keys[x]
        if dw == 0:  # consecutive documents: the key's index is its distance
            if d < key:
                i += key - d
                d = key
        elif dw == 1:
            # One bit per gap: a whole unread word of 32 gaps moves d by 32 plus its set
            # bits (a popcount), so words wholly before the key are passed undecoded. The
            # last word may be part padding (zero bits), which only overstates where it
            # ends: it is never passed, the key being at most the block's last doc.
            while have == 0:
                step = 32 + popcount64(np.uint64(data[wi]))
                if d + step >= key:
                    break
                d += step
                i += 32
                wi += 1
        while d < key:
            i += 1
            if dw == 0:
                d += 1
            else:
                if have < dw:
                    buf |= np.uint64(data[wi]) << np.uint64(have)
                    wi += 1
                    have += 32
                d += np.int64(buf & dmask) + 1
                buf >>= np.uint64(dw)
                have -= dw
        if d == key:
            f = 1
            if tw > 0:
                pos = tf_bit + i * tw
                both = np.uint64(data[pos >> 5]) | (np.uint64(data[(pos >> 5) + 1]) << np.uint64(32))
                f = np.int64((both >> np.uint64(pos & 31)) & tmask) + 1
            hit_key[m] = x
            hit_tf[m] = f
            m += 1
        x += 1
    return x, m


@njit(cache=True, nogil=True, inline="always")
def _skipped_block(pk, t, last, b0, blk, before, x, n_before, docs, tfs):
    """Look up the sorted documents ``before`` (touched by earlier terms) in skipped block
    ``blk`` of term t, from cursor x: (new x, hits m), hit h being ``before[docs[h]]`` with
    term frequency ``tfs[h]``. A term scan that skipped blocks calls this once per skipped
    block, then adds each hit's weight by its own formula."""
    lo = last[blk - 1] if blk > b0 else -1
    while x < n_before and before[x] <= lo:
        x += 1
    return _match_block(pk[7], pk[3], pk[4], pk[5], last, blk, blk == b0, _count(pk, t, blk), before, x, n_before,
                        docs, tfs)


@njit(cache=True, nogil=True)
def _lookup(pk, t, cand, nc, acc, s, wt, k1, docs, tfs, kb, bavg, doc_len):
    """Term t's contribution added to the sorted candidates cand[:nc] that it holds,
    reading only the blocks that hold a candidate (``_match_block``; docs/tfs are its
    scratch). ``bavg`` > 0: the filtered formula (survivor avgdl: ``s`` x tf / (tf + k1
    (kb + bavg len)), ``doc_len`` the lengths by document), else ``w x s``."""
    blk = np.int64(pk[1][t])
    end = np.int64(pk[1][t + 1])
    last = pk[2]
    x = 0
    while x < nc and blk < end:
        if last[blk] < cand[x]:
            blk = _gallop(last, blk, end, cand[x])
            continue
        n = _count(pk, t, blk)
        x, m = _match_block(pk[7], pk[3], pk[4], pk[5], last, blk, blk == np.int64(pk[1][t]), n, cand, x, nc, docs, tfs)
        for h in range(m):
            d = cand[docs[h]]
            if bavg > 0.0:
                f = np.float64(tfs[h])
                acc[d] += filtered_part(s, f, k1, kb, bavg, doc_len[d])
            else:
                acc[d] += _w(tfs[h], pk[13][d], wt) * s
        blk += 1


@njit(cache=True, nogil=True)
def _exhaustive(pk, idf, qtids, k1p1, k, acc, wt):
    """Every posting scattered into acc in query-token order, then one ordered pass
    (``kernels.plain_unfiltered._exhaustive``)."""
    docs = np.empty(_BLOCK, np.int64)
    tfs = np.empty(_BLOCK, np.int64)
    dcode = pk[13]
    for j in range(qtids.shape[0]):
        t = qtids[j]
        s = term_scale(stored_idf(idf, pk[0], t), k1p1, 1.0)
        for blk in range(np.int64(pk[1][t]), np.int64(pk[1][t + 1])):
            n = _count(pk, t, blk)
            _unpack(pk[7], pk[3], pk[4], pk[5], pk[2], blk, blk == np.int64(pk[1][t]), n, docs, tfs)
            for i in range(n):
                d = docs[i]
                acc[d] += _w(tfs[i], dcode[d], wt) * s
    kk = max(k, 1)
    every = np.arange(acc.shape[0])
    return _take_top(acc, every, every.shape[0], kk, np.empty(kk, np.float64), np.empty(kk, np.int64))


@njit(cache=True, nogil=True)
def _scan(pk, t, acc, touched, n_t, top1, s, rest, skip, k, hs, hi, wt, docs, tfs):
    """acc[d] += w x s over term t's postings; returns (n_t, top1).

    With ``skip``, block by block with a heap of the k best documents of this scan
    (distinct; partial scores, so lower bounds of their final ones): a block whose max w
    x s plus ``rest`` (the later terms' bounds) is below the k-th of them cannot bring in
    a document not touched yet and is skipped; documents touched before the scan that lie
    in skipped blocks then get the term from those blocks alone, so every document still
    sums its terms in term order. A document left without a term's part never reaches the
    top k (its whole score is below k documents' partial scores)."""
    dcode = pk[13]
    last = pk[2]
    b0 = np.int64(pk[1][t])
    b1 = np.int64(pk[1][t + 1])
    n_before = n_t
    skipped = np.empty(b1 - b0 if skip and n_before > 0 else 0, np.int64)
    nsk = 0
    nh = 0
    for blk in range(b0, b1):
        if skip and nh == k and blk_bmax(pk[6], blk) * s * (1.0 + _SLACK) + rest < hs[0]:
            if n_before > 0:
                skipped[nsk] = blk
                nsk += 1
            continue
        n = _count(pk, t, blk)
        _unpack(pk[7], pk[3], pk[4], pk[5], last, blk, blk == b0, n, docs, tfs)
        for i in range(n):
            d = docs[i]
            v = acc[d]
            if v == 0.0:
                touched[n_t] = d
                n_t += 1
            v += _w(tfs[i], dcode[d], wt) * s
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
                acc[d] += _w(tfs[h], dcode[d], wt) * s
    return n_t, top1


@njit(cache=True, nogil=True)
def search_one(pk, idf, wmax, qtids, wt, k, acc, touched, exhaustive_docs):
    """Exact unfiltered top-k over packed postings (``kernels.plain_unfiltered.search_one``).
    acc must be all zeros on entry and is all zeros again on return."""
    indptr = pk[0]
    k1p1 = wt[2] + 1.0
    n_docs = acc.shape[0]
    if n_docs <= exhaustive_docs and _broad(indptr, qtids, n_docs):
        return _exhaustive(pk, idf, qtids, k1p1, k, acc, wt)
    docs = np.empty(_BLOCK, np.int64)
    tfs = np.empty(_BLOCK, np.int64)
    ut, scale, ub = _unique_terms(qtids, idf, indptr, wmax, k1p1)
    nu = ut.shape[0]
    remaining = _suffix_sums(ub)
    hs = np.empty(max(k, 1), np.float64)
    hi = np.empty(max(k, 1), np.int64)
    n_t = 0
    j = 0
    theta = -1.0
    top1 = 0.0
    while j < nu:
        t = ut[j]
        df = term_df(indptr, t)
        if j > 0 and n_t >= k and remaining[j] * (1.0 + _SLACK) < top1 and 8 * df >= n_t:
            theta = _kth_score(acc, touched, n_t, k, hs, hi)
            if remaining[j] * (1.0 + _SLACK) < theta:
                break
        # Block skipping needs the documents touched before, sorted: only when they are
        # few against the list (always for the first term, as the plain kernel does).
        n_t, top1 = _scan(pk, t, acc, touched, n_t, top1, scale[j], remaining[j + 1] * (1.0 + _SLACK),
                          8 * n_t < df, k, hs, hi, wt, docs, tfs)
        j += 1
    if j == nu:
        return _take_top(acc, touched, n_t, k, hs, hi)
    cand = np.empty(n_t, np.int64)
    nc = _prune(acc, touched, n_t, remaining[j] * (1.0 + _SLACK), theta, cand)
    cand[:nc] = np.sort(cand[:nc])  # _prune keeps order, so the candidates stay sorted
    for jj in range(j, nu):
        _lookup(pk, ut[jj], cand, nc, acc, scale[jj], wt, 0.0, docs, tfs, 0.0, 0.0, pk[13])
        if jj + 1 < nu and nc > k:
            nc = _narrow(acc, cand, nc, k, remaining[jj + 1] * (1.0 + _SLACK), hs, hi)
    return _take_top(acc, cand, nc, k, hs, hi)


@njit(cache=True, nogil=True)
def decode_term(pk, t):
    """(doc positions, tf) of term t, unpacked (verification and tests)."""
    df = term_df(pk[0], t)
    out_d = np.empty(df, np.int64)
    out_f = np.empty(df, np.int64)
    docs = np.empty(_BLOCK, np.int64)
    tfs = np.empty(_BLOCK, np.int64)
    p = 0
    for blk in range(np.int64(pk[1][t]), np.int64(pk[1][t + 1])):
        n = _count(pk, t, blk)
        _unpack(pk[7], pk[3], pk[4], pk[5], pk[2], blk, blk == np.int64(pk[1][t]), n, docs, tfs)
        out_d[p:p + n] = docs[:n]
        out_f[p:p + n] = tfs[:n]
        p += n
    return out_d, out_f


@njit(cache=True, nogil=True, inline="always")
def _bits_of(x):
    """Bits needed for a non-negative integer (0 for 0)."""
    n = 0
    while x > 0:
        x >>= 1
        n += 1
    return n


@njit(cache=True, nogil=True, inline="always")
def _put(out, w, buf, have, value, width):
    """Append a field to the bit buffer, flushing whole words to out[w]; (w, buf, have)."""
    buf |= np.uint64(value) << np.uint64(have)
    have += width
    if have >= 32:
        out[w] = np.uint32(buf & np.uint64(0xFFFFFFFF))
        w += 1
        buf >>= np.uint64(32)
        have -= 32
    return w, buf, have


@njit(cache=True, nogil=True)
def encode_slice(docs, tfs, norm, doc_len, count, first, prev0, out, blocks, base):
    """Pack consecutive blocks (``count`` postings each; ``first``: the block opens its term;
    ``prev0``: the doc before the slice's first posting) into ``out`` (uint32 words), filling
    ``blocks`` = (blk_off, blk_last, blk_dbits, blk_tbits, blk_bmax, blk_maxtf, blk_minlen)
    for them, offsets from ``base``. Returns the words written, or -1 when doc positions do
    not ascend within a term. The block max w is ``tf / (norm + tf)``, as the plain layout."""
    off, last, dbits, tbits, bmax, maxtf, minlen = blocks
    p = 0
    w = 0
    for j in range(count.shape[0]):
        n = count[j]
        prev = np.int64(-1) if first[j] else (np.int64(prev0) if j == 0 else np.int64(docs[p - 1]))
        mg = 0
        mt = 0
        ml = np.int64(0xFFFFFFFF)
        bm = 0.0
        pv = prev
        for i in range(p, p + n):
            d = np.int64(docs[i])
            g = d - pv - 1
            if g < 0:
                return -1
            pv = d
            mg = max(mg, g)
            f = np.int64(tfs[i])
            mt = max(mt, f)
            ml = min(ml, np.int64(doc_len[d]))
            ff = np.float64(f)
            bm = max(bm, ff / (norm[d] + ff))
        dw = _bits_of(mg)
        tw = _bits_of(mt - 1)
        off[j] = base + w
        last[j] = pv
        dbits[j] = dw
        tbits[j] = tw
        bmax[j] = bm
        maxtf[j] = mt
        minlen[j] = ml
        for width, gaps in ((dw, True), (tw, False)):
            if width == 0:
                continue
            buf = np.uint64(0)
            have = 0
            pv = prev
            for i in range(p, p + n):
                if gaps:
                    v = np.int64(docs[i]) - pv - 1
                    pv = np.int64(docs[i])
                else:
                    v = np.int64(tfs[i]) - 1
                w, buf, have = _put(out, w, buf, have, v, width)
            if have > 0:
                out[w] = np.uint32(buf & np.uint64(0xFFFFFFFF))
                w += 1
        p += n
    return w


@njit(cache=True, nogil=True)
def check_all(pk, n_docs, n_words, norm, doc_len):
    """The first block (in order) whose fields, offsets, positions, skip data or bounds are
    wrong, else -1: every block unpacked and its last doc, max tf, min length and max w
    recomputed (``norm`` and ``doc_len`` per document; the full check at publish). The
    stored bounds are the narrowed ones (``index.packed``): the max w must be the least
    uint16 q with q x BMAX_STEP >= it, the max tf saturate at MAXTF_SAT, the min length
    be the stored one (through its code when the file has codes)."""
    bptr, last, off, dbits, tbits, bmax = pk[1], pk[2], pk[3], pk[4], pk[5], pk[6]
    maxtf, blk_len = pk[9], pk[10]
    docs = np.empty(_BLOCK, np.int64)
    tfs = np.empty(_BLOCK, np.int64)
    for t in range(bptr.shape[0] - 1):
        for blk in range(np.int64(bptr[t]), np.int64(bptr[t + 1])):
            n = _count(pk, t, blk)
            dw = np.int64(dbits[blk])
            tw = np.int64(tbits[blk])
            size = ((n * dw + 31) >> 5) + ((n * tw + 31) >> 5)
            o0 = np.int64(off[blk])
            o1 = np.int64(off[blk + 1])
            if n < 1 or n > _BLOCK or dw > 32 or tw > 32 or o1 - o0 != size or o1 > n_words - 2:
                return blk
            _unpack(pk[7], off, dbits, tbits, last, blk, blk == np.int64(bptr[t]), n, docs, tfs)
            if docs[n - 1] >= n_docs or docs[n - 1] != last[blk]:
                return blk
            mt = 0
            ml = np.int64(0xFFFFFFFF)
            bm = 0.0
            for i in range(n):
                d = docs[i]
                mt = max(mt, tfs[i])
                ml = min(ml, np.int64(doc_len[d]))
                ff = np.float64(tfs[i])
                bm = max(bm, ff / (norm[d] + ff))
            q = np.int64(bmax[blk])
            if min(mt, MAXTF_SAT) != np.int64(maxtf[blk]) or ml != blk_minlen(blk_len, blk):
                return blk
            if np.float64(q) * BMAX_STEP < bm or (q > 0 and np.float64(q - 1) * BMAX_STEP >= bm):
                return blk
    return -1
