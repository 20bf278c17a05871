"""Plain-layout views of a packed index's postings (``index.packed_index``).

Why apart: the packed index answers the numpy path and ``refresh.segments`` through the
plain layout's array names; these two adapters give it those, decoding terms on demand.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from .packed_index import PackedBM25Index


@dataclass(frozen=True)
class _QueryPostings:
    """A few terms' postings decoded into the plain layout's arrays, for ``index.numpy_search``
    (local term ids 0..m-1; ``n_docs``, ``avgdl`` and ``doc_len`` are the index's)."""

    indptr: np.ndarray
    indices: np.ndarray
    tf: np.ndarray
    w: np.ndarray
    df: np.ndarray
    _idf_full: np.ndarray
    _w_max: np.ndarray
    doc_len: np.ndarray
    n_docs: int
    avgdl: float
    k1: float
    b: float


class _PostingsView:
    """``indices`` / ``tf`` of a packed index as slices over the plain postings numbering
    (what ``refresh.segments`` reads: ``ix.indices[ix.indptr[t]:ix.indptr[t + 1]]``)."""

    def __init__(self, ix: PackedBM25Index, which: int) -> None:
        self._ix, self._which = ix, which

    def __len__(self) -> int:
        return int(self._ix.indptr[-1])

    def __getitem__(self, key: slice) -> np.ndarray:
        if not isinstance(key, slice) or key.step not in (None, 1):
            raise TypeError("packed postings are read by contiguous slices")
        start, stop, _ = key.indices(len(self))
        ix = self._ix
        if stop <= start:
            return np.zeros(0, np.int64)
        t = int(np.searchsorted(ix.indptr, start, side="right")) - 1
        parts, pos = [], int(ix.indptr[t])
        while pos < stop:
            ix._file.verify_term(t)
            parts.append(ix.decode(t)[self._which])
            pos += len(parts[-1])
            t += 1
        first = int(np.searchsorted(ix.indptr, start, side="right")) - 1
        flat = np.concatenate(parts)
        lo = start - int(ix.indptr[first])
        return flat[lo:lo + stop - start]
