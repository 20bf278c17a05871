"""Retrieval snapshots: publish one consistent set of versions per library, select one,
say what it serves (no Dagster here).

A snapshot names the versions of every table the served index reads (chunks, lexical
index, embeddings, RAPTOR tree, relation graph) under one ``snapshot_id``; readers resolve
everything through it, so a refresh is seen whole or not at all. A library re-chunked by
a backfill keeps the previous chunking's snapshot (``published_chunkings``), served less
every document the current snapshot hides (``_served_now``).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pyarrow as pa

from ..sensitivity import is_restricted
from .catalog import redacted_doc_ids
from .chunk_tables import active_chunk_table, doc_state, published_chunks, served_chunks
from .common import CHUNKS, EMBEDDINGS, LEXICAL, RAPTOR, RAW, SNAPSHOT, StepResult
from .purge import narrow_hidden_versions
from .versioned import Published, VersionedTables, WarehouseError, library_step

__all__ = ["chunker_name", "publish_snapshot", "published_chunkings", "published_libraries", "select_snapshot",
           "snapshot_chunker", "snapshot_protected", "snapshot_summary"]


@library_step
def publish_snapshot(wh: VersionedTables, library: str) -> StepResult:
    """One consistent version id across the library's index tables."""
    lex = wh.latest(LEXICAL, library)
    if lex is None:
        raise WarehouseError(f"no lexical index published for {library}")
    chunks_version = lex.manifest["metadata"]["chunks_version"]
    raw = wh.latest(RAW, library)
    emb = wh.latest(EMBEDDINGS, library)
    use_emb = emb is not None and emb.manifest["metadata"].get("chunks_version") == chunks_version
    payload = {"library": library, "chunks": chunks_version, "lexical_index": lex.version,
               "raw_documents": raw.version if raw else None, "analyzer": lex.manifest["metadata"]["analyzer"],
               "embeddings": emb.version if use_emb else None,
               "embedding_spec": emb.manifest["metadata"]["spec"] if use_emb else None,
               "embedding_model": emb.manifest["metadata"]["model_id"] if use_emb else None,
               "chunker": wh.get(CHUNKS, library, chunks_version).manifest["metadata"].get("chunker")}
    graph = wh.latest("relation_graph", library)  # named only when built from these chunks
    if graph is not None and graph.manifest["metadata"].get("chunks_version") == chunks_version:
        payload["relation_graph"] = graph.version
    # Opt-in layers are named only when on, so a snapshot without them reads (and hashes) as before.
    if lex.manifest["metadata"].get("contextual"):
        payload["contextual"] = lex.manifest["metadata"]["contextual"]
    raptor = wh.latest(RAPTOR, library)
    if raptor is not None and raptor.manifest["metadata"].get("chunks_version") == chunks_version:
        payload["raptor_tree"] = raptor.version
    if use_emb and emb.manifest["metadata"].get("fusion"):  # auto's / RAGSPINE_FUSION's choice
        payload["fusion"] = emb.manifest["metadata"]["fusion"]
    snap_id = hashlib.sha1(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:12]
    prev = wh.latest(SNAPSHOT, library)
    if prev is not None and prev.manifest["metadata"].get("snapshot_id") == snap_id:
        return StepResult(prev, {**payload, "snapshot_id": snap_id, "version": prev.version, "reused": True})
    # A relabel purges: older versions holding a document hidden now become owner-only
    # (before the publish: a crash in between leaves the work to the next run).
    purge = narrow_hidden_versions(wh, library, payload).metadata()
    pub = wh.write(SNAPSHOT, library, {"snapshot": pa.table({k: [str(v)] for k, v in payload.items()})},
                   {**payload, "snapshot_id": snap_id})
    return StepResult(pub, {**payload, "snapshot_id": snap_id, "version": pub.version, "reused": False, **purge})


def chunker_name(key: str | None) -> str:
    """``layout`` of a chunker key ``layout:1200:0`` (what ``--chunker`` matches on)."""
    return (key or "").split(":", 1)[0]


def snapshot_chunker(wh: VersionedTables, snap: Published) -> str:
    """The chunker key that built a snapshot's chunks (older snapshots: from the chunks version)."""
    meta = snap.manifest["metadata"]
    if meta.get("chunker"):
        return str(meta["chunker"])
    try:
        return str(wh.get(CHUNKS, snap.library, meta["chunks"]).manifest["metadata"].get("chunker") or "")
    except WarehouseError:
        return ""


