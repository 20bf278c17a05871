"""The per-library pipeline steps the Dagster assets call (no Dagster here).

raw_documents -> chunks -> lexical_index, embeddings -> retrieval_snapshot -> catalog,
each step a function from published tables to a new immutable version, and each
incremental: it reads the small state tables of the previous version, does work only
for what changed, and appends only the new rows as a segment (``versioned.Append``).

* ``build_raw_documents`` (raw.py) stats the library folder and parses changed files;
  unreadable files become rows with a ``parse_error`` (reported, never dropped, never
  fatal for the library).
* ``build_chunks`` (chunk_tables.py) re-chunks only documents whose source hash or
  chunker changed, withdraws removed documents (a document that failed to parse keeps
  its last good version), and appends the new document versions.
* ``build_lexical_index`` analyzes only open chunks it has no tokens for, and publishes
  with them the BM25 index of the served chunks and their records (``lexical_files``,
  ``served_records``): serving maps both and rebuilds nothing (a version from before the
  files is served from its tokens, as it was).
* ``build_embeddings`` embeds only open chunks it has no vector for under the same model.
* ``publish_snapshot`` (snapshots.py) names one consistent set of versions per library;
  readers resolve everything through it, so a refresh is seen whole or not at all.
* ``build_catalog`` (catalog.py) exposes the published tables to notebooks, saying
  nothing about restricted or withheld documents.

The names of snapshots.py and catalog.py are re-exported here: callers import one module.
"""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ..retrieval.chunking.chunk_columns import ChunkColumns
from ..retrieval.chunking.contextual import IndexTextFn, make_index_text_fn, plain_index_text
from ..retrieval.hybrid.fusion import FusionConfig
from ..retrieval.lexical.analysis.analyzer import make_analyzer
from ..retrieval.lexical.analysis.glossary import GlossaryQueryRewriter
from ..retrieval.lexical.index.mapped import MappedBM25Index
from ..retrieval.link.multi_index import MultiIndexRetriever
from ..retrieval.link.narrative_link import NarrativeIndex
from ..retrieval.vector import embedding_backends
from ..retrieval.vector.embedding_backends import backend_model_id
from ..sensitivity import is_restricted
from .catalog import CATALOG_LOCK, build_catalog, quote_ident, redacted_doc_ids, view_name
from .chunk_tables import (
    active_chunk_table,
    active_chunks,
    active_mask,
    build_chunks,
    doc_state,
    published_chunks,
    restricted_probes,
    served_chunks,
    sorted_active_chunks,
    unserved_docs,
    withheld_docs,
)
from .common import (
    CHUNKS,
    EMBEDDINGS,
    LEXICAL,
    RAW,
    SNAPSHOT,
    CheckOutcome,
    StepResult,
    last_row_per_key,
    restricted_mask,
)
from .embeddings_step import (
    embed_for_step,
    resolve_library_backend,
    serve_vectors,
    vector_file,
    write_vector_file,
)
from .lexical_files import bm25_file, open_bm25_file
from .raw import build_raw_documents, raw_state, table_documents
from .served_records import open_served_records, records_current
from .served_refresh import aligned_rows as _aligned
from .served_refresh import chunks_added_since, write_served_files
from .snapshots import (
    _served_now,
    chunker_name,
    publish_snapshot,
    published_chunkings,
    published_libraries,
    select_snapshot,
    snapshot_chunker,
    snapshot_protected,
    snapshot_summary,
)
from .step_executor import StepExecutor
from .versioned import (
    Append,
    Published,
    VersionedTables,
    WarehouseError,
    library_step,
    read_segments,
)

__all__ = ["CHUNKS", "EMBEDDINGS", "LEXICAL", "RAW", "SNAPSHOT", "CheckOutcome", "StepResult", "active_chunks",
           "build_chunks", "build_embeddings", "build_lexical_index", "build_raw_documents", "build_catalog",
           "CATALOG_LOCK", "quote_ident", "redacted_doc_ids", "view_name", "chunker_name", "snapshot_chunker",
           "load_snapshot_index", "publish_snapshot", "published_chunkings", "published_libraries", "raw_state",
           "select_snapshot", "snapshot_protected",
           "serving_retriever", "snapshot_summary", "sorted_active_chunks", "table_documents"]


