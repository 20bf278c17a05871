"""Compiled (numba) BM25 top-k kernels, with a clean fallback to the numpy path.

Why: the numpy path spends most of a short query in per-call overhead (concatenate,
argsort, reduceat, lexsort over every touched posting), and on large corpora it reads
every posting of every query term. The compiled kernels do the same arithmetic in one
pass and prune:

* ``search_one`` (unfiltered): on a small corpus (``EXHAUSTIVE_MAX_DOCS``) whose
  postings the query covers broadly, every posting is scattered into the accumulator
  and one sequential pass selects the top k (no bookkeeping: ~3x faster there than
  pruning). Otherwise term-at-a-time MaxScore. Terms are taken by descending
  upper bound (``scale * max w``). Before a long posting list is scanned, the k-th best
  partial score ``theta`` is compared with the summed bounds of the terms not yet
  scanned: when those bounds are below ``theta`` no untouched document can reach the
  top k, so the remaining terms are only *looked up* (galloping search in their sorted
  postings) for the few candidates whose partial score plus the remaining bound can
  still reach ``theta``. Exact: a dropped document's best possible score is strictly
  below a score that k documents already have (a relative margin covers float rounding).
* ``search_batch``: many queries in one call without the GIL (one scratch per call);
  ``BM25Index.search_batch`` runs chunks of a batch on threads.
* ``search_filtered``: the spec's filtered semantics (N, df and avgdl over the filter
  survivors), MaxScore- and block-bound-pruned, on a filter prepared by ``index.filter``
  (packed bits, survivor count and length without a per-document pass; the kernels of
  that step are ``kernels.filter_stats``'s). A term's survivor df is a popcount of its
  bitset row against the filter, or comes from one pass over its list that also gathers
  its surviving postings, or from galloping the few survivors into it; a bitset term is
  read at the survivors by rank. A selective filter costs about as much as its
  survivors, a broad one about an unfiltered query plus reading the filter once.

Every kernel returns (doc positions, scores) ranked by (score desc, position asc) and
keeps only scores > 0; scores equal the reference formula to 1e-9 (tests check this
for both kernels on random data and on every shared set).

numba is a core dependency; ``load_kernels()`` returns None when it cannot be imported
or compiled, and ``BM25Index`` then keeps its numpy path.

The unfiltered accumulator is corpus-sized and reused between queries, so it is kept
per thread (``threading.local``): concurrent searches on one index never share scratch.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import numpy as np

from . import numba_start

_log = logging.getLogger(__name__)


def fell_back(err: BaseException) -> None:
    """Say, as a warning, that installed numba failed and BM25 takes the numpy path: the
    same answers, but tens of times slower, which would otherwise go unnoticed until a
    benchmark (a kernel that stops compiling is the usual cause)."""
    _log.warning("BM25 kernels could not be compiled or loaded (%s: %s); queries take the numpy path "
                 "(identical answers, much slower)", type(err).__name__, err)


K = TypeVar("K")


class KernelLoader(Generic[K]):
    """Load a family of compiled kernels once, warm them once per flavour, and fall back.

    Why one: every kernel family (the plain layout's here, the packed layout's in
    ``index.packed_index``) must start numba without its BLAS probe, import its kernel
    modules once under a lock, warm each flavour of index arrays (dtypes, read-only flag)
    before its first query, and on any failure take the numpy path *saying so*
    (``fell_back``); the same steps written once. ``load`` imports (compiles) the family
    and returns it; ``warm(kernels, key)`` calls every entry point with the argument types
    of flavour ``key``. ``get`` returns the kernels warmed for ``key``, or None: numba not
    installed (silently) or broken (said)."""

    def __init__(self, load: Callable[[], K], warm: Callable[[K, Any], None]) -> None:
        self._load = load
        self._warm = warm
        self._lock = threading.Lock()
        self.kernels: K | None = None
        self.tried = False
        # Flavours whose signatures are loaded: the kernels are typed by each array's dtype
        # *and* read-only flag, so a memory-mapped index calls other signatures than one built
        # in memory, and a warm with the wrong flags loads code no query uses.
        self.warmed: set[Hashable] = set()

    def get(self, key: Hashable) -> K | None:
        if self.tried and (self.kernels is None or key in self.warmed):
            return self.kernels
        with self._lock:
            if not self.tried:
                try:
                    numba_start.start()  # numba's start-up, less its BLAS probe
                    self.kernels = self._load()
                except ImportError:  # numba not installed: the numpy path
                    self.kernels = None
                except Exception as err:  # noqa: BLE001 - numba present but broken: the numpy path, said
                    fell_back(err)
                    self.kernels = None
                self.tried = True
            if self.kernels is not None and key not in self.warmed:
                try:
                    self._warm(self.kernels, key)
                except Exception as err:  # noqa: BLE001 - any numba compile error: the numpy path, said
                    fell_back(err)
                    return None
                self.warmed.add(key)
        return self.kernels


# The index arrays the kernels read, in ``Flavour`` order, and what a tiny warm index holds.
_TINY: dict[str, tuple[Any, Any]] = {
    "indptr": ([0, 1], np.int64), "indices": ([0], np.int32), "tf": ([1], np.uint8), "w": ([1.0], np.float64),
    "doc_len": ([1], np.uint32), "idf": ([1.0], np.float64), "w_max": ([1.0], np.float64),
    "bptr": ([0, 1], np.int64), "bmax": ([1.0], np.float64), "bit_row": ([-1], np.int32),
    "bits": ([[0]], np.uint64),
}
Flavour = tuple[tuple[str, str, bool], ...]  # (array, dtype.str, writeable) per _TINY name, then lengths


@dataclass(frozen=True)
class Kernels:
    """The compiled entry points (numba dispatchers)."""

    search_one: Any
    search_batch: Any
    search_filtered: Any
    pack_mask: Any
    bits_to_positions: Any
    set_positions: Any
    sliced_total: Any
    count_bits: Any
    clear_bits: Any
    term_block_bounds: Any
    rank_directory: Any


def _compile() -> Kernels:
    # lazy: numba (optional: the numpy path serves without it) and the kernels' load, which
    # the first index to search pays, not every import of the package
    from . import filter_stats as fp
    from . import plain as nb

    return Kernels(nb.search_one, nb.search_batch, nb.search_filtered, fp.pack_mask, fp.bits_to_positions,
                   fp.set_positions, fp.sliced_total, fp.count_bits, fp.clear_bits, fp.term_block_bounds,
                   fp.rank_directory)


def flavour(like: Any = None, *, mapped: bool = False, lengths: Any = np.uint8) -> Flavour:
    """What the warm must match: the dtype and writeable flag of each index array the kernels
    read, from ``like`` (a ``Postings``, or anything with those attributes), else the usual
    dtypes, read-only with ``mapped`` (a published file) or writable (built in memory); and
    the dtype of the compact lengths the filtered kernel reads (``index.filter.compact_dtype``:
    uint8 on nearly every chunk corpus; a wider file loads that signature on its first
    filtered query)."""
    rows = []
    for name, (_values, dtype) in _TINY.items():
        a = getattr(like, name, None)
        rows.append((name, np.dtype(dtype).str, not mapped) if a is None
                    else (name, a.dtype.str, bool(a.flags.writeable)))
    return (*rows, ("lengths", np.dtype(lengths).str, True))


def _tiny(f: Flavour) -> dict[str, np.ndarray]:
    """A one-document, one-term index whose arrays have the dtypes and flags of ``f``."""
    out = {}
    for name, dtype, writeable in f:
        values = _TINY[name][0] if name in _TINY else [1]
        a = np.array(values, np.dtype(dtype))
        a.setflags(write=writeable)
        out[name] = a
    return out


def _warm(k: Kernels, f: Flavour) -> None:
    """Load (or compile) every entry point with the argument types an index of flavour ``f``
    passes, on a tiny input, so its first query of any kind (unfiltered, filtered by mask,
    bits or positions, batched) never loads or compiles, and a failure falls back here. The
    scratch arguments (accumulators, filter bits, query term ids) are writable in every index."""
    a = _tiny(f)
    indptr, indices, w, idf, w_max, bptr, bmax = (a[n] for n in ("indptr", "indices", "w", "idf", "w_max", "bptr",
                                                                 "bmax"))
    q = np.zeros(1, np.int64)
    acc = np.zeros(1, np.float64)
    touched = np.zeros(1, np.int32)
    for exhaustive_docs in (0, 1):  # both unfiltered routes
        k.search_one(indptr, indices, w, idf, w_max, q, 2.0, 1, acc, touched, exhaustive_docs, bptr, bmax)
    k.search_batch(indptr, indices, w, idf, w_max, q, np.array([0, 1], np.int64), 2.0, 1, 1, 1, bptr, bmax)
    mask = np.ones(1, np.bool_)
    bits, slices = np.zeros(1, np.uint64), np.ones((1, 1), np.uint64)
    n, total = k.pack_mask(np.zeros(0, np.uint64), mask, slices, bits)
    surv = np.zeros(1, np.int64)
    k.bits_to_positions(bits, surv)
    for gather in (True, False):
        k.set_positions(surv, a["doc_len"], bits, gather)
    k.sliced_total(bits, slices)
    k.count_bits(bits)
    k.clear_bits(surv, bits)
    blk_tf, blk_len = np.zeros(1, np.uint32), np.zeros(1, np.uint32)
    k.term_block_bounds(indptr, indices, a["tf"], a["doc_len"], bptr, 0, 128, blk_tf, blk_len)
    rank_dir = np.zeros((1, 1), np.uint32)
    k.rank_directory(a["bits"][0], rank_dir[0])
    k.search_filtered(indptr, indices, a["tf"], a["lengths"], bits, surv, n, total, q, a["bit_row"], a["bits"],
                      rank_dir, 1.5, 0.75, 1, acc, touched, w_max, 1.0, bptr, bmax, blk_tf, blk_len, blk_tf, blk_len,
                      np.zeros(1, np.int64), np.zeros(0, np.int64))  # no stack statistics (bm25_stats_query)


# The plain layout's kernels (``_warm`` looked up per call: a test may replace it).
_PLAIN: KernelLoader[Kernels] = KernelLoader(_compile, lambda k, f: _warm(k, f))


def load_kernels(like: Any = None, *, mapped: bool = False) -> Kernels | None:
    """The compiled kernels, warmed for an index whose arrays are like ``like`` (see
    ``flavour``; ``mapped`` without ``like``: a published file of the usual dtypes), or None
    when numba is not installed or cannot compile."""
    return _PLAIN.get(flavour(like, mapped=mapped))


def require(kernel: str, compiled: Any) -> None:
    """``kernel="numba"`` asks for the compiled kernels: an error when they did not load."""
    if kernel == "numba" and compiled is None:
        raise RuntimeError("kernel='numba' needs numba, which could not be imported or compiled "
                           "(pip install 'numba>=0.60')")


class Scratch(threading.local):
    """Per-thread accumulator, touched-doc list and packed-filter buffers for one index.

    ``mask_bits`` receives a packed bool mask (every word rewritten per query);
    ``pos_bits`` stays all zeros between queries (positions set their bits and clear them
    after), so a filter given as positions costs O(positions), not O(N).
    """

    def __init__(self, n_docs: int) -> None:
        self.acc = np.zeros(max(n_docs, 1), np.float64)
        self.touched = np.zeros(max(n_docs, 1), np.int32)
        words = (max(n_docs, 1) + 63) // 64
        self.mask_bits = np.zeros(words, np.uint64)
        self.pos_bits = np.zeros(words, np.uint64)
