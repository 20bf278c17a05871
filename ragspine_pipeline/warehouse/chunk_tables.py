"""The ``chunks`` step: versioned chunks kept as append-only history plus a small state table.

Tables of a chunks version:

* ``chunks``: every chunk row ever published (seed semantics: a changed document gets
  version = max+1, its old rows stay for point-in-time reads). Append-only: a refresh
  writes only the rows of the document versions it created.
* ``doc_versions``: one row per (document, version), withdrawals included; append-only.
* ``doc_state``: one row per document, its current version, chunk fingerprint, source
  hash (content hash + chunker key) and whether it is withdrawn; written whole each
  version (it is small: one short row per document, no text).

``active`` and ``superseded_at`` are derived, never stored: a chunk row is active when
its (doc_id, version) is its document's current, non-withdrawn version, and it was
superseded when the document's next version was ingested. So publishing a new version
never rewrites an old row, and an old version's tables still read exactly as they did.

A document whose file or sidecar stopped parsing is *withheld*: its last good version
stays stored (so it serves again, with no re-chunking, once it parses; the index tables
drop its rows meanwhile and analyze it again then), but ``doc_state`` marks it and the
served index leaves it out — a relabel that failed to parse must not
keep serving the old, less restricted version. ``on_parse_error="serve_last_good"``
is the explicit opt-out for libraries that prefer availability.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections import Counter
from dataclasses import replace
from datetime import datetime
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ..corpus import make_chunker
from ..ingest.documents import on_parse_error_policy
from ..ingest.locators import locate
from ..retrieval.chunking.chunk_store import (
    CHUNK_COLUMNS,
    DOC_VERSION_COLUMNS,
    StoredChunk,
    chunk_fingerprint,
    chunk_rows_table,
    row_to_chunk,
    timestamp_after,
)
from ..retrieval.chunking.chunking import Chunk
from ..sensitivity import REDACTED, is_restricted, redact
from .common import CHUNKS, RAW, CheckOutcome, StepResult, last_row_per_key, restricted_mask
from .raw import fetch_documents, raw_delta, raw_state
from .step_executor import StepExecutor, step_executor
from .versioned import (
    Append,
    Inherit,
    Published,
    VersionedTables,
    WarehouseError,
    library_step,
    read_segments,
)

STORED_CHUNK_COLUMNS = [c for c in CHUNK_COLUMNS if c not in ("superseded_at", "active")]
STATE_SCHEMA = pa.schema([("doc_id", pa.string()), ("version", pa.int32()), ("fingerprint", pa.string()),
                          ("source_hash", pa.string()), ("withdrawn", pa.bool_()), ("n_chunks", pa.int32()),
                          ("n_restricted", pa.int32()), ("ingested_at", pa.timestamp("us")),
                          ("withheld", pa.bool_())])

DOC_VERSION_SCHEMA = pa.schema([("doc_id", pa.string()), ("version", pa.int32()), ("content_hash", pa.string()),
                                ("n_chunks", pa.int32()), ("withdrawn", pa.bool_()),
                                ("ingested_at", pa.timestamp("us")), ("source_hash", pa.string())])
assert list(DOC_VERSION_SCHEMA.names) == list(DOC_VERSION_COLUMNS)


def published_chunks(wh: VersionedTables, library: str, version: str | None = None) -> Published:
    pub = wh.get(CHUNKS, library, version) if version else wh.latest(CHUNKS, library)
    if pub is None:
        raise WarehouseError(f"no chunks published for {library}")
    return pub


def doc_state(pub: Published, doc_ids: set[str] | None = None, *,
              columns: list[str] | None = None) -> dict[str, dict[str, Any]]:
    """doc_id -> current state row of a chunks version (only ``doc_ids`` when given).

    ``doc_state`` is append-only too: a version appends the rows of the documents whose
    state it changed, and the newest row per document wins.
    """
    if "doc_state" not in pub.manifest["tables"]:
        state = _legacy(pub)[2]
        return state if doc_ids is None else {d: state[d] for d in doc_ids if d in state}
    cols = None if columns is None else list(dict.fromkeys(["doc_id", *columns]))
    t = _read_state(pub, cols)
    if doc_ids is not None:
        t = t.filter(pc.is_in(t.column("doc_id"), value_set=pa.array(sorted(doc_ids), pa.string())))
    t = last_row_per_key(t, "doc_id")
    names = t.column_names
    return {r[0]: dict(zip(names, r, strict=True)) for r in zip(*(t.column(n).to_pylist() for n in names), strict=True)}


def _read_state(pub: Published, cols: list[str] | None) -> pa.Table:
    """doc_state segments; a column an older segment lacks (``withheld``) reads as null."""
    if cols is None:
        return read_segments(pub, "doc_state")
    parts = []
    for path in pub.table_paths("doc_state"):
        have = set(pq.read_schema(path).names)
        t = pq.read_table(path, columns=[c for c in cols if c in have])
        for c in cols:
            if c not in have:
                t = t.append_column(c, pa.nulls(t.num_rows, STATE_SCHEMA.field(c).type))
        parts.append(t.select(cols))
    return parts[0] if len(parts) == 1 else pa.concat_tables(parts, promote_options="permissive")


def withheld_docs(pub: Published) -> set[str]:
    """Documents of a chunks version kept out of serving because their file fails to parse."""
    if "doc_state" not in pub.manifest["tables"]:
        return set()
    t = last_row_per_key(_read_state(pub, ["doc_id", "withheld"]), "doc_id")
    return set(pc.filter(t.column("doc_id"), pc.fill_null(t.column("withheld"), False)).to_pylist())


def _legacy(pub: Published) -> tuple[pa.Table, pa.Table, dict[str, dict[str, Any]]]:
    """A version written before doc_state existed (one file with stored ``active``)."""
    chunks = read_segments(pub, "chunks")
    chunks = chunks.select([c for c in STORED_CHUNK_COLUMNS if c in chunks.column_names])
    dv = read_segments(pub, "doc_versions")
    state: dict[str, dict[str, Any]] = {}
    for r in dv.to_pylist():  # ordered by (doc_id, version): the last row wins
        state[r["doc_id"]] = {"doc_id": r["doc_id"], "version": r["version"], "fingerprint": r["content_hash"],
                              "source_hash": r.get("source_hash"), "withdrawn": bool(r["withdrawn"]),
                              "n_chunks": r["n_chunks"], "n_restricted": None, "ingested_at": r["ingested_at"]}
    return chunks, dv, state


def active_mask(table: pa.Table, state: dict[str, dict[str, Any]]) -> pa.Array:
    """Which rows (doc_id, version) are their document's current, non-withdrawn version."""
    current = {d: s["version"] for d, s in state.items() if not s["withdrawn"]}
    return pa.array([current.get(d) == v for d, v in zip(table.column("doc_id").to_pylist(),
                                                          table.column("version").to_pylist(), strict=True)],
                    pa.bool_())


