"""Dense channel: embedding backends and vector stores."""

from .base import EmbeddingBackend, EmbeddingBackendUnavailable, backend_model_id
from .embedding_backends import (
    DeterministicHashBackend,
    OpenAIEmbeddingBackend,
    make_embedding_backend,
)
from .store import InProcessVectorStore, VectorHit, VectorStore

__all__ = [
    "DeterministicHashBackend", "EmbeddingBackend", "EmbeddingBackendUnavailable",
    "InProcessVectorStore", "OpenAIEmbeddingBackend", "VectorHit", "VectorStore",
    "backend_model_id", "make_embedding_backend",
]
