"""The dense channel's ANN path: a faiss HNSW graph published beside each vector version.

Why: an exact scan reads every vector per query -- ~1.5 GB at a million 384-d float32 rows,
tens of milliseconds on this box -- while BM25 answers in a fraction of a millisecond
(issue 47 item 3). Above ``RAGSPINE_ANN_MIN_VECTORS`` vectors the publish step calls
:func:`build_ann`; a serving process calls :func:`open_ann` and asks
:meth:`AnnIndex.search` for *candidate positions*, which the caller rescores exactly
(float64 dot products over the published vectors) and cuts to ``k``. The graph only has
to put the true top-``k`` among the candidates; the scores the user sees are exact.

Why faiss HNSW (``IndexHNSWFlat``, inner product): in a 200k-vector pilot on the clustered
384-d set of ``benchmarks/bench_ann.py`` it reached recall@10 0.95 at 0.13 ms single-thread
p50, where usearch i8 (connectivity 16, expansion_add 128, rescored) needed 0.22 ms for 0.96
and built 5x slower (249 s vs 47 s), and faiss HNSW with SQ8 storage was slower to search and
to build than flat storage. It is also the one of these libraries whose Python API searches
*with a pre-filter* (``IDSelectorBitmap`` in ``SearchParametersHNSW``): filtered queries walk
the graph but only survivors enter the results, so "survivors only" holds by construction.
The 1M figures beside faiss's defaults are in ``benchmarks/results/ann_1m.md``.

Filters: ``allowed`` (a boolean mask over positions, or an array of allowed positions)
keeps the pre-filter semantics -- every returned position is allowed. Below
``FILTER_EXACT_BELOW`` survivors, or below ``FILTER_EXACT_FRACTION`` of the index, a
graph walk visits more nodes than a scan of the survivors, so :meth:`AnnIndex.search`
returns ``None`` and the caller scans the survivors exactly. Between those and
"everything allowed" the search widens ``efSearch`` by the inverse of the kept fraction
(capped), which keeps recall@10 >= 0.95 at 50% and 5% kept in the benchmark.

Determinism: the level of each node comes from faiss's fixed RNG seed (12345) and nodes
are added in position order; with more than one build thread the neighbour lists can
differ between runs in ties decided by thread timing, which the exact rescoring absorbs.
``build_ann(..., threads=1)`` gives byte-identical files.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np

from ... import settings
from .base import EmbeddingBackendUnavailable

HNSW_M = 32  # neighbours per node (faiss's "HNSW32"; 2*M on the bottom layer)
EF_CONSTRUCTION = 80  # candidate list while building (faiss's default is 40; 80 buys recall per ef)
EF_SEARCH = 32  # candidate list per query, unfiltered (recall@10 >= 0.95 at 1M in the benchmark)
MIN_CANDIDATES = 10  # positions handed back (at least k); the graph scores in exact float32, so more buy no recall
FILTER_EXACT_BELOW = 20_000  # survivors: below this the caller's exact scan is faster
FILTER_EXACT_FRACTION = 0.01  # kept fraction: below this the graph walk costs more than a scan
FILTER_EF_CAP = 1024  # widest efSearch a filtered query may use
FORMAT = "faiss-hnsw-flat-ip"


def _faiss():
    try:
        import faiss  # lazy: faiss-cpu, the optional [ann] extra
    except ImportError:
        raise EmbeddingBackendUnavailable(
            "the dense ANN path needs faiss (pip install 'ragspine-pipeline[ann]'); "
            "set RAGSPINE_ANN=off to scan exactly") from None
    return faiss


def build_ann(vectors: np.ndarray, path: Path, *, threads: int | None = None) -> None:
    """Build the HNSW graph over ``vectors`` (float32 unit rows, in position order) at ``path``.

    Written to a temporary file in the same folder and renamed, so a reader never opens a
    half-written index. ``threads`` bounds faiss's OpenMP threads for the build (None:
    faiss's default, every core); the process-wide setting is restored afterwards.
    """
    faiss = _faiss()
    x = np.ascontiguousarray(vectors, dtype=np.float32)
    if x.ndim != 2 or x.shape[0] == 0:
        raise ValueError(f"build_ann needs a non-empty 2-D array, got shape {x.shape}")
    index = faiss.IndexHNSWFlat(int(x.shape[1]), HNSW_M, faiss.METRIC_INNER_PRODUCT)
    index.hnsw.efConstruction = EF_CONSTRUCTION
    before = faiss.omp_get_max_threads()
    if threads is not None:
        faiss.omp_set_num_threads(max(1, int(threads)))
    try:
        for start in range(0, x.shape[0], 262_144):  # add in slices: no second full copy
            index.add(x[start:start + 262_144])
    finally:
        faiss.omp_set_num_threads(before)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        faiss.write_index(index, tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _open_flags(faiss) -> int:
    """Map the flat vector storage instead of reading it (faiss >= 1.9): a second serving
    process shares the pages; only the graph's neighbour lists are read into memory."""
    return int(getattr(faiss, "IO_FLAG_MMAP_IFC", 0)) | int(getattr(faiss, "IO_FLAG_READ_ONLY", 0))