def active_chunk_table(pub: Published, *, columns: list[str] | None = None) -> pa.Table:
    """The active rows of a chunks version, in chunk_id order (the row order of every index table)."""
    cols = None if columns is None else list(dict.fromkeys([*columns, "chunk_id", "doc_id", "version"]))
    if "doc_state" not in pub.manifest["tables"]:
        table = _legacy(pub)[0]
        table = table.select(cols) if cols else table
        active = table.filter(active_mask(table, doc_state(pub, columns=["version", "withdrawn"])))
    else:
        table = read_segments(pub, "chunks", columns=cols)
        active = table.filter(current_mask(table, current_versions(pub)))
    return active.take(pc.sort_indices(active, [("chunk_id", "ascending")]))


def current_versions(pub: Published) -> pa.Table:
    """(doc_id, version) of each document's current, non-withdrawn version (``doc_state``'s
    newest row per document), as Arrow: no Python row per document."""
    t = last_row_per_key(_read_state(pub, ["doc_id", "version", "withdrawn"]), "doc_id")
    return t.filter(pc.invert(pc.fill_null(t.column("withdrawn"), False)))


def current_mask(table: pa.Table, current: pa.Table) -> pa.Array:
    """``active_mask`` computed in Arrow: a row is active when its document is in
    ``current`` (``current_versions`` of some chunks version) and its version is that
    document's version there."""
    at = pc.index_in(table.column("doc_id"), value_set=current.column("doc_id").combine_chunks())
    version = current.column("version").combine_chunks().take(at)
    return pc.fill_null(pc.equal(version, table.column("version")), False)


