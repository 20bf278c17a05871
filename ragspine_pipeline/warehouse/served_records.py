"""The served chunk records of a lexical index version: one Arrow IPC file, opened mapped.

Why: opening a snapshot used to read the chunks Parquet and build a Python chunk per
row (seconds and a gigabyte per process at 250k chunks, #27). The ``lexical_index`` step
writes, beside its BM25 file, the rows the index serves (active, not withheld, not
RESTRICTED: the published index holds no restricted chunk at all), in chunk_id order, as
an uncompressed Arrow IPC file. Serving maps it (``open_served_records``): every process
shares the page-cache pages, and a ``StoredChunk`` is built only for a row a query
returns (``ChunkColumns``).

Integrity: a sidecar JSON records the format, the row count, the file size and a crc32
per (record batch, column). Opening checks the size, the Arrow footer and the counts;
a column's checksums are checked the first time the column is read whole (ids, labels,
languages, a filter field), and a batch's the first time one of its rows is read, so a
damaged file is a ``CorruptIndexError`` naming it, never a wrong snippet.

The file holds chunk text: it is owner-only (0600), as the chunks Parquet is.
"""

from __future__ import annotations

import bisect
import contextlib
import json
import os
import zlib
from collections.abc import Iterable
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from ..retrieval.chunking.chunk_columns import ChunkColumns
from ..retrieval.lexical.format.file import (
    CorruptIndexError,
    IndexFormatError,
    id_digest,
    strings_to_blob,
)
from .record_rows import row_json_batches

SERVED_FILE = "served_chunks.arrow"
SERVED_META = "served_chunks.json"
RECORDS_FORMAT = 3
BATCH_ROWS = 2048
# Read whole at open (ids, labels, languages): first in each batch, so the pages an open
# touches are contiguous runs rather than a little of every column.
OPEN_COLUMNS = ("chunk_id", "sensitivity", "language")
# The fields a filter or a whole-set question reads as columns (HybridRetriever's filter
# fields); every row is also kept whole as JSON in ROW_COLUMN, so building the chunk of a
# hit is one read and one parse, not a scalar per column.
FIELD_COLUMNS = (*OPEN_COLUMNS, "doc_id", "title", "topic", "entity", "geography", "period", "valid_as_of",
                 "chunker", "parent_id", "version")
ROW_COLUMN = "row"

__all__ = ["RECORDS_FORMAT", "SERVED_FILE", "SERVED_META", "open_served_records", "records_current",
           "records_schema", "write_record_batches", "write_served_records"]


def _crc(arr: pa.Array) -> int:
    crc = 0
    for buf in arr.buffers():
        if buf is not None:
            crc = zlib.crc32(memoryview(buf), crc)
    return crc


def _batch_crcs(reader: pa.ipc.RecordBatchFileReader) -> list[list[int]]:
    return [[_crc(col) for col in reader.get_batch(i).columns] for i in range(reader.num_record_batches)]


def write_served_records(version_dir: str | os.PathLike[str], table: pa.Table) -> dict[str, Any]:
    """Write the served rows (chunk_id order) as ``version_dir/SERVED_FILE`` + its sidecar,
    owner-only; the checksums are taken from the file as it will be read. Returns the
    manifest metadata to report."""
    fields = [c for c in FIELD_COLUMNS if c in table.column_names]
    schema = records_schema(table.schema)
    # Each row a JSON list in the order the sidecar records (no key repeated on every row).
    batches = (pa.record_batch([*(batch.column(c) for c in fields), rows], schema=schema)
               for batch, rows in row_json_batches(table, BATCH_ROWS))
    return write_record_batches(version_dir, table.schema, batches, table.num_rows)


def records_schema(rows: pa.Schema) -> pa.Schema:
    """The records file's schema for chunk rows of schema ``rows``: its filter fields, then
    each whole row as JSON."""
    return pa.schema([*(rows.field(c) for c in FIELD_COLUMNS if c in rows.names), pa.field(ROW_COLUMN, pa.string())])


