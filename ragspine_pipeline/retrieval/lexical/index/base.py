"""What the two index layouts share: ``BM25Index`` (plain postings, built or mapped) and
``PackedBM25Index`` (block-packed postings, mapped) answer the same query API.

Why a base: both layouts had their own copies of the batch entry point, the dense score
vector, the term-id lookup and the stack-statistics queries, which differ only in the
calls below them (the kernel, the numpy path). Each layout now implements those calls:

* ``_search_compiled`` / ``search_batch_arrays``: its compiled kernels;
* ``_accumulate`` / ``_stack_accumulate``: its numpy path (``index.numpy_search``);
* ``_filtered_run``: its filtered kernel over prepared survivors;
* ``_as_mask`` / ``_doc_lengths_read``: a filter as a bool mask, the lengths' first check;
* ``filter_support``: the lazily built helpers of its filtered queries.

The stack-statistics queries (one index of a stack scored with the stack's N, df and
avgdl: ``index.stats_query``) are written once here, over those calls.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from . import filter as bm25_filter
from .corpus_stats import CorpusStats
from .filter import PackedFilter
from .pool import batch_rows
from .stats_query import NO_STACK, StackArgs, known_tokens, stack_args
from .topk import DENSE, ScoredDocs, empty_scored, top_k, top_k_dense

__all__ = ["IndexBase"]


class IndexBase:
    """The query API both layouts share; a subclass sets the attributes below and
    implements the layout's calls (see the module docstring)."""

    vocab: Any
    indptr: np.ndarray
    indices: Any
    doc_len: np.ndarray
    n_docs: int
    total_len: int
    avgdl: float
    _kernels: Any

    # ------------------------------------------------------------ shape
    @property
    def kernel(self) -> str:
        """Which top-k path queries take: "numba" (compiled) or "numpy"."""
        return "numba" if self._kernels is not None else "numpy"

    def _query_term_ids(self, query_tokens: Sequence[str]) -> list[int]:
        """The term ids of the query tokens the vocabulary knows, in query order."""
        get = self.vocab.get
        return [t for t in (get(q) for q in query_tokens) if t is not None]

    def _compiled_terms(self, query_tokens: Sequence[str], candidates: Any) -> np.ndarray | None:
        """The query's known term ids for a compiled search, or None when it can match
        nothing (no known term, or no text in the index): then a filter is still checked
        (a malformed one is an error whatever the query). Under a filter the document
        lengths are read first (the survivors' statistics need them)."""
        tids = np.array(self._query_term_ids(query_tokens), np.int64)
        if candidates is not None:
            self._doc_lengths_read()
        if not len(tids) or self.avgdl == 0:
            if candidates is not None:
                bm25_filter.check(candidates, self.n_docs)
            return None
        return tids

    # ------------------------------------------------------------ the layout's calls
    def _doc_lengths_read(self) -> None:
        """Hook before a query reads every document length (a filter)."""

    def _as_mask(self, candidates: Any) -> np.ndarray | None:
        raise NotImplementedError

    def _accumulate(self, query_tokens: Sequence[str], mask: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        raise NotImplementedError

    def _stack_accumulate(self, term_ids: list[int], mask: np.ndarray,
                          stack: StackArgs) -> tuple[np.ndarray, np.ndarray]:
        raise NotImplementedError

    def _filtered_run(self, tids: np.ndarray, k: int, candidates: Any,
                      stack: StackArgs = NO_STACK) -> tuple[np.ndarray, np.ndarray, Any]:
        raise NotImplementedError

    def search(self, query_tokens: Sequence[str], k: int = 10, candidates: Any = None, *,
               stats: CorpusStats | None = None) -> ScoredDocs:
        raise NotImplementedError

    def search_batch_arrays(self, queries: Sequence[Sequence[str]], k: int = 10, *,
                            threads: int | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        raise NotImplementedError

    # ------------------------------------------------------------ shared queries
    def get_scores(self, query_tokens: Sequence[str], candidates: Any = None) -> np.ndarray:
        """Dense score vector over all docs (0 outside the candidate mask)."""
        mask = self._as_mask(candidates)
        ids, sc = self._accumulate(query_tokens, mask)
        if ids is DENSE:
            return sc
        out = np.zeros(self.n_docs, dtype=np.float64)
        out[ids] = sc
        return out

    def search_batch(self, queries: Sequence[Sequence[str]], k: int = 10, *,
                     threads: int | None = None) -> list[ScoredDocs]:
        """``search(q, k)`` for each unfiltered query, in one call; results equal ``search``'s.

        The compiled kernel runs the whole batch without the GIL and without per-query
        Python work (``search_batch_arrays``); ``threads`` (default: the CPUs this process
        may use) splits the batch into at most that many chunks run on Python threads.
        """
        if k <= 0 or not queries:
            return [empty_scored() for _ in queries]
        if self._kernels is None or self.avgdl == 0:
            return [self.search(q, k) for q in queries]
        return batch_rows(self.search_batch_arrays(queries, k, threads=threads))

    def survivor_stats(self, query_tokens: Sequence[str], candidates: Any = None) -> CorpusStats:
        """The documents ``candidates`` keeps (any form ``search`` takes; None: all): their
        count, summed length and, per query token in order, how many contain it: this
        index's part of a stack's statistics (``CorpusStats``, summed with ``+``). Counted
        by the filtered kernel's own routes (a reused ``PackedFilter`` costs no pass over
        N and shares its df cache with the queries)."""
        tids, pos = known_tokens(self.vocab.get, query_tokens)
        out = np.zeros(len(query_tokens), np.int64)
        if candidates is None:  # every document: the index's own counts, no pass
            out[pos] = self.indptr[tids + 1] - self.indptr[tids]
            return CorpusStats(int(self.n_docs), int(self.total_len), out)
        seen: dict[int, int] = {}
        inv = np.array([seen.setdefault(t, len(seen)) for t in tids.tolist()], np.int64)
        ut = np.array(list(seen), np.int64)
        self._doc_lengths_read()
        if self._kernels is None:
            mask = self._as_mask(candidates)
            assert mask is not None
            n, total = int(np.count_nonzero(mask)), int(self.doc_len[mask].sum(dtype=np.int64))
            dfs = np.array([np.count_nonzero(mask[self.indices[self.indptr[t]:self.indptr[t + 1]]])
                            for t in ut.tolist()], np.int64)
        else:
            dfs, _, surv = self._filtered_run(ut, 0, candidates, NO_STACK)
            n, total = int(surv.n), int(surv.total)
            if len(dfs) != len(ut):  # no survivor, or none with a token: the kernel stopped before counting
                dfs = np.zeros(len(ut), np.int64)
        out[pos] = dfs[inv]
        return CorpusStats(n, total, out)

    def _stack_search(self, query_tokens: Sequence[str], k: int, candidates: Any,
                      stats: CorpusStats) -> ScoredDocs:
        """``search(query_tokens, k, candidates, stats=stats)``: the filtered query over
        ``candidates`` (None: every document) with the stack's N, df and avgdl."""
        tids, pos = known_tokens(self.vocab.get, query_tokens)
        stack = stack_args(stats, len(query_tokens), pos)
        if candidates is None:
            candidates = self._every_doc()
        self._doc_lengths_read()
        if k <= 0 or not len(tids) or self.avgdl == 0:
            bm25_filter.check(candidates, self.n_docs)
            return empty_scored()
        if self._kernels is None:
            mask = self._as_mask(candidates)
            assert mask is not None
            ids, sc = self._stack_accumulate(tids.tolist(), mask, stack)
            return top_k_dense(sc, k) if ids is DENSE else top_k(ids, sc, k)
        ids, scores, _ = self._filtered_run(tids, int(k), candidates, stack)
        return ScoredDocs(ids, scores)

    def _every_doc(self) -> PackedFilter:
        """Every document as a filter, made once per index and reused (so the survivors
        and df cache are remembered: ``index.filter.remembered``): what a stack's
        ``candidates=None`` means."""
        f = self.__dict__.get("_every_doc_filter")
        if f is None:
            f = PackedFilter.from_mask(np.ones(self.n_docs, np.bool_))
            self._every_doc_filter = f
        return f
