"""The served retriever, assembled once for every door.

The CLI (``ragspine query``, ``cli.open_retriever``), the Python API
(``open_published_retriever``), the Dagster ``RetrievalResource`` and its ``ask`` job,
and the benchmarks all build the retriever they serve here, so the same question with
the same settings gets the same snippets whichever door it comes through:

1. the source: the published retrieval snapshots of a warehouse (one per library,
   read-only), else — an engine-only warehouse — its DuckDB chunk store (``chunks.duckdb``)
   with dense vectors cached under ``<warehouse>/engine_vectors/``; a folder with neither
   is ``NoWarehouse`` (nothing is created: only ``ragspine demo`` builds a warehouse);
2. the mode: ``modes.resolve_retrieval``, the one resolution of ``RAGSPINE_RETRIEVAL_MODE``;
3. each index wrapped by the retrieval assembly (``retrieval.link.assembly``): reranker
   (``RAGSPINE_RERANKER``; precomputed passage vectors of the library attached);
4. several libraries fused by a ``MultiIndexRetriever`` with the router
   (``RAGSPINE_ROUTER``, default ``rules``; a failed or empty route searches all);
5. the query layers and post-processors around the whole (the assembly again), with the
   glossary (``RAGSPINE_GLOSSARY``, default the demo glossary) the index rewriter, the
   router and the layers share.

This module sits above ``retrieval`` and ``warehouse``; nothing below imports it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .llm.provider import LLMProvider
from .modes import LEXICAL_MODES, resolve_retrieval, retrieval_mode
from .retrieval.chunking.chunk_store import ChunkStore
from .retrieval.lexical.analysis.analyzer import Analyzer
from .retrieval.link.assembly import (
    GlossarySpec,
    RerankerSpec,
    glossary_file,
    index_retriever,
    lexical_view,
    resolve_glossary,
    serving_reranker,
    with_layers,
)
from .retrieval.link.assembly_warm import WarmReport, warm_retriever
from .retrieval.link.multi_index import MultiIndexRetriever
from .retrieval.link.narrative_index import NarrativeIndex, NarrativeIndexRetriever
from .retrieval.link.routing import make_router
from .retrieval.postprocess.base import Postprocessor
from .retrieval.vector.base import EmbeddingBackend
from .vector_cache import preload_cached_vectors
from .warehouse.pipeline import SNAPSHOT, load_snapshot_index, published_libraries, select_snapshot
from .warehouse.rerank_vectors import attach_library_vectors
from .warehouse.sources import warehouse_glossary
from .warehouse.versioned import VersionedTables

STORE_FILE = "chunks.duckdb"
VECTOR_CACHE_DIR = "engine_vectors"
BUILD_COMMAND = "ragspine demo"


class NoPublishedSnapshot(FileNotFoundError):
    """The warehouse has no published retrieval snapshot (for the libraries asked)."""


class NoWarehouse(FileNotFoundError):
    """A path with no published snapshot and no chunk store: nothing to serve there."""

    def __init__(self, path: Path) -> None:
        super().__init__(f"no warehouse at {path}: no published retrieval snapshot and no chunk store "
                         f"({STORE_FILE}); `{BUILD_COMMAND} --warehouse {path}` builds one")
        self.path = path


def store_path(warehouse: str | os.PathLike[str]) -> Path:
    """The engine-only chunk store of a warehouse folder."""
    return Path(warehouse) / STORE_FILE


def published_library_ids(warehouse: str | os.PathLike[str], wanted: Sequence[str] | None = None) -> list[str]:
    """Libraries (all, or ``wanted``) with a published snapshot; [] for any path that is
    not a warehouse (missing, a file, an unrelated folder). Reads only."""
    root = Path(warehouse)
    if not (root / SNAPSHOT).is_dir():
        return []
    return published_libraries(VersionedTables(root), list(wanted) if wanted else None)


def _has_vectors(wh: VersionedTables, library: str, chunker: str | None) -> bool:
    snap = select_snapshot(wh, library, chunker)
    return snap.manifest["metadata"].get("embeddings") not in (None, "None")


def published_index(wh: VersionedTables, library: str, *, mode: str | None = None,
                    glossary: Path | None = None, embedding: str | EmbeddingBackend | None = None,
                    chunker: str | None = None) -> NarrativeIndex:
    """The NarrativeIndex of ``library``'s published snapshot (``chunker``: the newest
    snapshot of that published chunking) for a retrieval ``mode``, resolved by
    ``modes.resolve_retrieval`` with what the snapshot holds."""
    backend, channels = resolve_retrieval(mode, embedding, stored_vectors=_has_vectors(wh, library, chunker))
    return load_snapshot_index(wh, library, glossary=glossary, embedding_backend=backend, channels=channels,
                               chunker=chunker)


def library_retriever(wh: VersionedTables, library: str, *, reranker: Any, mode: str | None = None,
                      glossary: Path | None = None, embedding: str | EmbeddingBackend | None = None,
                      chunker: str | None = None, postprocessor: Postprocessor | None = None
                      ) -> NarrativeIndexRetriever:
    """One published library's retriever: its index, wrapped by the assembly with the
    resolved ``reranker`` (which also serves the library's precomputed passage vectors)."""
    attach_library_vectors(reranker, wh.root, [library])
    index = published_index(wh, library, mode=mode, glossary=glossary, embedding=embedding, chunker=chunker)
    return index_retriever(index, reranker=reranker, postprocessor=postprocessor)


def library_retrievers(wh: VersionedTables, library: str, modes: Sequence[str | None], *, reranker: Any,
                       glossary: Path | None = None, embedding: str | EmbeddingBackend | None = None,
                       chunker: str | None = None, postprocessor: Postprocessor | None = None
                       ) -> dict[str | None, NarrativeIndexRetriever]:
    """One published library's retriever per mode (keyed as given), over one open of its
    published files: the first mode that is not lexical (else the first) is loaded
    (``library_retriever``), every lexical mode is a BM25-only view of that index
    (``lexical_view``). Why: a service serving ``hybrid`` and ``bm25`` mapped the library's
    BM25 file twice, and each mapping paid its own lazy checks and warm-up (the heaviest
    terms' checks, ~2-6 s at 1M documents, twice); the answers are those of a load per mode."""
    lexical = [m for m in modes if retrieval_mode(m) in LEXICAL_MODES]
    first = next((m for m in modes if m not in lexical), modes[0])
    base = library_retriever(wh, library, reranker=reranker, mode=first, glossary=glossary, embedding=embedding,
                             chunker=chunker, postprocessor=postprocessor)
    view = None
    out: dict[str | None, NarrativeIndexRetriever] = {}
    for m in modes:
        if m == first:
            out[m] = base
        elif m in lexical:
            view = view or index_retriever(lexical_view(base.index), reranker=reranker, postprocessor=postprocessor)
            out[m] = view
        else:  # a second dense mode (none is served so): a load of its own
            out[m] = library_retriever(wh, library, reranker=reranker, mode=m, glossary=glossary,
                                       embedding=embedding, chunker=chunker, postprocessor=postprocessor)
    return out


def serve(retrievers: Mapping[str, Any], *, router: str | None = None, glossary: Path | None = None,
          layers: Mapping[str, Any] | None = None, provider: LLMProvider | None = None,
          embedding_backend: EmbeddingBackend | None = None) -> Any:
    """The served whole: one library's retriever as it is, several in a
    ``MultiIndexRetriever`` with the router (``router``, else ``RAGSPINE_ROUTER``, default
    rules), then the query layers and post-processors (the assembly's ``with_layers``)."""
    if not retrievers:
        raise NoPublishedSnapshot("no libraries to serve")
    if len(retrievers) == 1:
        base = next(iter(retrievers.values()))
    else:
        base = MultiIndexRetriever(retrievers, router=make_router(router, retrievers, glossary=glossary,
                                                                   provider=provider))
    return with_layers(base, layers=layers, provider=provider, glossary=glossary,
                       embedding_backend=embedding_backend)


def open_published_retriever(
    warehouse: str | os.PathLike[str] = "data/warehouse",
    library: str | Sequence[str] | None = None,
    *,
    mode: str | None = None,
    provider: LLMProvider | None = None,
    reranker: RerankerSpec = None,
    postprocessor: Postprocessor | None = None,
    glossary: GlossarySpec = None,
    embedding_backend: EmbeddingBackend | str | None = None,
    router: str | None = None,
    chunker: str | None = None,
    layers: Mapping[str, Any] | None = None,
    warm: bool = False,
) -> Any:
    """Read-only retriever over the published snapshots under ``warehouse``.

    ``library``: one library id, several, or None for every published library. One
    library gives its ``NarrativeIndexRetriever``; several a ``MultiIndexRetriever``
    (the router picks, RRF across libraries, ``library_id`` on every snippet). Around
    either, the query layers and post-processors the settings name (the base itself when
    all are off). Every answer is ``retrieve(query, *, filters=None, top_k=...) ->
    list[dict]``. ``reranker``: an object or a spec (None: ``RAGSPINE_RERANKER``, else
    the listwise judge over ``provider``); ``glossary`` as in ``build_narrative_retriever``;
    ``router``: rules, llm or none (None: ``RAGSPINE_ROUTER``); ``layers``:
    ``make_query_layers`` keywords over their variables; ``embedding_backend`` (an object or
    a spec) embeds only where the mode needs vectors a snapshot lacks (``modes``); ``chunker``
    serves each library's newest snapshot of that chunking. ``warm``: a serving process
    (the service, an app holding the retriever) pays the first query's costs now
    (``warm_retriever``): its first answer then takes what any other does; off for a one-shot
    query, which would read whole files to answer once. Raises ``NoPublishedSnapshot``
    naming the folder and the command that publishes one.
    """
    m = retrieval_mode(mode)
    root = Path(warehouse)
    wanted = [library] if isinstance(library, str) else (list(library) if library is not None else None)
    libs = published_library_ids(root, wanted)
    missing = sorted(set(wanted or []) - set(libs))
    if missing or not libs:
        what = f"libraries {missing}" if missing else "any library"
        raise NoPublishedSnapshot(f"no published retrieval snapshot for {what} under {root.resolve()}; "
                                  f"`{BUILD_COMMAND}` (or a Dagster refresh) publishes them")
    # No glossary asked for: the warehouse's own corpora decide (ragspine index records them).
    gl = served_glossary(root, glossary)
    wh = VersionedTables(root)
    rr = serving_reranker(reranker, provider)
    retrievers = {lib: library_retriever(wh, lib, reranker=rr, mode=m, glossary=gl, embedding=embedding_backend,
                                         chunker=chunker, postprocessor=postprocessor) for lib in libs}
    if warm:
        warm_retriever(*retrievers.values(), name=f"libraries {', '.join(libs)}")
    layers = dict(layers or {})
    if postprocessor is not None:
        layers.setdefault("postprocessor", "none")  # the argument replaces RAGSPINE_POSTPROCESSOR
    return serve(retrievers, router=router, glossary=gl, layers=layers, provider=provider)


def served_glossary(warehouse: str | os.PathLike[str], glossary: GlossarySpec = None) -> Path | None:
    """The glossary file every door serves ``warehouse`` with: ``glossary`` when given, else
    the warehouse's own corpora's (``ragspine index`` records them), else the default chain
    (``RAGSPINE_GLOSSARY``, the corpus root's)."""
    return glossary_file(glossary if glossary is not None else warehouse_glossary(warehouse))


def open_store_retriever(warehouse: str | os.PathLike[str], *, mode: str | None = None,
                         embedding: str | EmbeddingBackend | None = None, analyzer: Analyzer | str | None = None,
                         glossary: GlossarySpec = None, layers: Mapping[str, Any] | None = None,
                         reranker: RerankerSpec = None, provider: LLMProvider | None = None,
                         progress: bool = False) -> Any:
    """The engine-only warehouse: one index over the chunk store's active chunks (read-only),
    wrapped by the same assembly. Dense vectors come from the on-disk cache under
    ``<warehouse>/engine_vectors/`` (keyed by model id + text hash: a second query embeds
    nothing but the question); that cache is the one thing serving may write, and only
    inside a warehouse that has a chunk store."""
    path = store_path(warehouse)
    if not path.is_file():
        raise NoWarehouse(Path(warehouse))
    backend, channels = resolve_retrieval(mode, embedding)
    rewriter = resolve_glossary(glossary)
    with ChunkStore(path, read_only=True) as store:
        chunks = list(store.iter_chunks())
    index = NarrativeIndex.from_chunks(chunks, analyzer=analyzer, embedding_backend=backend, rewriter=rewriter,
                                       channels=channels)
    if backend is not None:
        preload_cached_vectors(index.retriever, Path(warehouse) / VECTOR_CACHE_DIR, progress=progress)
    base = index_retriever(index, reranker=serving_reranker(reranker, provider))
    return serve({"": base}, glossary=glossary_file(glossary), layers=layers, provider=provider,
                 embedding_backend=backend)


def open_retriever(warehouse: str | os.PathLike[str], *, mode: str | None = None,
                   embedding: str | EmbeddingBackend | None = None, analyzer: Analyzer | str | None = None,
                   glossary: GlossarySpec = None, source: str = "auto", layers: Mapping[str, Any] | None = None,
                   chunker: str | None = None, router: str | None = None, progress: bool = False) -> Any:
    """The retriever a command serves: the published snapshots when there are any
    (``source="auto"``; an ``analyzer`` other than the snapshot's forces the store), else
    — or with ``source="store"`` — the engine-only chunk store. A path with neither raises
    ``NoWarehouse`` and writes nothing. ``chunker`` picks a published chunking (published
    snapshots only). ``progress``: a bar on stderr while chunk vectors are embedded."""
    if source not in ("auto", "store"):
        raise ValueError(f"source must be 'auto' or 'store', got {source!r}")
    root = Path(warehouse)
    if source == "auto" and analyzer is None and published_library_ids(root):
        return open_published_retriever(root, mode=mode, glossary=glossary, router=router, chunker=chunker,
                                        layers=layers, embedding_backend=embedding)
    if chunker:
        raise ValueError(f"--chunker {chunker!r} picks a published chunking: {root} has no published "
                         f"retrieval snapshots (run `{BUILD_COMMAND}` or a Dagster refresh)")
    return open_store_retriever(root, mode=mode, embedding=embedding, analyzer=analyzer, glossary=glossary,
                                layers=layers, progress=progress)


__all__ = ["BUILD_COMMAND", "STORE_FILE", "VECTOR_CACHE_DIR", "NoPublishedSnapshot", "NoWarehouse",
           "library_retriever", "library_retrievers", "open_published_retriever", "open_retriever", "open_store_retriever",
           "published_index", "published_library_ids", "serve", "store_path", "WarmReport", "warm_retriever"]