def as_chunks(table: pa.Table) -> list[StoredChunk]:
    """Stored chunk rows (e.g. ``served_chunk_table``'s) as chunk objects, in row order."""
    return [row_to_chunk(r) for r in table.to_pylist()]


def active_chunks(wh: VersionedTables, library: str, version: str | None = None) -> list[StoredChunk]:
    """Active chunks of a chunks version in (doc_id, ordinal) order."""
    chunks = as_chunks(active_chunk_table(published_chunks(wh, library, version)))
    return sorted(chunks, key=lambda c: (c.doc_id, c.ordinal, c.chunk_id))


def sorted_active_chunks(wh: VersionedTables, library: str, version: str) -> list[StoredChunk]:
    """Active chunks of a version in chunk_id order: the row order of every index table."""
    return as_chunks(active_chunk_table(published_chunks(wh, library, version)))


def served_chunks(wh: VersionedTables, library: str, version: str) -> list[StoredChunk]:
    """The chunks a served index may hold: active, not withheld, not RESTRICTED (chunk_id order).

    Non-interference: the served index is built from these alone, so BM25's N, df and
    avgdl, the dense candidates and every RRF rank are the same whether restricted or
    withheld documents exist or not — no served score can reveal a word of them. The
    two RESTRICTED exits stay in place behind this as defence in depth.
    """
    return as_chunks(served_chunk_table(wh, library, version))


def served_chunk_table(wh: VersionedTables, library: str, version: str, *,
                       columns: list[str] | None = None) -> pa.Table:
    """``served_chunks`` as Arrow rows (chunk_id order), without building a chunk: what the
    published index files are written from. A null label reads as the chunk it becomes
    (INTERNAL), exactly as ``served_chunks`` judges it.

    ``columns`` reads only those (plus the ids, version and label the selection needs):
    a refresh that reuses most rows need not read every chunk's text."""
    pub = published_chunks(wh, library, version)
    table = active_chunk_table(pub, columns=None if columns is None else [*columns, "sensitivity"])
    table = table.filter(pc.invert(_unserved(table, withheld_docs(pub))))
    return table if columns is None else table.select(list(dict.fromkeys([*columns, "chunk_id"])))


def _unserved(table: pa.Table, withheld: set[str]) -> pa.Array:
    """The active rows serving leaves out: RESTRICTED (a null label reads as INTERNAL), or of a withheld document."""
    drop = restricted_mask(table.column("sensitivity").fill_null("INTERNAL"))
    if withheld:
        drop = pc.or_(drop, pc.is_in(table.column("doc_id"), value_set=pa.array(sorted(withheld), pa.string())))
    return drop


def unserved_docs(wh: VersionedTables, library: str, version: str) -> set[str]:
    """Documents with active chunks that are not served in this chunks version, and withheld ones."""
    pub = published_chunks(wh, library, version)
    table, withheld = active_chunk_table(pub, columns=["doc_id", "sensitivity"]), withheld_docs(pub)
    return set(pc.unique(table.column("doc_id").filter(_unserved(table, withheld))).to_pylist()) | withheld


