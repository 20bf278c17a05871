"""The dense channel's top-``depth`` by cosine: exact float64 scores that do not depend
on where a vector sits in its matrix.

Why: a float32 matrix-vector product (BLAS ``sgemv``) sums a row's products in an order
that depends on the row's place in the matrix (blocks of rows, the remainder rows on
another kernel), so the same vector scored inside the whole corpus and inside one
shard's rows differed by up to 5e-6 relative, and the sharded dense and fused scores
were not the single index's. Here float32 only preselects: every candidate whose
float32 cosine is within twice the rounding bound of the ``depth``-th best is rescored
in float64 (each product of two float32 numbers is exact in float64, and every row is
summed by the same reduction), so a chunk's cosine is bit for bit the same in one
process and in any shard, and the order by (cosine desc, position asc) is the same.

The bound: a float32 dot product of length d, in any summation order (FMA or not), is
within gamma_d * sum|a_i b_i| of the exact one, gamma_d = d u / (1 - d u), u = 2**-24;
the vectors are unit (or zero) so sum|a_i b_i| <= |a| |b| <= 1 + a few ulps. A chunk of
the exact top-depth has float32 cosine >= (depth-th float32 best) - 2 gamma_d, so the
preselection cannot drop one.
"""

from __future__ import annotations

import numpy as np

from ..lexical.index.topk import ScoredDocs, empty_scored

_U32 = 2.0 ** -24


def float32_dot_bound(dim: int) -> float:
    """The most a float32 cosine of two unit vectors of ``dim`` entries can be off."""
    g = (dim + 1) * _U32
    return 1.0001 * g / (1.0 - g)  # 1.0001: the unit vectors' norms are 1 to a few ulps


def exact_cosines(mat: np.ndarray, qv64: np.ndarray) -> np.ndarray:
    """float64 cosines of the rows of ``mat`` (float32) with ``qv64``: every product is
    exact, every row summed the same way (the same bits wherever the row sits)."""
    return (np.asarray(mat, np.float64) * qv64).sum(axis=1)


def dense_top(mat: np.ndarray, positions: np.ndarray, row: np.ndarray, depth: int) -> ScoredDocs:
    """Top ``depth`` rows of ``mat`` (unit float32 vectors of corpus ``positions``) by
    (cosine desc, position asc) for one unit query vector ``row``; ids are positions,
    scores the exact float64 cosines."""
    n = len(positions)
    if n == 0 or depth <= 0:
        return empty_scored()
    positions = np.asarray(positions, np.int64)
    qv64 = np.asarray(row, np.float64)
    if n <= 4 * depth:
        sel = np.arange(n)
    else:
        sims32 = mat @ np.asarray(row, np.float32)
        kth = float(sims32[np.argpartition(-sims32, depth - 1)[depth - 1]])
        sel = np.flatnonzero(sims32 >= kth - 2.0 * float32_dot_bound(mat.shape[1]))
    sims = exact_cosines(mat[sel], qv64)
    order = np.lexsort((positions[sel], -sims))[:depth]
    return ScoredDocs(positions[sel[order]], sims[order])


__all__ = ["dense_top", "exact_cosines", "float32_dot_bound"]
