"""VectorStore protocol and the in-process brute-force store.

``InProcessVectorStore`` keeps L2-normalized float32 rows in one numpy matrix; a query
is one matrix-vector product. Ties are broken by id ascending. ``where`` uses the same
predicates as the lexical pre-filter. The store never strips RESTRICTED rows itself:
that is the retriever's exits' job, so there is one place that enforces it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np

from ..filters import compile_filters, predicate_mask


@dataclass(frozen=True)
class VectorHit:
    id: str
    score: float
    metadata: dict[str, Any]


def unit_rows(ids: Sequence[str], vectors: Sequence[Sequence[float]],
              metadata: Sequence[Mapping[str, Any]] | None) -> np.ndarray:
    """Validate an upsert batch and return its vectors L2-normalized (float32, 2-D).

    Shared by every store so they agree on what a valid batch is.
    """
    if len(ids) != len(vectors) or (metadata is not None and len(metadata) != len(ids)):
        raise ValueError("ids, vectors and metadata must have the same length")
    arr = np.asarray(vectors, dtype=np.float32)
    if not len(ids):
        return arr
    if arr.ndim != 2:
        raise ValueError("vectors must be a 2-D sequence")
    norms = np.linalg.norm(arr, axis=1, keepdims=True)
    return arr / np.where(norms == 0, 1, norms)


@runtime_checkable
class VectorStore(Protocol):
    def upsert(self, ids: Sequence[str], vectors: Sequence[Sequence[float]],
               metadata: Sequence[Mapping[str, Any]] | None = None) -> int: ...

    def query(self, vector: Sequence[float], k: int = 10,
              where: Mapping[str, Any] | None = None) -> list[VectorHit]: ...

    def delete(self, ids: Sequence[str]) -> int: ...

    def count(self) -> int: ...


class InProcessVectorStore:
    """Brute-force cosine over normalized rows; exact, deterministic."""

    def __init__(self, dim: int | None = None) -> None:
        self.dim = dim
        self._ids: list[str] = []
        self._pos: dict[str, int] = {}
        self._meta: list[dict[str, Any]] = []
        self._mat = np.zeros((0, dim or 0), dtype=np.float32)

    def count(self) -> int:
        return len(self._ids)

    def upsert(self, ids: Sequence[str], vectors: Sequence[Sequence[float]],
               metadata: Sequence[Mapping[str, Any]] | None = None) -> int:
        arr = unit_rows(ids, vectors, metadata)
        if not ids:
            return 0
        if self.dim is None:
            self.dim = arr.shape[1]
            self._mat = np.zeros((0, self.dim), dtype=np.float32)
        if arr.shape[1] != self.dim:
            raise ValueError(f"vector dimension {arr.shape[1]} != store dimension {self.dim}")
        new_rows = []
        for i, id_ in enumerate(ids):
            md = dict(metadata[i]) if metadata is not None else {}
            if id_ in self._pos:
                p = self._pos[id_]
                self._mat[p] = arr[i]
                self._meta[p] = md
            else:
                self._pos[id_] = len(self._ids) + len(new_rows)
                new_rows.append(i)
                self._meta.append(md)
        if new_rows:
            self._ids.extend(ids[i] for i in new_rows)
            self._mat = np.vstack([self._mat, arr[new_rows]])
        return len(ids)

    def delete(self, ids: Sequence[str]) -> int:
        drop = {self._pos[i] for i in ids if i in self._pos}
        if not drop:
            return 0
        keep = [p for p in range(len(self._ids)) if p not in drop]
        self._ids = [self._ids[p] for p in keep]
        self._meta = [self._meta[p] for p in keep]
        self._mat = self._mat[keep]
        self._pos = {id_: p for p, id_ in enumerate(self._ids)}
        return len(drop)

    def query(self, vector: Sequence[float], k: int = 10,
              where: Mapping[str, Any] | None = None) -> list[VectorHit]:
        if not self._ids or k <= 0:
            return []
        q = np.asarray(vector, dtype=np.float32)
        n = np.linalg.norm(q)
        if n > 0:
            q = q / n
        sims = self._mat @ q
        cand = np.arange(len(self._ids))
        if where:
            fields = {key: type(v) if v is not None else str
                      for key, v in (self._meta[0].items() if self._meta else [])}
            preds = compile_filters(where, fields)
            col_cache: dict[str, np.ndarray] = {}

            def column(f: str) -> np.ndarray:
                if f not in col_cache:
                    col_cache[f] = np.array([m.get(f) for m in self._meta], dtype=object)
                return col_cache[f]

            cand = np.flatnonzero(predicate_mask(preds, column, len(self._ids)))
        if len(cand) == 0:
            return []
        s = sims[cand].astype(np.float64)
        # BLAS may sum identical rows in a different order depending on where they sit in
        # the matrix (SIMD blocking), so equal vectors can differ in the last float32 bits.
        # Order on scores rounded below float32 precision so such ties go by id.
        s_order = np.round(s, 6)
        sel = np.arange(len(cand))
        if len(cand) > 4 * k:
            kth = s_order[np.argpartition(-s_order, k - 1)[k - 1]]
            sel = np.flatnonzero(s_order >= kth)  # tie-safe cut before the exact (score, id) sort
        order = sorted(sel.tolist(), key=lambda i: (-s_order[i], self._ids[cand[i]]))[:k]
        return [VectorHit(self._ids[cand[i]], float(s[i]), self._meta[cand[i]]) for i in order]
