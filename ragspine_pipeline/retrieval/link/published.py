"""Serving the published warehouse: the spec-shaped entry ``open_published_retriever``.

``ragspine demo`` (and every Dagster refresh) publishes one ``retrieval_snapshot`` per
library under the warehouse folder; this module turns those snapshots into the same
retriever the CLI and the Dagster ``RetrievalResource`` serve, read-only (nothing is
opened for writing, nothing to close).

``RAGSPINE_RETRIEVAL_MODE`` decides the channels exactly as on every other path:
``economy`` / ``bm25`` / ``lexical`` build no embedding backend and load no vectors;
``auto`` serves what the snapshot has (dense when it was embedded, else BM25); ``hybrid``
and ``vector`` need vectors: the snapshot's own, or a backend from
``RAGSPINE_EMBEDDING_BACKEND`` that embeds the chunks lazily.

The warehouse module is imported inside the functions: ``warehouse.pipeline`` itself
imports ``link.narrative_link``, and the engine's import graph stays one-way.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ...modes import LEXICAL_MODES, VECTOR_MODES, RetrievalModeError
from ..rerank.listwise_rerank import ListwiseJudge, Reranker
from ..vector.embedding_backends import (
    EmbeddingBackend,
    embedding_spec_from_env,
    make_embedding_backend,
)
from .narrative_link import (
    GlossarySpec,
    NarrativeIndex,
    NarrativeIndexRetriever,
    Postprocessor,
    default_glossary_path,
    retriever_for_index,
)

MODE_ENV = "RAGSPINE_RETRIEVAL_MODE"


class NoPublishedSnapshot(FileNotFoundError):
    """The warehouse has no published retrieval snapshot (for the libraries asked)."""


def retrieval_mode(mode: str | None = None) -> str:
    """The mode asked for (``RAGSPINE_RETRIEVAL_MODE`` when None, default ``auto``),
    normalized and validated."""
    m = (mode if mode is not None else os.environ.get(MODE_ENV, "auto")).strip().lower() or "auto"
    if m not in LEXICAL_MODES + VECTOR_MODES:
        raise RetrievalModeError(f"unknown retrieval mode {m!r}; use one of {VECTOR_MODES + LEXICAL_MODES}")
    return m


def _channels(mode: str) -> tuple[str, ...] | None:
    if mode in LEXICAL_MODES:
        return ("bm25",)
    return {"hybrid": ("bm25", "dense"), "vector": ("dense",)}.get(mode)  # auto: the snapshot's


def _has_embeddings(wh: Any, library: str, chunker: str | None = None) -> bool:
    from ...warehouse.pipeline import SNAPSHOT, select_snapshot

    snap = select_snapshot(wh, library, chunker) if chunker else wh.latest(SNAPSHOT, library)
    emb = snap.manifest["metadata"].get("embeddings") if snap is not None else None
    return emb not in (None, "None")


def load_published_index(
    wh: Any,
    library: str,
    *,
    mode: str | None = None,
    glossary: str | os.PathLike[str] | None = None,
    embedding_backend: EmbeddingBackend | None = None,
    chunker: str | None = None,
) -> NarrativeIndex:
    """The NarrativeIndex of ``library``'s published snapshot for a retrieval ``mode``
    (``chunker``: the newest snapshot of that published chunking instead).

    Lexical modes never touch the embedding factory. ``hybrid``/``vector`` on a snapshot
    without vectors use ``embedding_backend``, else one built from
    ``RAGSPINE_EMBEDDING_BACKEND`` (default auto); no backend at all is a
    RetrievalModeError rather than a silent BM25 fallback.
    """
    from ...warehouse.pipeline import load_snapshot_index

    m = retrieval_mode(mode)
    channels = _channels(m)
    backend = None
    if m in ("hybrid", "vector") and not _has_embeddings(wh, library, chunker):
        backend = embedding_backend
        if backend is None:
            spec = embedding_spec_from_env("auto")
            backend = make_embedding_backend(spec)
            if backend is None:
                raise RetrievalModeError(
                    f"mode {m!r} needs vectors: the snapshot of {library!r} has none and "
                    f"embedding spec {spec!r} builds no backend here")
    elif m == "auto":
        backend = embedding_backend  # used only when the snapshot has no vectors of its own
    return load_snapshot_index(wh, library, glossary=glossary, embedding_backend=backend, channels=channels,
                               chunker=chunker)


def open_published_retriever(
    warehouse: str | os.PathLike[str] = "data/warehouse",
    library: str | Sequence[str] | None = None,
    *,
    mode: str | None = None,
    provider: Any = None,
    reranker: Reranker | ListwiseJudge | None = None,
    postprocessor: Postprocessor | None = None,
    glossary: GlossarySpec = None,
    embedding_backend: EmbeddingBackend | None = None,
) -> Any:
    """Read-only retriever over the published snapshots under ``warehouse``.

    ``library``: one library id, several, or None for every published library. One
    library gives a ``NarrativeIndexRetriever``; several a ``MultiIndexRetriever`` (RRF
    across libraries, ``library_id`` on every snippet). Both answer
    ``retrieve(query, *, filters=None, top_k=...) -> list[dict]``. ``glossary`` as in
    ``build_narrative_retriever`` (None: ``RAGSPINE_GLOSSARY`` or the demo glossary).
    Raises ``NoPublishedSnapshot`` naming the folder and the command that publishes one.
    """
    from ...warehouse.pipeline import published_libraries, serving_retriever
    from ...warehouse.versioned import VersionedTables

    root = Path(warehouse)
    wanted = [library] if isinstance(library, str) else (list(library) if library is not None else None)
    wh = VersionedTables(root)
    libs = published_libraries(wh, wanted)
    missing = sorted(set(wanted or []) - set(libs))
    if missing or not libs:
        what = f"libraries {missing}" if missing else "any library"
        raise NoPublishedSnapshot(
            f"no published retrieval snapshot for {what} under {root.resolve()}; "
            "`ragspine demo` (or a Dagster refresh) publishes them")
    if glossary is False:
        gl = None
    elif glossary is None or glossary is True:
        gl = default_glossary_path()
    elif isinstance(glossary, str | os.PathLike):
        gl = Path(glossary)
    else:
        raise TypeError("open_published_retriever takes a glossary path, False or None")
    m = retrieval_mode(mode)
    retrievers: dict[str, NarrativeIndexRetriever] = {
        lib: retriever_for_index(
            load_published_index(wh, lib, mode=m, glossary=gl, embedding_backend=embedding_backend),
            provider, reranker=reranker, postprocessor=postprocessor)
        for lib in libs
    }
    return serving_retriever(retrievers)