def _missing_chunks(pub_chunks: Published, prev: Published | None, table: str, same_config: bool, *,
                    skip_restricted: bool = False,
                    index_text: IndexTextFn = plain_index_text) -> tuple[dict[str, tuple[str, str]], bool, bool]:
    """(chunk_id -> (index text, language) of the active chunks without a row in ``prev``'s
    ``table``, whether to append to ``prev``, whether to purge ``prev``'s rows now).

    The index text is what BM25 analyzes and the model embeds: the chunk text, or with
    contextual retrieval on (``index_text`` from ``make_index_text_fn``) the metadata
    header + the text; snippets keep the stored text either way.

    Chunk ids are content-addressed (doc, offsets, text), so a row stored under a chunk id
    with the same configuration never needs recomputing. When the chunks version only
    appended segments to the one ``prev`` was built from, only those segments' rows can be
    new: they are the only rows read (the refresh costs what changed, not the library).
    ``skip_restricted`` leaves RESTRICTED chunks out (their text must never reach a model,
    and the served index never holds them, so no published index table needs their tokens
    or vectors), and the chunks of withheld documents too (#42: a relabel whose sidecar
    stops parsing must not leave the text it meant to restrict in a published table; they
    are analyzed again when the file parses). A chunk stored while open that is RESTRICTED
    or withheld now (a relabel keeps the chunk id) asks for a purge: the appended table is
    compacted at once, without it, so no segment keeps it (and nothing else is recomputed).
    """
    fields = list(getattr(index_text, "fields", ()))
    withheld = withheld_docs(pub_chunks) if skip_restricted else set()

    def as_dict(t: pa.Table) -> dict[str, tuple[str, str]]:
        if skip_restricted:
            t = t.filter(pa.array([not is_restricted(x) and d not in withheld for x, d in
                                   zip(t.column("sensitivity").to_pylist(), t.column("doc_id").to_pylist(),
                                       strict=True)], pa.bool_()))
        texts = t.column("text").to_pylist()
        if fields:  # header fields from the chunk's own metadata columns
            meta = {f: t.column(f).to_pylist() for f in fields}
            texts = [index_text(SimpleNamespace(text=x, **{f: meta[f][i] or "" for f in fields}))  # type: ignore[arg-type]
                     for i, x in enumerate(texts)]
        return dict(zip(t.column("chunk_id").to_pylist(),
                        zip(texts, t.column("language").to_pylist(), strict=True), strict=True))

    cols = ["text", "sensitivity", "language", *(f for f in fields if f not in ("text", "sensitivity", "language"))]
    if prev is None or not same_config:
        return as_dict(active_chunk_table(pub_chunks, columns=cols)), False, False
    was_withheld, newly_hidden = _withheld_change(pub_chunks, prev, withheld) if skip_restricted else (set(), set())
    paths = chunks_added_since(prev, pub_chunks)
    if paths is not None:
        parts = [pq.read_table(p, columns=["chunk_id", "doc_id", "version", *cols]) for p in paths]
        if was_withheld:  # served again: its stored chunks get their rows back (none were kept)
            back = active_chunk_table(pub_chunks, columns=cols)
            parts.append(back.filter(pc.is_in(back.column("doc_id"), value_set=pa.array(sorted(was_withheld),
                                                                                       pa.string())))
                         .select(parts[0].column_names if parts else back.column_names))
        if not parts:
            return {}, True, _stored_hidden(pub_chunks, newly_hidden, prev, table)
        cand = pa.concat_tables(parts, promote_options="permissive")
        state = doc_state(pub_chunks, set(cand.column("doc_id").to_pylist()), columns=["version", "withdrawn"])
        cand = cand.filter(active_mask(cand, state))
    else:
        cand = active_chunk_table(pub_chunks, columns=cols)
    purge = skip_restricted and (_stored_now_restricted(cand, prev, table)
                                 or _stored_hidden(pub_chunks, newly_hidden, prev, table))
    if fields:
        # The header comes from metadata a chunk id does not hash (a new title keeps the
        # ids): a row counts as present only with the same index-text hash.
        rows = read_segments(prev, table, columns=["chunk_id", "text_hash"])
        stored = set(zip(rows.column("chunk_id").to_pylist(), rows.column("text_hash").to_pylist(), strict=True))
        return {cid: v for cid, v in as_dict(cand).items() if (cid, _text_hash(v[0])) not in stored}, True, purge
    have = read_segments(prev, table, columns=["chunk_id"]).column("chunk_id").combine_chunks()
    cand = cand.filter(pc.invert(pc.is_in(cand.column("chunk_id"), value_set=have)))
    return as_dict(cand), True, purge