def restricted_probes(wh: VersionedTables, library: str, version: str, limit: int = 25) -> list[tuple[str, str]]:
    """(chunk_id, text) of up to ``limit`` active RESTRICTED chunks: the leak check asks for
    each by its own words. Used only by that check; never shown."""
    table = active_chunk_table(published_chunks(wh, library, version), columns=["sensitivity", "text"])
    hits = [(cid, text) for cid, text, sens in zip(table.column("chunk_id").to_pylist(), table.column("text").to_pylist(),
                                                   table.column("sensitivity").to_pylist(), strict=True)
            if is_restricted(sens)]
    return hits[:limit]


def _state_table(rows: list[dict[str, Any]]) -> pa.Table:
    return pa.Table.from_pylist(sorted(rows, key=lambda r: r["doc_id"]), schema=STATE_SCHEMA)


@library_step
def build_chunks(wh: VersionedTables, library: str, chunker_spec: str | None = None,
                 raw_version: str | None = None, *, full_checks: bool = False,
                 on_parse_error: str | None = None, executor: StepExecutor | None = None, log=None) -> StepResult:
    """Publish the chunks of the raw version (default: the latest) incrementally.

    The documents looked at are the raw rows this step has not seen (the raw segments
    appended since its last run) when the chunker is unchanged, else every current row.
    ``full_checks`` re-verifies the checks over every active chunk instead of the rows
    this version wrote. ``on_parse_error`` (default ``RAGSPINE_ON_PARSE_ERROR`` or
    "withhold"): what a document whose file fails to parse serves meanwhile — nothing
    ("withhold"), or its last good version ("serve_last_good", availability first).
    ``executor`` (default None: here, in this process): e.g. ``scale.build.step_executor()``,
    Ray's for ``RAGSPINE_EXECUTOR=ray``, reads and chunks the documents to (re)chunk as a
    Ray Data pipeline; everything else is this function's, either way. ``log`` gets the
    progress of a Ray run, one line per batch.
    """
    t0 = time.perf_counter()
    executor = step_executor(executor)
    withhold = on_parse_error_policy(on_parse_error) == "withhold"
    chunker = make_chunker(chunker_spec)
    key = chunker.key
    raw_pub = wh.get(RAW, library, raw_version) if raw_version else wh.latest(RAW, library)
    if raw_pub is None:
        raise WarehouseError(f"no raw documents published for {library}")
    prev = wh.latest(CHUNKS, library)
    legacy = _legacy(prev) if prev is not None and "doc_state" not in prev.manifest["tables"] else None
    pmeta = prev.manifest["metadata"] if prev is not None else {}
    same_chunker = pmeta.get("chunker") == key
    policy = "withhold" if withhold else "serve_last_good"
    same_policy = pmeta.get("on_parse_error", "withhold") == policy
    # A changed chunker or parse-error policy looks at every current document again.
    seen = pmeta.get("raw_segments") if prev is not None and legacy is None and same_chunker and same_policy else None
    if seen is not None and seen == raw_pub.segments("documents") and not full_checks:
        # Nothing new upstream and the same chunker: keep the published tables.
        report = {"new": 0, "changed": 0, "withdrawn": 0, "rows_written": 0, "unchanged": pmeta.get("documents", 0),
                  "errors": pmeta.get("errors", 0), "active_chunks": pmeta.get("active_chunks", 0)}
        return StepResult(prev, _metadata(prev, report, key, [], [], [], [], [], t0, reused=True),
                          _checks(prev, raw_pub, [], {}, {}, {}, full=False))
    delta, is_delta = raw_delta(raw_pub, seen)
    rows_now = delta.to_pylist()
    present = {r["doc_id"]: r for r in rows_now if not r["deleted"] and not r["parse_error"]}
    failed_ids = {r["doc_id"] for r in rows_now if not r["deleted"] and r["parse_error"]}
    tombstoned = {r["doc_id"] for r in rows_now if r["deleted"]} - set(present) - failed_ids
    if legacy is not None:
        state = legacy[2]
    elif prev is None:
        state = {}
    else:
        state = doc_state(prev, None if not is_delta else set(present) | tombstoned | failed_ids)
    last_at = pmeta.get("last_ingested_at") if legacy is None else max(
        (s["ingested_at"] for s in state.values() if s["ingested_at"] is not None), default=None)
    now = timestamp_after(datetime.fromisoformat(last_at) if isinstance(last_at, str) else last_at)

    src_hash = {d: hashlib.sha256(f"{r['content_hash']}\x1f{key}".encode()).hexdigest() for d, r in present.items()}
    # A withdrawal clears the source hash, so a document that comes back is re-chunked.
    todo = sorted(d for d in present if d not in state or state[d]["source_hash"] != src_hash[d])
    if is_delta:
        gone = sorted(d for d in tombstoned if d in state and not state[d]["withdrawn"])
    else:
        gone = sorted(d for d, s in state.items() if not s["withdrawn"] and d not in present and d not in failed_ids)
    docs, chunked, job = _chunk_todo(raw_pub, {d: present[d]["source_path"] for d in todo}, chunker, chunker_spec,
                                     executor, log, library)
    chunked = {d: with_file_locators(cs, docs.get(d)) for d, cs in chunked.items()}

    new, changed, state_only = [], [], []
    rows: list[Chunk] = []
    row_version: list[int] = []
    versions: list[dict[str, Any]] = []
    updates: dict[str, dict[str, Any]] = {}
    for doc_id in todo:
        chunks = chunked[doc_id]
        ids = [c.chunk_id for c in chunks]
        if len(set(ids)) != len(ids) or any(c.doc_id != doc_id or not c.chunk_id.startswith(f"{doc_id}#")
                                            for c in chunks):
            raise WarehouseError(f"chunker {key} produced duplicate or foreign chunk ids for {doc_id!r}")
        fp = chunk_fingerprint(chunks)
        old = state.get(doc_id)
        if old is not None and not old["withdrawn"] and old["fingerprint"] == fp and old["n_chunks"] == len(chunks):
            state_only.append(doc_id)  # e.g. a new chunker that cuts this document the same way
            updates[doc_id] = {**old, "source_hash": src_hash[doc_id], "withheld": False}
            continue
        if not chunks and (old is None or old["withdrawn"]):
            # Nothing to publish or withdraw (an empty document); remember its hash so it is
            # not re-chunked on every refresh.
            state_only.append(doc_id)
            updates[doc_id] = {"doc_id": doc_id, "version": old["version"] if old else 0, "fingerprint": fp,
                               "source_hash": src_hash[doc_id], "withdrawn": True, "n_chunks": 0, "n_restricted": 0,
                               "ingested_at": old["ingested_at"] if old else now, "withheld": False}
            continue
        version = (old["version"] if old else 0) + 1
        (changed if old else new).append(doc_id)
        rows.extend(chunks)
        row_version.extend([version] * len(chunks))
        versions.append({"doc_id": doc_id, "version": version, "content_hash": fp, "n_chunks": len(chunks),
                         "withdrawn": not chunks, "ingested_at": now, "source_hash": src_hash[doc_id]})
        updates[doc_id] = {"doc_id": doc_id, "version": version, "fingerprint": fp, "source_hash": src_hash[doc_id],
                           "withdrawn": not chunks, "n_chunks": len(chunks),
                           "n_restricted": sum(is_restricted(c.sensitivity) for c in chunks), "ingested_at": now,
                           "withheld": False}
    for doc_id in gone:
        old = state[doc_id]
        versions.append({"doc_id": doc_id, "version": old["version"] + 1, "content_hash": None, "n_chunks": 0,
                         "withdrawn": True, "ingested_at": now, "source_hash": None})
        updates[doc_id] = {**old, "version": old["version"] + 1, "withdrawn": True, "n_chunks": 0, "n_restricted": 0,
                           "withheld": False,
                           "ingested_at": now, "fingerprint": None, "source_hash": None}

    # Library-wide counts, carried forward by the difference each changed document makes.
    # Withhold documents that stopped parsing (their stored version stays indexed, unserved),
    # and serve again those that parse again with unchanged content.
    for doc_id in sorted(failed_ids):
        old = state.get(doc_id)
        if old is not None and not old["withdrawn"] and bool(old.get("withheld")) != withhold:
            updates[doc_id] = {**old, "withheld": withhold}
    for doc_id in sorted(present):
        old = state.get(doc_id)
        if doc_id not in updates and old is not None and old.get("withheld"):
            updates[doc_id] = {**old, "withheld": False}
    totals = {k: int(pmeta.get(k, 0)) for k in ("active_chunks", "restricted_chunks", "active_docs")}
    if legacy is not None or prev is None or not is_delta:
        full_state = {**state, **updates}
        totals = {"active_chunks": sum(s["n_chunks"] for s in full_state.values() if not s["withdrawn"]),
                  "restricted_chunks": 0, "active_docs": sum(1 for s in full_state.values() if not s["withdrawn"])}
        need = [d for d, s in full_state.items() if not s["withdrawn"] and s.get("n_restricted") is None]
        if need:  # a migrated legacy state does not know its restricted counts yet
            full_state.update(_restricted_counts(legacy[0] if legacy is not None else None, full_state, need))
            updates.update({d: full_state[d] for d in need})
        totals["restricted_chunks"] = sum(s["n_restricted"] or 0 for s in full_state.values() if not s["withdrawn"])
    else:
        for d, upd in updates.items():
            for s, sign in ((state.get(d), -1), (upd, 1)):
                if s is not None and not s["withdrawn"]:
                    totals["active_chunks"] += sign * s["n_chunks"]
                    totals["restricted_chunks"] += sign * (s["n_restricted"] or 0)
                    totals["active_docs"] += sign
    delta_rows = chunk_rows_table(rows, row_version, "", now, lineage_columns=False)
    dv_delta = pa.Table.from_pylist(versions, schema=DOC_VERSION_SCHEMA)
    report = {"new": len(new), "changed": len(changed), "withdrawn": len(gone), "rows_written": delta_rows.num_rows,
              "errors": int(raw_pub.manifest["metadata"].get("parse_failures", len(failed_ids)))}
    report["unchanged"] = int(raw_pub.manifest["metadata"].get("documents", len(present))) - len(new) - len(changed)
    meta = {"chunker": key, **report, **totals, "documents": raw_pub.manifest["metadata"].get("documents"),
            "raw_version": raw_pub.version, "raw_segments": raw_pub.segments("documents"), "on_parse_error": policy,
            "last_ingested_at": now.isoformat()}
    if prev is not None and legacy is None and not updates and same_chunker and same_policy:
        # Every document kept its version (e.g. files touched, not changed): keep the
        # published tables; the next refresh looks at these few raw rows again.
        pub = prev
    elif prev is None or legacy is not None:
        base_chunks, base_dv = legacy[:2] if legacy is not None else (delta_rows.slice(0, 0), dv_delta.slice(0, 0))
        full_state = {**state, **updates}
        pub = wh.write(CHUNKS, library, {
            "chunks": pa.concat_tables([base_chunks, delta_rows], promote_options="permissive"),
            "doc_versions": pa.concat_tables([base_dv, dv_delta], promote_options="permissive"),
            "doc_state": _state_table(list(full_state.values()))}, meta)
    else:
        pub = wh.write(CHUNKS, library, {
            "chunks": Append(delta_rows) if delta_rows.num_rows else Inherit(),
            "doc_versions": Append(dv_delta) if dv_delta.num_rows else Inherit(),
            "doc_state": Append(_state_table(list(updates.values())),
                                compact=lambda t: last_row_per_key(t, "doc_id"))}, meta, parent=prev)
    checks = _checks(pub, raw_pub, rows, docs, {**state, **updates}, present, full=full_checks, failed=failed_ids)
    md = _metadata(pub, {**report, "active_chunks": totals["active_chunks"]}, key, rows, row_version,
                   new, changed, gone, t0, reused=prev is not None and pub.version == prev.version)
    md["state_only"] = len(state_only)
    md["withheld_docs"] = sorted(d for d, u in updates.items() if u.get("withheld"))[:20]
    md["on_parse_error"] = policy
    md["looked_at"] = len(rows_now)
    md.update(job)
    return StepResult(pub, md, checks)


