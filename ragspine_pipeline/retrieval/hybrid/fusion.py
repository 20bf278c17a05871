"""Rank fusion: Reciprocal Rank Fusion (the spec's default) and two opt-in alternatives.

* ``rrf`` -- Cormack et al. (2009): score += 1 / (k + rank). The spec's fusion, k=60.
* ``weighted_rrf`` -- the same sum with a weight per channel (BM25 rankings weigh 1, dense
  rankings ``dense_weight``): lowers a channel measured to be weaker without dropping it.
* ``convex`` -- ``(1 - a) * bm25_norm + a * dense_norm`` over min-max normalised scores of
  each channel's candidates (Bruch et al., 2023, "An Analysis of Fusion Functions for
  Hybrid Retrieval": a tuned convex combination beats RRF when scores are calibrated).

Each channel may hold several rankings, one per query variant (the glossary's multi-query),
each with the variant's weight (``analysis.glossary.QueryVariant``): ``fuse_runs`` fuses them all,
a variant's weight multiplying its RRF terms (and, for ``convex``, its scores).

``RAGSPINE_FUSION=rrf|weighted_rrf|convex`` picks one (default ``rrf``);
``RAGSPINE_FUSION_DENSE_WEIGHT`` sets the weight (default: 1 for weighted_rrf, which is RRF,
0.5 for convex). ``RAGSPINE_EMBEDDING_BACKEND=auto`` may choose both per library from the
evaluation table (``retrieval/vector/auto_policy.py``). Every result lists the choice.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field

from ... import settings

DEFAULT_RRF_K = 60
FUSION_ENV = "RAGSPINE_FUSION"
FUSION_WEIGHT_ENV = "RAGSPINE_FUSION_DENSE_WEIGHT"
FUSION_METHODS = ("rrf", "weighted_rrf", "convex")


def _check_k(k: object) -> None:
    if isinstance(k, bool) or not isinstance(k, int | float) or k < 0:
        raise ValueError(f"rrf k must be a number >= 0 (got {k!r})")


def _sorted(scores: Mapping[Hashable, float]) -> dict:
    return dict(sorted(scores.items(), key=lambda kv: (-kv[1], kv[0])))  # type: ignore[return-value]


def rrf_fuse(rankings: Iterable[Sequence[Hashable]], k: int = DEFAULT_RRF_K) -> dict[str, float]:
    """Fuse ranked id lists: score(id) += 1 / (k + rank), rank counted from 1.

    Returns ``{id: fused_score}`` whose iteration order is the fused ranking: by
    descending score, equal scores in id order, so ``list(result)`` is the fused list and
    ``next(iter(result))`` the best id. An id repeated within one ranking counts at its
    best rank only. Ids are chunk ids (``str``) in the spec; any mutually sortable
    hashable ids work (the multi-index fuses ``(library_id, chunk_id)`` pairs).
    """
    _check_k(k)
    return weighted_rrf_fuse(((r, 1.0) for r in rankings), k=k)


def weighted_rrf_fuse(weighted: Iterable[tuple[Sequence[Hashable], float]],
                      k: int = DEFAULT_RRF_K) -> dict[str, float]:
    """RRF where each ranking carries a weight: score(id) += w / (k + rank).

    With every weight 1 this is exactly ``rrf_fuse`` (same floats, same order). A ranking
    of weight 0 contributes nothing (its ids still appear, at score 0, when no other
    ranking holds them -- they are dropped instead, so a zero weight is "not at all").
    """
    _check_k(k)
    scores: dict[Hashable, float] = {}
    for ranking, w in weighted:
        if not isinstance(w, int | float) or isinstance(w, bool) or not math.isfinite(w) or w < 0:
            raise ValueError(f"fusion weights must be finite numbers >= 0 (got {w!r})")
        if w == 0:
            continue
        seen: set[Hashable] = set()
        for rank, item in enumerate(ranking, start=1):
            if item in seen:
                continue
            seen.add(item)
            scores[item] = scores.get(item, 0.0) + (1.0 / (k + rank) if w == 1 else w / (k + rank))
    return _sorted(scores)


def minmax(scores: Mapping[Hashable, float]) -> dict[Hashable, float]:
    """Scores scaled to [0, 1] over the candidates given (all equal: all 1)."""
    if not scores:
        return {}
    lo, hi = min(scores.values()), max(scores.values())
    if hi <= lo:
        return dict.fromkeys(scores, 1.0)
    return {i: (s - lo) / (hi - lo) for i, s in scores.items()}


def convex_fuse(bm25: Mapping[Hashable, float], dense: Mapping[Hashable, float],
                dense_weight: float) -> dict[str, float]:
    """``(1 - a) * minmax(bm25) + a * minmax(dense)``; an id absent from a channel's
    candidates scores 0 there. Ordered like ``rrf_fuse`` (score desc, then id)."""
    a = float(dense_weight)
    if not math.isfinite(a) or not 0.0 <= a <= 1.0:
        raise ValueError(f"convex fusion needs a dense weight in [0, 1] (got {dense_weight!r})")
    nb, nd = minmax(bm25), minmax(dense)
    out: dict[Hashable, float] = {}
    for i in set(nb) | set(nd):
        out[i] = (1.0 - a) * nb.get(i, 0.0) + a * nd.get(i, 0.0)
    return _sorted(out)


@dataclass(frozen=True)
class FusionConfig:
    """How the channels are fused, and why (``source``: default, env, or auto's table row)."""

    method: str = "rrf"
    dense_weight: float = 1.0
    k: int = DEFAULT_RRF_K
    source: str = "default"

    def __post_init__(self) -> None:
        if self.method not in FUSION_METHODS:
            raise ValueError(f"unknown fusion {self.method!r}; use one of {', '.join(FUSION_METHODS)}")
        _check_k(self.k)
        w = self.dense_weight
        if isinstance(w, bool) or not isinstance(w, int | float) or not math.isfinite(w) or w < 0:
            raise ValueError(f"fusion dense weight must be a finite number >= 0 (got {w!r})")
        if self.method == "convex" and w > 1:
            raise ValueError(f"convex fusion needs a dense weight in [0, 1] (got {w!r})")
        if self.method == "rrf" and w != 1:
            raise ValueError("plain rrf weighs every channel 1; use weighted_rrf for another weight")

    @property
    def is_default(self) -> bool:
        return self.method == "rrf" and self.k == DEFAULT_RRF_K

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def fusion_configured() -> bool:
    """Whether ``RAGSPINE_FUSION`` or ``RAGSPINE_FUSION_DENSE_WEIGHT`` is set (non-empty):
    an explicit fusion beats the one auto embedding chose for a library, so the indexer
    and the retriever ask this one question the same way."""
    return bool(settings.raw(FUSION_ENV) or settings.raw(FUSION_WEIGHT_ENV))


def fusion_from_env(k: int = DEFAULT_RRF_K) -> FusionConfig:
    """``RAGSPINE_FUSION`` / ``RAGSPINE_FUSION_DENSE_WEIGHT``; unset is the spec's RRF."""
    method_set, weight_set = settings.resolve(FUSION_ENV), settings.resolve(FUSION_WEIGHT_ENV)
    method: str = method_set.value
    weight = weight_set.value
    if weight is None:
        weight = 0.5 if method == "convex" else 1.0
    if method == "rrf" and weight != 1.0:
        method = "weighted_rrf"  # a weight was asked for: honour it rather than ignore it
    given = settings.ENVIRONMENT in (method_set.source, weight_set.source)
    return FusionConfig(method=method, dense_weight=weight, k=k, source="env" if given else "default")


@dataclass(frozen=True)
class Run:
    """One ranking of one query variant in one channel: ids best first, their scores (same
    length), and the variant's fusion weight (the original query weighs 1)."""

    ids: Sequence[Hashable]
    scores: Sequence[float] = field(default=())
    weight: float = 1.0


def weighted_best(runs: Iterable[Run], *, positive_only: bool = False) -> dict[Hashable, float]:
    """Per id, its best ``weight * score`` over the runs (a weight of 1 is the raw score).
    ``positive_only`` leaves out ids whose best is <= 0 (BM25: no term matched)."""
    best: dict[Hashable, float] = {}
    for run in runs:
        if len(run.scores) != len(run.ids):
            raise ValueError(f"a run needs one score per id ({len(run.ids)} ids, {len(run.scores)} scores)")
        for i, s in zip(run.ids, run.scores, strict=True):
            ws = s if run.weight == 1 else run.weight * s
            if (not positive_only or ws > 0) and (i not in best or ws > best[i]):
                best[i] = ws
    return best


def fuse_runs(bm25: Sequence[Run], dense: Sequence[Run], fusion: FusionConfig, *, top_k: int,
              rrf_k: int = DEFAULT_RRF_K) -> list[tuple[Hashable, float]]:
    """The first ``top_k`` of the fused ranking of every run, as ``(id, score)`` pairs.

    * both channels, ``convex``: ``convex_fuse`` over each channel's ``weighted_best``;
    * both channels, ``weighted_rrf``: a run weighs its variant weight, times
      ``dense_weight`` for a dense run;
    * otherwise the spec's RRF (k = ``rrf_k`` for the default config, else ``hybrid.fusion.k``),
      each run weighing its variant weight. Every weight 1 is plain ``rrf_fuse``; a single
      run keeps its order (``weight / (k + rank)`` strictly falls).
    """
    if bm25 and dense and fusion.method == "convex":
        nb, nd = weighted_best(bm25, positive_only=True), weighted_best(dense)
        return list(convex_fuse(nb, nd, fusion.dense_weight).items())[:top_k]
    if bm25 and dense and fusion.method == "weighted_rrf":
        weighted = [(r.ids, r.weight) for r in bm25] + [(r.ids, r.weight * fusion.dense_weight) for r in dense]
        return list(weighted_rrf_fuse(weighted, k=fusion.k).items())[:top_k]
    k = rrf_k if fusion.is_default else fusion.k
    runs = [*bm25, *dense]
    if len(runs) == 1:
        _check_k(k)
        w = runs[0].weight
        return [(p, (1.0 if w == 1 else w) / (k + r)) for r, p in enumerate(runs[0].ids[:top_k], start=1)]
    return list(weighted_rrf_fuse(((r.ids, r.weight) for r in runs), k=k).items())[:top_k]
