"""A filter's survivors, prepared for the compiled filtered kernel, and the per-index
support that makes that cheap (issue #27 item 4: selective filters no slower than none).

The spec scores a filtered query with N, df and avgdl over the filter survivors. Before
scoring, the kernel therefore needs the survivors' count and summed length and a packed
bitset to test postings against; when the survivors are few, also their sorted positions
(long lists are then galloped at those positions instead of scanned).

A filter arrives as a bool mask over the index positions, as positions, or packed
(``PackedFilter``: what word-wise AND/OR of per-field bitmaps gives, an eighth of a mask):

* a mask is packed 64 documents per word and counted by popcount; the survivors' summed
  length comes from the bit-sliced document lengths (``FilterSupport.slices``), so no pass
  reads N lengths;
* packed bits skip the packing: a popcount and the length slices;
* positions (sorted or not) cost O(their number): a gather of their lengths and their bits
  set in a per-thread zeroed buffer, cleared after the query. A selective filter given as
  positions never does an O(N) pass.

``FilterSupport`` is built lazily, in memory, per index (nothing is added to the file
format, so it serves a memory-mapped index as well): the length slices on the first
filtered query, and per term on its first filtered use, per block of ``BLOCK_SIZE``
postings the largest tf and the smallest document length, and for a term with a bitset
row the row's rank directory (a document's place in the list in O(1)). From the first,
``maxtf / (maxtf + k1 (1 - b + b minlen / avgdl'))`` bounds the tf factor of every posting
of the block for any survivor avgdl', which lets the filtered kernel skip blocks and
terms (MaxScore) exactly.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import numpy as np

from .postings import BLOCK_SIZE, RANK_WORDS, Postings

FEW_SURVIVORS_DIV = 64  # survivors <= N / this: their positions go to the kernel (gallop, no scan)
NO_KNOWN = np.zeros(0, np.int64)  # no survivor df cache (``Survivors.known``)


@dataclass(frozen=True)
class Survivors:
    """A filter's survivors as the filtered kernel reads them."""

    n: int  # how many
    total: int  # their summed length
    bits: np.ndarray  # uint64 words, little bit order: the packed filter
    positions: np.ndarray  # int64 ascending positions when few (<= N / FEW_SURVIVORS_DIV), else empty
    scratch_set: np.ndarray | None  # positions whose bits must be cleared from the scratch after the query
    # Survivor df of the terms counted so far (``df_cache``), filled by the kernel: a reused
    # PackedFilter's (``remembered``); empty = count every query.
    known: np.ndarray = field(default_factory=lambda: NO_KNOWN)


