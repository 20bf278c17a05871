"""A published BM25 version as a stack of immutable segments with live rows (Lucene-style).

Why: a refresh that changes 1% of a library should write about 1% of an index, not the
whole file (#27 item 1). A version is therefore published as the segment files of earlier
versions, unchanged (hard links: no bytes copied), plus at most one new segment holding
the chunks added or re-analyzed now, and for every segment the version's *rows*: where
each of its documents sits in the version's chunk_id order, or -1 when the document is no
longer live (deleted, hidden, or replaced by a newer copy in a later segment). A merge
policy (``warehouse.lexical_stack``) folds the stack back into one file when it grows
deep or carries many dead documents, as Lucene's merge policies do.

Scores are the spec's: N, df and avgdl over the stack's live documents (under a filter,
its survivors), never a segment's own. Each segment reports its survivors' count, summed
length and per-token df (``survivor_stats``); the sums go back to every segment
(``search(..., stats=...)``), whose compiled filtered kernel scores its live postings with
them; the per-segment top-k lists merge by (score desc, row asc), ties by chunk_id as in
one index. Every row space the retriever uses (records, vectors, filters) is the
version's chunk_id order, so the stack answers in rows and takes filters in rows.

Files (all in the version folder): ``bm25-stack.json`` (``STACK_FORMAT``, the version's
row count and id digest, per segment its file, size, document count, live count and the
CRC-32 of its rows file) and per segment a rows file of little-endian int32. Opening
checks the manifest, each rows file's size and CRC, and that the live rows are exactly
0..N-1 once each, then maps the segment files (their own header/footer/checksum rules).
A damaged or missing file is a ``CorruptIndexError`` naming it.
"""

from __future__ import annotations

import json
import os
import threading
import weakref
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..format.file import CorruptIndexError, IndexFormatError, id_digest, strings_to_blob
from ..index import filter as bm25_filter
from ..index.bm25 import candidate_mask
from ..index.corpus_stats import CorpusStats
from ..index.filter import PackedFilter
from ..index.mapped import open_index
from ..index.topk import ScoredDocs, empty_scored, merge_top_k
from ..kernels.loader import fell_back

STACK_FILE = "bm25-stack.json"
STACK_KIND = "ragspine-bm25-stack"
STACK_FORMAT = 1
ROWS_DTYPE = np.dtype("<i4")
DF_MEMO = 1 << 16  # tokens whose stack df a reused filter keeps (then it starts again)
FILTER_MEMO = 16  # reused row filters translated per segment and kept (each may remember a df cache per segment)


@dataclass(frozen=True)
class StackSegment:
    """One segment as the manifest names it."""

    file: str  # file name in the version folder
    docs: int  # documents in the file
    live: int  # documents live in this version
    rows: str  # rows file name
    rows_crc32: int
    bytes: int

    def as_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def rows_file_name(i: int) -> str:
    return f"bm25-rows-{i:03d}.i32"


def write_stack(folder: str | os.PathLike[str], files: Sequence[str], rows: Sequence[np.ndarray], n_docs: int,
                ids_off: np.ndarray, ids_blob: np.ndarray) -> Path:
    """Write the rows files and the manifest of a stack whose segment files already lie in
    ``folder`` (``files[i]`` with ``rows[i]``); ``ids_off``/``ids_blob`` are the version's
    chunk ids in row order (``strings_to_blob``), digested for the open-time id check.
    Each file is written to a temporary name and renamed; the manifest last."""
    folder = Path(folder)
    check_rows(folder / STACK_FILE, rows, n_docs)
    segs = []
    for i, (name, r) in enumerate(zip(files, rows, strict=True)):
        data = np.ascontiguousarray(r, ROWS_DTYPE).tobytes()
        _atomic_write(folder / rows_file_name(i), data)
        segs.append(StackSegment(name, int(len(r)), int(np.count_nonzero(r >= 0)), rows_file_name(i),
                                 zlib.crc32(data), (folder / name).stat().st_size))
    manifest = {"kind": STACK_KIND, "format": STACK_FORMAT, "n_docs": int(n_docs),
                "doc_id_digest": id_digest(ids_off, ids_blob).hex(), "segments": [s.as_json() for s in segs]}
    path = folder / STACK_FILE
    _atomic_write(path, json.dumps(manifest, indent=1).encode())
    return path


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def check_rows(where: Path, rows: Sequence[np.ndarray], n_docs: int) -> None:
    """The live rows of all segments must be exactly 0..n_docs-1, once each."""
    live = [np.asarray(r)[np.asarray(r) >= 0] for r in rows]
    got = np.concatenate(live) if live else np.zeros(0, np.int64)
    if len(got) != n_docs or (n_docs and (int(got.min()) < 0 or int(got.max()) >= n_docs
                                          or np.bincount(got, minlength=n_docs).max() != 1)):
        raise CorruptIndexError(where, f"the segments' live rows are not 0..{n_docs - 1} once each")
    if any(len(lv) > 1 and bool((np.diff(lv) <= 0).any()) for lv in live):
        raise CorruptIndexError(where, "a segment's live rows are not ascending (chunk_id order)")


