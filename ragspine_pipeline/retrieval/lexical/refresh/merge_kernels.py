"""The loops of an incremental BM25 merge (``refresh.merge``): numpy here, compiled in
``kernels.merge``, picked by ``kernels``.

Why two modules: the compiled packed loop inlines the query kernels' block decoder
(``kernels.packed``, numba only), so its source cannot run as plain Python; the numpy
versions here are the fallback when numba cannot be imported and the oracle the tests
compare the compiled loops with (as ``refresh.stream_kernels``).

Every loop writes the postings of a range of the previous index's terms, in term order,
from ``p`` on: the previous postings whose document stays (``old_new[d] >= 0``, mapped to
its new position) merged with the new documents' postings of the same term (``lut[t]``:
the term's id among the new documents, or -1; ``new_pos``: a new document's position).
Both position maps are monotone, so a term's list is one linear merge of two sorted lists,
never a sort. ``out_indptr[t + 1]`` is the end of term t's postings; a loop returns -1
when an old posting's position lies outside the previous index (a damaged file).

* ``merge_plain``: the previous index's plain arrays (indptr, indices, tf).
* ``merge_packed``: its packed blocks (``pk``, ``PackedBM25Index._pk``), unpacked block
  by block with the query kernels' own decoder.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..index.packed import PackedArrays, decode_blocks
from ..index.packed_narrow import term_dfs
from .stream_kernels import NUMPY as STREAM_NUMPY
from .stream_kernels import kernels as stream_kernels


# ----------------------------------------------------------------------------- numpy
def _merge_np(term: np.ndarray, docs: np.ndarray, tfs: np.ndarray, t0: int, t1: int, old_new: np.ndarray,
              lut: np.ndarray, n_indptr: np.ndarray, n_indices: np.ndarray, n_tf: np.ndarray, new_pos: np.ndarray,
              out_indptr: np.ndarray, out_idx: np.ndarray, out_tf: np.ndarray, p: int) -> int:
    """Decoded old postings of terms t0..t1-1 (``term`` per posting) and the new postings of
    the same terms, ordered by (term, new position) with one sort."""
    if len(docs) and (int(docs.min()) < 0 or int(docs.max()) >= len(old_new)):
        return -1
    pos = old_new[docs]
    keep = pos >= 0
    term, pos, tfs = term[keep], pos[keep], tfs[keep]
    nt = lut[t0:t1]
    has = np.flatnonzero(nt >= 0)
    lo, hi = n_indptr[nt[has]], n_indptr[nt[has] + 1]
    cnt = hi - lo
    src = np.repeat(lo - np.cumsum(cnt) + cnt, cnt) + np.arange(int(cnt.sum()), dtype=np.int64)
    term = np.concatenate([term, np.repeat(has + t0, cnt)])
    pos = np.concatenate([pos, new_pos[n_indices[src]]])
    tfs = np.concatenate([tfs, np.asarray(n_tf)[src]])
    order = np.lexsort((pos, term))
    out_idx[p:p + len(order)] = pos[order]
    out_tf[p:p + len(order)] = tfs[order]
    out_indptr[t0 + 1:t1 + 1] = p + np.cumsum(np.bincount(term - t0, minlength=t1 - t0))
    return p + len(order)


def merge_plain_np(indptr: np.ndarray, indices: np.ndarray, tf: np.ndarray, t0: int, t1: int,
                   old_new: np.ndarray, lut: np.ndarray, n_indptr: np.ndarray, n_indices: np.ndarray,
                   n_tf: np.ndarray, new_pos: np.ndarray, out_indptr: np.ndarray, out_idx: np.ndarray,
                   out_tf: np.ndarray, p: int) -> int:
    """``merge_plain`` by one sort per call (the caller bounds the range's postings)."""
    s, e = int(indptr[t0]), int(indptr[t1])
    term = np.repeat(np.arange(t0, t1, dtype=np.int64), np.diff(indptr[t0:t1 + 1]))
    return _merge_np(term, np.asarray(indices[s:e]), np.asarray(tf[s:e]).astype(np.int64), t0, t1, old_new, lut,
                     n_indptr, n_indices, n_tf, new_pos, out_indptr, out_idx, out_tf, p)


def merge_packed_np(pk: tuple, t0: int, t1: int, old_new: np.ndarray, lut: np.ndarray, n_indptr: np.ndarray,
                    n_indices: np.ndarray, n_tf: np.ndarray, new_pos: np.ndarray, out_indptr: np.ndarray,
                    out_idx: np.ndarray, out_tf: np.ndarray, p: int) -> int:
    """``merge_packed`` with ``index.packed.decode_blocks``."""
    minlen = pk[10][0] if isinstance(pk[10], tuple) else pk[10]
    arrays = PackedArrays(data=pk[7], blk_off=pk[3], blk_last=pk[2], blk_dbits=pk[4], blk_tbits=pk[5],
                          blk_bmax=pk[6], blk_maxtf=pk[9], blk_minlen=minlen, bptr=pk[1], last_count=pk[0][1])
    docs, tfs, _count_ = decode_blocks(arrays, int(pk[1][t0]), int(pk[1][t1]))
    term = np.repeat(np.arange(t0, t1, dtype=np.int64), term_dfs(pk[1], pk[0][1])[t0:t1])
    return _merge_np(term, docs, tfs, t0, t1, old_new, lut, n_indptr, n_indices, n_tf, new_pos, out_indptr,
                     out_idx, out_tf, p)


NUMPY = {"merge_plain": merge_plain_np, "merge_packed": merge_packed_np, "compiled": False}


def kernels(kernel: str = "auto") -> dict[str, Any]:
    """``merge_plain``/``merge_packed`` (and ``compiled``: whether they are), by the
    streaming build's rule (``refresh.stream_kernels.kernels``): numba for ``auto`` and
    ``numba``, numpy for ``numpy`` or when numba cannot be imported (``numba`` then raises).
    """
    if stream_kernels(kernel) is STREAM_NUMPY:  # also checks the name
        return NUMPY
    # lazy: numba kernels (~6 ms of import); without numba, NUMPY above
    from ..kernels import merge as nb

    return {"merge_plain": nb.merge_plain, "merge_packed": nb.merge_packed, "compiled": True}
