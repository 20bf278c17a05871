"""The per-library pipeline steps the Dagster assets call (no Dagster here).

raw_documents -> chunks -> lexical_index -> retrieval_snapshot -> catalog, each step a
function from published tables to a new immutable version:

* ``build_raw_documents`` parses a library folder; unreadable files become rows with a
  ``parse_error`` (reported, never dropped, never fatal for the library).
* ``build_chunks`` loads the previous published chunk tables into an in-memory
  ChunkStore, re-chunks only documents whose source hash or chunker changed, withdraws
  removed documents (a document that failed to parse keeps its last good version), and
  writes every row with its version history.
* ``build_lexical_index`` stores the analyzed tokens of the active chunks, so the read
  path builds its BM25 postings without re-tokenizing.
* ``publish_snapshot`` names one consistent set of versions per library; readers resolve
  everything through it, so a refresh is seen whole or not at all.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa

from ..corpus import Document, DocumentError, ingest_documents, load_library, make_chunker
from ..retrieval.chunking.chunk_store import ChunkStore
from ..retrieval.chunking.chunking import Chunk
from ..retrieval.lexical.analyzer import make_analyzer
from ..retrieval.lexical.glossary import GlossaryQueryRewriter
from ..retrieval.link.narrative_link import NarrativeIndex
from ..sensitivity import is_restricted
from .versioned import Published, VersionedTables, WarehouseError, write_json_atomic

RAW, CHUNKS, LEXICAL, SNAPSHOT = "raw_documents", "chunks", "lexical_index", "retrieval_snapshot"
EMBEDDINGS = "embeddings"


def parse_library(folder: str | os.PathLike[str], library: str | None = None
                  ) -> tuple[list[Document], list[DocumentError]]:
    """Every supported file of the folder as a Document, plus the files that failed."""
    if not Path(folder).is_dir():
        raise WarehouseError(f"library folder not found: {folder}")
    return load_library(folder, library)


def documents_table(docs: list[Document], errors: list[DocumentError], library: str) -> pa.Table:
    rows = {"doc_id": [], "title": [], "text": [], "metadata": [], "sensitivity": [], "source_path": [],
            "content_hash": [], "parse_error": []}
    for d in docs:
        rows["doc_id"].append(d.doc_id)
        rows["title"].append(d.title)
        rows["text"].append(d.text)
        rows["metadata"].append(json.dumps(d.metadata, ensure_ascii=False, sort_keys=True))
        rows["sensitivity"].append(str(d.metadata.get("sensitivity") or "INTERNAL"))
        rows["source_path"].append(d.source_path)
        rows["content_hash"].append(d.content_hash)
        rows["parse_error"].append(None)
    for e in errors:
        rows["doc_id"].append(f"{library}/{Path(e.path).stem}")
        rows["title"].append("")
        rows["text"].append(None)
        rows["metadata"].append("{}")
        rows["sensitivity"].append(None)
        rows["source_path"].append(e.path)
        rows["content_hash"].append(None)
        rows["parse_error"].append(e.error)
    return pa.table({k: pa.array(v, pa.string()) for k, v in rows.items()})


def table_documents(t: pa.Table) -> tuple[list[Document], list[DocumentError]]:
    docs, errors = [], []
    for r in t.to_pylist():
        if r["parse_error"]:
            errors.append(DocumentError(r["source_path"], r["parse_error"]))
        else:
            docs.append(Document(r["doc_id"], r["title"], r["text"], json.loads(r["metadata"]), r["source_path"]))
    return docs, errors


@dataclass
class StepResult:
    published: Published
    metadata: dict[str, Any] = field(default_factory=dict)
    active: list[Chunk] | None = None  # build_chunks: the published active chunks (for checks)


def build_raw_documents(wh: VersionedTables, corpus_root: Path, library: str) -> StepResult:
    t0 = time.perf_counter()
    docs, errors = parse_library(corpus_root / library, library)
    table = documents_table(docs, errors, library)
    fingerprint = hashlib.sha256(json.dumps(
        [table.column("doc_id").to_pylist(), table.column("content_hash").to_pylist(),
         table.column("parse_error").to_pylist()]).encode()).hexdigest()
    prev = wh.latest(RAW, library)
    if prev is not None and prev.manifest["metadata"].get("fingerprint") == fingerprint:
        pub = prev  # nothing changed on disk: keep the published version
    else:
        pub = wh.write(RAW, library, {"documents": table},
                       {"documents": len(docs), "parse_failures": len(errors), "fingerprint": fingerprint})
    md = {"documents": len(docs), "parse_failures": len(errors),
          "failed_files": [f"{Path(e.path).name}: {e.error}" for e in errors],
          "restricted_documents": sum(is_restricted(d.metadata.get("sensitivity")) for d in docs),
          "previous_version": prev.version if prev else None, "version": pub.version,
          "reused": prev is not None and pub.version == prev.version,
          "seconds": round(time.perf_counter() - t0, 3)}
    return StepResult(pub, md)


def _store_from(wh: VersionedTables, library: str) -> ChunkStore:
    store = ChunkStore(":memory:")
    prev = wh.latest(CHUNKS, library)
    if prev is not None:
        store.import_arrow(wh.read(CHUNKS, library, "chunks"), wh.read(CHUNKS, library, "doc_versions"))
    return store


def build_chunks(wh: VersionedTables, library: str, chunker_spec: str | None = None,
                 raw_version: str | None = None) -> StepResult:
    t0 = time.perf_counter()
    chunker = make_chunker(chunker_spec)
    docs, errors = table_documents(wh.read(RAW, library, "documents", raw_version))
    prev = wh.latest(CHUNKS, library)
    with _store_from(wh, library) as store:
        report = ingest_documents(store, docs, scope_prefix=f"{library}/", chunker=chunker, errors=errors)
        active = [c for c in store.iter_chunks()]
        unchanged = not (report.new or report.changed or report.withdrawn)
        if prev is not None and unchanged and prev.manifest["metadata"].get("chunker") == chunker.key:
            pub = prev  # every document kept its version: keep the published table
            tables = {"chunks": wh.read(CHUNKS, library, "chunks")}
        else:
            tables = store.export_arrow()
            pub = wh.write(CHUNKS, library, tables, {"chunker": chunker.key, **report.summary()})
    preview = "\n".join(
        f"| {c.chunk_id} | v{c.version} | {c.sensitivity} | {' '.join(c.text.split())[:60]} |" for c in active[:5])
    md = {**report.summary(), "chunker": chunker.key, "active_chunks": len(active),
          "rows_total": tables["chunks"].num_rows, "version": pub.version,
          "reused": prev is not None and pub.version == prev.version,
          "new_docs": report.new[:20], "changed_docs": report.changed[:20], "withdrawn_docs": report.withdrawn[:20],
          "preview_md": "| chunk_id | version | sensitivity | text |\n|---|---|---|---|\n" + preview,
          "seconds": round(time.perf_counter() - t0, 3)}
    return StepResult(pub, md, active)


def active_chunks(wh: VersionedTables, library: str, version: str | None = None) -> list[Chunk]:
    chunks = wh.read(CHUNKS, library, "chunks", version)
    dv = wh.read(CHUNKS, library, "doc_versions", version)
    with ChunkStore(":memory:") as store:
        store.import_arrow(chunks, dv)
        return list(store.iter_chunks())


def _chunks_version(wh: VersionedTables, library: str, version: str | None) -> Published:
    pub = wh.get(CHUNKS, library, version) if version else wh.latest(CHUNKS, library)
    if pub is None:
        raise WarehouseError(f"no chunks published for {library}")
    return pub


def sorted_active_chunks(wh: VersionedTables, library: str, version: str) -> list[Chunk]:
    """Active chunks of a version in chunk_id order: the row order of every index table."""
    return sorted(active_chunks(wh, library, version), key=lambda c: c.chunk_id)


def build_lexical_index(wh: VersionedTables, library: str, analyzer: str | None = None,
                        chunks_version: str | None = None) -> StepResult:
    t0 = time.perf_counter()
    pub_chunks = _chunks_version(wh, library, chunks_version)
    an = make_analyzer(analyzer)
    prev = wh.latest(LEXICAL, library)
    if prev is not None and prev.manifest["metadata"].get("chunks_version") == pub_chunks.version \
            and prev.manifest["metadata"].get("analyzer") == an.name:
        return StepResult(prev, {"analyzer": an.name, "chunks_version": pub_chunks.version, "version": prev.version,
                                 "reused": True, "seconds": round(time.perf_counter() - t0, 3)})
    chunks = sorted_active_chunks(wh, library, pub_chunks.version)
    # Chunk ids are content-addressed (doc, offsets, text): a chunk id seen by the previous
    # index with the same analyzer has the same tokens, so only new chunks are analyzed.
    cached: dict[str, list[str]] = {}
    if prev is not None and prev.manifest["metadata"].get("analyzer") == an.name:
        old = wh.read(LEXICAL, library, "tokens", prev.version)
        cached = dict(zip(old.column("chunk_id").to_pylist(), old.column("tokens").to_pylist(), strict=True))
    tokens = [cached[c.chunk_id] if c.chunk_id in cached else an(c.text) for c in chunks]
    reanalyzed = sum(c.chunk_id not in cached for c in chunks)
    table = pa.table({"chunk_id": pa.array([c.chunk_id for c in chunks], pa.string()),
                      "tokens": pa.array(tokens, pa.list_(pa.string()))})
    pub = wh.write(LEXICAL, library, {"tokens": table},
                   {"analyzer": an.name, "chunks_version": pub_chunks.version})
    return StepResult(pub, {"analyzer": an.name, "chunks_indexed": len(chunks), "chunks_version": pub_chunks.version,
                            "tokens": int(sum(len(t) for t in tokens)), "version": pub.version,
                            "chunks_analyzed": reanalyzed, "reused": False, "seconds": round(time.perf_counter() - t0, 3)})


def _text_hash(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()


def build_embeddings(wh: VersionedTables, library: str, backend, spec: str,
                     chunks_version: str | None = None) -> StepResult | None:
    """Vectors of the active chunks; only (text, model) pairs not embedded before are computed.

    Returns None (nothing written) when no backend is configured: the default product is
    pure BM25. A different model id re-embeds everything into a new version; the previous
    version stays readable and keeps serving until a snapshot publishes the new one.
    """
    if backend is None:
        return None
    t0 = time.perf_counter()
    pub_chunks = _chunks_version(wh, library, chunks_version)
    model_id = backend.model_id
    prev = wh.latest(EMBEDDINGS, library)
    cached: dict[str, list[float]] = {}
    if prev is not None and prev.manifest["metadata"].get("model_id") == model_id:
        if prev.manifest["metadata"].get("chunks_version") == pub_chunks.version:
            # Same chunks, same model: keep the published vectors without loading anything.
            return StepResult(prev, {"model_id": model_id, "version": prev.version, "reused": True, "embedded": 0,
                                     "count": prev.manifest["tables"]["vectors"]["rows"],
                                     "seconds": round(time.perf_counter() - t0, 3)})
        old = wh.read(EMBEDDINGS, library, "vectors", prev.version)
        cached = dict(zip(old.column("text_hash").to_pylist(), old.column("vector").to_pylist(), strict=True))
    chunks = sorted_active_chunks(wh, library, pub_chunks.version)
    hashes = [_text_hash(c.text) for c in chunks]
    todo = sorted({h: c.text for h, c in zip(hashes, chunks, strict=True) if h not in cached}.items())
    t1 = time.perf_counter()
    fresh = backend.embed_texts([t for _, t in todo]) if todo else []
    embed_s = time.perf_counter() - t1
    cached.update({h: v for (h, _), v in zip(todo, fresh, strict=True)})
    vectors = [cached[h] for h in hashes]
    dim = len(vectors[0]) if vectors else 0
    table = pa.table({"chunk_id": pa.array([c.chunk_id for c in chunks], pa.string()),
                      "text_hash": pa.array(hashes, pa.string()),
                      "vector": pa.array(vectors, pa.list_(pa.float32()))})
    meta = {"model_id": model_id, "spec": spec, "dim": dim, "chunks_version": pub_chunks.version}
    pub = wh.write(EMBEDDINGS, library, {"vectors": table}, meta)
    return StepResult(pub, {**meta, "version": pub.version, "reused": False, "count": len(chunks),
                            "embedded": len(todo), "sentences_per_s": round(len(todo) / embed_s, 1) if todo and embed_s else None,
                            "seconds": round(time.perf_counter() - t0, 3)})


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
               "embedding_model": emb.manifest["metadata"]["model_id"] if use_emb else None}
    snap_id = hashlib.sha1(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:12]
    prev = wh.latest(SNAPSHOT, library)
    if prev is not None and prev.manifest["metadata"].get("snapshot_id") == snap_id:
        return StepResult(prev, {**payload, "snapshot_id": snap_id, "version": prev.version, "reused": True})
    pub = wh.write(SNAPSHOT, library, {"snapshot": pa.table({k: [str(v)] for k, v in payload.items()})},
                   {**payload, "snapshot_id": snap_id})
    return StepResult(pub, {**payload, "snapshot_id": snap_id, "version": pub.version, "reused": False})


def load_snapshot_index(wh: VersionedTables, library: str, *, glossary: str | os.PathLike[str] | None = None,
                        embedding_backend=None, channels: tuple[str, ...] | None = None) -> NarrativeIndex:
    """NarrativeIndex over exactly the versions the library's published snapshot names.

    Dense retrieval: when the snapshot has embeddings, its own model embeds the queries
    (the snapshot names it; a differently-configured backend cannot mix vector spaces);
    without embeddings, a given ``embedding_backend`` embeds the chunks lazily. A lexical
    ``channels`` choice (no "dense") loads no vectors and builds no backend at all.
    """
    snap = wh.latest(SNAPSHOT, library)
    if snap is None:
        raise WarehouseError(f"no retrieval snapshot published for {library}")
    meta = snap.manifest["metadata"]
    chunks = sorted_active_chunks(wh, library, meta["chunks"])
    tok = wh.read(LEXICAL, library, "tokens", meta["lexical_index"])
    ids = tok.column("chunk_id").to_pylist()
    if ids != [c.chunk_id for c in chunks]:
        raise WarehouseError(f"snapshot {snap.version} of {library}: lexical index does not match its chunks")
    rewriter = GlossaryQueryRewriter.from_file(glossary) if glossary and Path(glossary).exists() else None
    dense = channels is None or "dense" in channels
    emb_version = meta.get("embeddings") if meta.get("embeddings") not in (None, "None") else None
    backend = None
    if dense and emb_version:
        from ..retrieval.vector.embedding_backends import make_embedding_backend

        backend = make_embedding_backend(meta["embedding_spec"])
        if backend is None or backend.model_id != meta["embedding_model"]:
            raise WarehouseError(f"snapshot {snap.version} of {library} was embedded with {meta['embedding_model']}, "
                                 f"which {meta['embedding_spec']!r} no longer builds here")
    elif dense:
        backend = embedding_backend
    use_channels = channels or (("bm25", "dense") if backend is not None else ("bm25",))
    if backend is None:
        use_channels = tuple(c for c in use_channels if c != "dense") or ("bm25",)
    index = NarrativeIndex.from_chunks(chunks, analyzer=meta["analyzer"], rewriter=rewriter,
                                       embedding_backend=backend, channels=use_channels,
                                       docs_tokens=tok.column("tokens").to_pylist(),
                                       library_id=library, version=meta["snapshot_id"])
    if backend is not None and emb_version:
        vt = wh.read(EMBEDDINGS, library, "vectors", emb_version)
        if vt.column("chunk_id").to_pylist() != ids:
            raise WarehouseError(f"snapshot {snap.version} of {library}: embeddings do not match its chunks")
        index.retriever.preload_vectors(np.asarray(vt.column("vector").to_pylist(), dtype=np.float32))
    return index


def published_libraries(wh: VersionedTables, wanted: list[str] | None = None) -> list[str]:
    """Libraries (all, or ``wanted``) that have a published retrieval snapshot, sorted."""
    root = wh.root / SNAPSHOT
    found = sorted(p.name for p in root.iterdir() if p.is_dir()) if root.is_dir() else []
    return [lib for lib in (wanted or found) if wh.latest(SNAPSHOT, lib) is not None]


def serving_retriever(retrievers: dict[str, Any]):
    """One library's retriever as it is; several fused by a MultiIndexRetriever."""
    from ..retrieval.link.multi_index import MultiIndexRetriever

    if not retrievers:
        raise WarehouseError("no published snapshots to serve")
    return next(iter(retrievers.values())) if len(retrievers) == 1 else MultiIndexRetriever(retrievers)


