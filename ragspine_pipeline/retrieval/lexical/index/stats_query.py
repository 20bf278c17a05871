"""One index of a stack, queried with the stack's statistics (refresh segments, #27 item 1).

Why: a version published as a stack of immutable files (an old base, a small delta, each
with the rows still live) must score a query with N, df and avgdl of all the stack's
surviving documents, as one index over them would (the spec's filtered semantics). Each
index reports its part (``survivor_stats``: a ``CorpusStats`` of its survivors), the
parts are summed, and each index then scores its own postings with the sum
(``search(..., stats=...)``). Both run the index's filtered kernel: the survivor df is
its own counting (same routes, same df cache of a reused ``PackedFilter``; ``k == 0``),
and a stack's statistics change only idf, avgdl and the bounds built on them, so an
index whose statistics are its own answers bit for bit as its filtered query.

Shared here by ``BM25Index`` (and the mapped plain index) and ``PackedBM25Index``; each
passes the calls that differ (its kernel, its numpy path).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from . import filter as bm25_filter
from .corpus_stats import CorpusStats
from .filter import PackedFilter
from .topk import DENSE, ScoredDocs, empty_scored, top_k, top_k_dense

# What the filtered kernels take: int64 [N, summed length, df per known query token...]
# (``stack_args``); empty: the survivors' own statistics.
StackArgs = np.ndarray
NO_STACK: StackArgs = np.zeros(0, np.int64)

# (term ids, k, filter, stack) -> the kernel's (ids, scores, survivors); k == 0: (df per distinct term, _, _)
Run = Callable[[np.ndarray, int, Any, StackArgs], tuple[np.ndarray, np.ndarray, Any]]
# (term ids, bool mask, stack) -> bm25_numpy.accumulate's (ids or DENSE, scores)
Accumulate = Callable[[list[int], np.ndarray, StackArgs], tuple[Any, np.ndarray]]


def known_tokens(get: Callable[[str], int | None], query_tokens: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """(term ids of the query tokens the vocabulary knows, in query order; their positions
    in the query)."""
    found = [(t, i) for i, t in enumerate(get(q) for q in query_tokens) if t is not None]
    return np.array([t for t, _ in found], np.int64), np.array([i for _, i in found], np.int64)


def stack_args(stats: CorpusStats, n_tokens: int, pos: np.ndarray) -> StackArgs:
    """``stats`` as the kernels take it: N, summed length, then df at the known tokens'
    positions, in a fresh writable int64 array (the one array type the kernels are
    compiled for)."""
    df = np.asarray(stats.df)
    if df.shape != (n_tokens,):
        raise ValueError(f"stack statistics hold {df.size} df for a query of {n_tokens} tokens")
    out = np.empty(2 + len(pos), np.int64)
    out[0], out[1], out[2:] = int(stats.n), int(stats.total), df[pos]
    return out


def check_stack(stack: StackArgs, surv: Any) -> None:
    """Raise ValueError when a stack's N or summed length cannot include this index's
    survivors (``surv.n`` / ``surv.total``): the caller's sums are wrong."""
    if len(stack) and surv.n > 0 and (stack[0] < surv.n or stack[1] < surv.total):
        raise ValueError(f"stack statistics (N={stack[0]}, length {stack[1]}) do not include this index's "
                         f"{surv.n} survivors (length {surv.total})")


def everything(ix: Any) -> PackedFilter:
    """Every document of ``ix`` as a filter, made once per index and reused (so the
    survivors and df cache are remembered: ``index.filter.remembered``): what a stack's
    ``candidates=None`` means."""
    f = ix.__dict__.get("_every_doc")
    if f is None:
        f = PackedFilter.from_mask(np.ones(ix.n_docs, np.bool_))
        ix._every_doc = f
    return f


def survivor_stats(ix: Any, query_tokens: Sequence[str], candidates: Any, run: Run) -> CorpusStats:
    """``ix``'s part of a stack's statistics (``BM25Index.survivor_stats``)."""
    tids, pos = known_tokens(ix.vocab.get, query_tokens)
    out = np.zeros(len(query_tokens), np.int64)
    if candidates is None:  # every document: the index's own counts, no pass
        out[pos] = ix.indptr[tids + 1] - ix.indptr[tids]
        return CorpusStats(int(ix.n_docs), int(ix.total_len), out)
    seen: dict[int, int] = {}
    inv = np.array([seen.setdefault(t, len(seen)) for t in tids.tolist()], np.int64)
    ut = np.array(list(seen), np.int64)
    ix._doc_lengths_read()
    if ix._kernels is None:
        mask = ix._as_mask(candidates)
        n, total = int(np.count_nonzero(mask)), int(ix._doc_len32[mask].sum(dtype=np.int64))
        dfs = np.array([np.count_nonzero(mask[ix.indices[ix.indptr[t]:ix.indptr[t + 1]]]) for t in ut.tolist()],
                       np.int64)
    else:
        dfs, _, surv = run(ut, 0, candidates, NO_STACK)
        n, total = int(surv.n), int(surv.total)
        if len(dfs) != len(ut):  # no survivor, or none with a token: the kernel stopped before counting
            dfs = np.zeros(len(ut), np.int64)
    out[pos] = dfs[inv]
    return CorpusStats(n, total, out)


def search(ix: Any, query_tokens: Sequence[str], k: int, candidates: Any, stats: CorpusStats, run: Run,
           accumulate: Accumulate) -> ScoredDocs:
    """``ix.search(query_tokens, k, candidates, stats=stats)``: the filtered query over
    ``candidates`` (None: every document) with the stack's N, df and avgdl."""
    tids, pos = known_tokens(ix.vocab.get, query_tokens)
    stack = stack_args(stats, len(query_tokens), pos)
    if candidates is None:
        candidates = everything(ix)
    ix._doc_lengths_read()
    if k <= 0 or not len(tids) or ix.avgdl == 0:
        bm25_filter.check(candidates, ix.n_docs)
        return empty_scored()
    if ix._kernels is None:
        ids, sc = accumulate(tids.tolist(), ix._as_mask(candidates), stack)
        return top_k_dense(sc, k) if ids is DENSE else top_k(ids, sc, k)
    ids, scores, _ = run(tids, int(k), candidates, stack)
    return ScoredDocs(ids, scores)