def _stored_now_restricted(cand: pa.Table, prev: Published, table: str) -> bool:
    """Whether a RESTRICTED chunk among ``cand`` already has a row in ``prev``'s ``table``."""
    ids = pc.filter(cand.column("chunk_id"), restricted_mask(cand.column("sensitivity")))
    if not len(ids):
        return False
    have = read_segments(prev, table, columns=["chunk_id"]).column("chunk_id").combine_chunks()
    return bool(pc.any(pc.is_in(ids, value_set=have)).as_py())


def _withheld_change(pub_chunks: Published, prev: Published, withheld: set[str]) -> tuple[set[str], set[str]]:
    """(documents withheld when ``prev`` was built and served now, documents hidden now —
    RESTRICTED or withheld — but not then). An index table holds no row of a withheld
    document (its last good text may be what a relabel with a typo meant to restrict): the
    first come back, and a row of the second in ``prev`` asks for a purge. Fail closed:
    with the previous chunks version unknown, every hidden document counts as new."""
    root = VersionedTables(pub_chunks.path.parent.parent.parent)  # <root>/chunks/<library>/<version>
    hidden = unserved_docs(root, pub_chunks.library, pub_chunks.version)
    version = prev.manifest["metadata"].get("chunks_version")
    try:
        before = root.get(pub_chunks.asset, pub_chunks.library, str(version)) if version else None
    except WarehouseError:
        before = None
    if before is None:
        return set(), hidden
    return withheld_docs(before) - withheld, hidden - unserved_docs(root, pub_chunks.library, before.version)


def _stored_hidden(pub_chunks: Published, docs: set[str], prev: Published, table: str) -> bool:
    """Whether any chunk ever stored for a document in ``docs`` (newly hidden; any version,
    so also an old text a deleted and re-added document no longer has) has a row in
    ``prev``'s ``table``."""
    if not docs:
        return False
    hist = read_segments(pub_chunks, "chunks", columns=["chunk_id", "doc_id"])
    ids = pc.filter(hist.column("chunk_id"), pc.is_in(hist.column("doc_id"), value_set=pa.array(sorted(docs),
                                                                                               pa.string())))
    if not len(ids):
        return False
    have = read_segments(prev, table, columns=["chunk_id"]).column("chunk_id").combine_chunks()
    return bool(pc.any(pc.is_in(ids.combine_chunks(), value_set=have)).as_py())


def _index_spec(table: pa.Table, append: bool, purge: bool, pub_chunks: Published) -> pa.Table | Append:
    """How an index step writes its new rows: whole, or appended to the parent's segments
    (compacted now when ``purge``: a stored chunk turned RESTRICTED must leave)."""
    return Append(table, compact=_compact_to_active(pub_chunks), now=purge) if append else table


def _compact_to_active(pub_chunks: Published):
    """A compaction filter: drop rows of chunks no longer active, RESTRICTED or withheld (and any repeats)."""
    def compact(t: pa.Table) -> pa.Table:
        act = active_chunk_table(pub_chunks, columns=["chunk_id", "sensitivity"])
        keep = pc.invert(restricted_mask(act.column("sensitivity")))
        withheld = withheld_docs(pub_chunks)
        if withheld:
            keep = pc.and_(keep, pc.invert(pc.is_in(act.column("doc_id"), value_set=pa.array(sorted(withheld),
                                                                                            pa.string()))))
        ids = pc.filter(act.column("chunk_id"), keep)
        t = t.filter(pc.is_in(t.column("chunk_id"), value_set=ids.combine_chunks()))
        return last_row_per_key(t, "chunk_id")
    return compact


