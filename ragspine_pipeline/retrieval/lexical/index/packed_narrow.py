"""The narrowed per-term and per-block arrays of a packed file (#47 item 4, step T2).

Why: at 1M documents and a 2M-term vocabulary the packed file spent 36 bytes a term
(``indptr``/``bptr`` int64, ``w_max`` float64) and 30 a block (int64 offsets, float64
maxima, uint32 tf and length bounds) beside postings words of ~13 bits each: a fifth of
the file. Here a term costs 5 bytes (uint32 first block, uint8 count of its last block)
plus a small table for the few terms of more than one block, and a block 15:

* ``bptr`` uint32 and ``last_count`` uint8: df = 128 (blocks - 1) + last count; the plain
  ``indptr`` is rebuilt (``postings_pointers``) only where a reader numbers postings.
* ``blk_bmax`` uint16: the least q with q x BMAX_STEP >= the block's max w. A bound may
  get looser, never tighter (at most 1/65535 of w's range), so pruning stays exact.
* ``wmax_terms``/``wmax_q``: a term's max w is its block's bound when it has one block
  (97% of the terms), else the table's (the largest of its blocks' q).
* ``blk_maxtf`` uint8 with MAXTF_SAT for 255 or more (bounded by any tf: w < 1), and
  ``blk_minlen`` the uint16 code of the shortest length (codes are sorted by length),
  uint32 lengths in a file without codes.
* ``blk_off`` uint32: a file of 2^32 words (16 GiB) or more is refused (more buckets).

The kernels decode these in ``kernels.weight`` (``term_df``, ``term_wmax``, ``blk_*``).
"""

from __future__ import annotations

import numpy as np

from .postings import BLOCK_SIZE

BMAX_STEP = 1.0 / 65535  # kernels.weight.BMAX_STEP (the same float)
MAXTF_SAT = 255
MAX_U32 = (1 << 32) - 1


def quantize_bmax(w: np.ndarray) -> np.ndarray:
    """Each max w (0 <= w <= 1) as the least uint16 q with q x BMAX_STEP >= w: an upper
    bound (a block or term bound may only be looser, never tighter: answers stay exact)."""
    w = np.asarray(w, np.float64)
    q = np.clip(np.ceil(w * 65535.0), 0, 65535)
    for _ in range(4):  # float rounding of the product: settle on the least q that bounds w
        q = np.where((q < 65535) & (q * BMAX_STEP < w), q + 1, q)
        q = np.where((q > 0) & ((q - 1) * BMAX_STEP >= w), q - 1, q)
    if len(q) and bool((q * BMAX_STEP < w).any()):
        raise ValueError("a block max weight above 1 cannot be stored")
    return q.astype(np.uint16)


def narrow_maxtf(maxtf: np.ndarray) -> np.ndarray:
    """Block max tfs as uint8, MAXTF_SAT standing for any tf from 255 up."""
    return np.minimum(np.asarray(maxtf), MAXTF_SAT).astype(np.uint8)


def narrow_minlen(minlen: np.ndarray, code_len: np.ndarray | None) -> np.ndarray:
    """Block min lengths as the uint16 code of each (``code_len``: the sorted lengths of
    the codes), or uint32 lengths without codes."""
    if code_len is None:
        return np.asarray(minlen).astype(np.uint32)
    return np.searchsorted(code_len, np.asarray(minlen)).astype(np.uint16)


def to_u32(a: np.ndarray, what: str) -> np.ndarray:
    """``a`` as uint32, or a ValueError saying how to stay below 2^32 (``what``: the thing)."""
    if len(a) and int(np.max(a)) > MAX_U32:
        raise ValueError(f"{what} reach 2^32, more than a packed file holds: publish more buckets "
                         f"(or segments) so that each file stays below 16 GiB of postings words")
    return np.asarray(a).astype(np.uint32)


def last_counts(indptr: np.ndarray, bptr: np.ndarray) -> np.ndarray:
    """``last_count``: postings in each term's last block (0 for a term without postings)."""
    df = np.diff(np.asarray(indptr, np.int64))
    nb = np.diff(np.asarray(bptr, np.int64))
    return np.where(nb > 0, df - BLOCK_SIZE * (nb - 1), 0).astype(np.uint8)


def term_dfs(bptr: np.ndarray, last_count: np.ndarray, tids: np.ndarray | None = None) -> np.ndarray:
    """df (int64) of the terms ``tids`` (all when None) from ``bptr`` and ``last_count``."""
    bp = np.asarray(bptr).astype(np.int64)
    lc = np.asarray(last_count).astype(np.int64)
    if tids is None:
        nb = np.diff(bp)
    else:
        tids = np.asarray(tids, np.int64)
        nb, lc = bp[tids + 1] - bp[tids], lc[tids]
    return np.where(nb > 0, BLOCK_SIZE * (nb - 1) + lc, 0)


def postings_pointers(bptr: np.ndarray, last_count: np.ndarray) -> np.ndarray:
    """The plain ``indptr`` (int64 [T+1]) rebuilt from ``bptr`` and ``last_count``: for the
    readers that number postings (``PostingsView``, refresh, stack statistics), never the kernels."""
    out = np.zeros(len(last_count) + 1, np.int64)
    np.cumsum(term_dfs(bptr, last_count), out=out[1:])
    return out


def wmax_table(bptr: np.ndarray, bmax_q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(``wmax_terms``, ``wmax_q``): the terms of more than one block and the largest of
    their blocks' stored bounds (a one-block term's is its block's: no entry)."""
    bp = np.asarray(bptr).astype(np.int64)
    nb = np.diff(bp)
    multi = np.flatnonzero(nb > 1)
    if not len(multi):
        return multi.astype(np.uint32), np.zeros(0, np.uint16)
    nonempty = np.flatnonzero(nb > 0)  # contiguous runs of blocks: reduceat ends each at the next
    q = np.maximum.reduceat(bmax_q, bp[nonempty])[np.searchsorted(nonempty, multi)]
    return multi.astype(np.uint32), np.asarray(q, np.uint16)


def term_wmax(bptr: np.ndarray, bmax_q: np.ndarray, wmax_terms: np.ndarray, wmax_q: np.ndarray,
              tids: np.ndarray) -> np.ndarray:
    """``kernels.weight.term_wmax`` for many terms (float64; the numpy query path)."""
    tids = np.asarray(tids, np.int64)
    bp = np.asarray(bptr).astype(np.int64)
    b0, nb = bp[tids], bp[tids + 1] - bp[tids]
    q = np.zeros(len(tids), np.float64)
    one = nb == 1
    q[one] = bmax_q[b0[one]]
    many = nb > 1
    if many.any():
        q[many] = wmax_q[np.searchsorted(wmax_terms, tids[many])]
    return q * BMAX_STEP
