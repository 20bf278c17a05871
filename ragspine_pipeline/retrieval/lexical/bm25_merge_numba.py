"""The compiled loops of an incremental BM25 merge (``bm25_merge_kernels`` says what each
does; its numpy versions are the oracle).

Why numba: a merge walks every posting of the previous index once (50M at 1M synthetic
chunks); per posting it is a map lookup and a compare, which numpy can only do by sorting.
The packed loop unpacks a term's blocks with the query kernels' own decoder
(``bm25_packed_kernels._unpack``), so it reads exactly the bits a query reads.
"""

import numpy as np
from numba import njit

from .bm25_build import BLOCK_SIZE
from .bm25_packed_kernels import _count, _unpack

_FAR = np.int64(1) << 62


@njit(cache=True, nogil=True, inline="always")
def _merge_term(odocs, otfs, n_old, old_new, j, je, n_indices, n_tf, new_pos, out_idx, out_tf, p):
    """One term: its kept old postings (``odocs``/``otfs``[:n_old]) merged with new postings
    j..je (both ascending once mapped); returns the new ``p``, or -1 at an old position
    outside the previous index (a damaged file: never an out-of-bounds read)."""
    nd = old_new.shape[0]
    i = 0
    while True:
        while i < n_old and (odocs[i] < 0 or odocs[i] >= nd or old_new[odocs[i]] < 0):
            if odocs[i] < 0 or odocs[i] >= nd:
                return -1
            i += 1
        a = np.int64(old_new[odocs[i]]) if i < n_old else _FAR
        c = np.int64(new_pos[n_indices[j]]) if j < je else _FAR
        if a == _FAR and c == _FAR:
            return p
        if a < c:
            out_idx[p] = a
            out_tf[p] = otfs[i]
            i += 1
        else:
            out_idx[p] = c
            out_tf[p] = n_tf[j]
            j += 1
        p += 1


@njit(cache=True, nogil=True)
def merge_plain(indptr, indices, tf, t0, t1, old_new, lut, n_indptr, n_indices, n_tf, new_pos, out_indptr,
                out_idx, out_tf, p):
    """Terms t0..t1-1 of a plain index merged with the new postings; returns the new ``p``."""
    for t in range(t0, t1):
        s = indptr[t]
        e = indptr[t + 1]
        nt = lut[t]
        j = n_indptr[nt] if nt >= 0 else 0
        je = n_indptr[nt + 1] if nt >= 0 else 0
        p = _merge_term(indices[s:e], tf[s:e], e - s, old_new, j, je, n_indices, n_tf, new_pos, out_idx, out_tf, p)
        if p < 0:
            return p
        out_indptr[t + 1] = p
    return p


@njit(cache=True, nogil=True)
def merge_packed(pk, t0, t1, old_new, lut, n_indptr, n_indices, n_tf, new_pos, out_indptr, out_idx, out_tf, p,
                 sdocs, stfs):
    """Terms t0..t1-1 of a packed index (``pk``) merged with the new postings. Each term is
    unpacked block by block into ``sdocs``/``stfs`` (at least the longest list) first."""
    indptr = pk[0]
    bptr = pk[1]
    docs = np.empty(BLOCK_SIZE, np.int64)
    tfs = np.empty(BLOCK_SIZE, np.int64)
    for t in range(t0, t1):
        q = 0
        for blk in range(bptr[t], bptr[t + 1]):
            n = _count(pk, t, blk)
            _unpack(pk[7], pk[3], pk[4], pk[5], pk[2], blk, blk == bptr[t], n, docs, tfs)
            for x in range(n):
                sdocs[q + x] = docs[x]
                stfs[q + x] = tfs[x]
            q += n
        nt = lut[t]
        j = n_indptr[nt] if nt >= 0 else 0
        je = n_indptr[nt + 1] if nt >= 0 else 0
        p = _merge_term(sdocs, stfs, indptr[t + 1] - indptr[t], old_new, j, je, n_indices, n_tf, new_pos,
                        out_idx, out_tf, p)
        if p < 0:
            return p
        out_indptr[t + 1] = p
    return p
