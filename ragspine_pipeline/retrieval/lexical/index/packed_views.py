"""Plain-layout views of a packed index's postings (``index.packed_index``).

Why apart: the packed index answers the numpy path and ``refresh.segments`` through the
plain layout's array names; these two adapters give it those, decoding terms on demand.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class QueryPostings:
    """A few terms' postings decoded into the plain layout's arrays, for ``index.numpy_search``
    (local term ids 0..m-1; ``n_docs``, ``avgdl`` and ``doc_len`` are the index's)."""

    indptr: np.ndarray
    indices: np.ndarray
    tf: np.ndarray
    w: np.ndarray
    df: np.ndarray
    idf: np.ndarray
    w_max: np.ndarray
    doc_len: np.ndarray
    n_docs: int
    avgdl: float
    k1: float
    b: float


class PostingsView:
    """``indices`` / ``tf`` of a packed index as slices over the plain postings numbering
    (what ``refresh.segments`` reads: ``ix.indices[ix.indptr[t]:ix.indptr[t + 1]]``):
    ``term_postings(t)`` gives a term's (doc positions, tf), its blocks checked first;
    ``indptr()`` the postings pointers (a packed file stores none: built on first use)."""

    def __init__(self, indptr: Callable[[], np.ndarray],
                 term_postings: Callable[[int], tuple[np.ndarray, np.ndarray]], which: int) -> None:
        self._ptrs, self._term_postings, self._which = indptr, term_postings, which

    @property
    def _indptr(self) -> np.ndarray:
        return self._ptrs()

    def __len__(self) -> int:
        return int(self._indptr[-1])

    def __getitem__(self, key: slice) -> np.ndarray:
        if not isinstance(key, slice) or key.step not in (None, 1):
            raise TypeError("packed postings are read by contiguous slices")
        start, stop, _ = key.indices(len(self))
        indptr = self._indptr
        if stop <= start:
            return np.zeros(0, np.int64)
        t = int(np.searchsorted(indptr, start, side="right")) - 1
        parts, pos = [], int(indptr[t])
        while pos < stop:
            parts.append(self._term_postings(t)[self._which])
            pos += len(parts[-1])
            t += 1
        first = int(np.searchsorted(indptr, start, side="right")) - 1
        flat = np.concatenate(parts)
        lo = start - int(indptr[first])
        return flat[lo:lo + stop - start]