def _contextual(contextual: str | None) -> tuple[IndexTextFn, str]:
    """(index text function, its lineage name: "" when off) of ``contextual`` or
    ``RAGSPINE_CONTEXTUAL``. Off, the manifests carry no ``contextual`` key at all."""
    fn = make_index_text_fn(contextual)
    return fn, ",".join(getattr(fn, "fields", ()))


@library_step
def build_lexical_index(wh: VersionedTables, library: str, analyzer: str | None = None,
                        chunks_version: str | None = None, *, contextual: str | None = None) -> StepResult:
    """BM25 tokens of the active, non-RESTRICTED chunks' index text (``contextual``: header
    fields, default ``RAGSPINE_CONTEXTUAL``; off: the chunk text, exactly as before).

    RESTRICTED chunks get no tokens: the served index never holds them, and the lexical
    index is a published table, readable beside the catalog (docs/security.md).

    The version also carries the BM25 file and the served chunk records (#27), written
    before it is published; a version without them (an older warehouse) is not reused:
    the next run writes them, re-analyzing nothing."""
    t0 = time.perf_counter()
    pub_chunks = published_chunks(wh, library, chunks_version)
    an = make_analyzer(analyzer)
    index_text, ctx = _contextual(contextual)
    prev = wh.latest(LEXICAL, library)
    # ``open_only``: an index from before RESTRICTED chunks were left out is rewritten once.
    same = prev is not None and prev.manifest["metadata"].get("analyzer") == an.name \
        and prev.manifest["metadata"].get("contextual", "") == ctx and prev.manifest["metadata"].get("open_only")
    if same and prev.manifest["metadata"].get("chunks_version") == pub_chunks.version and _has_files(prev):
        return StepResult(prev, {"analyzer": an.name, "chunks_version": pub_chunks.version, "version": prev.version,
                                 "reused": True, "chunks_analyzed": 0, "bytes_written": 0,
                                 **({"contextual": ctx} if ctx else {}),
                                 "seconds": round(time.perf_counter() - t0, 3)})
    texts, append, purge = _missing_chunks(pub_chunks, prev, "tokens", same, skip_restricted=True,
                                           index_text=index_text)
    todo = sorted(texts)
    table = pa.table({"chunk_id": pa.array(todo, pa.string()),
                      "tokens": pa.array([an.analyze(texts[c][0], texts[c][1] or None) for c in todo],
                                         pa.list_(pa.string()))})
    if ctx:  # what the header was, so a metadata change re-indexes the chunk (off: no column)
        table = table.append_column("text_hash", pa.array([_text_hash(texts[c][0]) for c in todo], pa.string()))
    meta = {"analyzer": an.name, "chunks_version": pub_chunks.version, "chunks_segments": pub_chunks.segments("chunks"),
            "open_only": True}
    if ctx:
        meta["contextual"] = ctx
    pub = wh.write(LEXICAL, library, {"tokens": _index_spec(table, append, purge, pub_chunks)}, meta,
                   parent=prev if append else None, publish=False)
    files = write_served_files(wh, library, pub, pub_chunks, prev if same else None, todo)
    wh.publish(pub)  # readers see the version only with its BM25 file and served records
    meta.pop("chunks_segments")
    return StepResult(pub, {**meta, **files, "chunks_indexed": _open_chunks(pub_chunks),
                            "chunks_analyzed": len(todo),
                            "tokens_written": int(pc.sum(pc.list_value_length(table.column("tokens"))).as_py() or 0),
                            "segments": len(pub.segments("tokens")), "version": pub.version, "reused": False,
                            "bytes_written": pub.manifest.get("bytes_written", 0),
                            "seconds": round(time.perf_counter() - t0, 3)})


