"""Dense channel: embedding backends and vector stores."""

from .embedding_backends import (
    DeterministicHashBackend,
    EmbeddingBackend,
    EmbeddingBackendUnavailable,
    OpenAIEmbeddingBackend,
    make_embedding_backend,
)
from .store import InProcessVectorStore, VectorHit, VectorStore

__all__ = [
    "DeterministicHashBackend", "EmbeddingBackend", "EmbeddingBackendUnavailable",
    "InProcessVectorStore", "OpenAIEmbeddingBackend", "VectorHit", "VectorStore",
    "make_embedding_backend",
]
