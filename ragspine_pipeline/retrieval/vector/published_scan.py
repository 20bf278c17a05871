"""int8 codes with a per-vector scale: how they are made, scanned, and why the pre-selection
they drive never drops a chunk of the exact top-k.

Why int8: a serving process scans every candidate row per query; as float32 a 1M x 384
matrix is 1.5 GB resident in every process, as int8 codes 384 MB (shared by every
process mapping the published file). The codes only *pre-select*: every candidate they
cannot rule out is rescored exactly from its float32 row (``dense_topk.exact_cosines``,
float64), so the served cosines and the order (cosine desc, position asc) are bit for
bit the in-memory exact path's (``dense_topk.dense_top``).

Quantization (per row x, float32 unit or zero): ``scale = max|x_j| / 127`` (1 for a zero
row), ``code_j = rint(x_j / scale)`` clipped to [-127, 127]. Per row the writer also
stores ``bound``: the most the approximate cosine ``scale * sum(code_j * y_j)`` (float32
arithmetic, any summation order, FMA or not) can differ from the exact one, per unit of
query norm:

    |x.y - approx| <= |x - scale*code|_2 |y|_2                   (Cauchy-Schwarz)
                    + (gamma_d + u) |scale*code|_2 |y|_2          (float32 rounding)

with gamma_d = d u / (1 - d u), u = 2**-24 (``dense_topk.float32_dot_bound``). The
residual norm is taken in float64 and every stored figure is rounded up, so the bound
is rigorous. The pre-selection keeps every row whose upper bound reaches the
``depth``-th largest lower bound; a row it drops has an exact cosine strictly below at
least ``depth`` others, so it cannot be in the exact top-``depth`` whatever the ties.
The pool is therefore adaptive (``published.PublishedVectors.top`` reports its size),
never a fixed multiple of ``depth`` that could miss a chunk.
"""

from __future__ import annotations

import contextlib

import numpy as np

from ..hybrid.dense_topk import float32_dot_bound
from ..lexical.kernels.numba_start import start as start_numba

_U32 = 2.0 ** -24
QMAX = 127
SCAN_BLOCK = 32768  # rows per block of the numpy fallback (a 12 MiB float32 temporary at d=384)
MARGIN = np.float32(1e-6)  # float32 rounding of the selection's own arithmetic (see ``candidates``)

try:  # numba is a core dependency; the numpy path is the same bound, only slower
    from numba import njit
except ImportError:  # pragma: no cover - exercised only where numba is missing
    njit = None


def numba_start() -> None:
    """numba's first refresh without the BLAS probe (``lexical/kernels/numba_start``: ~15
    MiB and a scipy import less), before this module's kernel first loads."""
    if njit is not None:
        with contextlib.suppress(ImportError):
            start_numba()


def quantize(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(int8 codes, float32 scale, float32 bound) of float32 ``rows`` (n, d); see the module."""
    rows = np.asarray(rows, np.float32)
    n, d = rows.shape
    peak = np.abs(rows).max(axis=1) if d else np.zeros(n, np.float32)
    scale = np.where(peak > 0, peak / np.float32(QMAX), np.float32(1)).astype(np.float32)
    codes = np.clip(np.rint(rows / scale[:, None]), -QMAX, QMAX).astype(np.int8)
    deq = codes.astype(np.float64) * scale.astype(np.float64)[:, None]
    resid = np.sqrt(((rows.astype(np.float64) - deq) ** 2).sum(axis=1))
    qnorm = np.sqrt((deq ** 2).sum(axis=1))
    bound = (resid + (float32_dot_bound(max(d, 1)) + _U32) * 1.001 * qnorm) * (1 + 1e-9)
    return codes, scale, round_up(bound)


def round_up(x: np.ndarray) -> np.ndarray:
    """float64 -> float32, never below the float64 value."""
    f = np.asarray(x, np.float64).astype(np.float32)
    return np.where(f.astype(np.float64) < x, np.nextafter(f, np.float32(np.inf)), f).astype(np.float32)


if njit is not None:
    @njit(cache=True, fastmath=True, nogil=True)
    def _scan_kernel(codes, scale, idx, ys, out):  # pragma: no cover - compiled
        m, d = ys.shape
        for k in range(idx.shape[0]):
            r = idx[k]
            s = scale[r]
            for j in range(m):
                acc = np.float32(0.0)
                for t in range(d):
                    acc += np.float32(codes[r, t]) * ys[j, t]
                out[j, k] = acc * s
else:  # pragma: no cover
    _scan_kernel = None


def approx_scores(codes: np.ndarray, scale: np.ndarray, idx: np.ndarray, ys: np.ndarray) -> np.ndarray:
    """float32 ``scale_r * sum_j code_rj * y_j`` for the rows ``idx`` (int64, in range) and
    each query row of ``ys`` (m, d float32): an (m, len(idx)) array."""
    ys = np.ascontiguousarray(ys, np.float32)
    out = np.empty((len(ys), len(idx)), np.float32)
    if not len(idx) or not len(ys):
        return out
    if _scan_kernel is not None:
        _scan_kernel(codes, scale, np.ascontiguousarray(idx, np.int64), ys, out)
        return out
    for lo in range(0, len(idx), SCAN_BLOCK):  # pragma: no cover - numba missing
        at = idx[lo:lo + SCAN_BLOCK]
        out[:, lo:lo + len(at)] = (codes[at].astype(np.float32) @ ys.T).T * scale[at]
    return out


def candidates(approx: np.ndarray, bound: np.ndarray, ynorm: float, depth: int) -> np.ndarray:
    """Indexes (into ``approx``) of every row that may be in the exact top ``depth``: its
    upper bound reaches the ``depth``-th largest lower bound (see the module).

    In float32 with ``MARGIN`` for the rounding of these few operations (values below 2
    |y| in magnitude: half an ulp is 1.2e-7 |y|) and of the float64 exact cosine: four
    arrays of n float32 temporaries (16 MB at 1M), not float64 ones."""
    n = len(approx)
    if n <= depth:
        return np.arange(n)
    err = np.multiply(bound, np.float32(ynorm * (1 + 1e-6)), dtype=np.float32)
    lower = np.subtract(approx, err)
    floor = np.partition(lower, n - depth)[n - depth]
    del lower
    np.add(approx, err, out=err)
    return np.flatnonzero(err >= floor - MARGIN * np.float32(max(1.0, 2.0 * ynorm)))


def query_norm(y: np.ndarray) -> float:
    """|y|_2 in float64, as the bound uses it."""
    return float(np.sqrt(np.dot(np.asarray(y, np.float64), np.asarray(y, np.float64))))


__all__ = ["QMAX", "approx_scores", "candidates", "numba_start", "quantize", "query_norm", "round_up"]
