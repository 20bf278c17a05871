"""Reading the spec's SQLite chunk store, for its additive migration into ``ChunkStore``.

The spec's chunk store is SQLite; this engine keeps its chunks in DuckDB. ``ChunkStore(path)``
on an existing SQLite file reads it here with Python's ``sqlite3`` through a read-only URI,
so the user's file is never written, and writes the DuckDB store beside it
(``<path>.duckdb``). DuckDB's own ``sqlite_scanner`` is never used: DuckDB would download
that extension on first use, a network call this offline engine must not make.

The schema read (the spec gives no DDL): table ``narrative_chunk``, one column per
``StoredChunk`` field, SQLite affinities -- TEXT and INTEGER, ``active`` 0/1,
``ingested_at`` ISO-8601 text or empty, ``source_locator`` and ``parent_locator`` as JSON
text ``{"doc_id", "start", "end", "source_path"}``. An older schema lacks ``parent_id``,
``heading``, ``window_text``, ``parent_locator`` and ``chunker``; those read as the
``StoredChunk`` defaults (that is the additive part). Any other missing column is an error:
the rest of the row cannot be guessed.

What SQLite does not carry is derived, never invented: an empty ``ingested_at`` is the
epoch (the same default an older DuckDB store's rows get, so ``as_of`` reads include
them); an inactive row's ``superseded_at`` is when the document's next version was
ingested (the store's latest ingest time when there is none: a withdrawn document); each
stored version gets its content fingerprint, so re-ingesting the same chunks after the
migration is the usual no-op.
"""

from __future__ import annotations

import json
import numbers
import os
import sqlite3
from collections import defaultdict
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

from .chunk_schema import (
    CHUNK_COLUMNS,
    DOC_VERSION_COLUMNS,
    chunk_fingerprint,
    row_to_chunk,
    rows_table,
)

SQLITE_HEADER = b"SQLite format 3\x00"
SQLITE_TABLE = "narrative_chunk"
#: The columns of ``narrative_chunk``: the StoredChunk fields, in their order.
SQLITE_COLUMNS = ("chunk_id", "doc_id", "title", "text", "source_locator", "ordinal", "topic", "entity",
                  "geography", "period", "language", "sensitivity", "parent_id", "heading", "window_text",
                  "parent_locator", "chunker", "valid_as_of", "ingested_at", "version", "active")
#: Columns an older schema lacks (added later); they read as the StoredChunk defaults.
ADDED_COLUMNS = ("parent_id", "heading", "window_text", "parent_locator", "chunker")
TEXT_COLUMNS = ("title", "text", "topic", "entity", "geography", "period", "language", "sensitivity",
                "parent_id", "heading", "window_text", "chunker", "valid_as_of")
EPOCH = datetime(1970, 1, 1)

__all__ = ["ADDED_COLUMNS", "SQLITE_COLUMNS", "SQLITE_TABLE", "SqliteMigrationError", "is_sqlite_file",
           "migrated_path", "read_sqlite_store", "source_stamp"]


class SqliteMigrationError(ValueError):
    """A SQLite chunk file that cannot be migrated; the message names the file, and the
    row and column at fault when there is one."""


def is_sqlite_file(path: str | os.PathLike[str]) -> bool:
    """True when ``path`` is an existing SQLite 3 database (by its 16-byte header)."""
    try:
        with open(path, "rb") as f:
            return f.read(len(SQLITE_HEADER)) == SQLITE_HEADER
    except OSError:
        return False


def migrated_path(path: str | os.PathLike[str]) -> Path:
    """Where the DuckDB store migrated from the SQLite file ``path`` lives: ``<path>.duckdb``."""
    return Path(f"{os.fspath(path)}.duckdb")


def source_stamp(path: str | os.PathLike[str]) -> str:
    """Size, modification time and inode of ``path`` (and of its ``-wal`` file, where rows
    committed in WAL mode wait for a checkpoint), plus the header's file change counter
    (bytes 24-27, bumped by every commit in rollback-journal mode): recorded at migration,
    compared later to notice a SQLite file changed since (cheap on large files, unlike a
    hash; the inode catches a file replaced by another of the same size and time)."""
    with open(path, "rb") as f:
        f.seek(24)
        parts = [f.read(4).hex()]
    for p in (os.fspath(path), f"{os.fspath(path)}-wal"):
        try:
            st = os.stat(p)
        except FileNotFoundError:
            continue
        parts.append(f"{st.st_size}:{st.st_mtime_ns}:{st.st_ino}")
    return "/".join(parts)


def read_sqlite_store(path: str | os.PathLike[str]) -> tuple[Any, Any]:
    """The SQLite store at ``path`` as Arrow ``(chunks, doc_versions)`` tables in the
    ``ChunkStore`` columns, ready for ``ChunkStore.import_arrow``. Reads only."""
    where = os.fspath(path)
    rows = [_chunk_row(r, where) for r in _sqlite_rows(where)]
    _infer_superseded(rows)
    return rows_table(rows, CHUNK_COLUMNS), rows_table(_version_records(rows), DOC_VERSION_COLUMNS)


