"""Run the product's retrieval stack over a BEIR dataset and score it.

Documents go through the same path as production: ``chunk_document`` -> ``ChunkStore``
-> ``NarrativeIndex`` -> ``NarrativeIndexRetriever.retrieve``. A document split into
several chunks counts once, at its best-ranked chunk.

Timings keep building apart from asking: the corpus is embedded (``embed_corpus``) before
the query clock starts, so ``per_query_ms`` is what one question costs against a built
index, and ``embed`` (with ``embed_items_per_s``) is the one-off indexing cost. Counting the
corpus embedding as query time once reported 17,325 ms/query.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
from tqdm import tqdm

from ..corpus import Document, ingest_documents
from ..modes import resolve_retrieval
from ..retrieval.chunking.chunk_store import ChunkStore
from ..retrieval.chunking.chunking import DEFAULT_CHUNK_CHARS, DEFAULT_OVERLAP_CHARS
from ..retrieval.chunking.factory import paragraph_chunker
from ..retrieval.link.narrative_link import NarrativeIndex, NarrativeIndexRetriever
from ..retrieval.rerank.cross_encoder import make_reranker
from ..retrieval.vector.batching import tqdm_progress
from .beir import BeirDataset, load_beir
from .metrics import mean_metrics

DOCUMENT_CHUNK_CHARS = 1_000_000  # "document" chunker: one chunk per document


@dataclass
class EvalConfig:
    mode: str = "bm25"
    embedding: str | None = None
    chunker: str = "document"  # same default as `ragspine eval`
    max_chars: int | None = None
    overlap_chars: int | None = None
    analyzer: str | None = None
    reranker: str | None = None
    limit: int | None = None
    depth: int = 100
    progress: bool = True  # shown only when stderr is a terminal (see progress_enabled)


def beir_documents(ds: BeirDataset) -> list[Document]:
    """A BEIR record as a product document: title paragraph, then the body."""
    docs = []
    for d in ds.corpus.values():
        text = f"{d.title}\n\n{d.text}" if d.title else d.text
        docs.append(Document(d.doc_id, d.title, text, {}, ""))
    return docs


def _chunker(cfg: EvalConfig):
    if cfg.chunker == "document":
        return paragraph_chunker(DOCUMENT_CHUNK_CHARS, 0)
    if cfg.chunker != "paragraph":
        raise ValueError(f"unknown chunker {cfg.chunker!r}; available: paragraph, document")
    return paragraph_chunker(cfg.max_chars or DEFAULT_CHUNK_CHARS,
                             DEFAULT_OVERLAP_CHARS if cfg.overlap_chars is None else cfg.overlap_chars)


def progress_enabled(*, json_output: bool = False, stream=None) -> bool:
    """Progress bars go to stderr only for a person watching: never under ``--json``
    and never when stderr is not a terminal (pipes, CI logs, tests)."""
    stream = sys.stderr if stream is None else stream
    if json_output:
        return False
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty and isatty())
    except (OSError, ValueError):  # a closed or odd stream
        return False


def _progress(it, total: int, enabled: bool, desc: str):
    if not (enabled and progress_enabled()):
        return it
    return tqdm(it, total=total, desc=desc, file=sys.stderr, leave=False, mininterval=0.5, unit="query")


def embed_corpus(index: NarrativeIndex) -> tuple[float, int]:
    """Embed every chunk of ``index``'s dense channel now (seconds, chunks embedded); (0, 0)
    without one. The hybrid retriever embeds lazily, on the first query that needs a
    vector; this does the same work up front so the query timings leave it out."""
    hybrid = index.retriever
    if getattr(hybrid, "embedding_backend", None) is None or "dense" not in getattr(hybrid, "channels", ()):
        return 0.0, 0
    t0 = time.perf_counter()
    hybrid.ensure_vectors(np.arange(len(hybrid.chunks)))  # the lazy path's own method: identical vectors
    return time.perf_counter() - t0, len(hybrid.chunks)


def embed_timings(seconds: float, items: int) -> dict[str, float]:
    """``embed`` seconds and ``embed_items_per_s`` of the corpus embedding (0 without one)."""
    return {"embed": round(seconds, 3), "embed_items_per_s": round(items / seconds, 1) if items and seconds else 0.0}


def ranked_doc_ids(retriever: NarrativeIndexRetriever, query: str, chunk_depth: int, depth: int) -> list[str]:
    """Document ids of one query, best chunk first: ranks only, no snippet dicts
    (building ~300 snippet dicts per query cost ~100x the index's own time)."""
    return retriever.ranked_doc_ids(query, chunk_depth=chunk_depth, depth=depth)


def evaluate_modes(folder: str, modes: list[str], embedding: str | None = None,
                   cfg: EvalConfig | None = None) -> list[dict[str, Any]]:
    """Several modes over one build: the corpus is chunked, stored and embedded once.

    ``modes`` are channel presets (bm25, vector, hybrid); results match running
    ``evaluate_dataset`` per mode, without re-embedding the corpus each time.
    """
    base = cfg or EvalConfig()
    backend, _ = resolve_retrieval("hybrid", embedding) if any(m != "bm25" for m in modes) else (None, ())
    ds = load_beir(folder)
    store = ChunkStore(":memory:")
    ingest_documents(store, beir_documents(ds), scope_prefix="", chunker=_chunker(base))
    chunks = list(store.iter_chunks())
    store.close()
    index = NarrativeIndex.from_chunks(chunks, analyzer=base.analyzer, embedding_backend=backend,
                                       channels=("bm25", "dense") if backend else ("bm25",), library_id=ds.name)
    index.retriever.embed_progress = tqdm_progress(f"embed {ds.name}", enabled=base.progress)
    embedded = embed_timings(*embed_corpus(index))
    qids = ds.judged_queries[: base.limit] if base.limit else ds.judged_queries
    out = []
    for mode in modes:
        channels = {"bm25": ("bm25",), "vector": ("dense",), "hybrid": ("bm25", "dense")}[mode]
        retriever = NarrativeIndexRetriever(NarrativeIndex(index.retriever.with_channels(channels), ds.name))
        t0 = time.perf_counter()
        runs = {q: ranked_doc_ids(retriever, ds.queries[q], base.depth * 3, base.depth)
                for q in _progress(qids, len(qids), base.progress, f"{ds.name} {mode}")}
        elapsed = time.perf_counter() - t0
        out.append({"dataset": ds.name, "mode": mode, "embedding": getattr(backend, "model_id", None) if mode != "bm25" else None,
                    **mean_metrics(runs, {q: ds.qrels[q] for q in qids}),
                    "counts": {"documents": len(ds.corpus), "chunks": len(chunks), "queries": len(qids)},
                    "timings_s": {**embedded, "queries": round(elapsed, 3),
                                  "per_query_ms": round(1000 * elapsed / max(len(qids), 1), 3)}})
    return out


def evaluate_dataset(folder: str, cfg: EvalConfig | None = None) -> dict[str, Any]:
    cfg = cfg or EvalConfig()
    t0 = time.perf_counter()
    ds = load_beir(folder)
    backend, channels = resolve_retrieval(cfg.mode, cfg.embedding)
    t_load = time.perf_counter()
    store = ChunkStore(":memory:")
    docs = beir_documents(ds)
    ingest_documents(store, docs, scope_prefix="", chunker=_chunker(cfg))
    chunks = list(store.iter_chunks())
    t_ingest = time.perf_counter()
    index = NarrativeIndex.from_chunks(chunks, analyzer=cfg.analyzer, embedding_backend=backend,
                                       channels=channels, library_id=ds.name)
    index.retriever.embed_progress = tqdm_progress(f"embed {ds.name}", enabled=cfg.progress)
    reranker = None
    if cfg.reranker:
        reranker = make_reranker(cfg.reranker)
    retriever = NarrativeIndexRetriever(index, reranker=reranker)
    t_built = time.perf_counter()
    embed_s, embedded = embed_corpus(index)
    t_index = time.perf_counter()  # the query clock starts after the corpus embedding
    qids = ds.judged_queries
    if cfg.limit:
        qids = qids[: cfg.limit]
    runs: dict[str, list[str]] = {}
    chunk_depth = max(cfg.depth * 3, cfg.depth)
    for q in _progress(qids, len(qids), cfg.progress, f"eval {ds.name}"):
        runs[q] = ranked_doc_ids(retriever, ds.queries[q], chunk_depth, cfg.depth)
    t_query = time.perf_counter()
    metrics = mean_metrics(runs, {q: ds.qrels[q] for q in qids})
    store.close()
    return {
        "dataset": ds.name,
        "mode": cfg.mode,
        "embedding": getattr(backend, "model_id", None),
        "analyzer": index.retriever.analyzer.name,
        "chunker": cfg.chunker,
        "reranker": cfg.reranker,
        **metrics,
        "counts": {"documents": len(ds.corpus), "chunks": len(chunks), "queries": len(qids)},
        "timings_s": {
            "load": round(t_load - t0, 3),
            "ingest": round(t_ingest - t_load, 3),
            "index": round(t_built - t_ingest, 3),
            **embed_timings(embed_s, embedded),
            "queries": round(t_query - t_index, 3),
            "per_query_ms": round(1000 * (t_query - t_index) / max(len(qids), 1), 3),
        },
    }