def build_catalog(wh: VersionedTables, libraries: list[str], path: Path) -> dict[str, Any]:
    """A DuckDB file with one view per published table, swapped in atomically.

    Views point at the immutable Parquet files of each library's snapshot, so a notebook
    holding the catalog read-only keeps a consistent picture while refreshes publish.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.unlink(missing_ok=True)
    con = duckdb.connect(str(tmp))
    views, rows = [], []
    try:
        for lib in libraries:
            snap = wh.latest(SNAPSHOT, lib)
            if snap is None:
                continue
            meta = snap.manifest["metadata"]
            rows.append((lib, meta["snapshot_id"]))
            safe = "".join(ch if ch.isalnum() else "_" for ch in lib)
            sources = {
                "documents": wh.get(RAW, lib, meta["raw_documents"]).table_path("documents") if meta.get("raw_documents") and meta["raw_documents"] != "None" else None,
                "chunks": wh.get(CHUNKS, lib, meta["chunks"]).table_path("chunks"),
                "doc_versions": wh.get(CHUNKS, lib, meta["chunks"]).table_path("doc_versions"),
                "lexical_tokens": wh.get(LEXICAL, lib, meta["lexical_index"]).table_path("tokens"),
                "embeddings": (wh.get(EMBEDDINGS, lib, meta["embeddings"]).table_path("vectors")
                               if meta.get("embeddings") not in (None, "None") else None),
            }
            for name, src in sources.items():
                if src is None:
                    continue
                view = f"{name}_{safe}"
                # A view body cannot take parameters: the path is quoted as an SQL literal.
                literal = src.resolve().as_posix().replace("'", "''")
                con.execute(f"CREATE VIEW {view} AS SELECT * FROM read_parquet('{literal}')")
                views.append(view)
        con.execute("CREATE TABLE snapshots (library VARCHAR, snapshot_id VARCHAR)")
        if rows:
            con.executemany("INSERT INTO snapshots VALUES (?, ?)", rows)
        con.execute("CHECKPOINT")
    finally:
        con.close()
    os.replace(tmp, path)
    write_json_atomic(path.with_suffix(".json"), {"views": views, "libraries": libraries})
    return {"views": views, "path": str(path)}
