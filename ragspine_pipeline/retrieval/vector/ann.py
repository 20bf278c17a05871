"""The dense channel's ANN path: a faiss HNSW graph published beside each vector version.

Why: an exact scan reads every vector per query -- ~1.5 GB at a million 384-d float32 rows,
tens of milliseconds on this box -- while BM25 answers in a fraction of a millisecond
(issue 47 item 3). Above ``RAGSPINE_ANN_MIN_VECTORS`` vectors the publish step calls
:func:`build_ann`; a serving process calls :func:`open_ann` and asks
:meth:`AnnIndex.search` for *candidate positions*, which the caller rescores exactly
(float64 dot products over the published float32 rows) and cuts to ``k``. The graph only
has to put the true top-``k`` among the candidates; the scores the user sees are exact.

Storage (:data:`STORAGES`): 6-bit scalar-quantised codes (``IndexHNSWSQ``, ``QT_6bit``: a
per-dimension min/max trained on a strided sample) under an M=16 graph, not a float32 copy.
The published vector file already holds the float32 rows the rescoring reads, so the
graph's own vectors only have to steer the walk. What a serving process holds resident
after a query load is the whole index file (every page is touched within a few hundred
queries): 1.81 GB at 1M x 384 with float32 storage, 0.66 GB with 8-bit codes and M=32
(384 MB of codes + 256 MB of bottom-layer neighbour lists), 0.43 GB (412 MiB; 288 MB of
codes + 128 MB of lists) with 6-bit codes and M=16 -- under issue 47's 0.5 GB. The thinner
graph needs a wider walk for the same recall (efSearch 64-80 where M=32 needed 40-48), each
step cheaper; ``benchmarks/results/ann_1m.md`` has them side by side with faiss HNSW.
The lossy graph scores only choose candidates; :meth:`AnnIndex.search` hands back
``k + RESCORE_EXTRA`` of them (at least ``MIN_CANDIDATES``), enough for the exact rescoring
to restore the order. The whole index file -- codes and neighbour lists -- is
memory-mapped (``IO_FLAG_MMAP_IFC``): a second serving process shares its pages.

Why not let the graph read the published int8 codes (no second copy at all): those codes
carry a per-row scale (``published_scan.quantize``), which no faiss storage type applies
(``QT_8bit_direct_signed`` has none, and ranking by unscaled codes is another metric), and
faiss's HNSW reads its vectors from its own storage index; sharing the file's bytes would
take a custom C++ storage class, not something the library supports.

Indexes published before still open and answer the same way: ``"sq8"`` (8-bit codes,
M=32, format ``faiss-hnsw-sq8-ip``) and ``"flat"`` (``IndexHNSWFlat``, format
``faiss-hnsw-flat-ip``, which keeps its float32 copy until the version is republished;
:func:`open_ann` logs that once per file). Any other faiss index type in the file raises
:class:`AnnIndexFormatError` (an ``IndexFormatError`` that says to rebuild it with the
publish step).

efSearch: :func:`ef_search` -- it grows with the index size (measured at 1M and 3M) and is
never below the candidates a request wants (a hybrid query's depth 100 walks at >= 110).

Why faiss HNSW: in a 200k-vector pilot on the clustered 384-d set of
``benchmarks/bench_ann.py`` it reached recall@10 0.95 at 0.13 ms single-thread p50, where
usearch i8 (connectivity 16, expansion_add 128, rescored) needed 0.22 ms for 0.96 and
built 5x slower (249 s vs 47 s). It is also the one of these libraries whose Python API
searches *with a pre-filter* (``IDSelectorBitmap`` in ``SearchParametersHNSW``): filtered
queries walk the graph but only survivors enter the results, so "survivors only" holds
by construction. The 1M figures beside faiss's defaults are in ``benchmarks/results/ann_1m.md``.

Filters: ``allowed`` (a boolean mask over positions, or an array of allowed positions)
keeps the pre-filter semantics -- every returned position is allowed. Below
``FILTER_EXACT_BELOW`` survivors, or below ``FILTER_EXACT_FRACTION`` of the index, a
graph walk visits more nodes than a scan of the survivors, so :meth:`AnnIndex.search`
returns ``None`` and the caller scans the survivors exactly. Between those and
"everything allowed" the search widens ``efSearch`` by the inverse of the kept fraction
(capped), which keeps recall@10 >= 0.95 at 50% and 5% kept in the benchmark.

Determinism: the quantiser is trained on a fixed strided sample; the level of each node
comes from faiss's fixed RNG seed (12345) and nodes are added in position order; with more
than one build thread the neighbour lists can differ between runs in ties decided by thread
timing, which the exact rescoring absorbs. ``build_ann(..., threads=1)`` gives
byte-identical files.
"""