def _has_files(pub: Published) -> bool:
    """Whether a lexical version carries its BM25 file and served records (older ones do not)."""
    return bm25_file(pub.path) is not None and records_current(pub.path)


def _open_chunks(pub_chunks: Published) -> int:
    """Active chunks less RESTRICTED ones: the rows an index table holds."""
    meta = pub_chunks.manifest["metadata"]
    return (meta.get("active_chunks") or 0) - (meta.get("restricted_chunks") or 0)


def _text_hash(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()


@library_step
def build_embeddings(wh: VersionedTables, library: str, backend, spec: str,
                     chunks_version: str | None = None, *, contextual: str | None = None, log=None,
                     executor: StepExecutor | None = None) -> StepResult | None:
    """Vectors of the active chunks; only chunks without a vector from the same model are embedded.

    Returns None (nothing written) when no backend is configured: the default product is
    pure BM25. A different model id re-embeds everything into a new version; the previous
    version stays readable and keeps serving until a snapshot publishes the new one.
    ``contextual`` (default ``RAGSPINE_CONTEXTUAL``) embeds the header + text, the same
    index text the lexical step analyzes; a change of it re-embeds everything too.
    ``executor`` (default None: here, in this process): e.g. ``scale.build.step_executor()``
    embeds the new chunks on a Ray actor pool, the same groups of texts, so the same vectors;
    the rest is this function's either way. The warehouse never reads ``RAGSPINE_EXECUTOR``:
    the doors (the Dagster resource, the in-process indexing door) resolve it and pass it in.
    """
    if backend is None:
        return None
    t0 = time.perf_counter()
    pub_chunks = published_chunks(wh, library, chunks_version)
    backend, spec, auto_meta = resolve_library_backend(backend, spec, pub_chunks)  # auto: per library

    model_id = backend_model_id(backend)  # model_id is optional on a backend
    index_text, ctx = _contextual(contextual)
    prev = wh.latest(EMBEDDINGS, library)
    same = prev is not None and prev.manifest["metadata"].get("model_id") == model_id \
        and prev.manifest["metadata"].get("contextual", "") == ctx
    if same and prev.manifest["metadata"].get("chunks_version") == pub_chunks.version \
            and prev.manifest["metadata"].get("fusion") == auto_meta.get("fusion") and vector_file(prev.path):
        # Same chunks, same model, same fusion: keep the published vectors without loading anything.
        # (A new fusion alone writes a version that appends nothing: the snapshot must serve it.)
        return StepResult(prev, {"model_id": model_id, "version": prev.version, "reused": True, "embedded": 0,
                                 "count": prev.manifest["metadata"].get("count", prev.rows("vectors")),
                                 "bytes_written": 0, "seconds": round(time.perf_counter() - t0, 3)},
                          {"restricted_never_embedded": restricted_embedded_check(prev, pub_chunks)})
    texts, append, purge = _missing_chunks(pub_chunks, prev, "vectors", same, skip_restricted=True,
                                           index_text=index_text)
    todo = sorted(texts)
    t1 = time.perf_counter()
    fresh, job = embed_for_step(backend, spec, [texts[c][0] for c in todo], library, log, executor, ids=todo)
    embed_s = time.perf_counter() - t1
    dim = len(fresh[0]) if len(fresh) else int(prev.manifest["metadata"].get("dim", 0)) if append else 0
    table = pa.table({"chunk_id": pa.array(todo, pa.string()),
                      "text_hash": pa.array([_text_hash(texts[c][0]) for c in todo], pa.string()),
                      "vector": _vector_column(fresh, dim)})
    meta = {"model_id": model_id, "spec": spec, "dim": dim, "chunks_version": pub_chunks.version,
            "count": _open_chunks(pub_chunks),  # restricted chunks get no vector
            "chunks_segments": pub_chunks.segments("chunks"), **auto_meta}
    if ctx:
        meta["contextual"] = ctx
    pub = wh.write(EMBEDDINGS, library, {"vectors": _index_spec(table, append, purge, pub_chunks)}, meta,
                   parent=prev if append else None, publish=False)
    files = write_vector_file(wh, library, pub, pub_chunks.version, meta)
    wh.publish(pub)  # readers see the version only with its vector file
    meta.pop("chunks_segments")
    return StepResult(pub, {**meta, **files, "version": pub.version, "reused": False, "embedded": len(todo),
                            "sentences_per_s": round(len(todo) / embed_s, 1) if todo and embed_s else None,
                            "segments": len(pub.segments("vectors")),
                            "bytes_written": pub.manifest.get("bytes_written", 0),
                            "seconds": round(time.perf_counter() - t0, 3), **job},
                      {"restricted_never_embedded": restricted_embedded_check(pub, pub_chunks)})


def restricted_embedded_check(emb: Published, pub_chunks: Published) -> CheckOutcome:
    """No vector of the embeddings version belongs to an active RESTRICTED chunk: their text
    was never sent to the model (a remote backend included)."""
    t = active_chunk_table(pub_chunks, columns=["sensitivity"])
    restricted = [cid for cid, sens in zip(t.column("chunk_id").to_pylist(), t.column("sensitivity").to_pylist(),
                                           strict=True) if is_restricted(sens)]
    have = read_segments(emb, "vectors", columns=["chunk_id"]).column("chunk_id").combine_chunks()
    hits = pc.is_in(pa.array(restricted, pa.string()), value_set=have).to_pylist() if restricted else []
    leaked = [cid for cid, hit in zip(restricted, hits, strict=True) if hit]
    return CheckOutcome(not leaked, {"restricted_chunks": len(restricted), "embedded_restricted": len(leaked),
                                     "examples": leaked[:5]})


def _vector_column(vectors, dim: int) -> pa.Array:
    arr = np.asarray(vectors, dtype=np.float32).reshape(-1, dim) if len(vectors) else np.zeros((0, dim), np.float32)
    offsets = pa.array(np.arange(0, arr.size + 1, max(dim, 1), dtype=np.int32)[: len(arr) + 1], pa.int32())
    return pa.ListArray.from_arrays(offsets, pa.array(arr.ravel(), pa.float32()))


def load_snapshot_index(wh: VersionedTables, library: str, *, glossary: str | os.PathLike[str] | None = None,
                        embedding_backend=None, channels: tuple[str, ...] | None = None,
                        chunker: str | None = None) -> NarrativeIndex:
    """NarrativeIndex over exactly the versions the library's published snapshot names.

    Dense retrieval: when the snapshot has embeddings, its own model embeds the queries
    (the snapshot names it; a differently-configured backend cannot mix vector spaces);
    without embeddings, a given ``embedding_backend`` embeds the chunks lazily (the same
    contextual index text the snapshot's lexical index used). A lexical ``channels``
    choice (no "dense") loads no vectors and builds no backend at all.

    ``chunker`` serves the newest snapshot of that chunking instead of the published one
    (``select_snapshot``). An older snapshot serves its chunks as they were, less every
    document the current snapshot hides or withdrew: a relabel to RESTRICTED (or a
    withdrawal) reaches the previous chunkings too.
    """
    snap = select_snapshot(wh, library, chunker)
    meta = snap.manifest["metadata"]
    current = wh.latest(SNAPSHOT, library)
    older = current is not None and current.version != snap.version
    mapped = None if older else _published_files(wh, library, meta)
    if mapped is not None:  # the published index and records, mapped: nothing rebuilt
        chunks, bm25 = mapped
        ids: pa.Array | None = None  # read (and checksummed) only where stored vectors are aligned to it below
        index_kwargs: dict[str, Any] = {"bm25_index": bm25}
    else:  # a version from before the files, or an older snapshot served less what is hidden now
        chunks = served_chunks(wh, library, meta["chunks"])  # no RESTRICTED, no withheld: non-interference
        if older:
            chunks = _served_now(wh, library, chunks)
        ids = pa.array([c.chunk_id for c in chunks], pa.string())
        tok = _aligned(wh.read(LEXICAL, library, "tokens", meta["lexical_index"]), ids,
                       f"snapshot {snap.version} of {library}: lexical index does not match its chunks")
        index_kwargs = {"docs_tokens": tok.column("tokens").to_pylist()}
    rewriter = GlossaryQueryRewriter.from_file(glossary) if glossary and Path(glossary).exists() else None
    dense = channels is None or "dense" in channels
    emb_version = meta.get("embeddings") if meta.get("embeddings") not in (None, "None") else None
    backend = None
    if dense and emb_version:
        # looked up at call time: a test replaces the factory to prove a lexical mode never calls it
        backend = embedding_backends.make_embedding_backend(meta["embedding_spec"])
        if backend is None or backend_model_id(backend) != meta["embedding_model"]:
            raise WarehouseError(f"snapshot {snap.version} of {library} was embedded with {meta['embedding_model']}, "
                                 f"which {meta['embedding_spec']!r} no longer builds here")
    elif dense:
        backend = embedding_backend
    use_channels = channels or (("bm25", "dense") if backend is not None else ("bm25",))
    if backend is None:
        use_channels = tuple(c for c in use_channels if c != "dense") or ("bm25",)
    fusion = None
    if backend is not None and isinstance(meta.get("fusion"), dict):
        fusion = FusionConfig(**meta["fusion"])  # the snapshot's recorded fusion
    index = NarrativeIndex.from_chunks(chunks, analyzer=meta["analyzer"], rewriter=rewriter,
                                       embedding_backend=backend, channels=use_channels, fusion=fusion,
                                       **index_kwargs,
                                       index_text=make_index_text_fn(meta.get("contextual") or "off"),
                                       library_id=library, version=meta["snapshot_id"])
    index.info["chunker"] = snapshot_chunker(wh, snap)
    if backend is not None and emb_version:  # the mapped vector file, else the table (the index holds no RESTRICTED row)
        serve_vectors(wh.get(EMBEDDINGS, library, emb_version), index.retriever, chunks, ids,
                      f"snapshot {snap.version} of {library}: embeddings do not match its chunks")
    return index


def _published_files(wh: VersionedTables, library: str,
                     meta: dict[str, Any]) -> tuple[ChunkColumns, MappedBM25Index] | None:
    """(served records, mapped BM25 index) of the snapshot's lexical version, or None when
    it has no files (written before them) or a label of its records is RESTRICTED under
    the label rules in force now (fail closed: the rows are then re-selected and the
    index rebuilt from tokens, as before). A damaged file raises, naming it."""
    lex = wh.get(LEXICAL, library, meta["lexical_index"])
    if lex.manifest["metadata"].get("chunks_version") != meta["chunks"]:
        return None
    chunks = open_served_records(lex.path)
    if chunks is None or chunks.matching("sensitivity", is_restricted).any():
        return None
    bm25 = open_bm25_file(lex.path)  # its ids are compared with the records' by HybridRetriever
    return None if bm25 is None else (chunks, bm25)


def serving_retriever(retrievers: dict[str, Any]):
    """One library's retriever as it is; several fused by a MultiIndexRetriever."""
    if not retrievers:
        raise WarehouseError("no published snapshots to serve")
    return next(iter(retrievers.values())) if len(retrievers) == 1 else MultiIndexRetriever(retrievers)


def restricted_leak_check(wh: VersionedTables, library: str, retriever) -> CheckOutcome:
    """Ask the served retriever for each RESTRICTED chunk by its own words: none may come back."""
    snap = wh.latest(SNAPSHOT, library)
    if snap is None:
        raise WarehouseError(f"no retrieval snapshot published for {library}")
    probes = restricted_probes(wh, library, snap.manifest["metadata"]["chunks"])
    leaks = sorted({s["chunk_id"] for cid, text in probes for s in retriever.retrieve(text[:200], top_k=20)
                    if is_restricted(s["sensitivity"]) or s["chunk_id"] == cid})
    return CheckOutcome(not leaks, {"leaks": len(leaks), "restricted_probed": len(probes), "examples": leaks[:5]})