def published_chunkings(wh: VersionedTables, library: str) -> dict[str, Published]:
    """Chunker key -> the newest stored snapshot of ``library`` built with it.

    A library re-chunked by a backfill with another chunker keeps the previous chunking's
    snapshot (and the chunk/index versions it names: the assets never prune them), so it
    stays queryable as it was when it was published.
    """
    out: dict[str, Published] = {}
    for v in reversed(wh.versions(SNAPSHOT, library)):
        try:
            snap = wh.get(SNAPSHOT, library, v)
        except WarehouseError:
            continue
        out.setdefault(snapshot_chunker(wh, snap), snap)
    return out


def select_snapshot(wh: VersionedTables, library: str, chunker: str | None = None) -> Published:
    """The published snapshot (``chunker`` None), else the newest one built by ``chunker``
    (a name such as ``layout``, or a full key ``layout:1200:0``). Raises WarehouseError
    naming the chunkings that are available."""
    snap = wh.latest(SNAPSHOT, library)
    if snap is None:
        raise WarehouseError(f"no retrieval snapshot published for {library}")
    if not chunker:
        return snap
    if snapshot_chunker(wh, snap) == chunker or chunker_name(snapshot_chunker(wh, snap)) == chunker:
        return snap
    found = published_chunkings(wh, library)
    for key, s in found.items():  # newest first
        if key == chunker or chunker_name(key) == chunker:
            return s
    raise WarehouseError(f"library {library!r} has no published chunking {chunker!r}; available: "
                         f"{', '.join(sorted(found)) or 'none'}")


def snapshot_protected(wh: VersionedTables, library: str, asset: str) -> set[str]:
    """Versions of ``asset`` that pruning must keep: those the published snapshot and the
    newest snapshot of every other chunking name (for ``SNAPSHOT``: those snapshots)."""
    snaps = list(published_chunkings(wh, library).values())
    cur = wh.latest(SNAPSHOT, library)
    if cur is not None:
        snaps.append(cur)
    if asset == SNAPSHOT:
        return {s.version for s in snaps}
    keys = {RAW: "raw_documents", CHUNKS: "chunks", LEXICAL: "lexical_index", EMBEDDINGS: "embeddings"}
    key = keys.get(asset, asset)
    return {str(s.manifest["metadata"][key]) for s in snaps if s.manifest["metadata"].get(key) not in (None, "None")}


def _served_now(wh: VersionedTables, library: str, chunks: list) -> list:
    """An older snapshot's chunks less every document the current snapshot would not serve.

    An allow-list (fail closed): a document stays only if the current snapshot serves it
    (its served chunks) and does not hide it (restricted in any version, unparseable,
    withheld, withdrawn) — a document that simply vanished from the current chunks is left
    out too.
    """
    cur = wh.latest(SNAPSHOT, library)
    meta = cur.manifest["metadata"]
    keep = {c.doc_id for c in served_chunks(wh, library, meta["chunks"])}
    hidden = redacted_doc_ids(wh, library, meta)
    pub = wh.get(CHUNKS, library, meta["chunks"])
    hidden.update(d for d, s in doc_state(pub, columns=["withdrawn"]).items() if s["withdrawn"])
    return [c for c in chunks if c.doc_id in keep and c.doc_id not in hidden]


def snapshot_summary(wh: VersionedTables, library: str) -> dict[str, Any]:
    """What the published snapshot serves, from the chunks version's state (no text, no index)."""
    snap = wh.latest(SNAPSHOT, library)
    if snap is None:
        raise WarehouseError(f"no retrieval snapshot published for {library}")
    pub = published_chunks(wh, library, snap.manifest["metadata"]["chunks"])
    meta = pub.manifest["metadata"]
    if "restricted_chunks" not in meta:  # a version written before these counts were kept
        t = active_chunk_table(pub, columns=["sensitivity"])
        return {"doc_ids": set(t.column("doc_id").to_pylist()), "chunks": t.num_rows,
                "restricted_chunks": sum(is_restricted(s) for s in t.column("sensitivity").to_pylist())}
    state = doc_state(pub, columns=["withdrawn"])
    return {"doc_ids": {d for d, s in state.items() if not s["withdrawn"]}, "chunks": int(meta["active_chunks"]),
            "restricted_chunks": int(meta["restricted_chunks"])}


def published_libraries(wh: VersionedTables, wanted: list[str] | None = None) -> list[str]:
    """Libraries (all, or ``wanted``) that have a published retrieval snapshot, sorted."""
    root = wh.root / SNAPSHOT
    found = sorted(p.name for p in root.iterdir() if p.is_dir()) if root.is_dir() else []
    return [lib for lib in (wanted or found) if wh.latest(SNAPSHOT, lib) is not None]