from __future__ import annotations

import logging
import math
import os
import tempfile
from pathlib import Path
from typing import NamedTuple

import numpy as np

from ... import settings
from ..lexical.format.file import IndexFormatError
from .base import EmbeddingBackendUnavailable

EF_CONSTRUCTION = 80  # candidate list while building (faiss's default is 40; 80 buys recall per ef)
MIN_CANDIDATES = 20  # positions handed back at least: lossy scores misorder near-ties, the rescoring fixes them
RESCORE_EXTRA = 10  # candidates beyond k (each costs one exact dot product over a published row)
TRAIN_ROWS = 65_536  # rows the scalar quantiser's per-dimension ranges are trained on (strided sample)
FILTER_EXACT_BELOW = 20_000  # survivors: below this the caller's exact scan is faster
FILTER_EXACT_FRACTION = 0.01  # kept fraction: below this the graph walk costs more than a scan
FILTER_EF_CAP = 1024  # widest efSearch a filtered query may use
EF_FLOOR = 32  # narrowest unfiltered efSearch (small indexes: the walk is cheap there anyway)
EF_REF_SIZE = 1_000_000  # the size the per-storage efSearch below was measured at


class Storage(NamedTuple):
    """How one published index stores its vectors: the format name, the graph's M, the faiss
    scalar quantiser (None: float32 rows) and the unfiltered efSearch for a top-10 at
    ``EF_REF_SIZE`` vectors with its growth exponent (see :func:`ef_search`)."""

    format: str
    m: int
    qtype: str | None
    ef_ref: int
    ef_growth: float


STORAGES = {
    # Published now: 6-bit codes (288 B per 384-d row) and M=16 (32 bottom-layer neighbours,
    # 128 B): 0.43 GB at 1M x 384 where the 8-bit M=32 file was 0.66 GB.
    "sq6": Storage("faiss-hnsw16-sq6-ip", 16, "QT_6bit", 80, 0.85),
    "sq8": Storage("faiss-hnsw-sq8-ip", 32, "QT_8bit", 48, 0.63),  # published before (still served)
    "flat": Storage("faiss-hnsw-flat-ip", 32, None, 48, 0.63),  # the first published form (still served)
}
DEFAULT_STORAGE = "sq6"
FORMAT = STORAGES[DEFAULT_STORAGE].format
LEGACY_FORMAT = STORAGES["flat"].format  # the float32-storage index published first (still served)
HNSW_M = STORAGES[DEFAULT_STORAGE].m
_log = logging.getLogger(__name__)


class AnnIndexFormatError(IndexFormatError):
    """An ANN index file that is not one :func:`build_ann` writes (another faiss index type,
    or not a faiss file at all): the version must be republished to rebuild it."""


def _faiss():
    try:
        import faiss  # lazy: faiss-cpu, the optional [ann] extra
    except ImportError:
        raise EmbeddingBackendUnavailable(
            "the dense ANN path needs faiss (pip install 'ragspine-pipeline[ann]'); "
            "set RAGSPINE_ANN=off to scan exactly") from None
    return faiss


