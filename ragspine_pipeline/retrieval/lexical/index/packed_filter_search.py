"""A filtered query over a packed index: the filter prepared as the plain layout prepares
it, then the packed filtered kernel (issue #27 item 4: selective filters no slower than none).

``PackedBM25Index.search(candidates=...)`` takes what ``BM25Index.search`` takes: a bool
mask, positions (any order) or a ``PackedFilter``. ``index.filter.prepare`` turns each into
packed bits, the survivor count and summed length and, when few, their positions, with no
pass over N document lengths (its kernels are ``kernels.filter_stats``'s; the bit-sliced
lengths it reads come from this index's ``PackedFilterSupport``). Positions set their bits
in a per-thread zeroed buffer that is cleared after the query, so a selective filter given
as positions costs O(survivors) before scoring.

A mask or packed words keeping few documents skip the bit-sliced sum (~0.5 ms at 10M
documents, 7 AND+popcount passes over N/64 words): their positions come from the bits
anyway (the kernel gallops them), and their summed length is then a gather of their
lengths (``_prepare_bits``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..kernels import filter_stats as bm25_filter_numba
from ..kernels import packed_filtered as bm25_packed_filtered
from ..kernels.filter_stats import (
    bits_to_positions,
    clear_bits,
    count_bits,
    pack_mask,
    rank_directory,
    set_positions,
)
from . import filter as bm25_filter
from .filter import FEW_SURVIVORS_DIV, NO_KNOWN, PackedFilter, Survivors
from .packed_filter_support import PackedFilterSupport, support
from .stats_query import NO_STACK, StackArgs, check_stack
from .topk import ScoredDocs

# Survivors up to N / this: their summed length is gathered from their positions (random
# reads of one-byte lengths), not summed from the bit-sliced lengths (N/64 words x 7).
GATHER_LENGTHS_DIV = 512
_NO_SLICES = np.zeros((0, 1), np.uint64)
_NO_CODES = np.zeros(0, np.uint32)
# Dense filters (more than N / FEW_SURVIVORS_DIV survivors) and the filtered window kernel
# (bm25_packed_filtered_windows): 1 routes each query (bm25_packed_filtered_windows.
# windows_suit), 0 keeps every one on the term-at-a-time route, 2 sends every one to the
# window kernel (tests and benchmarks compare the routes; all give the same answers).
WINDOWS = 1

# The index (a PackedBM25Index) is typed Any: importing bm25_packed_index here, even for
# type checking, would close an import cycle (it imports this module for filtered queries).


def search(ix: Any, tids: np.ndarray, k: int, candidates: Any, stack: StackArgs = NO_STACK) -> ScoredDocs:
    """Exact filtered top-k of the known query term ids ``tids`` (non-empty, k > 0) under
    ``candidates``, with a stack's statistics when ``stack`` has some
    (``index.stats_query``); raises ValueError for a malformed filter
    (``index.filter.prepare``) or statistics that cannot hold this index's survivors."""
    ids, scores, _ = run(ix, tids, k, candidates, stack)
    return ScoredDocs(ids, scores)


def run(ix: Any, tids: np.ndarray, k: int, candidates: Any,
        stack: StackArgs = NO_STACK) -> tuple[np.ndarray, np.ndarray, Survivors]:
    """The filtered kernel's (ids, scores), or with ``k == 0`` (survivor df per distinct
    term, empty), and the survivors it ran over."""
    sup = support(ix)
    sup.ensure_terms(tids)
    sc = ix._scratch
    surv = bm25_filter.remembered(candidates, sup, lambda: _prepare(ix, sup, candidates, sc), ix.n_terms)
    try:
        if stack.shape[0]:
            check_stack(stack, surv)
        ids, scores = bm25_packed_filtered.search_filtered(
            ix._pk, surv.bits, surv.positions, surv.n, surv.total, tids, ix._weights(), k, sc.acc, sc.touched,
            ix._w_max, sup.lengths(), sup.t_maxtf, sup.t_minlen, sup.rank_dir, sup.code_lengths(), WINDOWS,
            surv.known, stack)
    finally:
        if surv.scratch_set is not None:
            bm25_filter_numba.clear_bits(surv.scratch_set, surv.bits)
    return ids, scores, surv


