"""Reciprocal Rank Fusion (Cormack et al., 2009)."""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence

DEFAULT_RRF_K = 60


def rrf_fuse(
    rankings: Iterable[Sequence[Hashable]], k: int = DEFAULT_RRF_K
) -> list[tuple[Hashable, float]]:
    """Fuse ranked id lists: score(id) += 1 / (k + rank), rank counted from 1.

    An id repeated within one ranking counts at its best rank only. The result is
    sorted by (-score, id) so equal fused scores come out in id order, deterministically.
    """
    if k < 0:
        raise ValueError(f"rrf k must be >= 0 (got {k})")
    scores: dict[Hashable, float] = {}
    for ranking in rankings:
        seen: set[Hashable] = set()
        for rank, item in enumerate(ranking, start=1):
            if item in seen:
                continue
            seen.add(item)
            scores[item] = scores.get(item, 0.0) + 1.0 / (k + rank)
    return sorted(scores.items(), key=lambda kv: (-kv[1], kv[0]))