def write_record_batches(version_dir: str | os.PathLike[str], rows: pa.Schema, batches: Iterable[pa.RecordBatch],
                         n_rows: int) -> dict[str, Any]:
    """Write ``batches`` (``records_schema(rows)``, ``BATCH_ROWS`` rows each but the last, in
    chunk_id order) as the version's records file and sidecar; atomic, owner-only."""
    folder = Path(version_dir)
    schema = records_schema(rows)
    path, tmp = folder / SERVED_FILE, folder / f".{SERVED_FILE}.tmp-{os.getpid()}"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as fh, pa.ipc.new_file(fh, schema) as writer:
            for batch in batches:
                # Fresh buffers sized by the values alone: how a batch was gathered (slices of
                # DuckDB output, a refresh's kept and new records) must not change the bytes
                # written (the IPC writer writes a slice's range but a whole buffer's padding).
                writer.write_batch(batch.take(pa.array(np.arange(batch.num_rows, dtype=np.int64))))
        with pa.memory_map(str(tmp)) as src:
            reader = pa.ipc.open_file(src)
            starts = [0]
            for i in range(reader.num_record_batches):
                starts.append(starts[-1] + reader.get_batch(i).num_rows)
            meta = {"format": RECORDS_FORMAT, "rows": n_rows, "bytes": tmp.stat().st_size,
                    "columns": schema.names, "batch_starts": starts, "crc32": _batch_crcs(reader),
                    "chunk_id_digest": _ordered_id_digest(tmp, reader.read_all()),
                    "row_fields": rows.names, "row_types": [str(f.type) for f in rows],
                    "timestamps": [f.name for f in rows if pa.types.is_timestamp(f.type)]}
        if starts[-1] != n_rows:
            raise RuntimeError(f"{tmp}: {starts[-1]} records written for {n_rows} rows")
        side = folder / SERVED_META
        side.write_text(json.dumps(meta), encoding="utf-8")
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise
    return {"served_file": SERVED_FILE, "served_rows": n_rows, "served_bytes": meta["bytes"]}


def _ordered_id_digest(path: Path, table: pa.Table) -> str:
    """The ``id_digest`` of the file's chunk ids as written, after checking they are unique
    and in chunk_id order (what serving relies on, so an open compares 32 bytes with the
    BM25 file's digest instead of reading both id columns, #27)."""
    cols = ChunkColumns(table)  # raises unless unique and in chunk_id order
    return id_digest(*(cols.chunk_id_blob() if len(cols) else strings_to_blob([]))).hex()


class _Checks:
    """Which (batch, column) checksums have been verified; raises naming the file."""

    def __init__(self, path: Path, table: pa.Table, meta: dict[str, Any]) -> None:
        self.path, self.table = path, table
        self.names: list[str] = list(meta["columns"])
        self.crcs = meta["crc32"]
        self.ok = np.zeros((len(self.crcs), len(self.names)), np.bool_)
        self.batch_ok = np.zeros(len(self.crcs), np.bool_)
        self.start_list: list[int] = [int(x) for x in meta["batch_starts"]]
        self.rows = [table.column(ROW_COLUMN).chunk(b) for b in range(len(self.crcs))]
        self.timestamps: list[str] = list(meta.get("timestamps", ()))
        self.row_fields: list[str] = list(meta["row_fields"])

    def _check(self, b: int, c: int) -> None:
        if not self.ok[b, c]:
            if _crc(self.table.column(c).chunk(b)) != int(self.crcs[b][c]):
                raise CorruptIndexError(self.path, f"checksum mismatch in record batch {b}, column "
                                                   f"{self.names[c]!r}")
            self.ok[b, c] = True

    def read_row(self, j: int) -> dict[str, Any]:
        """Row ``j`` as the stored dict (what ``to_pylist`` of the chunks table gives)."""
        b = bisect.bisect_right(self.start_list, j) - 1
        values = json.loads(self.rows[b][j - self.start_list[b]].as_py())
        if not isinstance(values, list) or len(values) != len(self.row_fields):
            raise CorruptIndexError(self.path, f"record {j} does not hold {len(self.row_fields)} fields")
        row = dict(zip(self.row_fields, values, strict=True))
        for name in self.timestamps:
            if row.get(name) is not None:
                row[name] = datetime.fromisoformat(row[name])
        return row

    def row(self, j: int) -> None:
        b = bisect.bisect_right(self.start_list, j) - 1
        if not self.batch_ok[b]:
            for c in range(len(self.names)):
                self._check(b, c)
            self.batch_ok[b] = True

    def column(self, name: str) -> None:
        if name in self.names:
            c = self.names.index(name)
            for b in range(len(self.crcs)):
                self._check(b, c)


