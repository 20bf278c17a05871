"""Versioned chunk store on DuckDB.

Seed semantics per document: ``replace_doc_chunks`` writes version = max(version)+1 and
marks older rows inactive (``superseded_at`` set), in one transaction. Re-ingesting the
same chunks is a no-op (no new version); an empty list withdraws the document. Rows are
never deleted, so ``iter_chunks(as_of=T)`` answers "what was active at time T".

Only parameterized SQL touches data. ``execute_read`` runs a single read-only statement
inside a transaction that is always rolled back, so it cannot modify anything.

The spec's chunk store is SQLite: ``ChunkStore(path)`` on an existing SQLite chunk file
migrates it, through Python's ``sqlite3``, into ``<path>.duckdb`` beside it and uses that
(``sqlite_migration``), re-reading the file whenever it changes; the SQLite file itself is
never written. The row schema
(columns, ``StoredChunk``, conversions) lives in ``chunk_schema`` and is re-exported here.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa

from .chunk_schema import (
    CHUNK_COLUMNS,
    DOC_VERSION_COLUMNS,
    SCHEMA_VERSION,
    StoredChunk,
    as_table,
    chunk_fingerprint,
    chunk_rows_table,
    row_to_chunk,
    timestamp_after,
)
from .chunking import Chunk
from .sqlite_migration import (
    SqliteMigrationError,
    is_sqlite_file,
    migrated_path,
    read_sqlite_store,
    source_stamp,
)

__all__ = ["CHUNK_COLUMNS", "DOC_VERSION_COLUMNS", "SCHEMA_VERSION", "ChunkStore", "ReadOnlyQueryError",
           "SqliteMigrationError", "StoredChunk", "chunk_fingerprint", "chunk_rows_table", "row_to_chunk",
           "timestamp_after"]

_log = logging.getLogger(__name__)


class ReadOnlyQueryError(ValueError):
    """``execute_read`` was given something other than one read-only statement."""


def _connect(path: str, *, read_only: bool) -> duckdb.DuckDBPyConnection:
    """A DuckDB connection that never installs or autoloads an extension (offline engine).

    Set after connecting, not as ``connect(config=...)``: another connection to the same
    file in this process (a notebook's ``duckdb.connect(path)``) must not meet a
    configuration mismatch. A SQLite file never reaches DuckDB (``ChunkStore.__init__``
    routes it through ``sqlite3``), so no connect-time autoload can be triggered here.
    """
    con = duckdb.connect(path, read_only=read_only)
    con.execute("SET autoinstall_known_extensions = false")
    con.execute("SET autoload_known_extensions = false")
    return con


class ChunkStore:
    """DuckDB-backed, versioned chunk table. Thread-safe within one process."""

    def __init__(self, db_path: str | os.PathLike[str] = ":memory:", *, read_only: bool = False):
        self.read_only = read_only
        self._lock = threading.RLock()
        #: The SQLite chunk file this store was migrated from (None for a DuckDB store).
        self.migrated_from: str | None = None
        path = str(db_path)
        pending = None  # tables of a SQLite store to load into a fresh in-memory store
        if path != ":memory:" and is_sqlite_file(path):
            self.migrated_from, path = path, str(migrated_path(path))
            if read_only and not Path(path).exists():  # nothing may be written: migrate in memory
                pending, path = read_sqlite_store(self.migrated_from), ":memory:"
            elif not Path(path).exists():
                self._migrate(self.migrated_from, path)  # later opens use the migrated store
        self.db_path = path
        if path != ":memory:" and not read_only:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        self._con = _connect(path, read_only=read_only and pending is None)
        if not read_only or pending is not None:
            self.init_schema()
        if pending is not None:
            self._load_tables(*pending)
        elif self.migrated_from is not None:
            self._reread_source()

    @staticmethod
    def _migrate(sqlite_path: str, target: str) -> None:
        """Write the DuckDB store for ``sqlite_path`` at ``target``, atomically.

        Built under a temporary name and published with ``os.link``, which never replaces
        an existing file: if another process migrated the same file first, its (equal)
        store wins and this one is discarded, so no open connection loses its file.
        """
        chunks, versions = read_sqlite_store(sqlite_path)
        tmp = f"{target}.tmp-{os.getpid()}-{threading.get_ident()}"
        try:
            with ChunkStore(tmp) as store:
                store._load_tables(chunks, versions)
                store._run("INSERT OR REPLACE INTO store_meta VALUES ('migrated_from', ?), "
                           "('migrated_source_stamp', ?)", [sqlite_path, source_stamp(sqlite_path)])
            try:
                os.link(tmp, target)
            except FileExistsError:
                pass  # another process published first
            except OSError:  # a filesystem without hard links
                os.replace(tmp, target)
        finally:
            for leftover in (tmp, f"{tmp}.wal"):
                Path(leftover).unlink(missing_ok=True)
        _log.info("migrated the SQLite chunk store %s (%d rows) to %s", sqlite_path, chunks.num_rows, target)

    def _reread_source(self) -> None:
        """Re-read the SQLite file this store was migrated from when it changed since (its
        (size, mtime_ns, inode) stamp, and its WAL's, differ from the recorded one).

        The SQLite file is the authority for each document it holds, unless this store has
        a newer version of that document (written through ``replace_doc_chunks`` after the
        migration): those and documents only this store has are kept; every other document
        of the file replaces its rows here, so rows added to the file later are seen. A
        read-only open cannot write the store: it warns and serves the migrated rows.
        Called on open and before every ``iter_chunks`` (one ``stat``)."""
        src = self.migrated_from
        if src is None or self.db_path == ":memory:":
            return
        with self._lock:
            stamp = source_stamp(src)
            if stamp == getattr(self, "_source_seen", None):
                return
            rows = self._run("SELECT value FROM store_meta WHERE key = 'migrated_source_stamp'")
            self._source_seen = stamp
            if rows and rows[0][0] == stamp:
                return
            if self.read_only:
                _log.warning("%s changed after it was migrated to %s; a read-only open serves the migrated "
                             "rows (open it writable once to re-read the file)", src, self.db_path)
                return
            chunks, versions = read_sqlite_store(src)
            theirs: dict[str, int] = {}
            for d, v in zip(chunks.column("doc_id").to_pylist(), chunks.column("version").to_pylist(), strict=True):
                theirs[d] = max(v, theirs.get(d, 0))
            ours = dict(self._run("SELECT doc_id, max(version) FROM (SELECT doc_id, version FROM chunks UNION ALL "
                                  "SELECT doc_id, version FROM doc_versions) GROUP BY doc_id"))  # withdrawals count
            take = sorted(d for d, v in theirs.items() if v >= ours.get(d, 0))
            self._run("BEGIN TRANSACTION")
            try:
                for name, table, cols in (("chunks", chunks, list(CHUNK_COLUMNS)),
                                          ("doc_versions", versions, list(DOC_VERSION_COLUMNS))):
                    self._run(f"DELETE FROM {name} WHERE list_contains(?, doc_id)", [take])
                    present = [c for c in cols if c in table.column_names]
                    self._con.register("_import", table)
                    try:
                        self._run(f"INSERT INTO {name} ({', '.join(present)}) SELECT {', '.join(present)} "
                                  "FROM _import WHERE list_contains(?, doc_id)", [take])
                    finally:
                        self._con.unregister("_import")
                self._run("INSERT OR REPLACE INTO store_meta VALUES ('migrated_source_stamp', ?)", [stamp])
                self._run("COMMIT")
            except BaseException:
                self._run("ROLLBACK")
                raise
        _log.warning("%s changed after it was migrated to %s; re-read %d documents from it", src, self.db_path,
                     len(take))

    def _run(self, sql: str, params: Sequence[Any] | None = None) -> list[tuple[Any, ...]]:
        """Execute and drain the result (DuckDB 2 refuses new work on an unfinished one)."""
        return self._con.execute(sql, list(params) if params is not None else []).fetchall()

    # --------------------------------------------------------------- lifecycle
    def close(self) -> None:
        with self._lock:
            self._con.close()

    def __enter__(self) -> ChunkStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def init_schema(self) -> None:
        """Create tables, or add any columns an older schema lacks. Idempotent."""
        cols = ",\n  ".join(f"{n} {t}" for n, (t, _) in CHUNK_COLUMNS.items())
        dcols = ",\n  ".join(f"{n} {t}" for n, t in DOC_VERSION_COLUMNS.items())
        with self._lock:
            self._con.execute(f"CREATE TABLE IF NOT EXISTS chunks (\n  {cols}\n)")
            self._con.execute(f"CREATE TABLE IF NOT EXISTS doc_versions (\n  {dcols}\n)")
            self._con.execute(
                "CREATE TABLE IF NOT EXISTS store_meta (key VARCHAR PRIMARY KEY, value VARCHAR)"
            )
            have = {
                r[0]
                for r in self._con.execute(
                    "SELECT column_name FROM information_schema.columns WHERE table_name = 'chunks'"
                ).fetchall()
            }
            dv_have = {
                r[0]
                for r in self._con.execute(
                    "SELECT column_name FROM information_schema.columns WHERE table_name = 'doc_versions'"
                ).fetchall()
            }
            for name, typ in DOC_VERSION_COLUMNS.items():
                if name not in dv_have:
                    self._con.execute(f"ALTER TABLE doc_versions ADD COLUMN {name} {typ.replace(' NOT NULL', '')}")
            for name, (typ, default) in CHUNK_COLUMNS.items():
                if name not in have:
                    base_type = typ.replace(" NOT NULL", "")
                    self._con.execute(f"ALTER TABLE chunks ADD COLUMN {name} {base_type} DEFAULT {default}")
            # The spec's name for the chunk table; a view, so there is one table to write.
            self._con.execute("CREATE OR REPLACE VIEW narrative_chunk AS SELECT * FROM chunks")
            self._con.execute(
                "INSERT OR REPLACE INTO store_meta VALUES ('schema_version', ?)", [str(SCHEMA_VERSION)]
            )

    # ------------------------------------------------------------------ writes
    def _now_after_latest(self) -> datetime:
        """A timestamp strictly after every stored one, so as_of reads are unambiguous."""
        rows = self._run(
            "SELECT max(greatest(ingested_at, coalesce(superseded_at, ingested_at))) FROM chunks"
        )
        return timestamp_after(rows[0][0] if rows else None)

    def replace_doc_chunks(self, doc_id: str, chunks: Sequence[Chunk], valid_as_of: str = "") -> int:
        """Publish ``chunks`` as the new version of ``doc_id``; returns rows written.

        Identical chunks to the active version -> 0 rows, no new version. An empty list
        withdraws the document (old rows inactive, a withdrawal recorded, 0 rows).
        """
        return self.replace_many([(doc_id, chunks)], valid_as_of=valid_as_of)

    def replace_many(self, items: Sequence[tuple[str, Sequence[Chunk]]], valid_as_of: str = "",
                     source_hashes: Mapping[str, str] | None = None) -> int:
        """``replace_doc_chunks`` for many documents in one transaction (bulk ingest).

        All documents publish together or not at all; returns total rows written.
        ``source_hashes`` (doc_id -> hash of source + chunker config) are recorded on the
        document version so a later refresh can skip re-chunking unchanged documents.
        """
        if self.read_only:
            raise PermissionError("ChunkStore opened read_only")
        seen_docs: set[str] = set()
        prepared: list[tuple[str, Sequence[Chunk], str]] = []
        for doc_id, chunks in items:
            if not doc_id:
                raise ValueError("doc_id must be non-empty")
            if doc_id in seen_docs:
                raise ValueError(f"document {doc_id!r} given twice in one batch")
            seen_docs.add(doc_id)
            ids = [c.chunk_id for c in chunks]
            if len(set(ids)) != len(ids):
                raise ValueError(f"duplicate chunk ids in the new version of {doc_id!r}")
            for c in chunks:
                if c.doc_id != doc_id:
                    raise ValueError(f"chunk {c.chunk_id!r} belongs to {c.doc_id!r}, not {doc_id!r}")
            prepared.append((doc_id, chunks, chunk_fingerprint(chunks)))
        if not prepared:
            return 0
        with self._lock:
            self._run("BEGIN TRANSACTION")
            try:
                written = self._replace_locked(prepared, valid_as_of, source_hashes or {})
                self._run("COMMIT")
            except BaseException:
                self._run("ROLLBACK")
                raise
        return written

    def _doc_state(self, doc_ids: list[str]) -> dict[str, tuple[int, int, str | None, bool | None]]:
        """doc_id -> (active rows, max version, last fingerprint, last withdrawn)."""
        self._run("CREATE OR REPLACE TEMP TABLE _batch_docs (doc_id VARCHAR)")
        self._run("INSERT INTO _batch_docs SELECT unnest(?)", [doc_ids])
        rows = self._run(
            """
            WITH a AS (SELECT doc_id, count(*) FILTER (WHERE active) AS n_active,
                              max(version) AS vmax FROM chunks
                       WHERE doc_id IN (SELECT doc_id FROM _batch_docs) GROUP BY doc_id),
                 v AS (SELECT doc_id, max(version) AS vmax,
                              arg_max(content_hash, version) AS h, arg_max(withdrawn, version) AS w
                       FROM doc_versions WHERE doc_id IN (SELECT doc_id FROM _batch_docs)
                       GROUP BY doc_id)
            SELECT b.doc_id, coalesce(a.n_active, 0), greatest(coalesce(a.vmax, 0), coalesce(v.vmax, 0)),
                   v.h, v.w
            FROM _batch_docs b LEFT JOIN a USING (doc_id) LEFT JOIN v USING (doc_id)
            """
        )
        return {r[0]: (int(r[1]), int(r[2]), r[3], r[4]) for r in rows}

    def _replace_locked(self, prepared: list[tuple[str, Sequence[Chunk], str]], valid_as_of: str,
                        source_hashes: Mapping[str, str]) -> int:
        state = self._doc_state([d for d, _, _ in prepared])
        now = self._now_after_latest()
        to_supersede: list[str] = []
        versions: list[tuple[str, int, str, int, bool]] = []
        rows: list[Chunk] = []
        row_version: list[int] = []
        same_content: list[str] = []
        for doc_id, chunks, fp in prepared:
            n_active, vmax, last_fp, last_withdrawn = state[doc_id]
            if not chunks:
                if n_active == 0:
                    continue  # nothing to withdraw
            elif last_fp == fp and not last_withdrawn and n_active == len(chunks):
                same_content.append(doc_id)
                continue
            version = vmax + 1
            if n_active:
                to_supersede.append(doc_id)
            versions.append((doc_id, version, fp, len(chunks), not chunks, source_hashes.get(doc_id)))
            rows.extend(chunks)
            row_version.extend([version] * len(chunks))
        if same_content:
            # Same content; only a changed valid_as_of / source hash is written in place.
            self._run(
                "UPDATE chunks SET valid_as_of = ? WHERE active AND valid_as_of <> ? AND doc_id IN "
                "(SELECT unnest(?))", [valid_as_of, valid_as_of, same_content])
            for doc_id in same_content:
                if doc_id in source_hashes:
                    self._run("UPDATE doc_versions SET source_hash = ? WHERE doc_id = ? AND version = ?",
                              [source_hashes[doc_id], doc_id, state[doc_id][1]])
        if to_supersede:
            self._run(
                "UPDATE chunks SET active = FALSE, superseded_at = ? WHERE active AND doc_id IN "
                "(SELECT unnest(?))", [now, to_supersede])
        if versions:
            vt = pa.table({
                "doc_id": [v[0] for v in versions], "version": pa.array([v[1] for v in versions], pa.int32()),
                "content_hash": [v[2] for v in versions], "n_chunks": pa.array([v[3] for v in versions], pa.int32()),
                "withdrawn": [v[4] for v in versions], "ingested_at": pa.array([now] * len(versions), pa.timestamp("us")),
                "source_hash": pa.array([v[5] for v in versions], pa.string()),
            })
            self._con.register("_new_versions", vt)
            self._run(f"INSERT INTO doc_versions ({', '.join(DOC_VERSION_COLUMNS)}) "
                              f"SELECT {', '.join(DOC_VERSION_COLUMNS)} FROM _new_versions")
            self._con.unregister("_new_versions")
        if rows:
            self._insert_chunks(rows, row_version, valid_as_of, now)
        return len(rows)

    def _insert_chunks(self, rows: list[Chunk], row_version: list[int], valid_as_of: str,
                       now: datetime) -> None:
        table = chunk_rows_table(rows, row_version, valid_as_of, now)
        self._con.register("_new_chunks", table)
        try:
            self._run(f"INSERT INTO chunks ({', '.join(CHUNK_COLUMNS)}) "
                              f"SELECT {', '.join(CHUNK_COLUMNS)} FROM _new_chunks")
        finally:
            self._con.unregister("_new_chunks")

    # ------------------------------------------------------------------- reads
    def iter_chunks(
        self,
        *,
        doc_id: str | None = None,
        topic: str | None = None,
        entity: str | None = None,
        geography: str | None = None,
        period: str | None = None,
        language: str | None = None,
        include_inactive: bool = False,
        as_of: datetime | str | None = None,
    ) -> list[StoredChunk]:
        """Chunks matching every given field (AND), in (doc_id, ordinal, version) order.

        A list (the spec's return type): the rows are fetched in one query anyway, and a
        list can be measured, indexed and iterated twice.

        ``as_of`` (an ``ingested_at`` timestamp) returns the rows active at that moment;
        it overrides ``include_inactive``.
        """
        self._reread_source()  # the spec's SQLite file, when it changed since the migration
        where: list[str] = []
        params: list[Any] = []
        for name, value in (("doc_id", doc_id), ("topic", topic), ("entity", entity),
                            ("geography", geography), ("period", period), ("language", language)):
            if value is not None:
                where.append(f"{name} = ?")
                params.append(value)
        if as_of is not None:
            ts = datetime.fromisoformat(as_of) if isinstance(as_of, str) else as_of
            if ts.tzinfo is not None:
                ts = ts.astimezone(UTC).replace(tzinfo=None)
            where.append("ingested_at <= ? AND (superseded_at IS NULL OR superseded_at > ?)")
            params += [ts, ts]
        elif not include_inactive:
            where.append("active")
        sql = f"SELECT {', '.join(CHUNK_COLUMNS)} FROM chunks"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY doc_id, ordinal, version, chunk_id"
        with self._lock:
            rows = self._con.execute(sql, params).fetchall()
        names = list(CHUNK_COLUMNS)
        return [row_to_chunk(dict(zip(names, r, strict=True))) for r in rows]

    def doc_versions(self, doc_id: str | None = None) -> list[dict[str, Any]]:
        sql = f"SELECT {', '.join(DOC_VERSION_COLUMNS)} FROM doc_versions"
        params: list[Any] = []
        if doc_id is not None:
            sql += " WHERE doc_id = ?"
            params.append(doc_id)
        sql += " ORDER BY doc_id, version"
        with self._lock:
            cur = self._con.execute(sql, params)
            names = [d[0] for d in cur.description]
            return [dict(zip(names, r, strict=True)) for r in cur.fetchall()]

    def latest_versions(self) -> dict[str, int]:
        """doc_id -> highest version recorded (withdrawals included; rows of a migrated
        older store, which has chunks but no version records, count too)."""
        with self._lock:
            return {d: int(v) for d, v in self._run(
                "SELECT doc_id, max(version) FROM (SELECT doc_id, version FROM chunks "
                "UNION ALL SELECT doc_id, version FROM doc_versions) GROUP BY doc_id")}

    def latest_source_hashes(self) -> dict[str, str]:
        """doc_id -> source hash of its latest, non-withdrawn version (where recorded)."""
        with self._lock:
            rows = self._run(
                "SELECT doc_id, arg_max(source_hash, version), arg_max(withdrawn, version) "
                "FROM doc_versions GROUP BY doc_id")
        return {d: h for d, h, w in rows if h and not w}

    # ------------------------------------------------------------- arrow I/O
    def export_arrow(self) -> dict[str, Any]:
        """Both tables as Arrow (every version, for an immutable warehouse snapshot)."""
        with self._lock:
            chunks = self._con.sql(
                f"SELECT {', '.join(CHUNK_COLUMNS)} FROM chunks ORDER BY doc_id, version, ordinal").to_arrow_table()
            versions = self._con.sql(
                f"SELECT {', '.join(DOC_VERSION_COLUMNS)} FROM doc_versions ORDER BY doc_id, version").to_arrow_table()
        return {"chunks": as_table(chunks), "doc_versions": as_table(versions)}

    def import_arrow(self, chunks: Any, doc_versions: Any) -> None:
        """Load tables written by ``export_arrow`` (into an empty store)."""
        if self.read_only:
            raise PermissionError("ChunkStore opened read_only")
        self._load_tables(chunks, doc_versions)

    def _load_tables(self, chunks: Any, doc_versions: Any) -> None:
        with self._lock:
            if self._run("SELECT count(*) FROM chunks")[0][0] or self._run("SELECT count(*) FROM doc_versions")[0][0]:
                raise ValueError("import_arrow needs an empty store")
            for name, table, cols in (("chunks", chunks, list(CHUNK_COLUMNS)),
                                      ("doc_versions", doc_versions, list(DOC_VERSION_COLUMNS))):
                present = [c for c in cols if c in table.column_names]
                self._con.register("_import", table)
                try:
                    self._run(f"INSERT INTO {name} ({', '.join(present)}) SELECT {', '.join(present)} FROM _import")
                finally:
                    self._con.unregister("_import")

    def active_doc_ids(self) -> list[str]:
        with self._lock:
            return [r[0] for r in self._con.execute(
                "SELECT DISTINCT doc_id FROM chunks WHERE active ORDER BY doc_id").fetchall()]

    def execute_read(self, sql: str, params: Sequence[Any] | None = None) -> list[tuple[Any, ...]]:
        """Run one read-only statement (SELECT / WITH / DESCRIBE / SHOW / EXPLAIN).

        Anything else raises ``ReadOnlyQueryError`` before execution; the statement also
        runs inside a transaction that is rolled back, so nothing can persist.
        """
        try:
            stmts = self._con.extract_statements(sql)
        except duckdb.Error as exc:
            raise ReadOnlyQueryError(f"cannot parse query: {exc}") from None
        if len(stmts) != 1:
            raise ReadOnlyQueryError(f"execute_read takes exactly one statement (got {len(stmts)})")
        allowed = {duckdb.StatementType.SELECT, duckdb.StatementType.EXPLAIN}
        if stmts[0].type not in allowed:
            raise ReadOnlyQueryError(
                f"execute_read only runs read-only statements; got {stmts[0].type.name}"
            )
        with self._lock:
            if self.read_only:
                return self._con.execute(sql, list(params or [])).fetchall()
            self._run("BEGIN TRANSACTION")
            try:
                return self._con.execute(sql, list(params or [])).fetchall()
            finally:
                self._run("ROLLBACK")
