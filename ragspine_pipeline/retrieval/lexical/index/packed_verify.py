"""The full check of a packed file (``PackedBM25Index.verify``, what publishing runs before
the rename): every checksum, the whole structure, every block decoded and its skip data and
bounds recomputed, the term bounds and the bit sets rebuilt.

Why apart: ``index.packed_index`` holds the query API; this runs once per publish.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..format.file import HEADER_BYTES, CorruptIndexError
from .packed import (
    BLOCK_ARRAYS,
    PAD_WORDS,
    SLICE_BLOCKS,
    block_pointers,
    check_blocks,
    compiled,
    decode_term,
    norm_of,
)
from .packed_narrow import wmax_table
from .packed_tables import check_tables
from .postings import BLOCK_SIZE


def verify_packed(ix: Any) -> None:
    """``ix.verify()`` of a ``PackedBM25Index``: raises ``CorruptIndexError`` naming its file."""
    f = ix._file
    ix._blocks.check(HEADER_BYTES, ix._blocks.end)
    ix._lengths_ok = False
    ix._doc_lengths_read()
    a, n, nt = f.arrays, ix.n_docs, ix.n_terms
    bp, lc = a["bptr"].astype(np.int64), a["last_count"]
    n_blocks = len(a["blk_last"])
    nb = np.diff(bp)
    ok = (len(bp) == nt + 1 and len(lc) == nt and int(bp[0]) == 0 and bool((nb >= 0).all())
          and int(bp[-1]) == n_blocks and bool(((lc >= 1) & (lc <= BLOCK_SIZE) | (nb == 0) & (lc == 0)).all())
          and ("indptr" not in a or np.array_equal(bp, block_pointers(a["indptr"])))
          and all(len(a[x]) == n_blocks + (x == "blk_off") for x in BLOCK_ARRAYS)
          and int(a["blk_off"][0]) == 0 and a["bits"].shape[1] == (n + 63) // 64
          and check_tables(a, nt, a["bits"].shape[0], f.bit_terms)
          and int(a["blk_off"][-1]) == len(a["data"]) - PAD_WORDS and not a["data"][-PAD_WORDS:].any())
    ok = ok and ix._tables_ok(f)
    if not ok:
        raise CorruptIndexError(ix.path, "index structure is inconsistent")
    pk, norm = f.packed(), norm_of(ix._doc_len32, ix.k1, ix.b, ix._w_avgdl)
    kernels = compiled()
    if kernels is not None and n_blocks:
        bad = int(kernels.check_all(ix._pk, n, len(a["data"]), norm, ix._doc_len32))
        if bad >= 0:
            raise CorruptIndexError(ix.path, f"block {bad}: fields, offsets, positions or skip data "
                                               f"do not match its postings")
    for b0 in range(0, n_blocks if kernels is None else 0, SLICE_BLOCKS):
        problem = check_blocks(pk, b0, min(b0 + SLICE_BLOCKS, n_blocks), n, len(a["data"]), norm,
                               ix._doc_len32)
        if problem is not None:
            raise CorruptIndexError(ix.path, f"blocks from {b0}: {problem}")
    terms, q = wmax_table(bp, a["blk_bmax"])
    if not (np.array_equal(terms, a["wmax_terms"]) and np.array_equal(q, a["wmax_q"])):
        raise CorruptIndexError(ix.path, "term max weights do not match the block maxima")
    for r, t in enumerate(f.bit_terms.tolist()):
        row = np.zeros(a["bits"].shape[1] * 64, np.bool_)
        row[decode_term(pk, t)[0]] = True
        if not np.array_equal(np.packbits(row, bitorder="little").view(np.uint64), a["bits"][r]):
            raise CorruptIndexError(ix.path, f"bitset of term {t} does not match its postings")
    f.term_ok[:] = True
    ix.vocab._table_ok = True
