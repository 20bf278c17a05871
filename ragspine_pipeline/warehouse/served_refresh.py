"""What the ``lexical_index`` step writes for serving (the BM25 file, the served records),
refreshed from the previous version's files when only a little changed.

Why: a 1% refresh of a 250k-chunk library spent most of its lexical step reading every
served chunk (text included), every chunk's tokens, and turning every row into JSON again,
although the previous version's files already hold all of that for the rows that stayed
(#27, pipeline refresh <= 5% of a full build). Here a refresh reads only the served rows'
keys (chunk id, document, version), then:

* the BM25 index stacks one new segment on the previous version's segments
  (``merge_bm25_file``, ``lexical_stack``), or merges when the policy says so, with the
  tokens of only the chunks it lacks (a ``TokenLoader`` reads them from the newest token
  segments that hold them); a refresh where a document became withheld or RESTRICTED
  always merges (``_newly_unserved``), so no dead copy of its text stays in the files;
* the served records keep each previous record whose row is the same stored row (same
  chunk id, document and document version: a chunks row is written once and never
  changed, and the previous version's chunks segments are a prefix of this one's), and
  make records only for the others. The file is then written whole, exactly as a full
  write would write it (same rows, same batches, checksums taken from the new file).

Security: what is reused comes from the previous version's served files, which hold
served rows only, and only rows that are served now are kept: a chunk deleted,
relabelled RESTRICTED (the labels are judged now, under the rules in force) or withheld
is not among the keys, so it leaves the records and the index's live rows (never counted
in a statistic, scored or returned). A deleted chunk's dead copy may stay in a stacked
segment's bytes until the next merge, as in Lucene; a withheld or RESTRICTED one never
does: such a refresh merges. A previous file that fails its checksums
is not reused (the full write runs, and the metadata says why).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from . import served_records as records
from .chunk_tables import served_chunk_table, unserved_docs
from .lexical_files import TokenLoader, merge_bm25_file
from .lexical_stack import DEFAULT_POLICY
from .record_rows import row_json_batches
from .served_records import (
    FIELD_COLUMNS,
    SERVED_FILE,
    SERVED_META,
    _batch_crcs,
    records_current,
    records_schema,
    write_record_batches,
    write_served_records,
)
from .versioned import Published, VersionedTables, WarehouseError, read_segments

KEYS = ["chunk_id", "doc_id", "version"]  # what identifies a stored chunk row

__all__ = ["KEYS", "aligned_rows", "chunk_rows", "chunks_added_since", "write_served_files"]


def write_served_files(wh: VersionedTables, library: str, pub: Published, pub_chunks: Published,
                       prev: Published | None = None, analyzed: Sequence[str] = ()) -> dict[str, Any]:
    """Write into the (unpublished) lexical version what serving maps: the BM25 index of
    the served chunks and those chunks' records.

    With ``prev`` (the previous version, tokens of the same analysis) the index is merged
    from its BM25 file (``merge_bm25_file``): the served chunks it holds whose tokens were
    not re-analyzed now (``analyzed``) keep their counts, the others are counted from the
    stored tokens; chunks no longer served (deleted, RESTRICTED now) leave it; and the
    records are refreshed from its records file (``_refresh_records``). Otherwise, or when
    a file cannot be reused (the metadata says why), they are written whole."""
    if prev is None:
        served = served_chunk_table(wh, library, pub_chunks.version)
        ids = served.column("chunk_id").combine_chunks()
        tok = aligned_rows(read_segments(pub, "tokens"), ids, _no_tokens(pub, library))
        files = merge_bm25_file(pub.path, None, ids, tok.column("tokens"))
        return {**files, **write_served_records(pub.path, served)}
    keys = served_chunk_table(wh, library, pub_chunks.version, columns=KEYS)
    ids = keys.column("chunk_id").combine_chunks()
    purge = _newly_unserved(wh, library, pub_chunks.version, prev.manifest["metadata"].get("chunks_version"))
    files = merge_bm25_file(pub.path, prev.path, ids, _token_loader(pub, ids, _no_tokens(pub, library)),
                            changed=pa.array(list(analyzed), pa.string()), stack=None if purge else DEFAULT_POLICY)
    if purge:
        files["bm25_stack_off"] = purge
    why = _records_unusable(prev, pub_chunks)
    if why is None:
        try:
            return {**files, **_refresh_records(pub.path, prev.path, keys, pub_chunks), "served_build": "merged"}
        except _NotReusable as exc:
            why = str(exc)
    served = served_chunk_table(wh, library, pub_chunks.version)
    return {**files, **write_served_records(pub.path, served), "served_build": "full", "served_full_reason": why}


def _newly_unserved(wh: VersionedTables, library: str, version: str, prev_version: str | None) -> str | None:
    """Why this refresh must not stack (None: it may).

    A stack keeps the previous segments' bytes, dead copies included, until a merge. A
    document that is withheld or RESTRICTED now but was not before (relabelled, or deleted
    and back under a closed label) may have its text in those bytes: the refresh then
    merges, so the published files hold no posting, term or length of it (fail closed:
    also when the previous chunks version is unknown)."""
    if prev_version is None:
        return "the previous chunks version is not recorded"
    new = unserved_docs(wh, library, version) - unserved_docs(wh, library, prev_version)
    return f"{len(new)} documents newly withheld or RESTRICTED: merged, their text leaves the files" if new else None


def _no_tokens(pub: Published, library: str) -> str:
    return f"lexical index {pub.version} of {library}: no tokens for some served chunks"


def _token_loader(pub: Published, ids: pa.Array, error: str) -> TokenLoader:
    """Token lists of the chunks at given positions of ``ids`` (all: None), read from the
    newest token segments first and no further than the one that completes them."""
    def load(at: np.ndarray | None) -> pa.ChunkedArray:
        if at is None:
            return aligned_rows(read_segments(pub, "tokens"), ids, error).column("tokens")
        want = ids.take(pa.array(at, pa.int64()))
        parts, found = [], pa.array([], pa.string())
        for path in reversed(pub.table_paths("tokens")):
            if len(found) == len(want):
                break  # older segments only hold older rows of these ids: the newest wins anyway
            seg = pq.read_table(path, columns=["chunk_id"]).column("chunk_id")
            hit = pc.is_in(seg, value_set=want)
            if pc.any(hit).as_py():
                parts.append(pq.read_table(path, columns=["chunk_id", "tokens"]).filter(hit))
                found = pc.unique(pa.concat_arrays([found, pc.filter(seg, hit).combine_chunks().cast(pa.string())]))
        rows = pa.concat_tables(parts[::-1]) if parts else pa.table({"chunk_id": pa.array([], pa.string()),
                                                                    "tokens": pa.array([], pa.list_(pa.string()))})
        return aligned_rows(rows, want, error).column("tokens")
    return load


class _NotReusable(Exception):
    """The previous records cannot be reused; the message says why."""


def _records_unusable(prev: Published, pub_chunks: Published) -> str | None:
    """Why the previous version's records cannot be refreshed from, or None."""
    if not records_current(prev.path):
        return "the previous version has no served records in this format"
    if chunks_added_since(prev, pub_chunks) is None:
        return "the previous records were written from another chunks lineage"
    return None