def _sqlite_rows(path: str) -> list[dict[str, Any]]:
    """Every ``narrative_chunk`` row as a dict of the columns the file has."""
    uri = f"file:{quote(os.path.abspath(path))}?mode=ro"  # read-only: SQLite never writes the file
    try:
        con = sqlite3.connect(uri, uri=True)
    except sqlite3.Error as exc:
        raise SqliteMigrationError(f"{path}: cannot open the SQLite chunk store read-only ({exc})") from None
    try:
        have = {r[1] for r in con.execute(f"PRAGMA table_info({SQLITE_TABLE})")}
        if not have:
            raise SqliteMigrationError(f"{path}: a SQLite file without a {SQLITE_TABLE} table "
                                       "(the spec's chunk table); nothing to migrate")
        missing = [c for c in SQLITE_COLUMNS if c not in have and c not in ADDED_COLUMNS]
        if missing:
            raise SqliteMigrationError(f"{path}: {SQLITE_TABLE} lacks {', '.join(missing)}; only "
                                       f"{', '.join(ADDED_COLUMNS)} may be missing (an older schema)")
        cols = [c for c in SQLITE_COLUMNS if c in have]
        return [dict(zip(cols, r, strict=True))
                for r in con.execute(f"SELECT {', '.join(cols)} FROM {SQLITE_TABLE}")]
    except sqlite3.Error as exc:
        raise SqliteMigrationError(f"{path}: cannot read {SQLITE_TABLE} ({exc})") from None
    finally:
        con.close()


def _chunk_row(r: dict[str, Any], path: str) -> dict[str, Any]:
    """One SQLite row as a ``chunks`` row (``superseded_at`` is filled in later)."""
    at = f"{path}: {SQLITE_TABLE} row chunk_id={r.get('chunk_id')!r}"
    for key in ("chunk_id", "doc_id"):
        if r[key] is None or not str(r[key]):
            raise SqliteMigrationError(f"{at}: {key} is empty")
    loc = _locator(r["source_locator"], at, "source_locator")
    if loc is None:
        raise SqliteMigrationError(f"{at}: source_locator is empty")
    parent = _locator(r.get("parent_locator"), at, "parent_locator")
    return {
        **{c: None if r.get(c) is None else str(r[c]) for c in TEXT_COLUMNS},
        "chunk_id": str(r["chunk_id"]),
        "doc_id": str(r["doc_id"]),
        "source_path": loc[2],
        "start_char": loc[0],
        "end_char": loc[1],
        "parent_start": parent[0] if parent else None,
        "parent_end": parent[1] if parent else None,
        "ordinal": _integer(r["ordinal"], 0, at, "ordinal"),
        "ingested_at": _timestamp(r["ingested_at"], at),
        "version": _integer(r["version"], 1, at, "version"),
        "active": _flag(r["active"], at),
    }


def _locator(raw: Any, at: str, column: str) -> tuple[int, int, str] | None:
    """``(start, end, source_path)`` of a JSON locator; None for NULL or empty text.

    The locator's own ``doc_id`` is not kept: a locator points into its document's
    source, and the store takes the document from the row (as ``row_to_chunk`` does).
    """
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return None
    try:
        loc = json.loads(raw)
        start, end = _integer(loc["start"], None, at, column), _integer(loc["end"], None, at, column)
        source_path = loc.get("source_path") or ""
    except (TypeError, ValueError, KeyError, AttributeError):
        raise SqliteMigrationError(f'{at}: {column} must be JSON {{"doc_id", "start", "end", '
                                   f'"source_path"}} (got {raw!r:.120})') from None
    return start, end, str(source_path)


def _integer(value: Any, default: int | None, at: str, column: str) -> int:
    """An INTEGER column (SQLite may hand back integral text or reals); NULL -> ``default``."""
    if value is None and default is not None:
        return default
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return int(value)
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value)
    raise SqliteMigrationError(f"{at}: {column} must be an integer (got {value!r})")


def _flag(value: Any, at: str) -> bool:
    """``active``: 0/1 (NULL: the StoredChunk default, active)."""
    if value is None:
        return True
    if value in (0, 1) or value in ("0", "1"):
        return str(int(value)) == "1"
    raise SqliteMigrationError(f"{at}: active must be 0 or 1 (got {value!r})")


def _timestamp(value: Any, at: str) -> datetime:
    """``ingested_at``: ISO-8601 text as naive UTC (the store's clock); empty -> the epoch."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return EPOCH
    try:
        ts = datetime.fromisoformat(str(value).strip())
    except ValueError:
        raise SqliteMigrationError(f"{at}: ingested_at must be ISO-8601 text or empty (got {value!r})") from None
    return ts.astimezone(UTC).replace(tzinfo=None) if ts.tzinfo is not None else ts


def _infer_superseded(rows: Iterable[dict[str, Any]]) -> None:
    """``superseded_at`` of each inactive row: the next version's first ingest time, else
    (a withdrawn document) the store's latest ingest time -- never before its own."""
    rows = list(rows)
    latest = max((r["ingested_at"] for r in rows), default=EPOCH)
    started: dict[str, dict[int, datetime]] = defaultdict(dict)
    for r in rows:
        seen = started[r["doc_id"]].get(r["version"])
        started[r["doc_id"]][r["version"]] = r["ingested_at"] if seen is None else min(seen, r["ingested_at"])
    for r in rows:
        if r["active"]:
            r["superseded_at"] = None
            continue
        later = [t for v, t in started[r["doc_id"]].items() if v > r["version"]]
        r["superseded_at"] = max(r["ingested_at"], min(later) if later else latest)


def _version_records(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """One ``doc_versions`` record per stored (document, version), with its fingerprint."""
    groups: dict[tuple[str, int], list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        groups[(r["doc_id"], r["version"])].append(r)
    records = []
    for (doc_id, version), group in sorted(groups.items()):
        chunks = [row_to_chunk(r) for r in sorted(group, key=lambda r: (r["ordinal"], r["chunk_id"]))]
        records.append({"doc_id": doc_id, "version": version, "content_hash": chunk_fingerprint(chunks),
                        "n_chunks": len(chunks), "withdrawn": False,
                        "ingested_at": min(r["ingested_at"] for r in group), "source_hash": None})
    return records
