"""Precomputed passage encodings for the model rerankers (SPLADE vectors, token matrices).

A library that opts in keeps, per reranker model, the encoding of every open chunk text in
one DuckDB file (``<warehouse>/rerank_vectors/<library>.duckdb``). The SPLADE and
late-interaction rerankers read it before encoding anything (``PassageCache`` with a
backing source), so a query pays only for its own encoding; a text missing from the store
is encoded on the fly as before. Rows are keyed by (model id, sha256 of the text), so a
changed chunk, or another model, never reuses a stale vector, and ``refresh_document_vectors``
encodes only the texts the store does not hold yet and drops the ones no longer served.

RESTRICTED chunks are never encoded and never written (``is_restricted``, fail closed);
``restricted_rows`` lets the asset check prove it. Token matrices are stored as float16
(half the bytes; MaxSim over them moves scores by ~1e-3 of a cosine), SPLADE vectors as
int32 ids + float32 weights, exactly.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa

from ..retrieval.rerank.scoring import text_key
from ..sensitivity import is_restricted
from .chunk_tables import active_chunk_table, published_chunks, served_chunks
from .common import SNAPSHOT, CheckOutcome
from .versioned import WarehouseError

STORE_DIR = "rerank_vectors"
KIND_SPARSE, KIND_TOKENS = "sparse", "tokens"

__all__ = ["KIND_SPARSE", "KIND_TOKENS", "STORE_DIR", "RefreshReport", "RerankVectorStore",
           "attach_library_vectors", "open_for_refresh", "refresh_document_vectors", "store_path", "text_key"]


def store_path(warehouse_root: str | Path, library: str) -> Path:
    """Where a library's reranker vectors live under the warehouse root."""
    if not library or "/" in library or "\\" in library or library in (".", ".."):
        raise ValueError(f"library id {library!r} cannot name a file")
    return Path(warehouse_root) / STORE_DIR / f"{library}.duckdb"


def _encode(value: Any) -> tuple[str, int, int, bytes | None, bytes]:
    """(kind, rows, cols, ids, data) of a SPLADE vector (``ids``/``weights``) or a token matrix."""
    if hasattr(value, "ids") and hasattr(value, "weights"):
        ids = np.asarray(value.ids, dtype=np.int32)
        w = np.asarray(value.weights, dtype=np.float32)
        if ids.shape != w.shape or ids.ndim != 1:
            raise ValueError("a sparse vector needs aligned 1-D ids and weights")
        return KIND_SPARSE, len(ids), 1, ids.tobytes(), w.tobytes()
    m = np.asarray(value)
    if m.ndim != 2:
        raise ValueError(f"a token matrix must be 2-D (got shape {m.shape})")
    return KIND_TOKENS, m.shape[0], m.shape[1], None, m.astype(np.float16).tobytes()


def _decode(kind: str, rows: int, cols: int, ids: bytes | None, data: bytes) -> Any:
    if kind == KIND_SPARSE:
        # lazy: splade.py loads scipy.special (~0.2 s): only a store holding SPLADE rows pays it
        from ..retrieval.rerank.splade import SparseVector

        return SparseVector(np.frombuffer(ids or b"", dtype=np.int32).copy(),
                            np.frombuffer(data, dtype=np.float32).copy())
    if kind == KIND_TOKENS:
        return np.frombuffer(data, dtype=np.float16).reshape(rows, cols).astype(np.float32)
    raise ValueError(f"unknown stored vector kind {kind!r}")


