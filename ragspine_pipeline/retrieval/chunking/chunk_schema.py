"""What a stored chunk row is: the ``chunks`` / ``doc_versions`` columns, ``StoredChunk``
and the conversions between the two (Arrow rows in, ``StoredChunk`` out, the content
fingerprint). Kept apart from ``ChunkStore`` so the warehouse tables and the SQLite
migration share one definition of a row without importing the store.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pyarrow as pa

from .chunking import METADATA_FIELDS, Chunk, SourceLocator

SCHEMA_VERSION = 2

# column -> (DuckDB type, default for rows written by an older schema)
CHUNK_COLUMNS: dict[str, tuple[str, str]] = {
    "chunk_id": ("VARCHAR NOT NULL", ""),
    "doc_id": ("VARCHAR NOT NULL", ""),
    "title": ("VARCHAR", "''"),
    "text": ("VARCHAR", "''"),
    "source_path": ("VARCHAR", "''"),
    "start_char": ("INTEGER", "0"),
    "end_char": ("INTEGER", "0"),
    "ordinal": ("INTEGER", "0"),
    "topic": ("VARCHAR", "''"),
    "entity": ("VARCHAR", "''"),
    "geography": ("VARCHAR", "''"),
    "period": ("VARCHAR", "''"),
    "language": ("VARCHAR", "''"),
    "sensitivity": ("VARCHAR", "'INTERNAL'"),
    "parent_id": ("VARCHAR", "''"),
    "heading": ("VARCHAR", "''"),
    "window_text": ("VARCHAR", "''"),
    "parent_start": ("INTEGER", "NULL"),
    "parent_end": ("INTEGER", "NULL"),
    "chunker": ("VARCHAR", "'paragraph'"),
    "locator": ("VARCHAR", "''"),  # SourceLocator.extra: pages / blocks / element as JSON
    "valid_as_of": ("VARCHAR", "''"),
    "ingested_at": ("TIMESTAMP", "TIMESTAMP '1970-01-01 00:00:00'"),
    "superseded_at": ("TIMESTAMP", "NULL"),
    "version": ("INTEGER", "1"),
    "active": ("BOOLEAN", "TRUE"),
}

DOC_VERSION_COLUMNS: dict[str, str] = {
    "doc_id": "VARCHAR NOT NULL",
    "version": "INTEGER NOT NULL",
    "content_hash": "VARCHAR",
    "n_chunks": "INTEGER",
    "withdrawn": "BOOLEAN",
    "ingested_at": "TIMESTAMP",
    "source_hash": "VARCHAR",
}


@dataclass(frozen=True)
class StoredChunk(Chunk):
    """A chunk as stored: the chunk plus its version lineage."""

    valid_as_of: str = ""
    ingested_at: datetime | None = None
    version: int = 1
    active: bool = True


def timestamp_after(latest: datetime | None) -> datetime:
    """Now (naive UTC), or 1 µs after ``latest`` if the clock has not passed it: ingest
    timestamps stay strictly increasing, so as_of reads are unambiguous."""
    now = datetime.now(UTC).replace(tzinfo=None)
    if latest is not None and now <= latest:
        now = latest + timedelta(microseconds=1)
    return now


def chunk_rows_table(rows: Sequence[Chunk], row_version: Sequence[int], valid_as_of: str,
                     now: datetime, *, lineage_columns: bool = True) -> Any:
    """Chunks as Arrow rows of the ``chunks`` table (CHUNK_COLUMNS order).

    ``lineage_columns=False`` leaves out ``superseded_at`` and ``active``: the warehouse
    derives them from the document versions instead of rewriting old rows.
    """
    n = len(rows)
    i32, s = pa.int32(), pa.string()
    cols = {
        "chunk_id": pa.array([c.chunk_id for c in rows], s),
        "doc_id": pa.array([c.doc_id for c in rows], s),
        "title": pa.array([c.title for c in rows], s),
        "text": pa.array([c.text for c in rows], s),
        "source_path": pa.array([c.source_locator.source_path for c in rows], s),
        "start_char": pa.array([c.start for c in rows], i32),
        "end_char": pa.array([c.end for c in rows], i32),
        "ordinal": pa.array([c.ordinal for c in rows], i32),
        **{f: pa.array([getattr(c, f) for c in rows], s) for f in METADATA_FIELDS},
        "sensitivity": pa.array([c.sensitivity for c in rows], s),
        "parent_id": pa.array([c.parent_id for c in rows], s),
        "heading": pa.array([c.heading for c in rows], s),
        "window_text": pa.array([c.window_text for c in rows], s),
        "parent_start": pa.array([c.parent_locator.start if c.parent_locator else None for c in rows], i32),
        "parent_end": pa.array([c.parent_locator.end if c.parent_locator else None for c in rows], i32),
        "chunker": pa.array([c.chunker for c in rows], s),
        "locator": pa.array([c.source_locator.extra for c in rows], s),
        "valid_as_of": pa.array([valid_as_of] * n, s),
        "ingested_at": pa.array([now] * n, pa.timestamp("us")),
        "superseded_at": pa.array([None] * n, pa.timestamp("us")),
        "version": pa.array(list(row_version), i32),
        "active": pa.array([True] * n, pa.bool_()),
    }
    names = [c for c in CHUNK_COLUMNS if lineage_columns or c not in ("superseded_at", "active")]
    return pa.table({name: cols[name] for name in names})


def chunk_fingerprint(chunks: Sequence[Chunk]) -> str:
    """Hash of a document's chunk list: equal lists mean "same content, same version"."""
    h = hashlib.sha256()
    for c in chunks:
        row = [c.chunk_id, c.doc_id, c.title, c.text, c.start, c.end, c.source_locator.source_path,
               c.ordinal, c.sensitivity, c.parent_id, c.heading, c.window_text, c.chunker,
               *(getattr(c, f) for f in METADATA_FIELDS)]
        if c.source_locator.extra:  # only then: fingerprints of md/txt chunks stay as they were
            row.append(c.source_locator.extra)
        h.update(json.dumps(row, ensure_ascii=False).encode())
        h.update(b"\x1e")
    return h.hexdigest()


