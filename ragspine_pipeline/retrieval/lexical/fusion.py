"""Reciprocal Rank Fusion (Cormack et al., 2009)."""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence

DEFAULT_RRF_K = 60


def rrf_fuse(rankings: Iterable[Sequence[Hashable]], k: int = DEFAULT_RRF_K) -> dict[str, float]:
    """Fuse ranked id lists: score(id) += 1 / (k + rank), rank counted from 1.

    Returns ``{id: fused_score}`` whose iteration order is the fused ranking: by
    descending score, equal scores in id order, so ``list(result)`` is the fused list and
    ``next(iter(result))`` the best id. An id repeated within one ranking counts at its
    best rank only. Ids are chunk ids (``str``) in the spec; any mutually sortable
    hashable ids work (the multi-index fuses ``(library_id, chunk_id)`` pairs).
    """
    if isinstance(k, bool) or not isinstance(k, int | float) or k < 0:
        raise ValueError(f"rrf k must be a number >= 0 (got {k!r})")
    scores: dict[Hashable, float] = {}
    for ranking in rankings:
        seen: set[Hashable] = set()
        for rank, item in enumerate(ranking, start=1):
            if item in seen:
                continue
            seen.add(item)
            scores[item] = scores.get(item, 0.0) + 1.0 / (k + rank)
    return dict(sorted(scores.items(), key=lambda kv: (-kv[1], kv[0])))  # type: ignore[return-value]