def _prepare(ix: Any, sup: PackedFilterSupport, candidates: Any, sc: Any) -> Survivors:
    surv = _prepare_bits(ix, sup, candidates, sc)
    if surv is None:  # positions: O(their number) already
        surv = bm25_filter.prepare(ix, bm25_filter_numba, candidates, sc)  # type: ignore[arg-type]
    return surv


def _prepare_bits(ix: Any, sup: PackedFilterSupport, candidates: Any, sc: Any) -> Survivors | None:
    """``index.filter.prepare`` for a bool mask or packed words (None for positions), with
    the few survivors' summed length gathered from their positions; raises what
    ``prepare`` raises for a malformed filter."""
    n_docs = ix.n_docs
    if isinstance(candidates, PackedFilter):
        bm25_filter.check(candidates, n_docs)
        bits = np.ascontiguousarray(candidates.words)
        n = int(bm25_filter_numba.count_bits(bits))
    elif isinstance(candidates, np.ndarray) and candidates.dtype == np.bool_:
        bm25_filter.check(candidates, n_docs)
        cand = np.ascontiguousarray(candidates)
        bits = sc.mask_bits
        n = int(bm25_filter_numba.pack_mask(cand[: n_docs // 8 * 8].view(np.uint64), cand, _NO_SLICES, bits)[0])
    else:
        return None
    pos = _NONE
    if 0 < n <= n_docs // FEW_SURVIVORS_DIV:
        pos = np.empty(n, np.int64)
        bm25_filter_numba.bits_to_positions(bits, pos)
    if n <= n_docs // GATHER_LENGTHS_DIV:
        total = int(sup.lengths()[pos].sum(dtype=np.int64))
    else:
        total = int(bm25_filter_numba.sliced_total(bits, sup.slices()))
    return Survivors(n, total, bits, pos, None)


_NONE = np.zeros(0, np.int64)


def warm(pk: tuple[Any, ...], wt: tuple[Any, ...], w_max: tuple[np.ndarray, ...], n_docs: int,
         lengths: np.dtype) -> None:
    """Compile the filtered kernel for a tiny index's read-only arrays (``pk``, ``wt`` as
    ``PackedBM25Index`` passes them), positions given or not, with the compact lengths
    (``PackedFilterSupport.lengths``) of dtype ``lengths``: the one width a file's queries
    use, so a process compiles and loads no other (each width is a compile of ~15 s)."""
    words = (n_docs + 63) // 64
    bits = np.zeros(words, np.uint64)
    mask = np.ones(n_docs, np.bool_)
    pack_mask(mask[: n_docs // 8 * 8].view(np.uint64), mask, np.zeros((1, words), np.uint64), bits)
    pos = np.arange(n_docs, dtype=np.int64)
    bits_to_positions(bits, pos)
    bits[:] = 0
    set_positions(pos, pk[8], bits, True)
    n = int(count_bits(bits))
    rank_directory(pk[12][0], np.zeros(words, np.uint32))
    acc, touched = np.zeros(n_docs), np.zeros(n_docs, np.int32)
    t_stat = np.ones(max(len(pk[1]) - 1, 1), np.uint32)
    rank_dir = np.zeros((max(pk[12].shape[0], 1), 1), np.uint32)
    q = np.zeros(1, np.int64)
    lens = pk[8].astype(lengths)
    for surv in (pos, pos[:0]):
        bm25_packed_filtered.search_filtered(pk, bits, surv, n, int(np.sum(pk[8])), q, wt, 1, acc, touched, w_max,
                                             lens, t_stat, t_stat, rank_dir, _NO_CODES, 1, NO_KNOWN, NO_STACK)
    clear_bits(pos, bits)
