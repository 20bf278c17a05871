"""Deterministic numpy top-k selection shared by the numpy scoring path.

Selection is kept apart from scoring (as bm25s does): both the sparse and the dense
accumulators end here, and the tie rule (score descending, then doc position ascending)
lives in one place.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class ScoredDocs:
    """Top documents of one query: internal doc positions and their scores (desc)."""

    ids: np.ndarray  # int64 doc positions
    scores: np.ndarray  # float64


def empty_scored() -> ScoredDocs:
    """No match: the result of a query with no known term or no survivor."""
    return ScoredDocs(np.zeros(0, np.int64), np.zeros(0, np.float64))


# Sentinel ids: the accumulator returned a corpus-sized dense score vector instead.
DENSE = np.zeros(0, np.int64)


def top_k_dense(acc: np.ndarray, k: int) -> ScoredDocs:
    """Top-k straight on a corpus-sized score vector (no gather of the matches first)."""
    n = len(acc)
    if k <= 0 or n == 0:
        return empty_scored()
    if k < n:
        kth = acc[np.argpartition(acc, n - k)[n - k:]].min()
        sel = np.flatnonzero(acc >= kth) if kth > 0 else np.flatnonzero(acc)
    else:
        sel = np.flatnonzero(acc)
    return top_k(sel, acc[sel], k)


def top_k(ids: np.ndarray, scores: np.ndarray, k: int) -> ScoredDocs:
    """Deterministic top-k: score descending, then doc position ascending.

    argpartition alone picks arbitrarily among ties at the cut; here every doc whose
    score equals the k-th score is kept before the exact (score, id) sort.
    """
    pos = scores > 0
    if not pos.all():
        ids, scores = ids[pos], scores[pos]
    if k <= 0 or len(ids) == 0:
        return empty_scored()
    if len(ids) > max(k, 512):
        part = np.argpartition(-scores, k - 1)[:k]
        kth = scores[part].min()
        sel = np.flatnonzero(scores >= kth)
        ids, scores = ids[sel], scores[sel]
    order = np.lexsort((ids, -scores))[:k]
    return ScoredDocs(ids[order].astype(np.int64), scores[order])


TIE_REL = 1e-12  # BM25 scores this close (relative) are one tie, ordered by position


def merge_top_k(ids: np.ndarray, scores: np.ndarray, k: int) -> ScoredDocs:
    """Top-k of BM25 candidates gathered from several segments or shards, by (score desc,
    position asc), where scores within ``TIE_REL`` of each other are one tie.

    Why: a segment's compiled kernel sums a document's terms in the order of that
    segment's own impact bounds, so two copies of one text in different segments can score
    one ulp apart (measured: 3.6e-15 on SciFact x10), where the single index gives them the
    same bits and orders them by position. Ordering near-ties by position gives the single
    index's order; the scores themselves still agree to ~1e-14.
    """
    if len(ids) <= MERGE_SMALL:
        return _merge_small(ids, scores, k)
    keep = scores > 0
    ids, scores = ids[keep].astype(np.int64), scores[keep].astype(np.float64)
    if k <= 0 or not len(ids):
        return empty_scored()
    order = np.lexsort((ids, -scores))
    ids, scores = ids[order], scores[order]
    gap = (scores[:-1] - scores[1:]) > TIE_REL * np.maximum(1.0, np.abs(scores[:-1]))
    group = np.r_[0, np.cumsum(gap)]
    order = np.lexsort((ids, group))[:k]
    return ScoredDocs(ids[order], scores[order])


# Candidates up to this many merge in Python: a stack's or shards' few top-k lists, where a
# dozen numpy calls cost ~50 us of a ~200 us query (profiled on a two-segment stack).
MERGE_SMALL = 256


def _merge_small(ids: np.ndarray, scores: np.ndarray, k: int) -> ScoredDocs:
    """``merge_top_k`` of a few candidates, with the same order: by score desc, a chain of
    gaps within ``TIE_REL`` one group, each group by position."""
    pairs = sorted((-s, i) for s, i in zip(np.asarray(scores, np.float64).tolist(),
                                           np.asarray(ids, np.int64).tolist(), strict=True) if s > 0)
    if k <= 0 or not pairs:
        return empty_scored()
    out: list[tuple[int, int, float]] = []  # (group, position, score)
    group, prev = 0, -pairs[0][0]
    for neg, i in pairs:
        s = -neg
        if prev - s > TIE_REL * max(1.0, abs(prev)):
            group += 1
        out.append((group, i, s))
        prev = s
    out.sort()
    out = out[:k]
    return ScoredDocs(np.array([i for _, i, _ in out], np.int64), np.array([s for _, _, s in out], np.float64))
