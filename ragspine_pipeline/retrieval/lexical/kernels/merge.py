"""The compiled loops of an incremental BM25 merge (``refresh.merge_kernels`` says what each
does; its numpy versions are the oracle).

Why numba: a merge walks every posting of the previous index once (50M at 1M synthetic
chunks); per posting it is a map lookup and a compare, which numpy can only do by sorting.
The packed loop unpacks a term's blocks with the query kernels' own decoder
(``kernels.packed._unpack``), so it reads exactly the bits a query reads.
"""

import numpy as np
from numba import njit

from ..format.raw import BLOCK_SIZE
from .packed import _count, _unpack

_FAR = np.int64(1) << 62


@njit(cache=True, nogil=True, inline="always")
def _merge_run(docs, tfs, n, old_new, c, j, je, n_indices, n_tf, new_pos, out_idx, out_tf, p):
    """The next ``n`` old postings of a term (``docs``/``tfs``, ascending) into the output,
    each kept one after the new postings placed before it; ``c`` is the position of new
    posting j (``_FAR`` past je). Returns (p, j, c), or p = -1 at an old position outside
    the previous index (a damaged file: never an out-of-bounds read).

    Why this shape: a kept old posting costs one lookup and one compare against the cached
    next new position; most lists gain no new posting between two old ones."""
    nd = old_new.shape[0]
    for x in range(n):
        d = docs[x]
        if d < 0 or d >= nd:
            return -1, j, c
        m = np.int64(old_new[d])
        if m < 0:
            continue
        while c < m:
            out_idx[p] = c
            out_tf[p] = n_tf[j]
            p += 1
            j += 1
            c = np.int64(new_pos[n_indices[j]]) if j < je else _FAR
        out_idx[p] = m
        out_tf[p] = tfs[x]
        p += 1
    return p, j, c


@njit(cache=True, nogil=True, inline="always")
def _rest(j, je, n_indices, n_tf, new_pos, out_idx, out_tf, p):
    """New postings j..je-1 after the term's last old one."""
    while j < je:
        out_idx[p] = new_pos[n_indices[j]]
        out_tf[p] = n_tf[j]
        p += 1
        j += 1
    return p


@njit(cache=True, nogil=True)
def merge_plain(indptr, indices, tf, t0, t1, old_new, lut, n_indptr, n_indices, n_tf, new_pos, out_indptr,
                out_idx, out_tf, p):
    """Terms t0..t1-1 of a plain index merged with the new postings; returns the new ``p`` (-1: damaged)."""
    for t in range(t0, t1):
        s = indptr[t]
        nt = lut[t]
        j = n_indptr[nt] if nt >= 0 else 0
        je = n_indptr[nt + 1] if nt >= 0 else 0
        c = np.int64(new_pos[n_indices[j]]) if j < je else _FAR
        p, j, c = _merge_run(indices[s:], tf[s:], indptr[t + 1] - s, old_new, c, j, je, n_indices, n_tf, new_pos,
                             out_idx, out_tf, p)
        if p < 0:
            return p
        p = _rest(j, je, n_indices, n_tf, new_pos, out_idx, out_tf, p)
        out_indptr[t + 1] = p
    return p


@njit(cache=True, nogil=True)
def merge_packed(pk, t0, t1, old_new, lut, n_indptr, n_indices, n_tf, new_pos, out_indptr, out_idx, out_tf, p):
    """Terms t0..t1-1 of a packed index (``pk``) merged with the new postings, a block at a
    time as it is unpacked; returns the new ``p`` (-1: damaged)."""
    bptr = pk[1]
    docs = np.empty(BLOCK_SIZE, np.int64)
    tfs = np.empty(BLOCK_SIZE, np.int64)
    for t in range(t0, t1):
        nt = lut[t]
        j = n_indptr[nt] if nt >= 0 else 0
        je = n_indptr[nt + 1] if nt >= 0 else 0
        c = np.int64(new_pos[n_indices[j]]) if j < je else _FAR
        for blk in range(np.int64(bptr[t]), np.int64(bptr[t + 1])):
            n = _count(pk, t, blk)
            _unpack(pk[7], pk[3], pk[4], pk[5], pk[2], blk, blk == np.int64(bptr[t]), n, docs, tfs)
            p, j, c = _merge_run(docs, tfs, n, old_new, c, j, je, n_indices, n_tf, new_pos, out_idx, out_tf, p)
            if p < 0:
                return p
        p = _rest(j, je, n_indices, n_tf, new_pos, out_idx, out_tf, p)
        out_indptr[t + 1] = p
    return p


@njit(cache=True, nogil=True, inline="always")
def _cmp(ao, ab, i, bo, bb, j):
    """-1, 0 or 1 as byte string i of (ao, ab) sorts before, equal to or after string j of (bo, bb)."""
    a0 = ao[i]
    b0 = bo[j]
    la = ao[i + 1] - a0
    lb = bo[j + 1] - b0
    for x in range(min(la, lb)):
        u = ab[a0 + x]
        v = bb[b0 + x]
        if u != v:
            return -1 if u < v else 1
    return -1 if la < lb else (1 if la > lb else 0)


@njit(cache=True, nogil=True)
def sorted_join(ao, ab, bo, bb, out):
    """out[i] = the position of string i of a in b, or -1, for two lists of byte strings
    each strictly ascending; False (out unspecified) as soon as either is not, so the caller
    falls back to a hash look-up. One linear walk: ~0.1 s for 10M ids, where a hash
    look-up takes 1.5-2.5 s."""
    na = ao.shape[0] - 1
    nb = bo.shape[0] - 1
    for i in range(1, na):
        if _cmp(ao, ab, i - 1, ao, ab, i) >= 0:
            return False
    for j in range(1, nb):
        if _cmp(bo, bb, j - 1, bo, bb, j) >= 0:
            return False
    j = 0
    for i in range(na):
        out[i] = -1
        while j < nb:
            c = _cmp(ao, ab, i, bo, bb, j)
            if c == 0:
                out[i] = j
                j += 1
                break
            if c < 0:
                break
            j += 1
    return True