class RerankVectorStore:
    """One DuckDB file of passage encodings, by (model id, text key).

    ``read_only=True`` (serving) opens the file for each read and closes it again, and
    treats a missing file as empty: the asset never writes the served file in place
    (``open_for_refresh`` updates a copy and renames it over), so a server never blocks a
    refresh, never sees a half-written file, and its next read sees the new one (a
    connection kept open would pin the old file: DuckDB shares one database instance per
    path within a process). Reads happen only for passages missing from the rerankers'
    memory cache, so the open is rare. The read-write mode (a benchmark's private disk
    cache) keeps one connection and writes in place. Thread-safe behind a lock.
    """

    def __init__(self, path: str | Path, *, read_only: bool = False) -> None:
        self.path = Path(path)
        self.read_only = read_only
        self._lock = threading.Lock()
        self._con: Any = None
        self.deleted = 0  # rows deleted through this object (their bytes stay in free blocks)

    @contextmanager
    def _connection(self) -> Iterator[Any]:
        """The connection for one operation (None: read-only and no file yet)."""
        if self.read_only:
            if not self.path.is_file():
                yield None
                return
            con = duckdb.connect(str(self.path), read_only=True)
            try:
                yield con
            finally:
                con.close()
            return
        if self._con is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._con = duckdb.connect(str(self.path))
            self._con.execute(
                "CREATE TABLE IF NOT EXISTS rerank_vectors (model_id VARCHAR NOT NULL, "
                "text_key VARCHAR NOT NULL, chunk_id VARCHAR, kind VARCHAR NOT NULL, n_rows INTEGER, "
                "n_cols INTEGER, ids BLOB, data BLOB NOT NULL, sensitivity VARCHAR, "
                "PRIMARY KEY (model_id, text_key))")
        yield self._con

    def close(self) -> None:
        with self._lock:
            if self._con is not None:
                self._con.close()
                self._con = None

    def _query(self, sql: str, params: list[Any]) -> list[tuple]:
        with self._lock, self._connection() as con:
            return [] if con is None else con.execute(sql, params).fetchall()

    def get_many(self, model_id: str, keys: Sequence[str]) -> dict[str, Any]:
        """The stored encodings of ``keys`` under ``model_id`` (missing keys are absent)."""
        if not keys:
            return {}
        rows = self._query("SELECT text_key, kind, n_rows, n_cols, ids, data FROM rerank_vectors "
                           "WHERE model_id = ? AND text_key IN (SELECT unnest(?::VARCHAR[]))",
                           [model_id, list(dict.fromkeys(keys))])
        return {k: _decode(kind, r, c, ids, data) for k, kind, r, c, ids, data in rows}

    def put_many(self, model_id: str, items: Mapping[str, Any],
                 meta: Mapping[str, tuple[str, str]] | None = None) -> int:
        """Store encodings by text key (replacing any with the same key); ``meta`` maps a
        key to (chunk_id, sensitivity) for lineage. Returns how many rows were written."""
        if self.read_only:
            raise PermissionError(f"{self.path} is open read-only")
        if not items:
            return 0
        meta = meta or {}
        rows = [(model_id, k, meta.get(k, (None, None))[0], *_encode(v), meta.get(k, (None, None))[1])
                for k, v in items.items()]
        cols = list(zip(*rows, strict=True))
        batch = pa.table({name: pa.array(col, typ) for name, col, typ in zip(
            ("model_id", "text_key", "chunk_id", "kind", "n_rows", "n_cols", "ids", "data", "sensitivity"), cols,
            (pa.string(), pa.string(), pa.string(), pa.string(), pa.int32(), pa.int32(), pa.binary(), pa.binary(),
             pa.string()), strict=True)})
        with self._lock, self._connection() as con:  # one statement over an Arrow batch (executemany is slow)
            con.register("_rerank_batch", batch)
            try:
                con.execute("INSERT OR REPLACE INTO rerank_vectors SELECT model_id, text_key, chunk_id, kind, "
                            "n_rows, n_cols, ids, data, sensitivity FROM _rerank_batch")
            finally:
                con.unregister("_rerank_batch")
        return len(rows)

    def keys(self, model_id: str) -> set[str]:
        return {k for (k,) in self._query("SELECT text_key FROM rerank_vectors WHERE model_id = ?", [model_id])}

    def models(self) -> dict[str, int]:
        """Row count per model id."""
        return dict(self._query("SELECT model_id, count(*) FROM rerank_vectors GROUP BY 1 ORDER BY 1", []))

    def delete(self, model_id: str, keys: Iterable[str]) -> int:
        if self.read_only:
            raise PermissionError(f"{self.path} is open read-only")
        drop = list(keys)
        if drop:
            self._query("DELETE FROM rerank_vectors WHERE model_id = ? AND text_key IN "
                        "(SELECT unnest(?::VARCHAR[]))", [model_id, drop])
            self.deleted += len(drop)
        return len(drop)

    def restricted_rows(self) -> int:
        """Rows whose recorded label is restricted (must be 0: the asset check)."""
        labels = self._query("SELECT sensitivity, count(*) FROM rerank_vectors GROUP BY 1", [])
        return sum(n for label, n in labels if is_restricted(label))


