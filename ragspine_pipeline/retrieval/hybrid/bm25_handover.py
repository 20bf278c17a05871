"""What the hybrid retriever hands its BM25 index: the pre-filter in the cheapest form the
index takes, and the check that a prebuilt index covers exactly the retriever's chunks.

Why apart from ``retriever.py``: both depend on the index layouts (plain, packed, stacked,
published) and not on fusion or the dense channel, so the retriever module stays about the
retrieval itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..chunking.chunk_columns import ChunkColumns
from ..chunking.chunking import Chunk
from ..lexical.index.bm25 import BM25Index
from ..lexical.index.filter import PackedFilter, handover
from ..lexical.index.packed_index import PackedBM25Index
from ..lexical.refresh.stack import StackedBM25


def bm25_candidates(index: Any, mask: np.ndarray | None,
                    positions: np.ndarray | None = None) -> np.ndarray | PackedFilter | None:
    """The pre-filter as ``index.search(candidates=...)`` prepares it cheapest.

    A ``BM25Index`` or ``PackedBM25Index`` with compiled kernels (in memory or
    memory-mapped) gets packed words, or the survivors' ``positions`` when the caller holds
    them and they are few (``index.filter.handover``): the filtered kernel then skips its pass
    over N bools (at 10M, packing a bool mask alone costs ~0.9 ms). Every other index (the
    numpy path, segments, the sharded front) turns any form back into a bool mask, so it gets
    the mask as is. Either way the same survivors: the answers are the mask's.
    """
    compiled = isinstance(index, (BM25Index, PackedBM25Index)) and getattr(index, "_kernels", None) is not None
    # A refresh stack translates packed words once per reused filter, and positions in O(their number).
    compiled = compiled or isinstance(index, StackedBM25)
    if mask is None or not compiled:
        return mask
    return handover(mask, positions)


def check_prebuilt(index: BM25Index, chunks: Sequence[Chunk]) -> None:
    """A given index must cover exactly the retriever's chunks, position = chunk_id order
    (checked against its recorded doc ids when it has them, e.g. a published file; for
    columnar chunks straight from their id column, or by the two digests publish recorded)."""
    blob = getattr(index, "same_doc_id_blob", None)
    same = getattr(index, "same_doc_ids", None)
    digest = getattr(index, "doc_id_digest", None)
    if index.n_docs != len(chunks):
        ok = False
    elif isinstance(chunks, ChunkColumns) and chunks.id_digest is not None and callable(digest) \
            and (theirs := digest()) is not None:
        ok = theirs == chunks.id_digest  # both taken at publish over the same ids (id_digest)
    elif isinstance(chunks, ChunkColumns) and callable(blob):
        ok = blob(*chunks.chunk_id_blob())
    else:
        ok = not callable(same) or same([c.chunk_id for c in chunks])
    if not ok:
        where = f" ({index.path})" if getattr(index, "path", None) else ""
        raise ValueError(f"bm25_index{where} indexes {index.n_docs} documents, not these {len(chunks)} chunks "
                         "in chunk_id order")


__all__ = ["bm25_candidates", "check_prebuilt"]
