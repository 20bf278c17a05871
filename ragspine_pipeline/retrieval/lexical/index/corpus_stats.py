"""Corpus statistics handed to an index that is one part of a larger corpus.

Why: a refresh that writes only what changed publishes a version as a stack of immutable
segments (the previous versions' files, a small segment of the chunks added or changed,
and per segment the rows still live; ``refresh.stack``), as Lucene does. The spec scores a
query with N, df and avgdl of the whole (filtered) corpus, so each segment must score its
postings with the stack's statistics, not its own. A segment first reports its part
(``survivor_stats``: its survivors' count, summed length and df of each query token), the
parts are summed (``+``), and each segment then scores with the sum
(``search(..., stats=...)``). Summing integers is exact, so the stack's scores are those of
one index over the same documents, bit for bit in the reference formula's terms.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class CorpusStats:
    """N, summed length and per-query-token df of some documents.

    ``df`` has one int64 entry per query token of the call it belongs to, in the query's
    order (a repeated token repeats its df; a token no document holds has 0)."""

    n: int
    total: int
    df: np.ndarray

    def __add__(self, other: CorpusStats) -> CorpusStats:
        if self.df.shape != other.df.shape:
            raise ValueError(f"statistics of different queries ({len(self.df)} vs {len(other.df)} tokens)")
        return CorpusStats(self.n + other.n, self.total + other.total, self.df + other.df)

    @staticmethod
    def zero(n_tokens: int) -> CorpusStats:
        return CorpusStats(0, 0, np.zeros(n_tokens, np.int64))
