"""Chunkers, their factory (``make_chunker``), the Chunk record and the versioned chunk store."""

from .chunk_store import ChunkStore, ReadOnlyQueryError, StoredChunk
from .chunking import (
    DEFAULT_CHUNK_CHARS,
    DEFAULT_OVERLAP_CHARS,
    METADATA_FIELDS,
    Chunk,
    SourceLocator,
    chunk_document,
)
from .factory import CHUNKER_SPECS, KeyedChunker, ParagraphChunker, make_chunker, paragraph_chunker

__all__ = [
    "CHUNKER_SPECS", "DEFAULT_CHUNK_CHARS", "DEFAULT_OVERLAP_CHARS", "METADATA_FIELDS", "Chunk", "ChunkStore",
    "KeyedChunker", "ParagraphChunker", "ReadOnlyQueryError", "SourceLocator", "StoredChunk", "chunk_document",
    "make_chunker", "paragraph_chunker",
]
