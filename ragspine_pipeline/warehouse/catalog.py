"""The DuckDB catalog: one view per published table of every library, for notebooks.

The catalog is a trust boundary. The default (redacted) catalog says nothing about a
RESTRICTED or withheld document beyond a per-library count (``withheld_documents``): no
doc_id, file name, chunk id, metadata value, offset, length or hash of it, keyed or not.

How: an **allow-list**. ``open_documents`` lists the documents the catalog may show
(every document the snapshot's tables know, less ``redacted_doc_ids``), and every view
keeps only rows of those documents. A deny-list in the catalog (the table of hidden ids
this module used to write, or their ids inlined in the view SQL) would itself name the
hidden documents; the allow-list is the same whether restricted documents exist or what
they say, so the catalog's readable content — every view, every table, the view SQL —
does not depend on them (``tests/test_catalog_redaction.py`` compares it byte for byte).

Why views over the Parquet segments and not materialized redacted tables: the catalog
is rebuilt on every snapshot change, and a materialized copy would rewrite every open
chunk's text each time (gigabytes at millions of chunks, against an incremental refresh
that costs what changed); the allow-list costs one row per open document, the views a
semi-join at query time. The price: a view reads the Parquet files when queried, so a
catalog reader needs read access to them — raw and chunk Parquet are owner-only
(``versioned.OWNER_ONLY_ASSETS``), so the catalog serves the warehouse owner's notebooks,
and what it returns (and the file itself) can be shared without telling anything about
restricted documents (docs/security.md).

``CATALOG_FORMAT`` is recorded beside the catalog; a catalog written by an older format
is rebuilt on the next run even when no snapshot changed, so an old catalog that still
named restricted documents stops existing after the upgrade.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import uuid
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ..retrieval.chunking.chunk_store import CHUNK_COLUMNS
from .chunk_tables import withheld_docs
from .common import CHUNKS, EMBEDDINGS, LEXICAL, RAPTOR, RAW, SNAPSHOT, restricted_mask
from .raw import raw_state
from .versioned import (
    VersionedTables,
    WarehouseError,
    fail_before_publish,
    read_segments,
    write_json_atomic,
)

__all__ = ["CATALOG_FORMAT", "CATALOG_LOCK", "OPEN_DOCS", "WITHHELD_COUNTS", "build_catalog", "open_doc_ids",
           "quote_ident", "redacted_doc_ids", "view_name"]

# 2: allow-list redaction (format 1, unversioned, kept restricted rows with NULL text and
# listed the hidden doc_ids in a table).
CATALOG_FORMAT = 2
CATALOG_LOCK = ".catalog"  # library ids never start with a dot: no clash
OPEN_DOCS = "open_documents"  # (library, doc_id): the documents the redacted catalog shows
WITHHELD_COUNTS = "withheld_documents"  # (library, documents): how many it leaves out


def view_name(table: str, library: str) -> str:
    """``<table>_<library>`` with the library id escaped injectively and case-safely.

    Letters a-z, digits, ``_`` and ``-`` stay; anything else (space, ``%``, upper case,
    non-ASCII) becomes ``%XX`` of its UTF-8 bytes, so ``a b``, ``a%b`` and ``a_b`` get
    three names, and DuckDB's case-insensitive identifiers cannot merge ``A`` and ``a``.
    Always quote the result in SQL: ``quote_ident(view_name(...))``.
    """
    keep = frozenset("abcdefghijklmnopqrstuvwxyz0123456789_-")
    safe = "".join(ch if ch in keep else "".join(f"%{b:02X}" for b in ch.encode()) for ch in library)
    return f"{table}_{safe}"


def quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _sql_str(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def _sql_list(paths: list[Path]) -> str:
    # A view body cannot take parameters: paths are quoted as SQL literals.
    return "[" + ", ".join(_sql_str(p.resolve().as_posix()) for p in paths) + "]"


def _newest_rows_sql(paths: list[Path], key: str) -> str:
    """SELECT of the newest row per ``key`` across append-only segments (later files win)."""
    order = ", ".join(f"({_sql_list([p])[1:-1]}, {i})" for i, p in enumerate(paths))
    return (f"SELECT * EXCLUDE (_seg, _row) FROM (SELECT d.* EXCLUDE (filename, "
            f"file_row_number), s.seg AS _seg, d.file_row_number AS _row FROM read_parquet({_sql_list(paths)}, "
            f"filename = true, file_row_number = true, union_by_name = true) d JOIN (VALUES {order}) s(fname, seg) "
            f"ON d.filename = s.fname QUALIFY row_number() OVER (PARTITION BY {key} ORDER BY _seg DESC, _row DESC) = 1)")


def _restricted_doc_ids(doc_ids: pa.ChunkedArray, labels: pa.ChunkedArray) -> set[str]:
    """Documents with at least one row whose label is restricted."""
    return set(pc.unique(pc.filter(doc_ids, restricted_mask(labels))).to_pylist())


def _has_raw(meta: dict[str, Any]) -> bool:
    return meta.get("raw_documents") not in (None, "None")


def redacted_doc_ids(wh: VersionedTables, lib: str, meta: dict[str, Any]) -> set[str]:
    """Documents whose text the default catalog hides, in every version (fail closed).

    A document is hidden when its current raw row is RESTRICTED, unparseable (its label
    is unknown) or has a label problem, when any stored chunk row of it is RESTRICTED
    (an as-of read must not show an older version of a now-restricted document, nor a
    restricted version of a now-public one), or when it is withheld.
    """
    hidden = raw_hidden_doc_ids(wh, lib, meta)
    chunks = wh.get(CHUNKS, lib, meta["chunks"])
    t = read_segments(chunks, "chunks", columns=["doc_id", "sensitivity"])
    hidden |= _restricted_doc_ids(t.column("doc_id"), t.column("sensitivity"))
    hidden.update(withheld_docs(chunks))
    return hidden


def raw_hidden_doc_ids(wh: VersionedTables, lib: str, meta: dict[str, Any]) -> set[str]:
    """Documents whose current raw row (of the snapshot ``meta`` describes) is RESTRICTED,
    unparseable (its label is unknown) or has a label problem."""
    hidden: set[str] = set()
    if _has_raw(meta):
        cur = raw_state(wh.get(RAW, lib, meta["raw_documents"]),
                        columns=["doc_id", "sensitivity", "parse_error", "label_problem"])
        cols = [cur.column(c).to_pylist() if c in cur.column_names else [None] * cur.num_rows
                for c in ("parse_error", "label_problem")]
        ids = cur.column("doc_id").to_pylist()
        hidden.update(d for d, err, problem in zip(ids, *cols, strict=True) if err or problem)
        hidden |= _restricted_doc_ids(cur.column("doc_id"), cur.column("sensitivity"))
    return hidden


def open_doc_ids(wh: VersionedTables, lib: str, meta: dict[str, Any]) -> tuple[list[str], int]:
    """(sorted documents the redacted catalog shows, how many it leaves out).

    Every document the snapshot's tables know — a current raw row, or any stored version
    in ``doc_versions`` (history of deleted documents included) — less ``redacted_doc_ids``.
    """
    known: set[str] = set()
    if _has_raw(meta):
        known.update(raw_state(wh.get(RAW, lib, meta["raw_documents"]), columns=["doc_id"]).column("doc_id")
                     .to_pylist())
    chunks = wh.get(CHUNKS, lib, meta["chunks"])
    known.update(pc.unique(read_segments(chunks, "doc_versions", columns=["doc_id"]).column("doc_id")).to_pylist())
    hidden = redacted_doc_ids(wh, lib, meta)
    known.discard(None)  # type: ignore[arg-type]
    return sorted(known - hidden), len(hidden)


def _catalog_views(wh: VersionedTables, lib: str, meta: dict[str, Any], *, redact: bool) -> dict[str, str]:
    """view name -> SELECT over the Parquet segments the library's snapshot names.

    With ``redact`` (the default catalog), every view keeps only rows of the documents in
    ``open_documents`` (and tokens, vectors, RAPTOR nodes and graph rows of their active
    chunks); without it, every row of every document.
    """
    views: dict[str, str] = {}
    shown = f"(SELECT doc_id FROM {OPEN_DOCS} WHERE library = {_sql_str(lib)})"
    shown_list = f"coalesce((SELECT list(doc_id) FROM {OPEN_DOCS} WHERE library = {_sql_str(lib)}), [])"

    def keep(body: str) -> str:
        return f"SELECT * FROM ({body}) WHERE doc_id IN {shown}" if redact else body

    chunks = wh.get(CHUNKS, lib, meta["chunks"])
    if _has_raw(meta):
        paths = wh.get(RAW, lib, meta["raw_documents"]).table_paths("documents")
        if len(paths) == 1 and "deleted" not in pq.read_schema(paths[0]).names:
            body = f"SELECT * FROM read_parquet({_sql_list(paths)})"
        else:  # the newest row per file, tombstones removed
            body = (f"SELECT * EXCLUDE (deleted) FROM ({_newest_rows_sql(paths, 'source_path')}) "
                    f"WHERE NOT coalesce(deleted, false)")
        views["documents"] = keep(body)
    if "doc_state" in chunks.manifest["tables"]:
        cols = ", ".join("dv.superseded_at" if c == "superseded_at" else
                         "coalesce(c.version = st.version AND NOT st.withdrawn, false) AS active" if c == "active"
                         else f"c.{c}" for c in CHUNK_COLUMNS)
        body = (
            f"SELECT {cols} FROM read_parquet({_sql_list(chunks.table_paths('chunks'))}, union_by_name = true) c "
            f"LEFT JOIN (SELECT doc_id, version, lead(ingested_at) OVER (PARTITION BY doc_id ORDER BY version) "
            f"AS superseded_at FROM read_parquet({_sql_list(chunks.table_paths('doc_versions'))})) dv "
            f"ON dv.doc_id = c.doc_id AND dv.version = c.version "
            f"LEFT JOIN ({_newest_rows_sql(chunks.table_paths('doc_state'), 'doc_id')}) st ON st.doc_id = c.doc_id")
        views["doc_state"] = keep(_newest_rows_sql(chunks.table_paths("doc_state"), "doc_id"))
    else:
        body = f"SELECT * FROM read_parquet({_sql_list(chunks.table_paths('chunks'))})"
    # ``redacted`` stays for schema parity with the unredacted catalog: the redacted one has no hidden rows.
    views["chunks"] = f"SELECT *, false AS redacted FROM ({keep(body)})"
    views["doc_versions"] = keep(f"SELECT * FROM read_parquet({_sql_list(chunks.table_paths('doc_versions'))})")
    active = f"(SELECT chunk_id FROM {quote_ident(view_name('chunks', lib))} WHERE active)"
    lex = wh.get(LEXICAL, lib, meta["lexical_index"])
    views["lexical_tokens"] = (f"SELECT * FROM read_parquet({_sql_list(lex.table_paths('tokens'))}) "
                               f"WHERE chunk_id IN {active}")
    if meta.get("raptor_tree") not in (None, "None"):
        tree = wh.get(RAPTOR, lib, meta["raptor_tree"])
        body = f"SELECT * FROM read_parquet({_sql_list(tree.table_paths('nodes'))})"
        # The tree never holds a RESTRICTED chunk; a node over a document hidden since is left out.
        views["raptor_nodes"] = (f"SELECT * FROM ({body}) WHERE list_has_all({shown_list}, doc_ids)"
                                 if redact else body)
    if meta.get("embeddings") not in (None, "None"):
        emb = wh.get(EMBEDDINGS, lib, meta["embeddings"])
        views["embeddings"] = (f"SELECT * FROM read_parquet({_sql_list(emb.table_paths('vectors'))}) "
                               f"WHERE chunk_id IN {active}")
    if meta.get("relation_graph") not in (None, "None"):
        views["graph_nodes"], views["graph_edges"] = _graph_views(wh, lib, meta, shown if redact else None,
                                                                  shown_list)
    return views


def _graph_views(wh: VersionedTables, lib: str, meta: dict[str, Any], shown: str | None,
                 shown_list: str) -> tuple[str, str]:
    """(nodes, edges) SELECTs of the relation graph; with ``shown`` (redacted) only nodes
    that cite open documents alone, and edges between such nodes.

    The graph holds served chunks only, but the redacted catalog hides more (a document
    with any restricted stored row, or hidden since): a node citing a document (``doc_id``
    or ``doc_ids`` in attrs) stays only when every cited document is open.
    """
    graph = wh.get("relation_graph", lib, meta["relation_graph"])
    nodes = f"SELECT * FROM read_parquet({_sql_list(graph.table_paths('nodes'))})"
    edges = f"SELECT * FROM read_parquet({_sql_list(graph.table_paths('edges'))})"
    if shown is None:
        return nodes, edges
    doc, docs = "json_extract_string(attrs, '$.doc_id')", "json_extract(attrs, '$.doc_ids')"
    cites_open = (f"(coalesce({doc} IN {shown}, {doc} IS NULL) AND "
                  f"coalesce(list_has_all({shown_list}, CAST({docs} AS VARCHAR[])), {docs} IS NULL))")
    kept = f"(SELECT id FROM ({nodes}) WHERE {cites_open})"
    return (f"SELECT * FROM ({nodes}) WHERE {cites_open}",
            f"SELECT * FROM ({edges}) WHERE {cites_open} AND src IN {kept} AND dst IN {kept}")


def build_catalog(wh: VersionedTables, libraries: list[str], path: Path, *,
                  include_restricted: bool = False) -> dict[str, Any]:
    """A DuckDB file with one view per published table, swapped in atomically.

    Views point at the immutable Parquet segments of each library's snapshot (``active``
    and ``superseded_at`` of chunks derived from the document versions), so a notebook
    holding the catalog read-only keeps a consistent picture while refreshes publish
    (the retention window keeps those files for at least ``retain_for``).

    The catalog is a trust boundary: by default it shows only the documents in
    ``open_documents`` and counts the rest in ``withheld_documents`` (see the module
    docstring). ``include_restricted=True`` builds the unredacted catalog — write it to a
    separate, explicitly named path that only readers cleared for RESTRICTED can open.
    One library that fails to build its views is reported in ``errors`` and left out;
    the others are still published.
    """
    with wh.lock(CATALOG_LOCK):
        return _build_catalog(wh, libraries, path, include_restricted)


def _build_catalog(wh: VersionedTables, libraries: list[str], path: Path, include_restricted: bool) -> dict[str, Any]:
    path.parent.mkdir(parents=True, exist_ok=True)
    snaps = {lib: snap.manifest["metadata"]["snapshot_id"] for lib in libraries
             if (snap := wh.latest(SNAPSHOT, lib)) is not None}
    index = path.with_suffix(".json")
    redact = not include_restricted
    if path.exists() and index.exists():
        old = json.loads(index.read_text(encoding="utf-8"))
        if old.get("format") == CATALOG_FORMAT and old.get("snapshots") == snaps \
                and old.get("redacted", True) == redact and not old.get("errors"):
            return {"views": old["views"], "path": str(path), "rebuilt": False, "errors": {}, "redacted": redact}
    # The unredacted catalog holds restricted rows: it is built in a private (0700) folder
    # and published mode 0600, so no moment leaves it (or its WAL) readable by others.
    private = None if redact else Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    tmp = (private or path.parent) / f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
    con = duckdb.connect(str(tmp))
    try:
        try:
            views, rows, errors = _fill_catalog(con, wh, libraries, redact)
            con.execute("CHECKPOINT")
        except BaseException:
            con.close()
            tmp.unlink(missing_ok=True)
            raise
        con.close()
        if private is not None:
            os.chmod(tmp, 0o600)
        try:
            fail_before_publish("catalog", str(path))
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
    finally:
        if private is not None:
            shutil.rmtree(private, ignore_errors=True)
    write_json_atomic(index, {"format": CATALOG_FORMAT, "views": views, "libraries": libraries, "snapshots": snaps,
                              "redacted": redact, "errors": errors}, private=not redact)
    return {"views": views, "path": str(path), "rebuilt": True, "errors": errors, "redacted": redact}


def _fill_catalog(con: duckdb.DuckDBPyConnection, wh: VersionedTables, libraries: list[str],
                  redact: bool) -> tuple[list[str], list[tuple[str, str]], dict[str, str]]:
    """Create the catalog's tables and every library's views in ``con``: (views, snapshot
    rows, errors by library)."""
    views: list[str] = []
    rows: list[tuple[str, str]] = []
    errors: dict[str, str] = {}
    if redact:  # the unredacted catalog shows everything: no allow-list (it withholds 0 documents)
        con.execute(f"CREATE TABLE {OPEN_DOCS} (library VARCHAR, doc_id VARCHAR)")
    con.execute(f"CREATE TABLE {WITHHELD_COUNTS} (library VARCHAR, documents BIGINT)")
    con.execute("CREATE TABLE catalog_views (library VARCHAR, table_name VARCHAR, view_name VARCHAR)")
    for lib in libraries:
        snap = wh.latest(SNAPSHOT, lib)
        if snap is None:
            continue
        meta = snap.manifest["metadata"]
        con.begin()
        try:
            if redact:
                shown, n_hidden = open_doc_ids(wh, lib, meta)
                allow = pa.table({"library": pa.array([lib] * len(shown), pa.string()),
                                  "doc_id": pa.array(shown, pa.string())})
                con.register("_open_docs_batch", allow)  # one Arrow insert, not a row per document
                con.execute(f"INSERT INTO {OPEN_DOCS} SELECT library, doc_id FROM _open_docs_batch")
                con.unregister("_open_docs_batch")
            con.execute(f"INSERT INTO {WITHHELD_COUNTS} VALUES (?, ?)", [lib, n_hidden if redact else 0])
            made = []
            for name, body in _catalog_views(wh, lib, meta, redact=redact).items():
                view = view_name(name, lib)
                con.execute(f"CREATE VIEW {quote_ident(view)} AS {body}")
                con.execute("INSERT INTO catalog_views VALUES (?, ?, ?)", [lib, name, view])
                made.append(view)
            con.commit()
        except (WarehouseError, OSError, duckdb.Error, KeyError, pa.ArrowException) as exc:
            con.rollback()
            errors[lib] = f"{type(exc).__name__}: {exc}"[:500]
            continue
        views.extend(made)
        rows.append((lib, meta["snapshot_id"]))
    con.execute("CREATE TABLE snapshots (library VARCHAR, snapshot_id VARCHAR)")
    if rows:
        con.executemany("INSERT INTO snapshots VALUES (?, ?)", rows)
    return views, rows, errors