def rows_table(rows: Sequence[Mapping[str, Any]], columns: Mapping[str, Any]) -> Any:
    """Row dicts as an Arrow table of ``columns`` (``CHUNK_COLUMNS`` or
    ``DOC_VERSION_COLUMNS``), typed as the DuckDB columns are; a missing key is NULL."""
    types = {"VARCHAR": pa.string(), "INTEGER": pa.int32(), "TIMESTAMP": pa.timestamp("us"),
             "BOOLEAN": pa.bool_()}
    schema = pa.schema([(name, types[(spec[0] if isinstance(spec, tuple) else spec).split()[0]])
                        for name, spec in columns.items()])
    return pa.Table.from_pylist([{name: r.get(name) for name in columns} for r in rows], schema=schema)


def as_table(obj: Any) -> Any:
    """An Arrow Table whether DuckDB handed back a Table or a RecordBatchReader."""
    return obj.read_all() if isinstance(obj, pa.RecordBatchReader) else obj


def row_to_chunk(r: dict[str, Any]) -> StoredChunk:
    """A stored row (a ``chunks`` table row as a dict) as a StoredChunk."""
    parent = None
    if r.get("parent_start") is not None and r.get("parent_end") is not None:
        # A locator points into the *document's* source (like source_locator): its doc_id
        # is the document, never the parent chunk's id.
        parent = SourceLocator(r["doc_id"], r["parent_start"], r["parent_end"], r["source_path"] or "")
    return StoredChunk(
        chunk_id=r["chunk_id"],
        doc_id=r["doc_id"],
        title=r["title"] or "",
        text=r["text"] or "",
        source_locator=SourceLocator(r["doc_id"], r["start_char"] or 0, r["end_char"] or 0,
                                     r["source_path"] or "", r.get("locator") or ""),
        ordinal=r["ordinal"] or 0,
        topic=r["topic"] or "",
        entity=r["entity"] or "",
        geography=r["geography"] or "",
        period=r["period"] or "",
        language=r["language"] or "",
        sensitivity=r["sensitivity"] or "INTERNAL",
        parent_id=r["parent_id"] or "",
        heading=r["heading"] or "",
        window_text=r["window_text"] or "",
        parent_locator=parent,
        chunker=r["chunker"] or "paragraph",
        valid_as_of=r["valid_as_of"] or "",
        ingested_at=r["ingested_at"],
        version=r["version"] if r["version"] is not None else 1,
        active=bool(r["active"]) if r.get("active") is not None else True,
    )
