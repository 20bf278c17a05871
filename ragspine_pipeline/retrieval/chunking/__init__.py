"""Chunkers, the Chunk record and the versioned chunk store."""

from .chunk_store import ChunkStore, ReadOnlyQueryError, StoredChunk
from .chunking import (
    DEFAULT_CHUNK_CHARS,
    DEFAULT_OVERLAP_CHARS,
    METADATA_FIELDS,
    Chunk,
    SourceLocator,
    chunk_document,
)

__all__ = [
    "DEFAULT_CHUNK_CHARS", "DEFAULT_OVERLAP_CHARS", "METADATA_FIELDS", "Chunk", "ChunkStore",
    "ReadOnlyQueryError", "SourceLocator", "StoredChunk", "chunk_document",
]
