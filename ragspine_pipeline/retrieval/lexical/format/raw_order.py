"""Raw postings renumbered so that term ids are the terms' lexicographic order (format 4).

Why: the front-coded vocabulary (``format.vocab_fc``) needs term id t to be the t-th term
in the order of its UTF-8 bytes. The layout writers (``refresh.publish``) call
``sorted_raw`` before anything else, so every array they write (per term, per block,
postings) follows that order. Postings that come sorted already (the streaming build
spills its runs in that order, ``refresh.stream_build``) pass through untouched; others
(a refresh's merge, a raw count in memory) are read through ``TermOrderView``: a slice
of the renumbered postings is gathered from the original arrays when the writer asks for
it, so no second copy of all postings is ever held.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from .file import strings_to_blob, terms_ascending
from .raw import RawPostings


def utf8_binary(terms: Any) -> Any:
    """Terms (Python strings) as an Arrow large_binary array of their UTF-8 bytes
    (surrogatepass: a lone surrogate keeps its bytes, as the file stores them)."""
    # lazy: Arrow (~0.1 s of import) is for writers, not for a reader's open
    import pyarrow as pa

    return pa.array([t.encode("utf-8", "surrogatepass") for t in terms], pa.large_binary())


def lexicographic_order(terms: Any) -> np.ndarray:
    """The term ids in the order of their UTF-8 bytes (int64): ``order[r]`` is the id of
    the r-th term. ``terms``: Python strings, or an Arrow binary array of them."""
    # lazy: Arrow (~0.1 s of import) is for writers, not for a reader's open
    import pyarrow as pa
    import pyarrow.compute as pc

    arr = terms if isinstance(terms, (pa.Array, pa.ChunkedArray)) else utf8_binary(terms)
    return pc.sort_indices(arr).to_numpy().astype(np.int64)


def rank_of(order: np.ndarray) -> np.ndarray:
    """The inverse of ``order``: each id's rank (int32)."""
    rank = np.empty(len(order), np.int32)
    rank[order] = np.arange(len(order), dtype=np.int32)
    return rank


class SliceReader:
    """A read-only 1-D array read a slice at a time through ``read(a, b)``: what the layout
    writers ask of ``RawPostings.indices``/``tf`` (``len``, ``dtype``, ``[a:b]`` and ``[i]``,
    copies of just those items; any other key goes through ``np.asarray``).

    ``array_is_map``: whether ``np.asarray(reader)`` is a memory map (no copy), so a
    consumer may index it at scattered positions; a reader that would copy says False and
    is read run by run through ``read`` instead (``TermOrderView.read``)."""

    ndim = 1
    array_is_map = False
    dtype: np.dtype[Any]
    shape: tuple[int]

    def read(self, a: int, b: int) -> np.ndarray:
        raise NotImplementedError

    @property
    def size(self) -> int:
        return self.shape[0]

    @property
    def nbytes(self) -> int:
        return self.shape[0] * self.dtype.itemsize

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, key: Any) -> Any:
        n = self.shape[0]
        if isinstance(key, (int, np.integer)):
            i = int(key) + n if key < 0 else int(key)
            if not 0 <= i < n:
                raise IndexError(f"index {int(key)} is out of bounds for size {n}")
            return self.read(i, i + 1)[0]
        if isinstance(key, slice):
            start, stop, step = key.indices(n)
            if step == 1:
                return self.read(start, max(start, stop))
        return np.asarray(self)[key]


class TermOrderView(SliceReader):
    """``indices`` or ``tf`` of raw postings read in another term order.

    ``order[r]``: the original id of new term r. Slices are gathered from ``base`` when
    asked for; ``np.asarray`` gathers the whole array a slice at a time into one new array.
    """

    _STEP = 1 << 22  # postings gathered per numpy pass for ``np.asarray``

    def __init__(self, base: Any, old_indptr: np.ndarray, order: np.ndarray, new_indptr: np.ndarray) -> None:
        self.base, self.old_indptr, self.order, self.new_indptr = base, old_indptr, order, new_indptr
        self.dtype = np.dtype(base.dtype)
        self.shape = (int(new_indptr[-1]) if len(new_indptr) else 0,)

    def _source(self, a: int, b: int) -> np.ndarray:
        """Original positions of new positions a..b-1."""
        ip = self.new_indptr
        t0 = int(np.searchsorted(ip, a, side="right")) - 1
        t1 = int(np.searchsorted(ip, b, side="left"))
        starts = ip[t0:t1]
        counts = np.diff(ip[t0:t1 + 1])
        shift = np.asarray(self.old_indptr, np.int64)[self.order[t0:t1]] - starts
        pos = np.repeat(shift, counts) + np.arange(int(starts[0]), int(ip[t1]), dtype=np.int64)
        return pos[a - int(starts[0]):b - int(starts[0])]

    def read(self, a: int, b: int) -> np.ndarray:
        if b <= a:
            return np.zeros(0, self.dtype)
        src = self._source(a, b)
        lo, hi = int(src.min()), int(src.max()) + 1
        if hasattr(self.base, "read") and hi - lo > 4 * (b - a):  # spread out: not one covering read
            if getattr(self.base, "array_is_map", False):
                return np.asarray(self.base)[src]
            cuts = np.flatnonzero(np.diff(src) != 1) + 1  # runs of consecutive positions: one read each
            return np.concatenate([self.base.read(int(r[0]), int(r[-1]) + 1) for r in np.split(src, cuts)])
        chunk = self.base.read(lo, hi) if hasattr(self.base, "read") else self.base[lo:hi]
        return np.asarray(chunk)[src - lo]

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        out = np.empty(self.shape[0], self.dtype)
        for a in range(0, self.shape[0], self._STEP):
            b = min(self.shape[0], a + self._STEP)
            out[a:b] = self.read(a, b)
        return out if dtype is None else out.astype(dtype, copy=False)


def sorted_raw(raw: RawPostings) -> RawPostings:
    """``raw`` renumbered so that term ids ascend with the terms' UTF-8 bytes (``raw``
    itself when they already do). Raises ``ValueError`` when a term repeats."""
    if terms_ascending(*strings_to_blob(raw.terms)):
        return raw
    order = lexicographic_order(raw.terms)
    terms = [raw.terms[t] for t in order.tolist()]
    if not terms_ascending(*strings_to_blob(terms)):
        raise ValueError(f"RawPostings has {raw.n_terms} postings lists for fewer distinct terms")
    old = np.asarray(raw.indptr, np.int64)
    df = np.diff(old)[order]
    indptr = np.zeros(len(order) + 1, np.int64)
    np.cumsum(df, out=indptr[1:])
    return replace(raw, indptr=indptr, terms=terms,
                   indices=TermOrderView(raw.indices, old, order, indptr),
                   tf=TermOrderView(raw.tf, old, order, indptr),
                   corpus_df=None if raw.corpus_df is None else np.asarray(raw.corpus_df)[order])
