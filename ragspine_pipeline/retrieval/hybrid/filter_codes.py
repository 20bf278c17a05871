"""The pre-filter's mask from per-field value codes: each predicate is decided once per
distinct value, not once per chunk (issue #27 item 4, the caller side).

``filters.predicate_mask`` compares every chunk's Python value: at 1M chunks one ``eq``
costs ~7.6 ms and one ``in`` ~88 ms per query, 20-300x the filtered BM25 search it feeds.
Metadata fields hold few distinct values (topic, language, sensitivity, period), so here a
field is coded once (code per chunk, distinct values), a predicate's verdict is computed
per distinct value and gathered by code. The verdicts are ``Predicate.matches`` of the same
values, so the mask is identical; distinct values are keyed by (type, value), as
``HybridRetriever.label_codes`` does, so 1 and True never share a verdict. A field with many
distinct values (chunk_id, doc_id) keeps the per-chunk evaluation, which is cheaper there.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..filters import Predicate, predicate_mask
from ..lexical.index.filter import DF_SLOTS

# Coded evaluation when distinct values are at most this fraction of the chunks (a verdict
# per distinct value is a Python call; a per-chunk ``eq`` over an object array is a C loop).
MAX_DISTINCT_SHARE = 1 / 64


@dataclass(frozen=True)
class FieldCodes:
    """A field as (code per chunk, distinct values); ``None`` codes: evaluate per chunk."""

    codes: np.ndarray | None
    values: list[Any]


def code_values(col: np.ndarray) -> FieldCodes:
    """Codes of an object column by (type, value); per-chunk evaluation (``codes`` None) when
    a value is unhashable or the distinct values are too many to pay off."""
    index: dict[tuple[type, Any], int] = {}
    values: list[Any] = []
    codes = np.empty(len(col), np.int32)
    limit = max(int(len(col) * MAX_DISTINCT_SHARE), 1)
    try:
        for i, v in enumerate(col.tolist()):
            key = (type(v), v)
            c = index.get(key)
            if c is None:
                if len(values) >= limit:
                    return FieldCodes(None, [])
                c = index[key] = len(values)
                values.append(v)
            codes[i] = c
    except TypeError:  # an unhashable value
        return FieldCodes(None, [])
    # The narrowest code type: the per-query gather reads a byte per chunk on most fields.
    narrow = np.uint8 if len(values) <= 2**8 else np.uint16 if len(values) <= 2**16 else np.int32
    return FieldCodes(codes.astype(narrow), values)


def coded_mask(preds: Sequence[Predicate], column: Callable[[str], np.ndarray],
               codes: Callable[[str], FieldCodes], n: int) -> np.ndarray:
    """AND of ``preds``: equal to ``predicate_mask(preds, column, n)``, each predicate decided
    once per distinct value of its field where the field is coded."""
    mask: np.ndarray | None = None
    for p in preds:
        fc = codes(p.field)
        if fc.codes is None:
            m = predicate_mask([p], column, n)
        else:
            verdict = np.fromiter((bool(p.matches(v)) for v in fc.values), dtype=bool, count=len(fc.values))
            m = _gather(verdict, fc.codes)
        if mask is None:
            mask = np.asarray(m, dtype=bool)  # a fresh array either way: owned, safe to AND into
        else:
            mask &= m
    return np.ones(n, dtype=bool) if mask is None else mask


def _gather(verdict: np.ndarray, codes: np.ndarray) -> np.ndarray:
    """``verdict[codes]``, as one compare when a single value passes or fails (an ``eq`` or
    ``ne``: ~0.03 ms at 1M chunks, where a gather takes ~1-2 ms)."""
    hits = np.flatnonzero(verdict)
    code = codes.dtype.type
    if len(hits) == 0 or len(hits) == len(verdict):
        return np.full(len(codes), len(hits) > 0, dtype=bool)
    if len(hits) == 1:
        return codes == code(hits[0])
    if len(hits) == len(verdict) - 1:
        return codes != code(np.flatnonzero(~verdict)[0])
    return np.take(verdict, codes)


# --------------------------------------------------------------------- the filter cache
# A retriever serves one immutable snapshot, so a filter expression names the same survivors
# on every query: its mask, its positions and what BM25 is handed (a ``PackedFilter``,
# which remembers its survivors' count, summed length and per-term df: ``bm25_filter.
# remembered``) are kept per expression, as Lucene's query cache keeps a filter's doc-id
# set. A repeated filter then costs no pass over N; at 10M chunks a 50% filter's mask,
# packing and survivor statistics were ~3 ms of a ~5 ms query. Bounded by entries and bytes
# (masks are N bytes each); least recently used goes first.
FILTER_CACHE_ENTRIES = 64
FILTER_CACHE_BYTES = 64 << 20


@dataclass
class CachedFilter:
    """One filter expression's survivors, in the forms the channels ask for (filled lazily;
    never written once set: every holder reads the same arrays)."""

    mask: np.ndarray
    positions: np.ndarray | None = None
    bm25: Any = None

    def nbytes(self) -> int:
        """Bytes held, with what a ``PackedFilter`` may remember on the retriever's one index
        counted at its most (it fills as queries come, after the entry is put): positions
        when few (at most its words' bytes) and a survivor-df cache of ``DF_SLOTS`` slots."""
        held = sum(int(getattr(a, "nbytes", 0)) for a in (self.mask, self.positions, self.bm25))
        words = getattr(self.bm25, "words", None)
        if words is not None:  # a PackedFilter: its words, its positions when few, its df cache
            held += 2 * int(words.nbytes) + DF_SLOTS * 8
        return held


class FilterCache:
    """Least-recently-used ``CachedFilter`` per filter key (``filter_key``), thread-safe."""

    def __init__(self, max_entries: int = FILTER_CACHE_ENTRIES, max_bytes: int = FILTER_CACHE_BYTES) -> None:
        self._entries: OrderedDict[Hashable, CachedFilter] = OrderedDict()
        self._lock = threading.Lock()
        self.max_entries = max_entries
        self.max_bytes = max_bytes

    def get(self, key: Hashable) -> CachedFilter | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                self._entries.move_to_end(key)
            return entry

    def put(self, key: Hashable, entry: CachedFilter) -> None:
        """Keep ``entry`` (its size is counted as it is now: call once its forms are filled)."""
        with self._lock:
            self._entries[key] = entry
            self._entries.move_to_end(key)
            total = sum(e.nbytes() for e in self._entries.values())
            while self._entries and (len(self._entries) > self.max_entries or total > self.max_bytes):
                _, old = self._entries.popitem(last=False)
                total -= old.nbytes()

    def __len__(self) -> int:
        return len(self._entries)


# An operand listing more values than this is not kept: the cache counts its arrays' bytes,
# not its keys', and a filter that long is rarely repeated.
MAX_KEY_VALUES = 256


def filter_key(preds: Sequence[Predicate]) -> Hashable | None:
    """A hashable key naming ``preds`` exactly (None when an operand cannot be keyed, or
    lists more than ``MAX_KEY_VALUES`` values): each value keyed with its type, as
    ``code_values`` keys them, so 1, 1.0 and True never share an entry."""
    if any(isinstance(p.operand, (list, tuple, set, frozenset)) and len(p.operand) > MAX_KEY_VALUES for p in preds):
        return None
    try:
        key = tuple((p.field, p.op, _frozen(p.operand)) for p in preds)
        hash(key)
    except TypeError:
        return None
    return key


def _frozen(v: Any) -> Hashable:
    if isinstance(v, (list, tuple)):
        return (type(v), tuple(_frozen(x) for x in v))
    if isinstance(v, (set, frozenset)):
        return (type(v), frozenset(_frozen(x) for x in v))
    if isinstance(v, float) and v != v:
        raise TypeError("NaN never equals itself")
    return (type(v), v)
