"""What a filtered query over a packed index needs besides the file: survivor statistics
without a per-query pass over N (issue #27 item 4), built lazily in memory per index.

A filter reaches ``PackedBM25Index.search(candidates=...)`` in the forms the plain layout
accepts (a bool mask, positions, a ``PackedFilter``) and is prepared by the plain layout's
``index.filter.prepare``: a mask is packed eight bools per multiply and counted by popcount,
packed words are only counted, positions cost O(their number); the survivors' summed
length (avgdl over the survivors, as the spec requires) comes from bit-sliced document
lengths, never from a pass over N lengths. ``prepare`` reads the slices through
``ix.filter_support()``, which for a packed index returns this object (so the plain
layout's code serves both, with no copy).

Per index, on the first filtered query (nothing is added to the file format, so a
memory-mapped index shared by many processes stays shared):

* ``slices()``: the bit-sliced lengths (``index.filter.length_slices``; 7 rows of N/64
  words for chunk lengths below 128: ~9 MB at 10M documents);
* ``lengths()``: the lengths in the narrowest type (``compact_lengths``): the scoring
  kernel reads one per scored posting at random, and uint8 stays in cache;
* per term on its first filtered use: its largest tf and shortest document over all its
  blocks (the term bound of MaxScore, from the file's per-block ``blk_maxtf`` /
  ``blk_minlen``), and for a term with a bitset row the row's rank directory (a
  document's place in the list in O(1): tfs of few survivors are read without scanning).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from ..kernels.filter_stats import rank_directory
from .filter import compact_lengths, length_slices
from .packed_narrow import MAX_U32, MAXTF_SAT
from .packed_tables import bit_row
from .postings import RANK_WORDS


class PackedFilterSupport:
    """Lazily built helpers of one packed index's filtered queries (thread-safe)."""

    def __init__(self, arrays: dict[str, np.ndarray], n_terms: int, doc_len: np.ndarray,
                 bit_terms: np.ndarray) -> None:
        """``arrays``: the mapped file's arrays (by name); ``doc_len``: its document lengths;
        ``bit_terms``: the terms with a bit-set row (``packed_tables.bit_terms_of``)."""
        self._arrays, self._doc_len, self._bit_terms = arrays, doc_len, bit_terms
        self._lock = threading.Lock()
        self._slices: np.ndarray | None = None
        self._lengths: np.ndarray | None = None
        self._codes: np.ndarray | None = None
        a = arrays
        n_terms = max(n_terms, 1)
        self.done = np.zeros(n_terms, np.bool_)
        self.t_maxtf = np.zeros(n_terms, np.uint32)
        self.t_minlen = np.zeros(n_terms, np.uint32)
        rows, words = a["bits"].shape
        # np.zeros maps pages lazily: only the rows of queried terms cost memory.
        self.rank_dir = np.zeros((max(rows, 1), words // RANK_WORDS + 1), np.uint32)
        self.rank_done = np.zeros(max(rows, 1), np.bool_)

    def slices(self) -> np.ndarray:
        """Bit-sliced document lengths (``index.filter.length_slices``), built on first use."""
        if self._slices is None:
            self._slices = self._built(length_slices)
        return self._slices

    def lengths(self) -> np.ndarray:
        """``compact_lengths`` of the index, built on first use."""
        if self._lengths is None:
            self._lengths = self._built(compact_lengths)
        return self._lengths

    def code_lengths(self) -> np.ndarray:
        """The file's length of each document length code (uint32, owned), or empty when
        the file has no codes (its ``doc_code`` column is the lengths themselves): the
        filtered window kernel computes each code's weight denominator once per query."""
        if self._codes is None:
            a = self._arrays
            self._codes = (np.array(a["code_len"], np.uint32) if "doc_code" in a else np.zeros(0, np.uint32))
        return self._codes

    def _built(self, build: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
        """``build`` of the document lengths, one build at a time (a racing reader waits
        and builds again: the same array)."""
        with self._lock:
            return build(np.asarray(self._doc_len))

    def ensure_terms(self, tids: np.ndarray) -> None:
        """Term bounds and rank directories of every term of ``tids`` that has none yet."""
        if self.done[tids].all():
            return
        a = self._arrays
        bptr = a["bptr"]
        with self._lock:
            for t in np.unique(tids).tolist():
                if self.done[t]:
                    continue
                b0, b1 = int(bptr[t]), int(bptr[t + 1])
                if b1 > b0:  # the narrowed block bounds decoded (index.packed_narrow)
                    mt = int(a["blk_maxtf"][b0:b1].max())
                    self.t_maxtf[t] = MAX_U32 if mt == MAXTF_SAT else mt
                    ml = int(a["blk_minlen"][b0:b1].min())
                    self.t_minlen[t] = a["code_len"][ml] if "doc_code" in a else ml
                row = bit_row(self._bit_terms, t)
                if row >= 0 and not self.rank_done[row]:
                    rank_directory(a["bits"][row], self.rank_dir[row])
                    self.rank_done[row] = True
                self.done[t] = True  # after the arrays: a reader that sees it sees them


def support(ix: Any) -> PackedFilterSupport:
    """The index's ``PackedFilterSupport`` (``PackedBM25Index.filter_support``), created on
    its first filtered query, where ``index.filter.prepare`` finds it too."""
    return ix.filter_support()
