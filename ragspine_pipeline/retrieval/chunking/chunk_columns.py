"""A chunk set kept columnar: Arrow columns, with a ``Chunk`` built only for a row asked for.

Why: a published library of 250k chunks took seconds and a gigabyte to open when every
row became a Python ``StoredChunk`` (#27), while a query only ever formats its top-k.
``ChunkColumns`` is a ``Sequence[Chunk]`` over an Arrow table (memory-mapped from an
Arrow IPC file by the warehouse, so every serving process shares the pages): indexing
builds the one ``StoredChunk`` with ``row_to_chunk`` (the same conversion as the
row-by-row path, so a snippet is the same bytes), and the whole-set questions the
retriever asks (ids, languages, labels, documents, filter columns) are answered from the
columns without building any chunk. A chunk built for a hit is kept (at most ``CACHE_MAX``) for
the next query that returns it.

Rows are in chunk_id order with unique ids (checked here, or, when ``id_digest`` is given,
by the publisher that took the digest: the retriever's position order is chunk_id order). ``verify_row`` and ``verify_column``, when given, are called before a
row is read into Python (with its position) and before a column is read whole (with its
name): the warehouse checks the checksums of what is about to be read. ``read_row``, when
given, returns a row's stored dict by position (the warehouse keeps each row whole in one
column, a single read); otherwise the row is read from the table's columns.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any, overload

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .chunk_schema import StoredChunk, row_to_chunk

# Chunks built for hits, kept for the next query that returns them (frozen: safe to share);
# cleared when full, so the set stays a few megabytes however large the library.
CACHE_MAX = 4096
# What ``row_to_chunk`` turns a null into, so a filter column holds what a built chunk would.
_NULL_AS = {"sensitivity": "INTERNAL", "chunker": "paragraph", "version": 1}

__all__ = ["ChunkColumns"]


class ChunkColumns(Sequence[StoredChunk]):
    """Chunks of an Arrow table (``chunks`` table columns), one ``StoredChunk`` per row on demand."""

    def __init__(self, table: pa.Table, *, verify_row: Callable[[int], None] | None = None,
                 verify_column: Callable[[str], None] | None = None,
                 read_row: Callable[[int], dict[str, Any]] | None = None,
                 id_digest: bytes | None = None) -> None:
        if id_digest is None:
            if verify_column is not None:
                verify_column("chunk_id")
            ids = table.column("chunk_id")
            n = table.num_rows
            if n > 1 and not pc.all(pc.greater(ids.slice(1), ids.slice(0, n - 1))).as_py():
                raise ValueError("ChunkColumns needs unique chunk ids in chunk_id order")
        # The publisher's ``bm25_format.id_digest`` of the ids, their order checked when it
        # was taken: an open compares it with the BM25 file's instead of reading the ids.
        self.id_digest = id_digest
        self.table = table
        self._verify = verify_row
        self._verify_column = verify_column
        self._read_row = read_row
        self._values: dict[str, np.ndarray] = {}
        self._batches: list[pa.RecordBatch] | None = None
        self._built: dict[int, StoredChunk] = {}
        self._starts = np.zeros(1, np.int64)

    def __len__(self) -> int:
        return self.table.num_rows

    @overload
    def __getitem__(self, i: int) -> StoredChunk: ...

    @overload
    def __getitem__(self, i: slice) -> list[StoredChunk]: ...

    def __getitem__(self, i: int | slice) -> StoredChunk | list[StoredChunk]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        n = len(self)
        j = int(i) + n if int(i) < 0 else int(i)
        if not 0 <= j < n:
            raise IndexError(f"chunk position {i} outside 0..{n - 1}")
        hit = self._built.get(j)
        if hit is None:
            if len(self._built) >= CACHE_MAX:
                self._built.clear()
            hit = self._built[j] = self._build(j)
        return hit

    def _build(self, j: int) -> StoredChunk:
        if self._verify is not None:
            self._verify(j)
        if self._read_row is not None:
            return row_to_chunk(self._read_row(j))
        if self._batches is None:  # a row is sliced from its batch: Table.slice walks every chunk
            self._batches = self.table.to_batches()
            self._starts = np.cumsum([0, *(b.num_rows for b in self._batches)], dtype=np.int64)
        b = int(np.searchsorted(self._starts, j, side="right")) - 1
        batch, k = self._batches[b], j - int(self._starts[b])
        # Scalar by scalar: a fifth of the cost of a one-row slice's to_pylist.
        return row_to_chunk({n: col[k].as_py() for n, col in zip(batch.schema.names, batch.columns, strict=True)})

    def __iter__(self) -> Iterator[StoredChunk]:
        """Every chunk (whole-set consumers: an ``auto`` backend's vote, a lazy embed)."""
        self._verify_all()
        if self._read_row is not None:
            yield from (row_to_chunk(self._read_row(j)) for j in range(len(self)))
            return
        for batch in self.table.to_batches(max_chunksize=4096):
            yield from (row_to_chunk(r) for r in batch.to_pylist())

    def _verify_all(self) -> None:
        if self._verify_column is not None:
            for name in self.table.column_names:
                self._verify_column(name)

    # ------------------------------------------------------------ columns
    def chunk_ids(self) -> list[str]:
        return self.column("chunk_id").to_pylist()

    def chunk_id_blob(self) -> tuple[np.ndarray, np.ndarray]:
        """The chunk ids as (int64 offsets from 0, UTF-8 bytes), straight from the Arrow
        buffers: how a published BM25 file records its doc ids, compared without a Python
        string per chunk."""
        arr = self.column("chunk_id").combine_chunks()
        if not pa.types.is_string(arr.type) or arr.null_count:
            raise TypeError(f"chunk_id must be a string column without nulls (got {arr.type})")
        bufs = arr.buffers()
        off = np.frombuffer(bufs[1], np.int32)[arr.offset:arr.offset + len(arr) + 1].astype(np.int64)
        blob = np.frombuffer(bufs[2], np.uint8)[off[0]:off[-1]] if len(arr) else np.zeros(0, np.uint8)
        return off - off[0], blob

    def column(self, name: str) -> pa.ChunkedArray:
        """A column with nulls read as ``row_to_chunk`` reads them ("" for text)."""
        if self._verify_column is not None:
            self._verify_column(name)
        col = self.table.column(name)
        if col.null_count:
            col = col.fill_null(_NULL_AS.get(name, "" if pa.types.is_string(col.type) else 0))
        return col

    def values(self, name: str, default: Any = None) -> np.ndarray:
        """Object array of a field's Python values per chunk (the filter columns); a field
        the table lacks is ``default`` everywhere, as ``getattr(chunk, name, default)``."""
        got = self._values.get(name)
        if got is None:
            if name in self.table.column_names:
                got = np.empty(len(self), dtype=object)
                got[:] = self.column(name).to_pylist()
            else:
                got = np.full(len(self), default, dtype=object)
            self._values[name] = got
        return got

    def codes(self, name: str) -> tuple[np.ndarray, list[Any]]:
        """(code per chunk, distinct values in first-seen order) of a column."""
        enc = pc.dictionary_encode(self.column(name)).combine_chunks()
        return _ints(enc.indices), enc.dictionary.to_pylist()

    def matching(self, name: str, predicate: Callable[[Any], bool]) -> np.ndarray:
        """Bool per chunk: ``predicate`` of its ``name`` value, called once per distinct value."""
        if not any(predicate(v) for v in pc.unique(self.column(name)).to_pylist()):
            return np.zeros(len(self), dtype=bool)  # the usual case: no per-chunk codes at all
        codes, values = self.codes(name)
        verdict = np.fromiter((bool(predicate(v)) for v in values), dtype=bool, count=len(values))
        return verdict[codes] if len(codes) else np.zeros(0, dtype=bool)

    def languages(self) -> list[str]:
        """Distinct non-empty document languages, sorted."""
        return sorted(v for v in pc.unique(self.column("language")).to_pylist() if v)

    def take(self, keep: np.ndarray) -> ChunkColumns:
        """The rows where ``keep`` is true (still in chunk_id order)."""
        rows = np.flatnonzero(keep)
        self._verify_all()  # the rows are copied out: check them all first
        read = self._read_row
        return ChunkColumns(self.table.take(pa.array(rows)),
                            read_row=None if read is None else (lambda j: read(int(rows[j]))))


def _ints(arr: pa.Array) -> np.ndarray:
    """An integer Arrow array without nulls as int64 numpy, read from its buffer
    (``Array.to_numpy`` would import pandas: a tenth of a second and 40 MiB per process)."""
    if arr.null_count:
        raise ValueError("codes of a column with nulls")
    data = np.frombuffer(arr.buffers()[1], dtype=np.dtype(f"int{arr.type.bit_width}"))
    return data[arr.offset:arr.offset + len(arr)].astype(np.int64)