def records_current(version_dir: str | os.PathLike[str]) -> bool:
    """Whether the version has served records in this code's format (else a refresh writes them)."""
    try:
        meta = json.loads((Path(version_dir) / SERVED_META).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return (Path(version_dir) / SERVED_FILE).is_file() and meta.get("format") == RECORDS_FORMAT


def open_served_records(version_dir: str | os.PathLike[str]) -> ChunkColumns | None:
    """The version's served rows, memory-mapped, as ``ChunkColumns``; None for a version
    written before there were any, or in an older layout. Raises ``CorruptIndexError`` (truncated, damaged,
    sidecar missing) or ``IndexFormatError`` (another format) naming the file."""
    path = Path(version_dir) / SERVED_FILE
    if not path.is_file():
        return None
    try:
        meta = json.loads((path.parent / SERVED_META).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise CorruptIndexError(path, f"its sidecar {SERVED_META} cannot be read: {exc}") from exc
    if isinstance(meta.get("format"), int) and 0 < meta["format"] < RECORDS_FORMAT:
        return None  # an older layout: served from tokens until the next refresh rewrites it
    if meta.get("format") != RECORDS_FORMAT:
        raise IndexFormatError(path, f"served records format {meta.get('format')!r}; this ragspine reads format "
                                     f"{RECORDS_FORMAT} (refresh the lexical index, or upgrade ragspine)")
    size = path.stat().st_size
    if size != meta.get("bytes"):
        raise CorruptIndexError(path, f"{size} bytes, {meta.get('bytes')} were written")
    try:
        # Zero-copy: the columns are views of the mapping. No ``validate()`` here (it touches
        # every column of every batch); a column is checksummed before it is first used.
        reader = pa.ipc.open_file(pa.memory_map(str(path)))
        table = reader.read_all()
    except (pa.ArrowException, OSError) as exc:
        raise CorruptIndexError(path, f"not a readable Arrow file: {exc}") from exc
    nb = reader.num_record_batches
    if (table.num_rows != meta.get("rows") or table.column_names != meta.get("columns")
            or nb != len(meta.get("crc32", ())) or len(meta.get("batch_starts", ())) != nb + 1
            or any(table.column(c).num_chunks != nb for c in range(table.num_columns))
            or not isinstance(meta.get("row_fields"), list) or not isinstance(meta.get("timestamps", []), list)):
        raise CorruptIndexError(path, "row, column or batch counts do not match its sidecar")
    checks = _Checks(path, table, meta)
    # Without a digest, ChunkColumns checksums and compares every id on construction. With
    # one, the ids' order was checked at publish and the digest binds it: the id column is
    # checksummed when first read whole, and with its batch when a row is read.
    digest = _sidecar_digest(path, meta.get("chunk_id_digest"))
    return ChunkColumns(table, verify_row=checks.row, verify_column=checks.column, read_row=checks.read_row,
                        id_digest=digest)


def _sidecar_digest(path: Path, value: Any) -> bytes | None:
    """The sidecar's chunk-id digest (None for records written before there was one)."""
    if value is None:
        return None
    try:
        digest = bytes.fromhex(value) if isinstance(value, str) else b""
    except ValueError:
        digest = b""
    if len(digest) != 32:
        raise CorruptIndexError(path, f"its sidecar's chunk_id_digest is not 32 hex bytes: {value!r}")
    return digest
