"""Okapi BM25: the precomputed postings index (and, re-exported, the reference scorer).

``bm25_scores`` (``index.reference``) is the readable reference. ``BM25Index`` tokenizes the
corpus once (``index.postings``) and keeps CSC postings with, per posting, the exact float64
saturation factor of the full corpus and the raw term frequency. An unfiltered query is
then slices, one multiply and one scatter-add; a filtered query re-derives N, df and avgdl
over the surviving candidates from the raw tf. Both equal the reference to 1e-9. Per
posting that is 13 bytes (int32 id + float64 + uint8 tf) against bm25s's 8.

Top-k queries run the compiled kernels (``kernels.loader``, numba: MaxScore-pruned when
unfiltered, survivor-statistics when filtered, ``search_batch`` in parallel) when numba
imports; otherwise, or with ``kernel="numpy"``, the vectorized numpy path
(``index.numpy_search``) with MaxScore pruning. Both are tested against the reference.

The same class serves an index opened from its published files (``index.mapped``): the
arrays are then read-only memory maps and the vocabulary a mapped hash table.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ....cpus import usable_cpus
from ..kernels import loader as bm25_kernel
from . import filter as bm25_filter
from . import numpy_search as bm25_numpy
from .base import IndexBase
from .corpus_stats import CorpusStats
from .filter import FilterSupport, PackedFilter, Survivors
from .pool import (
    POSTINGS_PER_THREAD,
    BatchArrays,
    batch_one_by_one,
    batch_pool,
    empty_batch,
    run_batch,
)
from .postings import BITSET_DF_FRACTION, BLOCK_SIZE, Postings, build_postings
from .reference import DEFAULT_B, DEFAULT_BM25_B, DEFAULT_BM25_K1, DEFAULT_K1, bm25_idf, bm25_scores
from .stats_query import NO_STACK, StackArgs, check_stack
from .topk import DENSE, ScoredDocs, empty_scored, top_k, top_k_dense

__all__ = [
    "BITSET_DF_FRACTION", "BITSET_MIN_DOCS", "BLOCK_SIZE", "DEFAULT_B", "DEFAULT_BM25_B", "DEFAULT_BM25_K1",
    "DEFAULT_K1", "EXHAUSTIVE_MAX_DOCS", "KERNELS", "MAXSCORE_MIN_DOCS", "BM25Index", "PackedFilter", "ScoredDocs",
    "bm25_idf", "bm25_scores",
]

MAXSCORE_MIN_DOCS = 50_000
# Compiled kernel: corpora up to this size score every posting of a broad query in one
# scatter + one sequential selection pass instead of MaxScore (measured: ~3x faster on
# Cranfield / CMRC-sized corpora, where pruning bookkeeping costs more than it saves).
EXHAUSTIVE_MAX_DOCS = 32_768
KERNELS = ("auto", "numba", "numpy")
BITSET_MIN_DOCS = 65_536  # corpora from this size get bitsets of their longest lists
# Older private names, kept for callers that reached them here.
_DENSE = DENSE
_top_k, _top_k_dense, _batch_pool = top_k, top_k_dense, batch_pool
_usable_cpus = usable_cpus  # the kernels' thread count (tests patch it)
_POSTINGS_PER_THREAD = POSTINGS_PER_THREAD  # batch work per extra thread (tests patch it)


class BM25Index(IndexBase):
    """Postings index whose scores equal ``bm25_scores`` over the same candidates.

    Doc positions are the order of ``docs_tokens``; ties are broken by ascending
    position, so callers that sort their documents by id get id-ascending ties.
    """

    def __init__(
        self,
        docs_tokens: Sequence[Sequence[str]],
        *,
        k1: float = DEFAULT_K1,
        b: float = DEFAULT_B,
        kernel: str = "auto",
    ) -> None:
        _check_params(k1, b, kernel)
        postings, vocab = build_postings(docs_tokens, float(k1), float(b), BITSET_MIN_DOCS)
        self._adopt(postings, vocab, k1, b, kernel)

    @classmethod
    def from_postings(cls, postings: Postings, vocab: Any, *, k1: float, b: float,
                      kernel: str = "auto") -> BM25Index:
        """An index over arrays built earlier (or memory-mapped from published files).

        ``vocab`` maps a token to its term id through ``get(token, default)`` and has a
        ``len``; ``k1`` and ``b`` must be the ones ``postings.w`` was computed with.
        """
        _check_params(k1, b, kernel)
        self = cls.__new__(cls)
        self._adopt(postings, vocab, k1, b, kernel)
        return self

    def _adopt(self, p: Postings, vocab: Any, k1: float, b: float, kernel: str,
               total_len: int | None = None) -> None:
        """Take the arrays; ``total_len`` (the summed lengths) when known, so a mapped index
        does not read every document length to open."""
        self.k1 = float(k1)
        self.b = float(b)
        self.vocab = vocab
        self.indptr, self.indices, self.tf, self.w, self.df = p.indptr, p.indices, p.tf, p.w, p.df
        self.doc_len = self._doc_len32 = p.doc_len
        self._idf_full, self._w_max, self._bptr, self._bmax = p.idf, p.w_max, p.bptr, p.bmax
        self._bit_row, self._bits = p.bit_row, p.bits
        self.n_docs = int(len(p.doc_len))
        self.total_len = int(p.doc_len.sum(dtype=np.int64)) if total_len is None else int(total_len)
        self.avgdl = self.total_len / self.n_docs if self.n_docs else 0.0
        # The avgdl ``w`` (and its maxima, the filtered kernel's bounds) was computed at: the
        # index's own, or a segment file's corpus's (``index.mapped.open_index`` sets it).
        self._w_avgdl = self.avgdl
        compiled = None if kernel == "numpy" else bm25_kernel.load_kernels()
        if kernel == "numba" and compiled is None:
            raise RuntimeError("kernel='numba' needs numba, which could not be imported or compiled "
                               "(pip install 'numba>=0.60')")
        self._kernels = compiled
        self._exhaustive_docs = EXHAUSTIVE_MAX_DOCS
        self._scratch = bm25_kernel.Scratch(self.n_docs) if compiled is not None else None

    def postings(self) -> Postings:
        """The index's arrays as one record (what ``format.file.write_index`` writes)."""
        return Postings(indptr=self.indptr, indices=self.indices, tf=self.tf, w=self.w, df=self.df,
                        doc_len=self._doc_len32, idf=self._idf_full, w_max=self._w_max, bptr=self._bptr,
                        bmax=self._bmax, bit_row=self._bit_row, bits=self._bits)

    @property
    def nbytes(self) -> int:
        return int(sum(a.nbytes for a in self.postings().arrays().values()))

    # ----------------------------------------------------------------- scoring
    def _doc_lengths_read(self) -> None:
        """Hook before a query reads every document length (a filter): the mapped index
        verifies the lengths' checksums there; built arrays need nothing."""

    def _accumulate(self, query_tokens: Sequence[str], mask: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        """(doc positions, scores) of every matching candidate (``index.numpy_search.accumulate``)."""
        return bm25_numpy.accumulate(self, self._query_term_ids(query_tokens), mask)

    def _maxscore(self, query_tokens: Sequence[str], k: int) -> ScoredDocs | None:
        """Exact MaxScore-pruned top-k, or None when pruning would not pay (``index.numpy_search``)."""
        return bm25_numpy.maxscore(self, self._query_term_ids(query_tokens), k, MAXSCORE_MIN_DOCS)

    def search(
        self,
        query_tokens: Sequence[str],
        k: int = 10,
        candidates: np.ndarray | PackedFilter | None = None,
        *,
        stats: CorpusStats | None = None,
    ) -> ScoredDocs:
        """Top-``k`` matching docs by (-score, position); only docs with score > 0.

        ``candidates`` (a filter): a bool mask over the index positions, the surviving
        positions (any order; a selective filter given as positions costs O(survivors)),
        or a ``PackedFilter`` (packed bits: no packing pass).

        ``stats`` (this index as one part of a stack: ``index.stats_query``): the filtered
        query over ``candidates`` (None: every document) scored with the stack's N, df
        (``stats.df``, one per query token) and avgdl (``stats.total / stats.n``) instead
        of the survivors' own; k1 and b stay the index's. With the statistics of
        ``survivor_stats`` the answer is the filtered query's, bit for bit. ValueError
        when they cannot include this index's survivors.
        """
        if stats is not None:
            return self._stack_search(query_tokens, k, candidates, stats)
        if k > 0 and self._kernels is not None:
            return self._search_compiled(query_tokens, k, candidates)
        mask = self._as_mask(candidates)
        if mask is None and k > 0:
            pruned = self._maxscore(query_tokens, k)
            if pruned is not None:
                return pruned
        ids, sc = self._accumulate(query_tokens, mask)
        if ids is DENSE:
            return top_k_dense(sc, k)
        return top_k(ids, sc, k)

    def _stack_accumulate(self, term_ids: list[int], mask: np.ndarray,
                          stack: StackArgs) -> tuple[np.ndarray, np.ndarray]:
        return bm25_numpy.accumulate(self, term_ids, mask, stack)

    def search_batch_arrays(self, queries: Sequence[Sequence[str]], k: int = 10, *,
                            threads: int | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The batch as arrays, for vectorized consumers: (ids[nq, k] padded with -1,
        scores[nq, k] padded with 0, counts[nq]); row i equals ``search(queries[i], k)``.

        Token -> term id for the whole batch runs in C-level loops (tokens outside the
        vocabulary become -1 and the kernel skips them). Extra threads start only when the
        batch's postings pay for them; the first chunk runs on the calling thread, the rest
        on one process-wide pool.
        """
        nq = len(queries)
        kk = max(int(k), 0)
        if kk == 0 or nq == 0 or self.avgdl == 0:
            return empty_batch(nq, kk)
        if self._kernels is None:
            return batch_one_by_one(self.search, queries, kk)
        kernel = self._kernels.search_batch

        def run(flat: np.ndarray, ptr: np.ndarray) -> BatchArrays:
            return kernel(self.indptr, self.indices, self.w, self._idf_full, self._w_max, flat, ptr,
                          self.k1 + 1.0, kk, self.n_docs, self._exhaustive_docs, self._bptr, self._bmax)

        return run_batch(queries, self.vocab.get, lambda known: self.df[known].sum(),
                         int(threads or _usable_cpus()), _POSTINGS_PER_THREAD, run)

    def _search_compiled(self, query_tokens: Sequence[str], k: int, candidates: np.ndarray | PackedFilter | None) -> ScoredDocs:
        """Top-k through the compiled kernels (pruned unfiltered, or survivor statistics)."""
        tids = self._compiled_terms(query_tokens, candidates)
        if tids is None:
            return empty_scored()
        sc = self._scratch
        kern = self._kernels
        if candidates is None:
            ids, scores = kern.search_one(self.indptr, self.indices, self.w, self._idf_full, self._w_max, tids,
                                          self.k1 + 1.0, int(k), sc.acc, sc.touched, self._exhaustive_docs,
                                          self._bptr, self._bmax)
            return ScoredDocs(ids, scores)
        ids, scores, _ = self._filtered_run(tids, int(k), candidates)
        return ScoredDocs(ids, scores)

    def _filtered_run(self, tids: np.ndarray, k: int, candidates: np.ndarray | PackedFilter,
                      stack: StackArgs = NO_STACK) -> tuple[np.ndarray, np.ndarray, Survivors]:
        """The filtered kernel over the prepared (or remembered) survivors: its (ids,
        scores), or with ``k == 0`` (survivor df per distinct term, empty); and the survivors."""
        sc = self._scratch
        kern = self._kernels
        sup = self.filter_support()
        sup.ensure_terms(kern, tids)
        surv = bm25_filter.remembered(candidates, sup, lambda: bm25_filter.prepare(self, kern, candidates, sc),
                                      len(self.df))
        try:
            if stack.shape[0]:
                check_stack(stack, surv)
            ids, scores = kern.search_filtered(
                self.indptr, self.indices, self.tf, sup.lengths(), surv.bits, surv.positions, surv.n, surv.total,
                tids, self._bit_row, self._bits, sup.rank_dir, self.k1, self.b, k, sc.acc, sc.touched,
                self._w_max, self._w_avgdl, self._bptr, self._bmax, sup.blk_tf, sup.blk_len, sup.t_maxtf,
                sup.t_minlen, surv.known, stack)
        finally:
            if surv.scratch_set is not None:
                kern.clear_bits(surv.scratch_set, surv.bits)
        return ids, scores, surv

    def filter_support(self) -> FilterSupport:
        """The lazily built helpers of this index's filtered queries (``index.filter``),
        created on the first filtered query; ``dict.setdefault`` is atomic: threads racing
        on the first query keep one."""
        sup = self.__dict__.get("_filter_support")
        if sup is None:
            sup = self.__dict__.setdefault("_filter_support", FilterSupport(self.postings()))
        return sup

    @property
    def idf(self) -> np.ndarray:
        """Each term's idf over the full corpus (what ``w`` was scaled by at build)."""
        return self._idf_full

    @property
    def w_max(self) -> np.ndarray:
        """Each term's largest ``w``: its MaxScore bound before the idf."""
        return self._w_max

    def _as_mask(self, candidates: np.ndarray | PackedFilter | None) -> np.ndarray | None:
        if candidates is None:
            return None
        self._doc_lengths_read()
        return candidate_mask(candidates, self.n_docs)


def candidate_mask(candidates: Any, n_docs: int) -> np.ndarray:
    """A filter as a bool mask over ``n_docs`` positions (given as a mask, as positions or
    as a ``PackedFilter``)."""
    if isinstance(candidates, PackedFilter):
        return candidates.to_mask(n_docs)
    cand = np.asarray(candidates)
    if cand.dtype == bool:
        if cand.shape != (n_docs,):
            raise ValueError("candidate mask must have one entry per indexed document")
        return cand
    pos = cand.astype(np.int64)
    if pos.size and (int(pos.min()) < 0 or int(pos.max()) >= n_docs):
        raise ValueError(f"candidate positions must lie in 0..{n_docs - 1}")
    mask = np.zeros(n_docs, dtype=bool)
    mask[pos] = True
    return mask


def _check_params(k1: float, b: float, kernel: str) -> None:
    if k1 < 0 or not (0.0 <= b <= 1.0):
        raise ValueError(f"BM25 needs k1 >= 0 and 0 <= b <= 1 (got k1={k1}, b={b})")
    if kernel not in KERNELS:
        raise ValueError(f"unknown BM25 kernel {kernel!r}; available: {', '.join(KERNELS)}")