def read_manifest(folder: str | os.PathLike[str]) -> dict[str, Any]:
    path = Path(folder) / STACK_FILE
    try:
        man = json.loads(path.read_bytes())
    except (OSError, ValueError) as exc:
        raise CorruptIndexError(path, f"unreadable stack manifest: {exc}") from exc
    if not isinstance(man, dict) or man.get("kind") != STACK_KIND:
        raise CorruptIndexError(path, "not a BM25 stack manifest")
    if man.get("format") != STACK_FORMAT:
        raise IndexFormatError(path, f"BM25 stack format version {man.get('format')!r}; this ragspine reads "
                                     f"stack format version {STACK_FORMAT}")
    return man


def open_stack(folder: str | os.PathLike[str], *, kernel: str = "auto") -> StackedBM25:
    """Map a stack published by ``write_stack`` (see the module docstring's checks)."""
    folder = Path(folder)
    man = read_manifest(folder)
    where = folder / STACK_FILE
    try:
        segs = [StackSegment(**s) for s in man["segments"]]
        n_docs = int(man["n_docs"])
        digest = bytes.fromhex(man["doc_id_digest"])
    except (KeyError, TypeError, ValueError) as exc:
        raise CorruptIndexError(where, f"malformed stack manifest: {exc}") from exc
    for s in segs:  # names in this folder only: a damaged or hostile manifest opens nothing else
        if any(not isinstance(x, str) or Path(x).name != x or x in ("", ".", "..")
                           for x in (s.file, s.rows)):
            raise CorruptIndexError(where, f"segment or rows file name {s.file!r}/{s.rows!r} is not a file here")
    if not segs:
        raise CorruptIndexError(where, "a stack without segments")
    rows = []
    for s in segs:
        p = folder / s.rows
        try:
            data = p.read_bytes()
        except OSError as exc:
            raise CorruptIndexError(p, f"rows file unreadable: {exc}") from exc
        if len(data) != s.docs * ROWS_DTYPE.itemsize or zlib.crc32(data) != s.rows_crc32:
            raise CorruptIndexError(p, "rows file truncated or corrupt (size or CRC-32)")
        rows.append(np.frombuffer(data, ROWS_DTYPE).astype(np.int64))
    check_rows(where, rows, n_docs)
    indexes = []
    for s in segs:
        p = folder / s.file
        if not p.is_file():
            raise FileNotFoundError(f"{p}: stack segment missing")
        ix = open_index(p, kernel=kernel)
        if ix.n_docs != s.docs:
            raise CorruptIndexError(p, f"holds {ix.n_docs} documents; the stack manifest says {s.docs}")
        indexes.append(ix)
    return StackedBM25(indexes, rows, n_docs, digest=digest, path=folder)


@dataclass
class _Totals:
    """A reused filter's statistics over the whole stack (n < 0: not counted yet)."""

    n: int = -1
    total: int = 0
    df: dict[str, int] = field(default_factory=dict)


