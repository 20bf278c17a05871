"""Maximal Marginal Relevance: diversity re-ordering and near-duplicate removal.

Runs after rerank on the open snippets only (exit #2 already ran), so it never sees
restricted text. Relevance is the retriever's own order (the fused/reranked score of
each snippet, scaled to [0, 1]); similarity between snippets is the cosine of their
dense vectors when present — the served index's own vector cache (``vectors``, no
model call), else an injected ``embedding_backend`` — and otherwise the Jaccard overlap
of their token sets (``tokenize``: the same CJK unigram+bigram analysis BM25 uses).

Greedy MMR: pick the snippet maximising ``lambda * rel - (1 - lambda) * max_sim`` to the
ones already picked; ties break by the incoming order, so the result is deterministic.
A snippet whose similarity to one already picked reaches ``duplicate_threshold`` is a
near-duplicate and is dropped (None keeps everything, re-ordered only).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import numpy as np

from ..lexical.analysis.analyzer import tokenize
from ..vector.base import EmbeddingBackend
from .base import mark_layer

DEFAULT_MMR_LAMBDA = 0.5
DEFAULT_DUPLICATE_THRESHOLD = 0.95


def _relevance(snippets: Sequence[dict[str, Any]]) -> np.ndarray:
    """Incoming order as relevance in [0, 1]: the fused score scaled by the best one,
    or (without usable scores) 1/rank position."""
    n = len(snippets)
    fused = []
    for s in snippets:
        v = (s.get("scores") or {}).get("fused")
        fused.append(float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None)
    if all(v is not None for v in fused) and max(fused) > 0:  # type: ignore[type-var]
        arr = np.asarray(fused, dtype=np.float64)
        return arr / arr.max()
    return 1.0 / np.arange(1, n + 1, dtype=np.float64)


@lru_cache(maxsize=4096)
def _token_set(text: str) -> frozenset[str]:
    return frozenset(tokenize(text))


def token_similarity(snippets: Sequence[dict[str, Any]]) -> np.ndarray:
    """Pairwise Jaccard overlap of the snippets' token sets."""
    sets = [_token_set(str(s.get("prompt_text") or s.get("text") or "")) for s in snippets]
    n = len(sets)
    sim = np.eye(n, dtype=np.float64)
    for i in range(n):
        a = sets[i]
        for j in range(i + 1, n):
            inter = len(a & sets[j])
            union = len(a) + len(sets[j]) - inter
            sim[i, j] = sim[j, i] = inter / union if union else 1.0
    return sim


VectorLookup = Callable[[Sequence[dict[str, Any]]], "np.ndarray | None"]


@dataclass
class IndexVectorLookup:
    """Dense vectors of snippets from the served index's own vector cache, by chunk id.

    ``hybrids`` maps a library id to its HybridRetriever ("" for a single index). Returns
    None unless *every* snippet's chunk already has a vector (preloaded from the
    warehouse or embedded for an earlier query): the lookup never calls a model.
    """

    hybrids: Mapping[str, Any]
    _ids: dict[int, list[str]] = field(default_factory=dict, repr=False)

    def _chunk_ids(self, h: Any) -> list[str]:
        ids = self._ids.get(id(h))
        if ids is None:  # HybridRetriever keeps its chunks sorted by chunk_id
            ids = self._ids[id(h)] = [c.chunk_id for c in h.chunks]
        return ids

    def __call__(self, snippets: Sequence[dict[str, Any]]) -> np.ndarray | None:
        rows = []
        for s in snippets:
            h = self.hybrids.get(str(s.get("library_id", ""))) or (
                next(iter(self.hybrids.values())) if len(self.hybrids) == 1 else None)
            cache = getattr(h, "_vectors", None)  # position-aligned unit vectors (HybridRetriever)
            if cache is None or cache.mat is None:
                return None
            ids = self._chunk_ids(h)
            pos = bisect_left(ids, s.get("chunk_id"))
            if pos >= len(ids) or ids[pos] != s.get("chunk_id") or not cache.have[pos]:
                return None
            rows.append(cache.mat[pos])
        return np.asarray(rows, dtype=np.float64) if rows else None


