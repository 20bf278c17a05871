"""``make_chunker``: a chunker from a spec string, and the default paragraph chunker.

Every chunker family lives in its own module of ``chunking/`` (``chunking`` for
paragraphs, ``structured`` for layout / parent_child / the presets, ``sentences`` for
sentence windows and semantic breakpoints); this module is the one place that turns the
``NAME[:ARG...]`` grammar of ``RAGSPINE_CHUNKER`` and the run config into one of them,
checking every parameter before any work. It sits in ``chunking/`` beside the chunkers
it builds, so the warehouse, the evaluation runner and the corpus helpers all reach it
downwards (``ragspine_pipeline.corpus`` re-exports it, its older import path).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from ... import settings
from ..vector.base import EmbeddingBackend, EmbeddingBackendUnavailable
from ..vector.embedding_backends import embedding_spec_from_env, make_embedding_backend
from .chunking import (
    DEFAULT_CHUNK_CHARS,
    DEFAULT_OVERLAP_CHARS,
    Chunk,
    check_chunk_params,
    chunk_document,
)
from .sentences import DEFAULT_PERCENTILE, SemanticChunker, SentenceWindowChunker
from .structured import PRESET_KINDS, ChunkerError, DocumentLike, LayoutChunker, ParentChildChunker

CHUNKER_ENV = "RAGSPINE_CHUNKER"
CHUNKER_SPECS = ("paragraph[:max_chars[:overlap_chars]]", "layout[:max_chars[:overlap_chars]]",
                 "laws[:max_chars[:overlap_chars]]", "qa[:max_chars[:overlap_chars]]",
                 "book[:max_chars[:overlap_chars]]",
                 "parent_child[:parent_max_chars[:child_max_chars[:child_overlap_chars]]]",
                 "sentence_window[:window[:max_chars]]", "semantic[:percentile[:max_chars]]")

__all__ = ["CHUNKER_ENV", "CHUNKER_SPECS", "Chunker", "KeyedChunker", "ParagraphChunker", "make_chunker",
           "paragraph_chunker"]

Chunker = Callable[[DocumentLike], list[Chunk]]


class KeyedChunker(Protocol):
    """A chunker as a value: called on a document; ``key`` names it and its parameters."""

    @property
    def key(self) -> str: ...

    def __call__(self, doc: DocumentLike) -> list[Chunk]: ...


@dataclass(frozen=True)
class ParagraphChunker:
    """The default chunker as a value: ``key`` names it and its parameters, so a refresh
    can tell "same document, same chunker" and skip re-chunking."""

    max_chars: int = DEFAULT_CHUNK_CHARS
    overlap_chars: int = DEFAULT_OVERLAP_CHARS

    def __post_init__(self) -> None:
        check_chunk_params(self.max_chars, self.overlap_chars)  # bad run config fails up front

    @property
    def key(self) -> str:
        return f"paragraph:{self.max_chars}:{self.overlap_chars}"

    def __call__(self, doc: DocumentLike) -> list[Chunk]:
        return chunk_document(doc.text, doc_id=doc.doc_id, title=doc.title, metadata=doc.metadata,
                              max_chars=self.max_chars, overlap_chars=self.overlap_chars,
                              source_path=doc.source_path)


def paragraph_chunker(max_chars: int = DEFAULT_CHUNK_CHARS,
                      overlap_chars: int = DEFAULT_OVERLAP_CHARS) -> ParagraphChunker:
    return ParagraphChunker(max_chars, overlap_chars)


def _ints(raw: str, params: list[str], most: int, names: str) -> list[int]:
    try:
        ints = [int(p) for p in params]
    except ValueError:
        raise ValueError(f"chunker parameters must be integers: {raw!r}") from None
    if len(ints) > most:
        raise ValueError(f"{raw.split(':')[0]} takes at most {names}: {raw!r}")
    return ints


def _semantic(raw: str, params: list[str], backend: EmbeddingBackend | None) -> KeyedChunker:
    if len(params) > 2:
        raise ValueError(f"semantic takes at most percentile and max_chars: {raw!r}")
    try:
        pct = float(params[0]) if params else DEFAULT_PERCENTILE
        size = int(params[1]) if len(params) > 1 else DEFAULT_CHUNK_CHARS
    except ValueError:
        raise ValueError(f"semantic parameters are a percentile and an integer max_chars: {raw!r}") from None
    if backend is None:
        spec = embedding_spec_from_env("auto")
        try:
            backend = make_embedding_backend(spec)
        except EmbeddingBackendUnavailable as exc:
            raise ChunkerError(f"the semantic chunker needs a dense embedding backend ({exc})") from None
        if backend is None:
            raise ChunkerError(
                f"the semantic chunker needs a dense embedding backend, and embedding spec {spec!r} builds none "
                "here: install the [embed-onnx] extra (pip install 'ragspine-pipeline[embed-onnx]') or set "
                "RAGSPINE_EMBEDDING_BACKEND")
    return SemanticChunker(backend, pct, size)


def make_chunker(spec: str | None = None, *, embedding_backend: EmbeddingBackend | None = None) -> KeyedChunker:
    """Chunker from a spec (``RAGSPINE_CHUNKER`` when None; default ``paragraph``).

    Specs (see ``CHUNKER_SPECS``): ``paragraph``, ``layout``, ``laws``, ``qa``, ``book``
    (``NAME:MAX:OVERLAP``), ``parent_child:PARENT:CHILD:OVERLAP``,
    ``sentence_window:WINDOW:MAX`` and ``semantic:PERCENTILE:MAX`` — which embeds with
    ``embedding_backend``, else the one ``RAGSPINE_EMBEDDING_BACKEND`` (default auto)
    builds, and is a ChunkerError naming the ``[embed-onnx]`` extra when there is none.
    Every parameter is checked here, so bad run config fails before any work; an unknown
    name in the variable is the registry's SettingsError naming ``RAGSPINE_CHUNKER``.
    """
    raw = (spec if spec is not None else settings.get(CHUNKER_ENV)).strip() or "paragraph"
    name, *params = raw.split(":")
    name = name.strip().lower()
    if name == "paragraph":
        return ParagraphChunker(*_ints(raw, params, 2, "max_chars and overlap_chars"))
    if name in PRESET_KINDS:
        return LayoutChunker(*_ints(raw, params, 2, "max_chars and overlap_chars"), preset=name)
    if name == "parent_child":
        return ParentChildChunker(*_ints(raw, params, 3, "parent_max_chars, child_max_chars, child_overlap_chars"))
    if name == "sentence_window":
        return SentenceWindowChunker(*_ints(raw, params, 2, "window and max_chars"))
    if name == "semantic":
        return _semantic(raw, params, embedding_backend)
    raise ValueError(f"unknown chunker {name!r}; available: {', '.join(CHUNKER_SPECS)}")