class StackedBM25:
    """Segments plus rows, answering in the version's rows (see the module docstring)."""

    def __init__(self, segments: list[Any], rows: list[np.ndarray], n_docs: int, *, digest: bytes | None = None,
                 path: Path | None = None) -> None:
        if not segments or len(segments) != len(rows):
            raise ValueError("a stack needs one rows array per segment, and at least one segment")
        first = segments[0]
        for seg in segments[1:]:
            if (seg.k1, seg.b) != (first.k1, first.b):
                raise CorruptIndexError(seg.path, f"k1/b {seg.k1}/{seg.b} differ from {first.path}'s")
        self.segments = segments
        self.rows = [np.asarray(r, np.int64) for r in rows]
        self.n_docs = int(n_docs)
        self.k1, self.b = first.k1, first.b
        self.path = path
        self._digest = digest
        lives = [r >= 0 for r in self.rows]
        self._live = [None if bool(m.all()) else PackedFilter.from_mask(m) for m in lives]
        self._row_seg: tuple[np.ndarray, np.ndarray] | None = None
        self._memo: dict[int, tuple[weakref.ref, list[Any], _Totals]] = {}
        self._live_totals = _Totals()
        self._memo_lock = threading.Lock()
        self._translation: tuple[Any, list[Any]] | tuple[()] | None = None  # _plans: () = numpy path

    # ------------------------------------------------------------ ids
    has_doc_ids = True

    def doc_id_digest(self) -> bytes | None:
        return self._digest

    def same_doc_id_blob(self, off: np.ndarray, blob: np.ndarray) -> bool:
        return self._digest is not None and len(off) == self.n_docs + 1 and id_digest(off, blob) == self._digest

    def same_doc_ids(self, ids: Sequence[str]) -> bool:
        return len(ids) == self.n_docs and self.same_doc_id_blob(*strings_to_blob(ids))

    def doc_ids(self, positions: Iterable[int]) -> list[str]:
        seg_of, pos_of = self._row_map()
        return [self.segments[int(seg_of[p])].doc_ids([int(pos_of[p])])[0] for p in positions]

    def verify(self) -> None:
        """Every segment's checksums and structure (``CorruptIndexError`` naming the file)."""
        for seg in self.segments:
            seg.verify()

    # ------------------------------------------------------------ search
    def search(self, query_tokens: Sequence[str], k: int = 10, candidates: Any = None, *,
               stats: CorpusStats | None = None) -> ScoredDocs:
        """Top-k rows by (score desc, row asc) with the stack's live (surviving) statistics.

        ``candidates``: a bool mask over the rows, rows (any order), or a ``PackedFilter``
        over the rows, as ``BM25Index.search`` takes them. ``stats``: statistics of a larger
        corpus this stack is one part of (``survivor_stats`` summed; several libraries
        ranked as one), used instead of the stack's own."""
        if len(self.segments) == 1 and self._live[0] is None:  # rows are 0..N-1: the file itself
            return self.segments[0].search(query_tokens, k, candidates, **({"stats": stats} if stats else {}))
        if k <= 0:
            if candidates is not None:
                candidate_mask(candidates, self.n_docs)  # a malformed filter is still an error
            return empty_scored()
        filters, totals = (self._live, self._live_totals) if candidates is None else self._segment_filters(candidates)
        tokens = list(query_tokens)
        stats = self._stats(tokens, filters, totals) if stats is None else stats
        if stats.n == 0 or stats.total == 0 or not stats.df.any():
            return empty_scored()
        ids, scores = [], []
        for seg, f, rows in zip(self.segments, filters, self.rows, strict=True):
            if f is False:
                continue
            part = seg.search(tokens, k, f, stats=stats)
            ids.append(rows[part.ids])
            scores.append(part.scores)
        return merge_top_k(np.concatenate(ids), np.concatenate(scores), k)

    def survivor_stats(self, query_tokens: Sequence[str], candidates: Any = None) -> CorpusStats:
        """The stack's live rows under ``candidates`` (None: every live row): their count,
        summed length and df per query token, this stack's part of a larger corpus's
        statistics (as ``BM25Index.survivor_stats``)."""
        if len(self.segments) == 1 and self._live[0] is None:
            return self.segments[0].survivor_stats(query_tokens, candidates)
        filters, totals = (self._live, self._live_totals) if candidates is None else self._segment_filters(candidates)
        return self._stats(list(query_tokens), filters, totals)

    def _stats(self, tokens: list[str], filters: list[Any], totals: _Totals | None) -> CorpusStats:
        """The stack's statistics of ``tokens`` under per-segment ``filters``: the segments'
        parts summed. A reused filter (``totals``; the live rows are one) remembers its
        count, summed length and each token's df, so a query of known tokens costs no
        segment call here: one scoring call per segment is what is left."""
        if totals is None:
            return self._summed(tokens, filters)
        got = {t: totals.df.get(t) for t in tokens}
        missing = [t for t, d in got.items() if d is None]
        n, total = totals.n, totals.total
        if missing or n < 0:
            part = self._summed(missing, filters)
            n, total = part.n, part.total
            counted = dict(zip(missing, part.df.tolist(), strict=True))
            got.update(counted)
            if len(totals.df) + len(missing) > DF_MEMO:
                totals.df = {}
            totals.df.update(counted)
            totals.n, totals.total = n, total
        return CorpusStats(n, total, np.array([got[t] for t in tokens], np.int64))

    def _summed(self, tokens: list[str], filters: list[Any]) -> CorpusStats:
        stats = CorpusStats.zero(len(tokens))
        for seg, f in zip(self.segments, filters, strict=True):
            if f is not False:
                stats = stats + seg.survivor_stats(tokens, f)
        return stats

    def search_batch(self, queries: Sequence[Sequence[str]], k: int = 10, *,
                     threads: int | None = None) -> list[ScoredDocs]:
        return [self.search(q, k) for q in queries]

    def _segment_filters(self, candidates: Any) -> tuple[list[Any], _Totals | None]:
        """Per segment, the row filter as that segment's filter (False: no survivor there),
        and the record of its statistics when it is a reused ``PackedFilter``: translated
        once, kept weakly (``FILTER_MEMO`` of them)."""
        if isinstance(candidates, PackedFilter):
            hit = self._memo.get(id(candidates))
            if hit is not None and hit[0]() is candidates:
                return hit[1], hit[2]
        cand = candidates if isinstance(candidates, PackedFilter) else np.asarray(candidates)
        if not isinstance(cand, PackedFilter) and cand.dtype != np.bool_:
            out = self._from_rows(cand)
        else:
            out = self._from_bits(cand)
        if not isinstance(candidates, PackedFilter):
            return out, None
        totals = _Totals()
        with self._memo_lock:
            while len(self._memo) >= FILTER_MEMO:
                self._memo.pop(next(iter(self._memo)), None)
            self._memo[id(candidates)] = (weakref.ref(candidates), out, totals)
        return out, totals

    def _from_bits(self, cand: np.ndarray | PackedFilter) -> list[Any]:
        """A bool mask or packed words over the rows: each segment's packed words, built by
        the compiled translation (``kernels.stack_filters``) from the filter's words, without
        a pass over N bools; the numpy translation where that is not loaded."""
        bm25_filter.check(cand, self.n_docs)  # what candidate_mask raises, before any work
        plans = self._plans()
        if plans is None:
            return mask_filters(cand, self.rows, self.n_docs)
        translate, runs = plans
        words = cand.words if isinstance(cand, PackedFilter) else PackedFilter.from_mask(cand).words
        out: list[Any] = []
        for rows, seg_runs in zip(self.rows, runs, strict=True):
            seg_words, n = translate(words, rows, seg_runs)
            out.append(PackedFilter(seg_words) if n else False)
        return out

    def _plans(self) -> tuple[Any, list[Any]] | None:
        """The compiled translation and each segment's plan (its runs), made on the stack's
        first filter (not at open: open time is a tracked figure); None for a stack whose
        segments take the numpy path, or when the compiled translation cannot load."""
        if self._translation is None:
            with self._memo_lock:
                if self._translation is None:
                    self._translation = _load_translation(self.segments, self.rows)
        return self._translation or None

    def _from_rows(self, rows_wanted: np.ndarray) -> list[Any]:
        """Rows given as integers: each segment gets its positions, O(their number)."""
        bm25_filter.check(rows_wanted, self.n_docs)  # a row outside the version is an error
        seg_of, pos_of = self._row_map()
        r = np.unique(np.asarray(rows_wanted, np.int64))
        out: list[Any] = []
        for s in range(len(self.segments)):
            mine = r[seg_of[r] == s]
            out.append(np.ascontiguousarray(pos_of[mine], np.int64) if len(mine) else False)
        return out

    def _row_map(self) -> tuple[np.ndarray, np.ndarray]:
        """(segment of each row, its position there), built on first use."""
        if self._row_seg is None:
            seg_of = np.zeros(self.n_docs, np.int16)
            pos_of = np.zeros(self.n_docs, np.int64)
            for s, rows in enumerate(self.rows):
                live = np.flatnonzero(rows >= 0)
                seg_of[rows[live]] = s
                pos_of[rows[live]] = live
            self._row_seg = (seg_of, pos_of)
        return self._row_seg