@dataclass
class MMRPostprocessor:
    """MMR diversity de-duplication (see the module docstring)."""

    lambda_: float = DEFAULT_MMR_LAMBDA
    duplicate_threshold: float | None = DEFAULT_DUPLICATE_THRESHOLD
    top_n: int | None = None
    embedding_backend: EmbeddingBackend | None = None
    vectors: VectorLookup | None = None
    name: str = "mmr"
    _vec_cache: dict[str, np.ndarray] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if isinstance(self.lambda_, bool) or not isinstance(self.lambda_, int | float) or not 0.0 <= self.lambda_ <= 1.0:
            raise ValueError(f"MMR lambda must be a number in [0, 1] (got {self.lambda_!r})")
        if self.duplicate_threshold is not None and not 0.0 < float(self.duplicate_threshold) <= 1.0:
            raise ValueError(f"duplicate_threshold must be in (0, 1] or None (got {self.duplicate_threshold!r})")
        if self.top_n is not None and (isinstance(self.top_n, bool) or not isinstance(self.top_n, int) or self.top_n < 1):
            raise ValueError(f"top_n must be a positive integer or None (got {self.top_n!r})")
        if self.embedding_backend is not None and not callable(getattr(self.embedding_backend, "embed_texts", None)):
            raise TypeError(f"{type(self.embedding_backend).__name__} is not an EmbeddingBackend")

    def _dense_similarity(self, snippets: Sequence[dict[str, Any]]) -> np.ndarray | None:
        if self.vectors is not None:
            try:
                mat = self.vectors(snippets)
            except Exception:  # noqa: BLE001 - a failing lookup degrades to the next source
                mat = None
            if mat is not None and mat.ndim == 2 and len(mat) == len(snippets):
                norms = np.linalg.norm(mat, axis=1, keepdims=True)
                mat = mat / np.where(norms == 0, 1, norms)
                return np.clip(mat @ mat.T, -1.0, 1.0)
        backend = self.embedding_backend
        if backend is None:
            return None
        keys = [f"{s.get('library_id', '')}\x1f{s.get('chunk_id')}" for s in snippets]
        missing = [i for i, k in enumerate(keys) if k not in self._vec_cache]
        if missing:
            try:
                vecs = backend.embed_texts([str(snippets[i].get("text") or "") for i in missing])
                arr = np.asarray(vecs, dtype=np.float64)
                if arr.ndim != 2 or len(arr) != len(missing):
                    return None
            except Exception:  # noqa: BLE001 - a failing backend degrades to token sets
                return None
            if len(self._vec_cache) > 10_000:
                self._vec_cache.clear()
            for i, row in zip(missing, arr, strict=True):
                norm = np.linalg.norm(row)
                self._vec_cache[keys[i]] = row / norm if norm else row
        mat = np.stack([self._vec_cache[k] for k in keys])
        return np.clip(mat @ mat.T, -1.0, 1.0)

    def similarity(self, snippets: Sequence[dict[str, Any]]) -> tuple[np.ndarray, str]:
        dense = self._dense_similarity(snippets)
        if dense is not None:
            return dense, "dense"
        return token_similarity(snippets), "tokens"

    def process(self, query: str, snippets: list[dict[str, Any]]) -> list[dict[str, Any]]:
        if len(snippets) <= 1:
            return [mark_layer(s, self.name) for s in snippets]
        rel = _relevance(snippets)
        sim, _ = self.similarity(snippets)
        lam = float(self.lambda_)
        n = len(snippets)
        remaining = np.ones(n, dtype=bool)
        max_sim = np.zeros(n, dtype=np.float64)  # similarity to the closest snippet kept
        picked: list[int] = []
        limit = self.top_n or n
        dup = None if self.duplicate_threshold is None else float(self.duplicate_threshold)
        while remaining.any() and len(picked) < limit:
            score = np.where(remaining, lam * rel - (1.0 - lam) * max_sim, -np.inf)
            best = int(np.argmax(score))  # first maximum: ties keep the incoming order
            remaining[best] = False
            if dup is not None and picked and max_sim[best] >= dup:
                continue  # a near-duplicate of a snippet already chosen
            picked.append(best)
            max_sim = np.maximum(max_sim, sim[best])
        return [mark_layer(snippets[i], self.name) for i in picked]