class AnnIndex:
    """An opened HNSW index. ``search`` is safe to call from several threads at once
    (faiss's search is const; per-query parameters travel in ``SearchParametersHNSW``)."""

    def __init__(self, index, path: Path) -> None:
        self._index = index
        self.path = Path(path)
        self.size = int(index.ntotal)
        self.dim = int(index.d)

    def _mask(self, allowed: np.ndarray) -> np.ndarray:
        a = np.asarray(allowed)
        if a.dtype == np.bool_:
            if a.shape != (self.size,):
                raise ValueError(f"allowed mask has shape {a.shape}, the index holds {self.size} vectors")
            return a
        mask = np.zeros(self.size, dtype=np.bool_)
        pos = a.astype(np.int64, copy=False).ravel()
        if pos.size and (pos.min() < 0 or pos.max() >= self.size):
            raise ValueError("allowed position outside the index")
        mask[pos] = True
        return mask

    def filter_is_exact(self, survivors: int) -> bool:
        """True where :meth:`search` hands a filtered query back to the caller's exact scan."""
        return survivors < FILTER_EXACT_BELOW or survivors < FILTER_EXACT_FRACTION * self.size

    def search(self, query: np.ndarray, k: int, allowed: np.ndarray | None = None, *,
               ef: int | None = None) -> np.ndarray | None:
        """Candidate positions for ``query`` (at least ``k`` where that many are allowed),
        best first by the graph's float32 scores; ``None`` means "scan the survivors exactly"
        (see the module docstring). ``ef`` overrides ``EF_SEARCH`` (the benchmark's sweep)."""
        faiss = _faiss()
        q = np.ascontiguousarray(np.asarray(query, dtype=np.float32).reshape(1, -1))
        if q.shape[1] != self.dim:
            raise ValueError(f"query has {q.shape[1]} dimensions, the index {self.dim}")
        k = int(k)
        if k <= 0:
            return np.empty(0, dtype=np.int64)
        want = min(max(k, MIN_CANDIDATES), self.size)
        ef_base = max(int(ef or EF_SEARCH), want)
        params = faiss.SearchParametersHNSW()
        selector = None
        if allowed is not None:
            mask = self._mask(allowed)
            survivors = int(np.count_nonzero(mask))
            if survivors == 0:
                return np.empty(0, dtype=np.int64)
            if survivors < self.size and self.filter_is_exact(survivors):
                return None
            if survivors < self.size:
                bits = np.packbits(mask, bitorder="little")
                selector = faiss.IDSelectorBitmap(self.size, faiss.swig_ptr(bits))
                params.sel = selector
                widen = self.size / survivors
                ef_base = min(FILTER_EF_CAP, max(ef_base, int(ef_base * widen)))
                want = min(want, survivors)
        params.efSearch = ef_base
        _, ids = self._index.search(q, want, params=params)
        ids = ids[0]
        return ids[ids >= 0].astype(np.int64, copy=False)


def open_ann(path: Path) -> AnnIndex:
    """Open an index written by :func:`build_ann`, its vector storage memory-mapped."""
    faiss = _faiss()
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no ANN index at {path}")
    try:
        index = faiss.read_index(str(path), _open_flags(faiss))
    except RuntimeError:  # a faiss without mapped reads of this index type
        index = faiss.read_index(str(path))
    return AnnIndex(index, path)


def ann_wanted(count: int, mode: str | None = None, minimum: int | None = None) -> bool:
    """Whether a vector version of ``count`` vectors gets an ANN index at publish time
    (``RAGSPINE_ANN`` and ``RAGSPINE_ANN_MIN_VECTORS`` unless given)."""
    mode = settings.get("RAGSPINE_ANN", mode)
    minimum = int(settings.get("RAGSPINE_ANN_MIN_VECTORS", minimum))
    return mode != "off" and count >= minimum


def ann_used(mode: str | None = None) -> bool:
    """Whether queries search the ANN index (``exact`` keeps it built but scans exactly)."""
    return settings.get("RAGSPINE_ANN", mode) == "auto"