def _chunk_todo(raw_pub: Published, paths: dict[str, str], chunker: Any, chunker_spec: str | None,
                executor: StepExecutor | None, log: Any, library: str,
                ) -> tuple[dict[str, Any], dict[str, list[Chunk]], dict[str, Any]]:
    """(doc_id -> Document, doc_id -> its chunks, the executor's job metadata or {}) of the
    documents to (re)chunk (doc_id -> source path): here, or by ``executor`` (Ray's)."""
    if executor is not None:
        if not paths:  # nothing to chunk: no cluster to start
            return {}, {}, executor.no_work()
        return executor.chunk(raw_pub, paths, chunker_spec, chunker.key, log=log, desc=f"chunks[{library}]")
    docs = {d.doc_id: d for d in fetch_documents(raw_pub, set(paths.values()))}
    return docs, {d: chunker(docs[d]) for d in paths}, {}


def with_file_locators(chunks: list[Chunk], doc: Any) -> list[Chunk]:
    """``chunks`` with each locator's file-side fields (PDF pages, DOCX blocks, HTML element)
    from the document's parser anchors; unchanged when it has none (md/txt, older rows)."""
    anchors = getattr(doc, "anchors", ()) if doc is not None else ()
    if not anchors:
        return chunks
    out = []
    for c in chunks:
        loc = c.source_locator
        extra = {k: v for k, v in locate(anchors, loc.start, loc.end, loc.source_path).items() if k != "space"}
        out.append(replace(c, source_locator=replace(loc, extra=json.dumps(extra, separators=(",", ":"))))
                   if extra else c)
    return out


