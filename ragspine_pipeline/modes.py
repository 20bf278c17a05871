"""RAGSPINE_RETRIEVAL_MODE: the one resolution of which channels run and which backend.

Every door resolves the mode here (the CLI, the Python API, the ``RetrievalResource`` and
the ``ask`` job through ``ragspine_pipeline.serving``; ``ragspine eval``), so a mode means
the same thing everywhere:

* ``economy`` / ``bm25`` / ``lexical``: BM25 only; no embedding backend is built, no
  vector is loaded (the factory is never called).
* ``hybrid`` (BM25 + dense) and ``vector`` (dense only) need vectors: the index's own (a
  published snapshot embedded by the pipeline: its model embeds the queries), else the
  backend passed in, else one built from ``RAGSPINE_EMBEDDING_BACKEND`` (default auto);
  none at all is a RetrievalModeError, never a silent BM25 fallback.
* ``auto`` (the default) keeps the configured hybrid behaviour: dense with the index's own
  vectors or a backend passed in; where the index's source records no embedding choice
  (the engine-only chunk store, chunks in memory) also with the configured backend;
  otherwise BM25. A snapshot published without vectors stays BM25 under ``auto``: its
  build already chose no dense channel, and serving never re-embeds a whole library
  behind the operator's back.
"""

from __future__ import annotations

from . import settings
from .retrieval.vector.base import EmbeddingBackend
from .retrieval.vector.embedding_backends import embedding_spec_from_env, make_embedding_backend

MODE_ENV = "RAGSPINE_RETRIEVAL_MODE"
LEXICAL_MODES = ("economy", "bm25", "lexical")
VECTOR_MODES = ("auto", "hybrid", "vector")


class RetrievalModeError(ValueError):
    """An unknown mode, or a mode that needs a backend none could be built for."""


def retrieval_mode(mode: str | None = None) -> str:
    """``mode`` (None or blank: ``RAGSPINE_RETRIEVAL_MODE``, default ``auto``), normalized
    and validated through the settings registry; the error names the variable when the
    value came from it."""
    try:
        return settings.get(MODE_ENV, mode)
    except settings.SettingsError as exc:
        where = f"{MODE_ENV}: " if exc.source == settings.ENVIRONMENT else ""
        raise RetrievalModeError(f"{where}unknown retrieval mode {exc.value!r}; use one of "
                                 f"{', '.join(VECTOR_MODES + LEXICAL_MODES)}") from None


def resolve_retrieval(mode: str | None = None, embedding: str | EmbeddingBackend | None = None, *,
                      stored_vectors: bool | None = None) -> tuple[EmbeddingBackend | None, tuple[str, ...]]:
    """(backend or None, channels) for a mode over an index whose source has
    (``stored_vectors=True``), lacks (``False``) or records nothing about (None: a chunk
    store) vectors of its own. ``embedding``: a backend object or a spec (None:
    ``RAGSPINE_EMBEDDING_BACKEND``). With stored vectors the backend is None: the index's
    own model embeds the queries. Lexical modes never touch the factory."""
    m = retrieval_mode(mode)
    if m in LEXICAL_MODES:
        return None, ("bm25",)
    channels = ("dense",) if m == "vector" else ("bm25", "dense")
    if stored_vectors:
        return None, channels
    if embedding is not None and not isinstance(embedding, str):
        return embedding, channels
    if m == "auto" and stored_vectors is False and embedding is None:
        return None, ("bm25",)  # the snapshot was published without vectors: what it has
    spec = embedding if embedding is not None else embedding_spec_from_env("auto")
    backend = make_embedding_backend(spec)
    if backend is None:
        if m == "auto":
            return None, ("bm25",)
        raise RetrievalModeError(
            f"mode {m!r} needs an embedding backend; spec {spec!r} gave none "
            "(install the [embed-onnx] extra or pass --embedding deterministic|openai|...)"
        )
    return backend, channels