def chunks_added_since(prev: Published, pub_chunks: Published) -> list[Path] | None:
    """The chunks segments ``pub_chunks`` appended after those ``prev`` (a lexical version)
    was built from, or None when its segments do not extend them (another lineage, a
    compaction, no recorded segments, or a chunks version without ``doc_state``)."""
    seen = prev.manifest["metadata"].get("chunks_segments")
    cur = pub_chunks.segments("chunks")
    if seen is None or cur[: len(seen)] != seen or "doc_state" not in pub_chunks.manifest["tables"]:
        return None
    return pub_chunks.table_paths("chunks")[len(seen):]


def _chunk_schema(pub_chunks: Published) -> pa.Schema:
    """The schema every chunks segment has (what a full read gives); raises when they differ
    (a full read then promotes types, which only the full write reproduces)."""
    schemas = [pq.read_schema(p) for p in pub_chunks.table_paths("chunks")]
    if not schemas or any(not s.equals(schemas[0], check_metadata=False) for s in schemas[1:]):
        raise _NotReusable("the chunks segments differ in schema")
    return schemas[0].remove_metadata()


def _open_previous(prev_dir: Path, rows: pa.Schema) -> pa.Table:
    """The previous records, mapped, after checking that they are records of rows of this
    schema and pass every checksum (what is copied into the new file is checked first)."""
    meta = json.loads((prev_dir / SERVED_META).read_text(encoding="utf-8"))
    if meta.get("row_fields") != rows.names or meta.get("row_types") != [str(f.type) for f in rows]:
        raise _NotReusable("the previous records hold rows of another schema")
    path = prev_dir / SERVED_FILE
    if path.stat().st_size != meta.get("bytes"):
        raise _NotReusable(f"{path}: size differs from its sidecar")
    try:
        reader = pa.ipc.open_file(pa.memory_map(str(path)))
        if _batch_crcs(reader) != meta.get("crc32"):
            raise _NotReusable(f"{path}: checksum mismatch")
        table = reader.read_all()
    except (pa.ArrowException, OSError) as exc:
        raise _NotReusable(f"{path}: not a readable Arrow file: {exc}") from exc
    if not table.schema.equals(records_schema(rows)) or table.num_rows != meta.get("rows"):
        raise _NotReusable(f"{path}: schema or rows differ from its sidecar")
    return table