def mask_filters(cand: np.ndarray | PackedFilter, rows_of: Sequence[np.ndarray], n_docs: int) -> list[Any]:
    """The numpy translation of a bool mask or packed words over the rows into per-segment
    ``PackedFilter``s (False: no survivor there): unpack, gather through each segment's
    rows, pack. The fallback without the compiled one, and the tests' oracle for it."""
    mask = candidate_mask(cand, n_docs)
    out: list[Any] = []
    for rows in rows_of:
        m = (mask[np.maximum(rows, 0)] & (rows >= 0)) if n_docs else np.zeros(len(rows), np.bool_)
        out.append(PackedFilter.from_mask(m) if m.any() else False)
    return out


def _load_translation(segments: Sequence[Any], rows_of: Sequence[np.ndarray]) -> tuple[Any, list[Any]] | tuple[()]:
    """(translate, per-segment plans) from ``kernels.stack_filters``, or () for the numpy path:
    a segment on the numpy path (``kernel="numpy"``), or a translation that cannot load."""
    if any(getattr(seg, "kernel", "numpy") == "numpy" for seg in segments):
        return ()
    try:
        # lazy: numba kernels, kept off an index's open (a tracked figure); ImportError: numpy path
        from ..kernels import stack_filters as sf

        return sf.warm(), [sf.plan(r) for r in rows_of]
    except ImportError:
        return ()
    except Exception as err:  # noqa: BLE001 - a compile failure: the numpy translation, said
        fell_back(err)
        return ()
