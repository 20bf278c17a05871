"""Cursor helpers of block-max MaxScore over packed postings (``index.packed``): what the
window kernel (``kernels.packed_windows``) keeps per distinct query term.

Why apart from the window kernel: these are the pieces every document-at-a-time exact
kernel over packed postings needs, and the exact reference kernels of the tests (block-max
WAND and per-document block-max MaxScore, ``tests/packed_reference_kernels.py``) walk the
same cursors with them:

- ``_shallow``: a cursor moved by the blocks' last-doc skip data only, nothing decoded;
- ``_seek``: a term's block decoded (once) and its position on the first posting >= a doc;
- ``_block_cursors``: the per-term cursor state (first/end block, last-block count, current
  and decoded block, position, decode buffers);
- ``_sort_by_bound``: live terms by ascending bound with prefix sums (which are
  non-essential).

Those two reference kernels were measured and are not routed: WAND ~10x slower than the
term-at-a-time MaxScore kernel at 200k docs on head-term queries (block boundaries of
several dense lists interleave, so each block-max skip moves only to the nearest block end
and every block gets decoded); block-max MaxScore per document lost to the window kernel
at 10M. ``kernels.packed_route`` decides what serves a query.
"""

import numpy as np
from numba import njit

from .packed import _BLOCK, _count, _unpack
from .selection import _gallop


@njit(cache=True, nogil=True, inline="always")
def _shallow(last, blk, bend, target):
    """First block in [blk, bend) whose last doc is >= target (bend when none)."""
    if blk < bend and last[blk] >= target:
        return blk
    return _gallop(last, blk, bend, target)


@njit(cache=True, nogil=True, inline="always")
def _seek(ar, j, b, target, b0, bend, cnt, dec, pos, nb, docs, tfs):
    """Term j's decoded block ``b`` (decoding it if another is held) with pos on its
    first posting >= target (target <= the block's last doc); returns that doc."""
    data, off, dbits, tbits, last = ar
    if dec[j] != b:
        n = _BLOCK if b + 1 < bend[j] else cnt[j]
        _unpack(data, off, dbits, tbits, last, b, b == b0[j], n, docs[j], tfs[j])
        dec[j] = b
        nb[j] = n
        pos[j] = 0
    p = pos[j]
    while docs[j, p] < target:
        p += 1
    pos[j] = p
    return docs[j, p]


@njit(cache=True, nogil=True, inline="always")
def _sort_by_bound(m, ordm, live, pre):
    """ordm[:live] by ascending bound m (insertion sort: a handful of terms), and the
    prefix sums of the sorted bounds into pre."""
    for i in range(1, live):
        x = ordm[i]
        y = i - 1
        while y >= 0 and m[ordm[y]] > m[x]:
            ordm[y + 1] = ordm[y]
            y -= 1
        ordm[y + 1] = x
    for i in range(live):
        pre[i + 1] = pre[i] + m[ordm[i]]


@njit(cache=True, nogil=True, inline="always")
def _block_cursors(pk, ut):
    """Per distinct term j (``ut`` order): its first block b0, block end bend, postings in
    its last block cnt, current block blk (= b0), decoded block dec (none), position pos
    and length nb in it, and the decode buffers docs/tfs: the cursor state block-max
    MaxScore keeps, per window (``kernels.packed_windows``) or per document (the tests' ``bmm_top_k``)."""
    nu = ut.shape[0]
    b0 = np.empty(nu, np.int64)
    bend = np.empty(nu, np.int64)
    cnt = np.empty(nu, np.int64)
    for j in range(nu):
        t = ut[j]
        b0[j] = np.int64(pk[1][t])
        bend[j] = np.int64(pk[1][t + 1])
        cnt[j] = _count(pk, t, bend[j] - 1)
    return (b0, bend, cnt, b0.copy(), np.full(nu, -1, np.int64), np.zeros(nu, np.int64), np.zeros(nu, np.int64),
            np.empty((nu, _BLOCK), np.int64), np.empty((nu, _BLOCK), np.int64))
