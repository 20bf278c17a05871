"""RAGSPINE_RETRIEVAL_MODE presets: which channels run and whether a backend is built.

auto / hybrid / vector keep the vector path (a backend from ``RAGSPINE_EMBEDDING_BACKEND`` or the
given spec; ``auto`` falls back to BM25 when none can be built). economy / bm25 / lexical
construct no embedding backend and no vector store at all.
"""

from __future__ import annotations

import os

from .retrieval.vector.embedding_backends import (
    EmbeddingBackend,
    embedding_spec_from_env,
    make_embedding_backend,
)

LEXICAL_MODES = ("economy", "bm25", "lexical")
VECTOR_MODES = ("auto", "hybrid", "vector")


class RetrievalModeError(ValueError):
    """An unknown mode, or a mode that needs a backend none could be built for."""


def resolve_retrieval(mode: str | None = None, embedding: str | None = None
                      ) -> tuple[EmbeddingBackend | None, tuple[str, ...]]:
    """(backend or None, channels) for a mode; lexical modes never touch the factory."""
    m = (mode or os.environ.get("RAGSPINE_RETRIEVAL_MODE", "auto")).strip().lower()
    if m in LEXICAL_MODES:
        return None, ("bm25",)
    if m not in VECTOR_MODES:
        raise RetrievalModeError(
            f"unknown retrieval mode {m!r}; use one of {VECTOR_MODES + LEXICAL_MODES}"
        )
    spec = embedding if embedding is not None else embedding_spec_from_env("auto")
    backend = make_embedding_backend(spec)
    if backend is None:
        if m == "auto":
            return None, ("bm25",)
        raise RetrievalModeError(
            f"mode {m!r} needs an embedding backend; spec {spec!r} gave none "
            "(install the [embed-onnx] extra or pass --embedding deterministic|openai|...)"
        )
    return backend, ("dense",) if m == "vector" else ("bm25", "dense")