def build_ann(vectors: np.ndarray, path: Path, *, threads: int | None = None,
              storage: str = DEFAULT_STORAGE) -> None:
    """Build the HNSW graph over ``vectors`` (float32 unit rows, in position order) at ``path``.

    ``storage``: a key of :data:`STORAGES` -- ``"sq6"`` (what publishing writes,
    :data:`FORMAT`), or the forms published before, ``"sq8"`` and ``"flat"``, kept to compare
    with and to test that such files still serve. Written to a temporary file in the same folder and renamed, so a
    reader never opens a half-written index. ``threads`` bounds faiss's OpenMP threads for
    the build (None: faiss's default, every core); the process-wide setting is restored.
    """
    faiss = _faiss()
    x = np.asarray(vectors)
    if x.ndim != 2 or x.shape[0] == 0:
        raise ValueError(f"build_ann needs a non-empty 2-D array, got shape {x.shape}")
    if storage not in STORAGES:
        raise ValueError(f"unknown ANN storage {storage!r}; use one of {', '.join(STORAGES)}")
    dim, spec = int(x.shape[1]), STORAGES[storage]
    if spec.qtype is None:
        index = faiss.IndexHNSWFlat(dim, spec.m, faiss.METRIC_INNER_PRODUCT)
    else:
        qtype = getattr(faiss.ScalarQuantizer, spec.qtype)
        index = faiss.IndexHNSWSQ(dim, qtype, spec.m, faiss.METRIC_INNER_PRODUCT)
    index.hnsw.efConstruction = EF_CONSTRUCTION
    before = faiss.omp_get_max_threads()
    if threads is not None:
        faiss.omp_set_num_threads(max(1, int(threads)))
    try:
        if not index.is_trained:  # a strided sample: deterministic, spread over the whole version
            step = max(1, x.shape[0] // TRAIN_ROWS)
            index.train(np.ascontiguousarray(x[::step][:TRAIN_ROWS], dtype=np.float32))
        for start in range(0, x.shape[0], 262_144):  # add in slices: no second full copy
            index.add(np.ascontiguousarray(x[start:start + 262_144], dtype=np.float32))
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
    """Map the index file instead of reading it (faiss >= 1.9): the codes (or a legacy
    file's float32 storage) and the neighbour lists stay page-cache pages, shared by every
    serving process, and only the pages a query touches become resident."""
    return int(getattr(faiss, "IO_FLAG_MMAP_IFC", 0)) | int(getattr(faiss, "IO_FLAG_READ_ONLY", 0))


class AnnIndex:
    """An opened HNSW index. ``search`` is safe to call from several threads at once
    (faiss's search is const; per-query parameters travel in ``SearchParametersHNSW``)."""

    def __init__(self, index, path: Path, storage: str = DEFAULT_STORAGE) -> None:
        self._index = index
        self.path = Path(path)
        self.size = int(index.ntotal)
        self.dim = int(index.d)
        self.storage = storage  # a key of STORAGES: "sq6", or "sq8" / "flat" for an index published before
        self.format = STORAGES[storage].format

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
        """Candidate positions for ``query`` (``k + RESCORE_EXTRA``, at least
        ``MIN_CANDIDATES``, where that many are allowed), best first by the graph's approximate
        scores; ``None`` means "scan the survivors exactly"
        (see the module docstring). ``ef`` overrides :func:`ef_search` (the benchmark's sweep)."""
        faiss = _faiss()
        q = np.ascontiguousarray(np.asarray(query, dtype=np.float32).reshape(1, -1))
        if q.shape[1] != self.dim:
            raise ValueError(f"query has {q.shape[1]} dimensions, the index {self.dim}")
        k = int(k)
        if k <= 0:
            return np.empty(0, dtype=np.int64)
        want = min(max(k + RESCORE_EXTRA, MIN_CANDIDATES), self.size)
        ef_base = max(int(ef), want) if ef else ef_search(self.size, want, self.storage)
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


def _storage_of(faiss, index) -> str | None:
    """The :data:`STORAGES` key of an opened index (read_index hands back the concrete type;
    the scalar quantiser's type tells 6-bit from 8-bit codes), None for any other index."""
    if isinstance(index, faiss.IndexHNSWFlat):
        return "flat"
    if isinstance(index, faiss.IndexHNSWSQ):
        qtype = int(faiss.downcast_index(index.storage).sq.qtype)
        for key, spec in STORAGES.items():
            if spec.qtype is not None and qtype == int(getattr(faiss.ScalarQuantizer, spec.qtype)):
                return key
    return None


def ef_search(size: int, want: int, storage: str = DEFAULT_STORAGE) -> int:
    """Unfiltered efSearch for ``want`` candidates out of ``size`` vectors.

    Why a rule and not one number: a fixed efSearch chosen at one size loses recall as the
    graph grows (the 8-bit M=32 index gave recall@10 0.971 at 1M with 48, 0.929 at 3M; 96 gave
    0.965 there). The rule ``ef_ref * (size / EF_REF_SIZE) ** ef_growth`` per storage, from its
    measured 1M and 3M points (``benchmarks/results/ann_1m.md`` / ``ann_3m.md``): 6-bit M=16,
    80 at 1M (recall@10 0.965) and 192 at 3M (0.961; 160 gave 0.949), so 0.85 (204 at 3M);
    8-bit M=32, 48 and 96, so 0.63. Never below ``EF_FLOOR`` nor below the candidates wanted,
    so a deep request (the hybrid channel's 100 + extra) walks at least as wide as its depth."""
    spec = STORAGES[storage]
    grown = spec.ef_ref * (max(int(size), 1) / EF_REF_SIZE) ** spec.ef_growth
    return max(int(want), EF_FLOOR, int(math.ceil(grown)))


def open_ann(path: Path) -> AnnIndex:
    """Open an index written by :func:`build_ann`, the file memory-mapped.

    ``FileNotFoundError`` without one; :class:`AnnIndexFormatError` when the file is not an
    HNSW index of either storage (another faiss type, or damaged): republish the version.
    A legacy flat index opens with ``storage == "flat"`` (a log line says it keeps a float32
    copy until the version is republished)."""
    faiss = _faiss()
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no ANN index at {path}")
    try:
        try:
            index = faiss.read_index(str(path), _open_flags(faiss))
        except RuntimeError:  # a faiss without mapped reads of this index type
            index = faiss.read_index(str(path))
    except RuntimeError as exc:
        raise AnnIndexFormatError(path, f"not a readable faiss index ({str(exc).splitlines()[0][:200]}); "
                                        "republish the vector version to rebuild it") from None
    storage = _storage_of(faiss, index)
    if storage is None:
        raise AnnIndexFormatError(path, f"{type(index).__name__} is not an ANN index this version serves "
                                        f"({', '.join(s.format for s in STORAGES.values())}); republish the "
                                        "vector version to rebuild it")
    if storage == "flat":
        _log.info("ANN index %s has float32 storage (%s, published before %s): it serves, but holds a "
                  "second copy of the vectors until the version is republished", path, LEGACY_FORMAT, FORMAT)
    if index.metric_type != faiss.METRIC_INNER_PRODUCT:
        raise AnnIndexFormatError(path, "the ANN index does not rank by inner product; republish the vector "
                                        "version to rebuild it")
    return AnnIndex(index, path, storage)


def ann_wanted(count: int, mode: str | None = None, minimum: int | None = None) -> bool:
    """Whether a vector version of ``count`` vectors gets an ANN index at publish time
    (``RAGSPINE_ANN`` and ``RAGSPINE_ANN_MIN_VECTORS`` unless given)."""
    mode = settings.get("RAGSPINE_ANN", mode)
    minimum = int(settings.get("RAGSPINE_ANN_MIN_VECTORS", minimum))
    return mode != "off" and count >= minimum


def ann_used(mode: str | None = None) -> bool:
    """Whether queries search the ANN index (``exact`` keeps it built but scans exactly)."""
    return settings.get("RAGSPINE_ANN", mode) == "auto"