def _restricted_counts(t: pa.Table | None, state: dict[str, dict[str, Any]], doc_ids: list[str]
                       ) -> dict[str, dict[str, Any]]:
    """Restricted chunk counts of ``doc_ids``' current versions, from a legacy chunks table."""
    counts: Counter = Counter()
    if t is not None:
        want = {d: state[d]["version"] for d in doc_ids}
        for d, v, sens in zip(t.column("doc_id").to_pylist(), t.column("version").to_pylist(),
                              t.column("sensitivity").to_pylist(), strict=True):
            if want.get(d) == v and is_restricted(sens):
                counts[d] += 1
    return {d: {**state[d], "n_restricted": counts[d]} for d in doc_ids}


def shown_chunk_id(c: Chunk) -> str:
    """The chunk id as Dagster metadata may show it: a RESTRICTED chunk's id embeds a hash
    of its text (``<doc_id>#<sha1 prefix>``), which would confirm a guessed text, so only
    its document part is shown."""
    return f"{c.doc_id}#{REDACTED}" if is_restricted(c.sensitivity) else c.chunk_id


def _metadata(pub: Published, report: dict[str, Any], key: str, rows: list[Chunk],
              row_version: list[int], new: list[str], changed: list[str], gone: list[str], t0: float, *,
              reused: bool) -> dict[str, Any]:
    preview = "\n".join(f"| {shown_chunk_id(c)} | v{v} | {c.sensitivity} | {redact(' '.join(c.text[:400].split())[:60], c.sensitivity)} |"
                        for c, v in list(zip(rows, row_version, strict=True))[:5])
    return {**report, "chunker": key, "rows_total": pub.rows("chunks"), "version": pub.version, "reused": reused,
            "segments": len(pub.segments("chunks")),
            "bytes_written": 0 if reused else pub.manifest.get("bytes_written", 0),
            "new_docs": new[:20], "changed_docs": changed[:20], "withdrawn_docs": gone[:20],
            "preview_md": "| chunk_id | version | sensitivity | text |\n|---|---|---|---|\n" + preview,
            "seconds": round(time.perf_counter() - t0, 3)}


