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

The queries themselves are ``IndexBase.survivor_stats`` / ``_stack_search``
(``index.base``), shared by both layouts; here are the statistics' form and checks.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .corpus_stats import CorpusStats

# What the filtered kernels take: int64 [N, summed length, df per known query token...]
# (``stack_args``); empty: the survivors' own statistics.
StackArgs = np.ndarray
NO_STACK: StackArgs = np.zeros(0, np.int64)


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
