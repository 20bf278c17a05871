"""The Chunk record and the default paragraph chunker.

Invariant kept by every chunker: ``source[chunk.start:chunk.end] == chunk.text`` — a chunk
is always a contiguous span of its source, so a citation can point at exact character
offsets. The paragraph chunker packs whole paragraphs up to ``max_chars``; the next chunk
re-opens up to ``overlap_chars`` before the previous chunk's end (snapped forward to a
word/sentence boundary). A paragraph longer than ``max_chars`` is split at sentence ends
(。！？；.!?;) into sub-chunks packed greedily, and a sentence longer than ``max_chars`` is
hard-cut; sub-chunks of one paragraph never overlap. No chunk is a bare heading: a heading
(or a piece under ``headings.MIN_CONTENT_CHARS`` letters and digits) is kept with the text
it heads (``headings.absorb_bare``), within the same budget.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from ...sensitivity import effective_label
from ...text_spans import locator_space
from .headings import absorb_bare, bare_span, rebalance

DEFAULT_CHUNK_CHARS = 480
DEFAULT_OVERLAP_CHARS = 80

METADATA_FIELDS: tuple[str, ...] = ("topic", "entity", "geography", "period", "language")
DEFAULT_SENSITIVITY = "INTERNAL"


@dataclass(frozen=True)
class SourceLocator:
    """Where a chunk's text sits in its source: character offsets [start, end) into the
    document's text; ``space`` (in ``to_dict``) says whether that is the file's own text."""

    doc_id: str
    start: int
    end: int
    source_path: str = ""
    # JSON object of the file-side locator fields (``pages`` / ``blocks`` / ``element``,
    # ``ingest/locators.py``), set by the chunks step from the parser's anchors; "" for
    # none. Not compared: two locators of the same span are the same citation.
    extra: str = field(default="", compare=False)

    def to_dict(self) -> dict[str, Any]:
        # Plain fields: a literal dict (asdict's recursive deep copy cost ~10x per snippet).
        out = {"doc_id": self.doc_id, "start": self.start, "end": self.end, "source_path": self.source_path}
        space = locator_space(self.source_path)
        if space:
            out["space"] = space
        if self.extra:
            out.update(json.loads(self.extra))
        return out


@dataclass(frozen=True)
class Chunk:
    """A citable span of a document, with the metadata the pre-filter uses."""

    chunk_id: str
    doc_id: str
    title: str
    text: str
    source_locator: SourceLocator
    ordinal: int = 0
    topic: str = ""
    entity: str = ""
    geography: str = ""
    period: str = ""
    language: str = ""
    sensitivity: str = DEFAULT_SENSITIVITY
    # Filled by the parent_child / sentence_window / layout chunkers.
    parent_id: str = ""
    heading: str = ""
    window_text: str = ""
    parent_locator: SourceLocator | None = None
    chunker: str = "paragraph"

    @property
    def start(self) -> int:
        return self.source_locator.start

    @property
    def end(self) -> int:
        return self.source_locator.end

    def metadata(self) -> dict[str, str]:
        return {f: getattr(self, f) for f in METADATA_FIELDS}

    def with_(self, **changes: Any) -> Chunk:
        return replace(self, **changes)


def make_chunk_id(doc_id: str, ordinal: int, start: int, end: int, text: str) -> str:
    """Stable id: same (doc, position, text) -> same id on every run."""
    h = hashlib.sha1(f"{doc_id}\x1f{start}\x1f{end}\x1f{text}".encode()).hexdigest()[:10]
    return f"{doc_id}#{ordinal:04d}-{h}"


def check_chunk_params(max_chars: int, overlap_chars: int) -> None:
    """ValueError unless 0 < max_chars and 0 <= overlap_chars < max_chars."""
    if max_chars <= 0:
        raise ValueError(f"max_chars must be > 0 (got {max_chars})")
    if overlap_chars < 0:
        raise ValueError(f"overlap_chars must be >= 0 (got {overlap_chars})")
    if overlap_chars >= max_chars:
        raise ValueError(
            f"overlap_chars must be < max_chars (got overlap={overlap_chars}, max={max_chars})"
        )


_PARA_SEP = re.compile(r"\n[ \t\r\f\v]*\n\s*")
# Sentence ends: CJK marks always; ASCII marks only before whitespace or the end, so
# "3.5%" or "e.g.x" is not a boundary.
_SENT_END = re.compile(r"[。！？；]+[\"'”’」』）)]*|[.!?;]+[\"'”’)]*(?=\s|$)")


def _strip_span(text: str, s: int, e: int) -> tuple[int, int]:
    while s < e and text[s].isspace():
        s += 1
    while e > s and text[e - 1].isspace():
        e -= 1
    return s, e


def paragraph_spans(text: str) -> list[tuple[int, int]]:
    """Non-empty paragraphs as (start, end), separated by blank lines, whitespace-trimmed."""
    spans: list[tuple[int, int]] = []
    pos = 0
    for m in _PARA_SEP.finditer(text):
        s, e = _strip_span(text, pos, m.start())
        if e > s:
            spans.append((s, e))
        pos = m.end()
    s, e = _strip_span(text, pos, len(text))
    if e > s:
        spans.append((s, e))
    return spans


def sentence_spans(text: str, start: int, end: int) -> list[tuple[int, int]]:
    """Sentences inside [start, end) split after 。！？；.!?; (trimmed, non-empty)."""
    out: list[tuple[int, int]] = []
    pos = start
    for m in _SENT_END.finditer(text, start, end):
        s, e = _strip_span(text, pos, m.end())
        if e > s:
            out.append((s, e))
        pos = m.end()
    s, e = _strip_span(text, pos, end)
    if e > s:
        out.append((s, e))
    return out


def _hard_cut(text: str, s: int, e: int, max_chars: int) -> list[tuple[int, int]]:
    """Pieces of at most ``max_chars``, cut at the last space of the second half of each
    window when there is one (no "P" / "URPOSE." scraps), else exactly at the budget."""
    out = []
    while s < e:
        cut = min(s + max_chars, e)
        if cut < e:
            space = next((i for i in range(cut, s + max_chars // 2, -1) if text[i].isspace()), None)
            cut = space if space is not None else cut
        a, b = _strip_span(text, s, cut)
        if b > a:
            out.append((a, b))
        s = cut
    return out


def split_oversize(text: str, s: int, e: int, max_chars: int) -> list[tuple[int, int]]:
    """Split one long span into non-overlapping pieces of at most ``max_chars``."""
    pieces: list[tuple[int, int]] = []
    cur: tuple[int, int] | None = None
    for ss, se in sentence_spans(text, s, e):
        if se - ss > max_chars:
            if cur:
                pieces.append(cur)
            cuts = _hard_cut(text, ss, se, max_chars)
            pieces.extend(cuts[:-1])
            cur = cuts[-1]  # the remainder may still pack with the next sentence
            continue
        if cur is None:
            cur = (ss, se)
        elif se - cur[0] <= max_chars:
            cur = (cur[0], se)
        else:
            pieces.append(cur)
            cur = (ss, se)
    if cur:
        pieces.append(cur)
    return absorb_bare(text, pieces, max_chars)


_BOUNDARY = re.compile(r"[\s。！？；，、,.!?;:：]")


def _overlap_start(text: str, prev_start: int, prev_end: int, next_start: int, next_end: int,
                   overlap_chars: int, max_chars: int) -> int:
    """Where the next chunk opens so it repeats up to ``overlap_chars`` of the previous."""
    if overlap_chars == 0:
        return next_start
    lo = max(prev_end - overlap_chars, prev_start + 1, next_end - max_chars)
    if lo >= next_start:
        return next_start
    # Snap forward to just after a boundary so the overlap starts on a word/sentence.
    m = _BOUNDARY.search(text, lo, prev_end)
    s = m.end() if m else lo
    s, _ = _strip_span(text, s, next_start)
    return min(s, next_start)


def chunk_spans(text: str, max_chars: int = DEFAULT_CHUNK_CHARS,
                overlap_chars: int = DEFAULT_OVERLAP_CHARS) -> list[tuple[int, int]]:
    """Character spans of the paragraph chunker (see module docstring).

    A chunk that would close on a heading paragraph (or that is bare as a whole) does not:
    the heading opens the next chunk, with the paragraph it heads (split by the oversize
    rules when the two exceed ``max_chars``)."""
    check_chunk_params(max_chars, overlap_chars)
    spans: list[tuple[int, int]] = []
    start: int | None = None  # start of the chunk being packed (may reach back: overlap)
    paras: list[tuple[int, int]] = []  # the paragraphs packed into it

    def close() -> tuple[tuple[int, int] | None, int | None]:
        """Close the open chunk: (span emitted or None, start of a heading carried over)."""
        end = paras[-1][1]
        if bare_span(text, start, end):
            return None, start
        if len(paras) > 1 and bare_span(text, paras[-1][0], end):
            if bare_span(text, start, paras[-2][1]):  # what would stay is a heading too: carry it all
                return None, start
            spans.append((start, paras[-2][1]))
            return None, paras[-1][0]
        spans.append((start, end))
        return (start, end), None

    tail: tuple[int, int] | None = None  # a bare last piece of an oversize split, for the next paragraph
    for ps, pe in paragraph_spans(text):
        if start is not None and pe - start <= max_chars:
            paras.append((ps, pe))
            continue
        prev, carry = close() if start is not None else (None, tail[0] if tail else None)
        start, paras, tail = None, [], None
        first = carry if carry is not None else ps
        if pe - first > max_chars:
            # Sub-chunks of an oversize paragraph overlap nothing, before or after.
            pieces = split_oversize(text, first, pe, max_chars)
            if len(pieces) > 1 and bare_span(text, *pieces[-1]):
                tail = pieces.pop()  # a scrap the split left: it joins the next paragraph
            spans.extend(pieces)
            continue
        start = first if prev is None else _overlap_start(text, prev[0], prev[1], ps, pe, overlap_chars, max_chars)
        paras = [(first, pe)] if carry is not None else [(ps, pe)]
    if tail is not None:
        start, paras = tail[0], [tail]
    if start is not None:
        end = paras[-1][1]
        if spans and bare_span(text, start, end):  # a trailing heading heads nothing: it joins the chunk before
            a = spans[-1][0]
            spans[-1:] = ([(a, end)] if end - a <= max_chars else
                          rebalance(text, a, start, end, max_chars) or [spans[-1], (start, end)])
        else:
            spans.append((start, end))
    return spans


def chunk_document(
    text: str,
    *,
    doc_id: str = "",
    title: str = "",
    metadata: Mapping[str, Any] | None = None,
    max_chars: int = DEFAULT_CHUNK_CHARS,
    overlap_chars: int = DEFAULT_OVERLAP_CHARS,
    source_path: str = "",
) -> list[Chunk]:
    """Split ``text`` into paragraph chunks carrying ``metadata`` and exact offsets.

    ``metadata`` may hold topic / entity / geography / period / language and
    sensitivity; unknown keys are ignored here (they stay on the document record).
    """
    check_chunk_params(max_chars, overlap_chars)
    md = dict(metadata or {})
    fields = {f: str(md.get(f) or "") for f in METADATA_FIELDS}
    # Fail closed: a label given but not a known label (even "") is RESTRICTED.
    sensitivity = effective_label(md.get("sensitivity"), DEFAULT_SENSITIVITY)
    chunks: list[Chunk] = []
    for ordinal, (s, e) in enumerate(chunk_spans(text, max_chars, overlap_chars)):
        piece = text[s:e]
        chunks.append(
            Chunk(
                chunk_id=make_chunk_id(doc_id, ordinal, s, e, piece),
                doc_id=doc_id,
                title=title,
                text=piece,
                source_locator=SourceLocator(doc_id, s, e, source_path),
                ordinal=ordinal,
                sensitivity=sensitivity,
                **fields,
            )
        )
    return chunks


@dataclass(frozen=True)
class ChunkerConfig:
    """Chunker choice + parameters, as run config and metadata record."""

    name: str = "paragraph"
    max_chars: int = DEFAULT_CHUNK_CHARS
    overlap_chars: int = DEFAULT_OVERLAP_CHARS
    extra: dict[str, Any] = field(default_factory=dict)
