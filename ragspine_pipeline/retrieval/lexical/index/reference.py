"""The readable BM25 reference formula and its defaults.

Kept apart from the index and its kernels so that the one definition every path is tested
against reads in a page: statistics (N, df, avgdl) are taken over exactly the candidate
documents given, ``idf = ln(1 + (N - df + 0.5)/(df + 0.5))``, and every query token counts
(a repeated query token counts twice, as in Lucene's boolean sum and rank-bm25).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence

import numpy as np

DEFAULT_BM25_K1 = 1.5
DEFAULT_BM25_B = 0.75
# Short names used inside the package: the same objects.
DEFAULT_K1 = DEFAULT_BM25_K1
DEFAULT_B = DEFAULT_BM25_B


def bm25_idf(n_docs: int, df: int | np.ndarray) -> float | np.ndarray:
    """Non-negative BM25 idf: ln(1 + (N - df + 0.5) / (df + 0.5))."""
    if isinstance(df, np.ndarray):
        return np.log1p((n_docs - df + 0.5) / (df + 0.5))
    return math.log1p((n_docs - df + 0.5) / (df + 0.5))


def bm25_scores(
    query_tokens: Sequence[str],
    docs_tokens: Sequence[Sequence[str]],
    k1: float = DEFAULT_K1,
    b: float = DEFAULT_B,
) -> list[float]:
    """Reference BM25 score of every doc in ``docs_tokens`` for ``query_tokens``."""
    n = len(docs_tokens)
    if n == 0:
        return []
    tfs = [Counter(d) for d in docs_tokens]
    lens = [len(d) for d in docs_tokens]
    avgdl = sum(lens) / n
    if avgdl == 0:
        return [0.0] * n
    df: Counter[str] = Counter()
    for tf in tfs:
        df.update(tf.keys())
    scores = [0.0] * n
    for q in query_tokens:
        dfq = df.get(q, 0)
        if dfq == 0:
            continue
        idf = bm25_idf(n, dfq)
        for i, tf in enumerate(tfs):
            f = tf.get(q, 0)
            if f:
                norm = k1 * (1.0 - b + b * lens[i] / avgdl)
                scores[i] += idf * (f * (k1 + 1.0)) / (f + norm)
    return scores