def _refresh_records(version_dir: Path, prev_dir: Path, keys: pa.Table, pub_chunks: Published) -> dict[str, Any]:
    """Write the served records of ``keys`` (chunk_id order) from the previous records and
    the chunks rows of only the keys they lack."""
    rows = _chunk_schema(pub_chunks)
    old = _open_previous(Path(prev_dir), rows)
    at = pc.index_in(keys.column("chunk_id"), value_set=old.column("chunk_id").combine_chunks())
    same = pc.fill_null(pc.and_(pc.equal(old.column("doc_id").take(at), keys.column("doc_id")),
                                pc.equal(old.column("version").take(at), keys.column("version"))), False)
    same = np.asarray(same.to_numpy(zero_copy_only=False), np.bool_)
    new_at = np.flatnonzero(~same)
    try:
        fresh = chunk_rows(pub_chunks, keys.take(pa.array(new_at, pa.int64())), rows)
    except WarehouseError as exc:
        raise _NotReusable(str(exc)) from exc
    added = _records_of(fresh, rows)
    take = np.asarray(pc.fill_null(at, -1).to_numpy(), np.int64)  # kept: the previous record's row
    take[new_at] = old.num_rows + np.arange(len(new_at))
    batches = _gathered(pa.concat_tables([old, added]), take, records.BATCH_ROWS)
    return {**write_record_batches(version_dir, rows, batches, len(take)),
            "served_records_kept": int(same.sum()), "served_records_added": len(new_at)}


def _gathered(src: pa.Table, take: np.ndarray, step: int) -> Iterator[pa.RecordBatch]:
    """Rows ``take`` of ``src`` as record batches of ``step`` rows, each made of the runs of
    consecutive rows it holds (kept records stay in order: a refresh's batch is a few long
    runs), with no gather of the whole table first (the writer copies each batch once)."""
    for lo in range(0, len(take), step):
        t = take[lo:lo + step]
        cuts = np.flatnonzero(np.diff(t) != 1) + 1
        starts, ends = np.concatenate([[0], cuts]), np.concatenate([cuts, [len(t)]])
        parts = [src.slice(int(t[a]), int(b - a)) for a, b in zip(starts.tolist(), ends.tolist(), strict=True)]
        yield pa.concat_tables(parts).combine_chunks().to_batches()[0]


def _records_of(table: pa.Table, rows: pa.Schema) -> pa.Table:
    """Records (filter fields + the row as JSON) of chunk rows, made as the full write makes them."""
    schema = records_schema(rows)
    fields = [c for c in FIELD_COLUMNS if c in rows.names]
    batches = [pa.record_batch([*(b.column(c) for c in fields), j], schema=schema)
               for b, j in row_json_batches(table, records.BATCH_ROWS)]
    return pa.Table.from_batches(batches, schema=schema)


def chunk_rows(pub_chunks: Published, want: pa.Table, schema: pa.Schema | None = None, *,
               columns: list[str] | None = None) -> pa.Table:
    """The stored chunk rows of ``want`` (columns chunk_id, doc_id, version; in its order),
    read from the newest chunks segments first and no further than the one that completes
    them (after a 1% refresh: the newest). ``schema``: the rows' schema (else the segments'
    own, promoted as a full read promotes them); ``columns``: only those (and the keys). Raises ``WarehouseError`` when a row is
    not found exactly once."""
    parts, need = [], want.num_rows
    ids = want.column("chunk_id").combine_chunks()
    for path in reversed(pub_chunks.table_paths("chunks")):
        if need == 0:
            break
        seg = pq.read_table(path, columns=KEYS)
        at = pc.index_in(seg.column("chunk_id"), value_set=ids)
        hit = pc.fill_null(pc.and_(pc.equal(want.column("doc_id").take(at), seg.column("doc_id")),
                                   pc.equal(want.column("version").take(at), seg.column("version"))), False)
        n = pc.sum(hit).as_py() or 0
        if n:
            cols = None if columns is None else list(dict.fromkeys([*KEYS, *columns]))
            parts.append(pq.read_table(path, columns=cols).filter(hit))
            need -= n
    if not parts:
        found = schema.empty_table() if schema is not None else read_segments(pub_chunks, "chunks").slice(0, 0)
    else:
        found = pa.concat_tables(parts[::-1], promote_options="permissive")
    if need != 0 or found.num_rows != want.num_rows:
        raise WarehouseError(f"chunks {pub_chunks.version} of {pub_chunks.library}: some served rows are not "
                             "stored exactly once")
    if schema is not None:
        found = found.cast(schema) if not found.schema.equals(schema, check_metadata=False) \
            else found.replace_schema_metadata()
    return found.take(pc.index_in(ids, value_set=found.column("chunk_id").combine_chunks()))


def aligned_rows(table: pa.Table, ids: pa.Array, error: str) -> pa.Table:
    """Rows of a chunk_id-keyed index table in the order of ``ids``; every id must be there.
    Where a chunk has several rows (a contextual header re-indexed after a metadata
    change), the newest — the last appended — wins."""
    n = table.num_rows
    if n and len(table.column("chunk_id").unique()) != n:
        table = table.take(pa.array(np.arange(n - 1, -1, -1)))
    pos = pc.index_in(ids, value_set=table.column("chunk_id").combine_chunks())
    if pos.null_count:
        raise WarehouseError(f"{error} ({pos.null_count} chunks have no row)")
    return table.take(pos)