def _checks(pub: Published, raw_pub: Published, new_rows: list[Chunk], docs: dict[str, Any],
            touched: dict[str, dict[str, Any]], present: dict[str, dict], *, full: bool,
            failed: set[str] = frozenset()) -> dict[str, CheckOutcome]:
    """The chunks asset's checks.

    By default they verify the rows this version wrote and the documents whose state it
    changed: chunk rows are immutable and a document keeps its rows only while its
    source hash (text + sidecar labels + chunker) is unchanged, so every other row was
    verified against the same source when it was written. ``full`` re-verifies every
    active chunk against the current raw documents (an audit; reads all text).
    """
    if full:
        active = active_chunk_table(pub)
        cur = raw_state(raw_pub, columns=["doc_id", "source_path", "parse_error", "sensitivity"])
        ok = {d: p for d, p, e in zip(cur.column("doc_id").to_pylist(), cur.column("source_path").to_pylist(),
                                      cur.column("parse_error").to_pylist(), strict=True) if not e}
        failed = set(cur.column("doc_id").to_pylist()) - set(ok)
        docs = {d.doc_id: d for d in fetch_documents(raw_pub, set(ok.values()))}
        rows = as_chunks(active)
        scope = {"scope": "every active chunk", "checked": len(rows)}
        orphans = sorted({c.doc_id for c in rows if c.doc_id not in ok and c.doc_id not in failed})
    else:
        rows = new_rows
        scope = {"scope": "rows written by this version", "checked": len(rows)}
        # A document whose file fails to parse keeps its last good version on purpose
        # (withheld, or served by the opt-out): not an orphan.
        orphans = sorted(d for d, s in touched.items()
                         if not s["withdrawn"] and s["n_chunks"] and d not in present and d not in failed)
    bad_span = [shown_chunk_id(c) for c in rows if c.doc_id in docs and docs[c.doc_id].text[c.start:c.end] != c.text]
    ids = [c.chunk_id for c in rows]
    dupes = sorted(i for i, n in Counter(ids).items() if n > 1)
    foreign = [c.chunk_id for c in rows if not c.chunk_id.startswith(f"{c.doc_id}#")]
    leaked = [f"{c.doc_id}#{REDACTED}" for c in rows if c.doc_id in docs
              and is_restricted(docs[c.doc_id].metadata.get("sensitivity")) and not is_restricted(c.sensitivity)]
    return {
        "chunk_text_is_source_substring": CheckOutcome(not bad_span, {**scope, "violations": len(bad_span),
                                                                      "examples": bad_span[:5]}),
        "no_orphan_chunks": CheckOutcome(not orphans, {**scope, "orphans": len(orphans), "examples": orphans[:5]}),
        # Chunk ids are namespaced by their document ("<doc_id>#..."), so ids can only
        # collide within one document version: checked on the rows of each new version.
        "no_duplicate_active_chunk_ids": CheckOutcome(not dupes and not foreign,
                                                      {**scope, "duplicates": len(dupes), "foreign_ids": len(foreign)}),
        "restricted_stays_restricted": CheckOutcome(not leaked, {**scope, "downgraded": len(leaked),
                                                                 "examples": leaked[:5]}),
    }