@contextmanager
def open_for_refresh(path: str | Path) -> Iterator[RerankVectorStore]:
    """A writable copy of the store at ``path``, renamed over it when the block succeeds
    (left untouched when it raises)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    os.close(fd)
    tmp = Path(tmp_name)
    tmp.unlink()
    try:
        if path.is_file():
            shutil.copyfile(path, tmp)
            os.chmod(tmp, 0o600)  # it may hold rows this refresh drops: nobody else reads it meanwhile
        store = RerankVectorStore(tmp)
        try:
            yield store
        finally:
            store.close()
        if store.deleted:  # DuckDB keeps a deleted row's bytes in free blocks: copy the rows left
            _rewrite_compact(tmp)  # a new file, as the umask says: it holds served rows only
        elif path.is_file():
            shutil.copymode(path, tmp)  # nothing dropped: the store keeps its mode (0600 after a purge)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
        Path(str(tmp) + ".wal").unlink(missing_ok=True)


def _rewrite_compact(path: Path) -> None:
    """Replace the store at ``path`` by a new file holding only its live rows (#42: a row
    dropped because its chunk became RESTRICTED or withheld leaves no byte behind)."""
    packed = path.with_name(path.name + ".packed")
    packed.unlink(missing_ok=True)
    fresh = RerankVectorStore(packed)
    try:
        with fresh._lock, fresh._connection() as con:
            con.execute("ATTACH '{}' AS src (READ_ONLY)".format(str(path).replace("'", "''")))
            try:
                con.execute("INSERT INTO rerank_vectors SELECT * FROM src.rerank_vectors")
            finally:
                con.execute("DETACH src")
            con.execute("CHECKPOINT")
        fresh.close()
        os.replace(packed, path)
    finally:
        fresh.close()
        packed.unlink(missing_ok=True)
        Path(str(packed) + ".wal").unlink(missing_ok=True)


def attach_library_vectors(reranker: Any, warehouse_root: str | Path, libraries: Sequence[str]) -> list[Path]:
    """Let ``reranker`` also serve from the precomputed vectors of ``libraries`` (read-only,
    opened lazily: a file that appears later is picked up). Idempotent: a library already
    attached is not added twice. No-op for rerankers without passage encodings
    (cross-encoder, LLM judge, none). Returns the paths attached now."""
    cache = getattr(reranker, "_passages", None)
    if reranker is None or cache is None or not callable(getattr(reranker, "use_document_vectors", None)):
        return []
    current = list(cache.sources)
    have = {Path(getattr(src, "path", "")) for src in current}
    new = [p for p in (store_path(warehouse_root, lib) for lib in libraries) if p not in have]
    if new:
        reranker.use_document_vectors([*current, *(RerankVectorStore(p, read_only=True) for p in new)])
    return new


@dataclass
class RefreshReport:
    """What one refresh did for one model."""

    model_id: str
    encoded: int
    reused: int
    removed: int
    restricted_skipped: int
    rows: int


def refresh_document_vectors(store: RerankVectorStore, model_id: str,
                             encode_batch: Callable[[list[str]], Sequence[Any]],
                             chunks: Iterable[Any], *, batch_size: int = 16) -> RefreshReport:
    """Bring ``store`` in line with ``chunks`` (objects with text, chunk_id, sensitivity)
    for one model: encode only texts it lacks, drop texts no longer served, never touch a
    RESTRICTED chunk."""
    if batch_size <= 0:
        raise ValueError("batch_size must be positive")
    wanted: dict[str, tuple[str, str, str]] = {}  # key -> (text, chunk_id, sensitivity)
    skipped = 0
    for c in chunks:
        if is_restricted(getattr(c, "sensitivity", None)):
            skipped += 1  # never encoded, never stored
            continue
        text = str(getattr(c, "text", "") or "")
        wanted.setdefault(text_key(text), (text, str(getattr(c, "chunk_id", "")), str(c.sensitivity)))
    have = store.keys(model_id)
    todo = [k for k in wanted if k not in have]
    for start in range(0, len(todo), batch_size):
        part = todo[start: start + batch_size]
        vecs = encode_batch([wanted[k][0] for k in part])
        if len(vecs) != len(part):
            raise ValueError(f"{model_id}: encoder returned {len(vecs)} vectors for {len(part)} texts")
        store.put_many(model_id, dict(zip(part, vecs, strict=True)),
                       {k: (wanted[k][1], wanted[k][2]) for k in part})
    removed = store.delete(model_id, [k for k in have if k not in wanted])
    return RefreshReport(model_id, encoded=len(todo), reused=len(wanted) - len(todo), removed=removed,
                         restricted_skipped=skipped, rows=len(wanted))


def _snapshot_chunks_version(wh: Any, library: str) -> str:
    snap = wh.latest(SNAPSHOT, library)
    if snap is None:
        raise WarehouseError(f"no retrieval snapshot published for {library}")
    return snap.manifest["metadata"]["chunks"]


def build_rerank_vectors(wh: Any, library: str, rerankers: Mapping[str, Any], *,
                         batch_size: int = 16) -> dict[str, Any]:
    """Refresh the library's store for each opted-in reranker over the chunks its published
    snapshot serves (``served_chunks``: no RESTRICTED, no withheld), encoding only what is
    new or changed. The store file is replaced atomically (``open_for_refresh``)."""
    chunks = served_chunks(wh, library, _snapshot_chunks_version(wh, library))
    path = store_path(wh.root, library)
    reports: dict[str, RefreshReport] = {}
    with wh.lock(library), open_for_refresh(path) as store:
        for name, r in rerankers.items():
            encode = getattr(r, "encode_passages", None)
            if not callable(encode):
                raise TypeError(f"reranker {name!r} has no passage encodings to precompute "
                                "(only splade and colbert do)")
            reports[name] = refresh_document_vectors(store, r.vectors_id, encode, chunks, batch_size=batch_size)
        kept = {r.vectors_id for r in rerankers.values()}
        for model_id in set(store.models()) - kept:  # a reranker no longer opted in
            store.delete(model_id, store.keys(model_id))
    return {"path": str(path), "chunks": len(chunks), "reports": reports}


def restricted_never_encoded_check(wh: Any, library: str) -> Any:
    """The asset check: no stored row is labelled restricted, and no stored text is the
    text of an active RESTRICTED chunk of the library (whatever label the row carries)."""
    path = store_path(wh.root, library)
    store = RerankVectorStore(path, read_only=True)
    try:
        table = active_chunk_table(published_chunks(wh, library, _snapshot_chunks_version(wh, library)),
                                   columns=["sensitivity", "text"])
        restricted_keys = {text_key(str(t or "")) for t, s in zip(table.column("text").to_pylist(),
                                                                 table.column("sensitivity").to_pylist(), strict=True)
                           if is_restricted(s)}
        models = store.models()
        leaked = {m: len(store.keys(m) & restricted_keys) for m in models}
        labelled = store.restricted_rows()
    finally:
        store.close()
    bad = sum(leaked.values()) + labelled
    return CheckOutcome(bad == 0, {"restricted_texts_encoded": sum(leaked.values()), "restricted_rows": labelled,
                                   "restricted_chunks": len(restricted_keys),
                                   "rows": sum(models.values()), "models": sorted(models)})