class FilterSupport:
    """Lazily built, in-memory helpers of one plain index's filtered queries (thread-safe),
    over its postings arrays (``BM25Index.postings()``)."""

    def __init__(self, p: Postings) -> None:
        self._p = p
        self._lock = threading.Lock()
        self._slices: np.ndarray | None = None
        self._lengths: np.ndarray | None = None
        n_terms, n_blocks = len(p.df), int(p.bptr[-1])
        self.done = np.zeros(n_terms, np.bool_)
        # np.zeros maps untouched pages lazily: only the blocks of queried terms cost memory.
        self.blk_tf = np.zeros(max(n_blocks, 1), np.uint32)
        self.blk_len = np.zeros(max(n_blocks, 1), np.uint32)
        self.t_maxtf = np.zeros(max(n_terms, 1), np.uint32)
        self.t_minlen = np.zeros(max(n_terms, 1), np.uint32)
        rows, words = p.bits.shape if p.bits.ndim == 2 else (0, 0)
        self.rank_dir = np.zeros((max(rows, 1), words // RANK_WORDS + 1), np.uint32)
        self.rank_done = np.zeros(max(rows, 1), np.bool_)

    def slices(self) -> np.ndarray:
        """Bit-sliced document lengths: row b is the bitset of documents whose length has bit
        b set (uint64 words), so a mask's summed length is sum_b 2^b popcount(mask & row b)."""
        if self._slices is None:
            with self._lock:
                if self._slices is None:
                    self._slices = length_slices(self._p.doc_len)
        return self._slices

    def lengths(self) -> np.ndarray:
        """``compact_lengths`` of the index, built on first use."""
        if self._lengths is None:
            with self._lock:
                if self._lengths is None:
                    self._lengths = compact_lengths(self._p.doc_len)
        return self._lengths

    def ensure_terms(self, kernels: Any, tids: np.ndarray) -> None:
        """Block bounds of every term of ``tids`` that has none yet (a term's first filtered use)."""
        if self.done[tids].all():
            return
        p = self._p
        with self._lock:
            for t in np.unique(tids).tolist():
                if not self.done[t]:
                    kernels.term_block_bounds(p.indptr, p.indices, p.tf, p.doc_len, p.bptr, t, BLOCK_SIZE,
                                              self.blk_tf, self.blk_len)
                    b0, b1 = int(p.bptr[t]), int(p.bptr[t + 1])
                    if b1 > b0:
                        self.t_maxtf[t] = self.blk_tf[b0:b1].max()
                        self.t_minlen[t] = self.blk_len[b0:b1].min()
                    row = int(p.bit_row[t])
                    if row >= 0 and not self.rank_done[row]:
                        kernels.rank_directory(p.bits[row], self.rank_dir[row])
                        self.rank_done[row] = True
                    self.done[t] = True  # after the arrays: a reader that sees it sees them


def compact_lengths(doc_len: np.ndarray) -> np.ndarray:
    """The document lengths in the narrowest unsigned type that holds them (uint8 for most
    chunk corpora): the filtered kernel reads one per scored posting at random, and a
    quarter of the bytes stays in cache."""
    return doc_len.astype(compact_dtype(int(doc_len.max()) if len(doc_len) else 0))


def compact_dtype(longest: int) -> np.dtype:
    """The dtype ``compact_lengths`` gives lengths whose longest is ``longest``: a packed
    file knows it at open (its last length code), so it compiles the filtered kernel for
    that width alone."""
    return np.dtype(np.uint8 if longest < 2**8 else np.uint16 if longest < 2**16 else np.uint32)


def length_slices(doc_len: np.ndarray) -> np.ndarray:
    """(bits of the longest length, ceil(N/64)) uint64: row b = the bitset of the documents
    whose length has bit b set."""
    n = len(doc_len)
    words = (n + 63) // 64
    top = int(doc_len.max()).bit_length() if n else 0
    out = np.zeros((top, words), np.uint64)
    pad = np.zeros(words * 64, np.bool_)
    for b in range(top):
        pad[:n] = (doc_len >> np.uint32(b)) & np.uint32(1)
        out[b] = np.packbits(pad, bitorder="little").view(np.uint64)
    return out


class Filtered(Protocol):
    """What ``prepare`` reads of an index (either layout): its size, its document lengths
    and the helpers of its filtered queries (an object with ``slices()``)."""

    n_docs: int
    doc_len: np.ndarray

    def filter_support(self) -> Any: ...


def support(ix: Filtered) -> Any:
    """The index's filter helpers (``FilterSupport``, or ``PackedFilterSupport`` for a
    packed index), created on its first filtered query."""
    return ix.filter_support()




@dataclass(frozen=True, eq=False)
class PackedFilter:
    """A filter as packed bits: bit d of ``words`` (uint64, little bit order, ceil(N/64)
    words, bits past N zero) keeps document position d.

    An eighth of a bool mask's bytes, so preparing it skips the packing pass: a caller that
    combines per-field bitmaps with word-wise AND/OR can hand the result over as is.

    Immutable: the words are the filter's own copy (none when they are already: ``from_mask``),
    which nothing writes (numpy keeps them writeable only because the compiled kernels are
    typed for writeable words: a read-only twin would be one more signature to load at every
    open). So a filter reused across queries (what ``HybridRetriever`` keeps
    per filter expression, as Lucene keeps a filter's doc-id set) remembers, per index, what
    only its survivors decide: their count and summed length, their positions when few, and
    a bounded cache of its query terms' survivor df (``remembered``, ``df_cache``). A reused
    filter then costs no pass over N at all; a first-seen one costs what it did. Equality is
    identity.
    """

    words: np.ndarray
    _memo: dict[int, tuple[Any, Survivors]] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # A copy: the caller's array could change under what the filter remembers.
        object.__setattr__(self, "words", np.array(self.words, copy=True))

    @classmethod
    def from_mask(cls, mask: np.ndarray) -> PackedFilter:
        """Pack a bool mask (one entry per indexed document)."""
        packed = np.packbits(np.asarray(mask, np.bool_), bitorder="little")  # bits past N are zero
        words = np.zeros(-(-len(packed) // 8), np.uint64)  # whole words: N/8 bytes, not N
        words.view(np.uint8)[: len(packed)] = packed
        own = object.__new__(cls)  # fresh words: adopted without __post_init__'s copy
        object.__setattr__(own, "words", words)
        object.__setattr__(own, "_memo", {})
        return own

    def __reduce__(self) -> tuple[Any, tuple[np.ndarray]]:
        """Pickled as its words alone: what it remembers belongs to indexes of this process
        (and holds weak references, which do not pickle)."""
        return (PackedFilter, (self.words,))

    def to_mask(self, n_docs: int) -> np.ndarray:
        """The bool mask over ``n_docs`` positions (checked as ``prepare`` checks it)."""
        words = _checked_words(self, n_docs)
        return np.unpackbits(words.view(np.uint8), bitorder="little")[:n_docs].astype(np.bool_)


# Indexes a filter remembers its survivors for (a filter outliving snapshots forgets the oldest).
MEMO_INDEXES = 4
_MEMO_LOCK = threading.Lock()


def remembered(f: Any, owner: Any, make: Callable[[], Survivors], n_terms: int = 0) -> Survivors:
    """A ``PackedFilter``'s survivors on the index whose filter support is ``owner``:
    ``make()`` on the first use, then the same record; with ``n_terms`` (a kernel that
    caches survivor df) its ``known`` array, which the kernel fills as query terms come.
    Any other form of filter is ``make()`` each time (a mask or positions can change).

    Keyed by the owner's identity, held weakly: a new snapshot is a new index, so nothing is
    carried across versions (an entry whose index is gone is never matched again and is the
    first to go). Threads racing on a first use each make a record; the last one is kept,
    and every one of them is exact."""
    if not isinstance(f, PackedFilter):
        return make()
    entry = f._memo.get(id(owner))
    if entry is not None and entry[0]() is owner:
        return entry[1]
    surv = make()
    if surv.scratch_set is not None or surv.bits is not f.words:
        return surv  # not the filter's own bits: nothing to remember
    if n_terms > 0:
        surv = replace(surv, known=df_cache(n_terms, n_docs=len(f.words) * 64))
    with _MEMO_LOCK:
        while len(f._memo) >= MEMO_INDEXES:
            f._memo.pop(next(iter(f._memo)))
        f._memo[id(owner)] = (weakref.ref(owner), surv)
    return surv


# Slots of a reused filter's survivor-df cache: 512 KiB per (filter, index) at most, however
# large the vocabulary (the retriever keeps up to 64 filters).
DF_SLOTS = 1 << 16


def df_cache(n_terms: int, n_docs: int) -> np.ndarray:
    """An empty survivor-df cache for an index of ``n_terms`` terms: a power-of-two number
    of int64 slots (term t in slot t mod size; ``kernels.filter_stats.known_df``), none when a
    df or a term id would not fit its 32 bits."""
    if n_terms <= 0 or n_docs >= 2**32 or n_terms >= 2**31:
        return NO_KNOWN
    return np.zeros(min(1 << (n_terms - 1).bit_length(), DF_SLOTS), np.int64)


def _checked_words(f: PackedFilter, n_docs: int) -> np.ndarray:
    words = np.ascontiguousarray(f.words)
    if words.dtype != np.uint64 or words.shape != ((n_docs + 63) // 64,):
        raise ValueError(f"a packed filter needs {(n_docs + 63) // 64} uint64 words for {n_docs} documents")
    if n_docs % 64 and int(words[-1]) >> (n_docs % 64):
        raise ValueError("a packed filter has bits set past the last indexed document")
    return words


def prepare(ix: Filtered, kernels: Any, candidates: Any, scratch: Any) -> Survivors:
    """The survivors of ``candidates``: a bool mask over the index positions, positions,
    or a ``PackedFilter``.

    Raises ValueError for a mask of the wrong length or a position outside the index.
    """
    n_docs = ix.n_docs
    if isinstance(candidates, PackedFilter):
        bits = _checked_words(candidates, n_docs)
        n = int(kernels.count_bits(bits))
        total = int(kernels.sliced_total(bits, ix.filter_support().slices())) if n else 0
        return Survivors(n, total, bits, _few_positions(kernels, bits, n, n_docs), None)
    cand = np.asarray(candidates)
    if cand.dtype == np.bool_:
        if cand.shape != (n_docs,):
            raise ValueError("candidate mask must have one entry per indexed document")
        bits = scratch.mask_bits
        n, total = kernels.pack_mask(cand[: n_docs // 8 * 8].view(np.uint64), cand, ix.filter_support().slices(), bits)
        return Survivors(int(n), int(total), bits, _few_positions(kernels, bits, int(n), n_docs), None)
    pos = _positions(cand)
    bits = scratch.pos_bits
    gather = len(pos) <= n_docs // FEW_SURVIVORS_DIV
    state, total = kernels.set_positions(pos, ix.doc_len, bits, gather)
    if state != 0:
        kernels.clear_bits(pos, bits)
        if state == 2:
            raise ValueError(f"candidate positions must lie in 0..{n_docs - 1}")
        pos = np.unique(pos)  # unsorted or repeated: sort once, then set again
        gather = len(pos) <= n_docs // FEW_SURVIVORS_DIV
        state, total = kernels.set_positions(pos, ix.doc_len, bits, gather)
    if not gather:
        total = kernels.sliced_total(bits, ix.filter_support().slices())
    return Survivors(len(pos), int(total), bits, pos if gather else _NONE, pos)


def _few_positions(kernels: Any, bits: np.ndarray, n: int, n_docs: int) -> np.ndarray:
    """The survivors' positions when they are few (the kernel gallops or ranks them), else empty."""
    if not 0 < n <= n_docs // FEW_SURVIVORS_DIV:
        return _NONE
    pos = np.empty(n, np.int64)
    kernels.bits_to_positions(bits, pos)
    return pos


def check(candidates: Any, n_docs: int) -> None:
    """Raise what ``prepare`` raises for a malformed filter, without preparing it."""
    if isinstance(candidates, PackedFilter):
        _checked_words(candidates, n_docs)
        return
    cand = np.asarray(candidates)
    if cand.dtype == np.bool_:
        if cand.shape != (n_docs,):
            raise ValueError("candidate mask must have one entry per indexed document")
        return
    pos = _positions(cand)
    if pos.size and (int(pos.min()) < 0 or int(pos.max()) >= n_docs):
        raise ValueError(f"candidate positions must lie in 0..{n_docs - 1}")


def _positions(cand: np.ndarray) -> np.ndarray:
    """Integer positions as a contiguous int64 array (no copy when they already are)."""
    if cand.ndim != 1 or not (np.issubdtype(cand.dtype, np.integer) or cand.size == 0):
        raise ValueError("candidates must be a bool mask or a 1-d array of integer positions")
    if cand.dtype == np.uint64 and cand.size and int(cand.max()) >= 2**63:
        raise ValueError("candidate positions must lie in the index")
    return np.ascontiguousarray(cand, np.int64)


_NONE = np.zeros(0, np.int64)


def handover(mask: np.ndarray, positions: np.ndarray | None = None) -> np.ndarray | PackedFilter:
    """A caller's bool mask in the form the compiled filtered kernel prepares cheapest.

    Packed words by default: packing a mask costs ~0.03 ms at 1M documents, and ``prepare``
    then skips its own pass over N bools (a popcount, and the few survivors' positions from
    the words, not from N bytes). Positions only when the caller already holds them (the
    dense channel needs them) and they are few (<= N / ``FEW_SURVIVORS_DIV``): then the
    kernel's preparation is O(survivors). Computing positions just for BM25 would not pay:
    ``np.flatnonzero`` reads N bytes, ~0.1 ms at 1M, more than the packed route saves.

    Only ``BM25Index`` (and the memory-mapped index, its subclass) with compiled kernels
    gains from it; other indexes turn any form back into a mask, so callers hand them the
    mask itself (``hybrid.bm25_handover.bm25_candidates``). Every form names the same survivors, so the
    answers are the mask's, bit for bit.
    """
    mask = np.asarray(mask, np.bool_)
    if positions is not None and len(positions) <= len(mask) // FEW_SURVIVORS_DIV:
        return np.asarray(positions, np.int64)
    return PackedFilter.from_mask(mask)
