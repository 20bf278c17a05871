"""Sentence-level chunkers: ``sentence_window`` and ``semantic``.

* ``sentence_window``: one sentence per chunk (what is indexed and cited), with
  ``window_text`` = the ±``window`` sentences around it inside the same section, which
  retrieval expands into ``prompt_text`` for generation.
* ``semantic``: sentences grouped where the meaning runs on, split where the cosine
  distance between adjacent sentence embeddings (each sentence embedded with one
  neighbour either side, as LlamaIndex's SemanticSplitter does) rises above the
  ``percentile``-th percentile of the document's distances. It needs a dense backend; a
  group longer than ``max_chars`` falls back to the paragraph rules inside it.

RESTRICTED: the semantic chunker never sends a restricted document's sentences to the
embedding model; such a document is cut by the paragraph rules instead (it is excluded
from every served index anyway).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ...sensitivity import is_restricted
from ..vector.base import EmbeddingBackend, backend_model_id
from .chunking import (
    DEFAULT_CHUNK_CHARS,
    Chunk,
    SourceLocator,
    chunk_spans,
    paragraph_spans,
    sentence_spans,
    split_oversize,
)
from .headings import MIN_SENTENCE_CONTENT_CHARS, absorb_bare
from .structured import (
    ChunkerError,
    DocumentLike,
    build_chunk,
    chunk_fields,
    document_marks,
    sections,
)

DEFAULT_WINDOW = 2
DEFAULT_SENTENCE_CHARS = DEFAULT_CHUNK_CHARS
DEFAULT_PERCENTILE = 95.0


def sentence_list(text: str, start: int, end: int, max_chars: int,
                  min_content: int = MIN_SENTENCE_CONTENT_CHARS) -> list[tuple[int, int]]:
    """Sentences of ``text[start:end]`` paragraph by paragraph; one longer than
    ``max_chars`` is cut by the paragraph chunker's oversize rules; a heading (or a scrap
    such as "3.") is joined to the sentence it heads (``headings.absorb_bare``)."""
    out: list[tuple[int, int]] = []
    for ps, pe in paragraph_spans(text[start:end]):
        for s, e in sentence_spans(text, start + ps, start + pe):
            out.extend([(s, e)] if e - s <= max_chars else split_oversize(text, s, e, max_chars))
    return absorb_bare(text, out, max_chars, min_content)


@dataclass(frozen=True)
class SentenceWindowChunker:
    """One sentence per chunk; ``window_text`` holds ±``window`` sentences of its section."""

    window: int = DEFAULT_WINDOW
    max_chars: int = DEFAULT_SENTENCE_CHARS

    def __post_init__(self) -> None:
        if self.window < 0:
            raise ChunkerError(f"sentence_window: window must be >= 0 (got {self.window})")
        if self.max_chars <= 0:
            raise ChunkerError(f"sentence_window: max_chars must be > 0 (got {self.max_chars})")

    @property
    def key(self) -> str:
        return f"sentence_window:{self.window}:{self.max_chars}"

    def __call__(self, doc: DocumentLike) -> list[Chunk]:
        fields = chunk_fields(doc)
        text = doc.text
        out: list[Chunk] = []
        for sec in sections(text, document_marks(doc)):
            sents = sentence_list(text, sec.start, sec.end, self.max_chars)
            for i, (s, e) in enumerate(sents):
                ws = sents[max(0, i - self.window)][0]
                we = sents[min(len(sents) - 1, i + self.window)][1]
                out.append(build_chunk(doc, fields, len(out), s, e, heading=sec.heading, window_text=text[ws:we],
                                  parent_locator=SourceLocator(doc.doc_id, ws, we, doc.source_path),
                                  chunker="sentence_window"))
        return out


def breakpoints(vectors: np.ndarray, percentile: float) -> list[int]:
    """Indices ``i`` after which a new group starts: distance(i, i+1) above the percentile."""
    if len(vectors) < 2:
        return []
    v = vectors / np.where((n := np.linalg.norm(vectors, axis=1, keepdims=True)) == 0, 1, n)
    dist = 1.0 - np.sum(v[:-1] * v[1:], axis=1)
    threshold = float(np.percentile(dist, percentile))
    return [i for i, d in enumerate(dist.tolist()) if d > threshold]


@dataclass(frozen=True)
class SemanticChunker:
    """Sentence groups cut at embedding-similarity drops (see module docstring)."""

    backend: EmbeddingBackend
    percentile: float = DEFAULT_PERCENTILE
    max_chars: int = DEFAULT_CHUNK_CHARS
    buffer: int = 1
    _model: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        if not callable(getattr(self.backend, "embed_texts", None)):
            raise ChunkerError("semantic chunker needs an embedding backend with embed_texts(texts)")
        if not 0 < self.percentile < 100:
            raise ChunkerError(f"semantic: percentile must be in (0, 100) (got {self.percentile})")
        if self.max_chars <= 0:
            raise ChunkerError(f"semantic: max_chars must be > 0 (got {self.max_chars})")
        object.__setattr__(self, "_model", backend_model_id(self.backend))

    @property
    def key(self) -> str:
        # The model is part of the key: another model cuts elsewhere, so it re-chunks.
        return f"semantic:{self.percentile:g}:{self.max_chars}:{self._model}"

    def _groups(self, text: str, sents: list[tuple[int, int]]) -> list[tuple[int, int]]:
        if len(sents) < 3:
            return [(sents[0][0], sents[-1][1])] if sents else []
        b = self.buffer
        windows = [text[sents[max(0, i - b)][0]:sents[min(len(sents) - 1, i + b)][1]] for i in range(len(sents))]
        vecs = np.asarray(self.backend.embed_texts(windows), dtype=np.float64)
        if vecs.ndim != 2 or len(vecs) != len(sents):
            raise ChunkerError("semantic: the embedding backend returned a wrong number of vectors")
        groups, first = [], 0
        for i in [*breakpoints(vecs, self.percentile), len(sents) - 1]:
            if i >= first:
                groups.append((sents[first][0], sents[i][1]))
                first = i + 1
        return groups

    def __call__(self, doc: DocumentLike) -> list[Chunk]:
        fields = chunk_fields(doc)
        text = doc.text
        if is_restricted(fields["sensitivity"]):
            # Never embed restricted text: the paragraph rules cut it instead.
            spans = chunk_spans(text, self.max_chars, 0)
        else:
            spans = []
            for s, e in self._groups(text, sentence_list(text, 0, len(text), self.max_chars)):
                spans.extend([(s, e)] if e - s <= self.max_chars
                             else [(s + a, s + c) for a, c in chunk_spans(text[s:e], self.max_chars, 0)])
            spans = absorb_bare(text, spans, self.max_chars)  # a group that is only a heading
        return [build_chunk(doc, fields, i, s, e, chunker="semantic") for i, (s, e) in enumerate(spans)]

