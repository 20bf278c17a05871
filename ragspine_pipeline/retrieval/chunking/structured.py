"""Structure-aware chunkers: ``layout``, ``parent_child`` and the laws / qa / book presets.

They split on the boundaries the parser recorded (``Document.structure``: headings, HTML
``h1``–``h6``, PDF pages, numbered and legal headings) instead of a fixed character
budget; a section longer than the budget falls back to the paragraph rules *inside* the
section. Every chunk is still ``text[start:end]`` of the stored source.

* ``layout``: one chunk per section (oversize sections split by the paragraph rules).
  Each chunk carries its ``heading`` path (``第一章 总则 > 第三条``), the section as
  ``parent_id`` / ``parent_locator``, and — when the section was split — the section
  text as ``window_text`` (up to ``WINDOW_FACTOR × max_chars``), which retrieval expands
  into ``prompt_text``.
* ``parent_child``: sections (split at ``parent_max_chars``) are parents; children of
  ``child_max_chars`` are what is indexed and cited. ``window_text`` is the parent's
  text: generation sees the whole parent section, the citation stays the child.
* presets (``laws``, ``book``, ``qa``): a layout chunker that only changes which
  headings open a section — laws at each 第N条/款/项 (and "Article N"), book at each
  第N章/节/篇 or markdown / numbered heading, qa at each question, paired with the
  answer paragraphs that follow under one ``parent_id``.

A document stored before ``structure`` existed (older raw rows) has no marks; its
headings are then found in the stored text itself (``text_structure``), so such a
library still chunks by structure without a re-parse of the files.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from ...sensitivity import effective_label
from ...text_spans import line_spans, trim_span
from ...text_structure import StructureMark, text_structure
from .chunking import (
    DEFAULT_CHUNK_CHARS,
    DEFAULT_OVERLAP_CHARS,
    DEFAULT_SENSITIVITY,
    METADATA_FIELDS,
    Chunk,
    SourceLocator,
    check_chunk_params,
    chunk_spans,
    make_chunk_id,
)
from .headings import bare_span

WINDOW_FACTOR = 4  # layout: a split section up to 4 × max_chars is kept as the window
DEFAULT_PARENT_CHARS = 1600
DEFAULT_CHILD_CHARS = 320
DEFAULT_CHILD_OVERLAP = 40
HEADING_SEP = " > "

ALL_KINDS = frozenset({"markdown", "html", "numbered", "cn_part", "cn_chapter", "cn_section", "cn_article",
                       "cn_clause", "article", "page"})  # "question" is the qa preset's own
# Heading detection per preset (the only thing a preset changes).
PRESET_KINDS: dict[str, frozenset[str]] = {
    "layout": ALL_KINDS,
    "laws": frozenset({"cn_part", "cn_chapter", "cn_section", "cn_article", "cn_clause", "article",
                       "markdown", "html", "page"}),
    "book": frozenset({"cn_part", "cn_chapter", "cn_section", "markdown", "html", "numbered", "page"}),
    "qa": frozenset({"markdown", "html", "page", "question"}),  # questions: found by the chunker
}
QUESTION_LEVEL = 9  # below every heading: a question nests under its FAQ category
MAX_QUESTION_LINE = 300
_QUESTION_PREFIX = re.compile(r"(?:Q|Question|问|問|提问)\s*\d*\s*[:：.．]", re.I)


class ChunkerError(ValueError):
    """A chunker cannot be built or run as asked (bad parameters, a missing backend)."""


class DocumentLike(Protocol):
    """What a chunker reads from a document (``ingest.documents.Document`` has it)."""

    doc_id: str
    title: str
    text: str
    metadata: Mapping[str, Any]
    source_path: str


@dataclass(frozen=True)
class Section:
    """A span of the source opened by a heading (or the preamble before the first)."""

    start: int
    end: int
    heading: str  # the heading path, outermost first
    ordinal: int


def chunk_fields(doc: DocumentLike) -> dict[str, str]:
    """The metadata fields and the fail-closed label every chunk of ``doc`` carries."""
    md = dict(doc.metadata or {})
    fields = {f: str(md.get(f) or "") for f in METADATA_FIELDS}
    fields["sensitivity"] = effective_label(md.get("sensitivity"), DEFAULT_SENSITIVITY)
    return fields


def document_marks(doc: DocumentLike) -> tuple[StructureMark, ...]:
    """The parser's marks, or (a row stored before marks existed) headings of the text."""
    marks = tuple(getattr(doc, "structure", ()) or ())
    if marks:
        return marks
    # As the parser would: ``#`` headings for markdown files (and for a document with no file).
    path = str(doc.source_path or "").lower()
    return text_structure(doc.text, markdown=not path or path.endswith(".md"))


def question_marks(text: str) -> list[StructureMark]:
    """Lines that ask a question — ``Q:`` / ``问：`` / ``问:`` prefixes, or a short line
    ending in ``?`` / ``？`` — as ``question`` marks below every heading level."""
    out: list[StructureMark] = []
    for ls, le in line_spans(text):
        s, e = trim_span(text, ls, le)
        if e > s:
            line = text[s:e].lstrip("#").strip()
            if _QUESTION_PREFIX.match(line) or (len(line) <= MAX_QUESTION_LINE and line.endswith(("?", "？"))):
                out.append(StructureMark(s, e, QUESTION_LEVEL, "question"))
    return out


def _heading_text(text: str, m: StructureMark) -> str:
    return " ".join(text[m.start:m.end].lstrip("#").split())


def sections(text: str, marks: Sequence[StructureMark], kinds: frozenset[str] = ALL_KINDS) -> list[Section]:
    """The document cut at every mark of ``kinds``, with heading paths.

    A section holding nothing but its heading line (a chapter title directly followed by
    its first article, or a heading line the marks did not record) is merged into the next
    one, and one at the very end into the one before, so no chunk is a bare title; page
    marks cut but add nothing to the heading path.
    """
    use = sorted((m for m in marks if m.kind in kinds and 0 <= m.start <= len(text)),
                 key=lambda m: (m.start, m.kind != "page"))
    stack: list[tuple[int, str]] = []
    cuts: list[tuple[int, int, str]] = []  # (start, heading end, heading path)
    if not use or use[0].start > 0:
        cuts.append((0, 0, ""))
    seen: set[tuple[int, str]] = set()
    for m in use:
        if m.kind != "page":
            label = _heading_text(text, m)
            if (m.start, label) in seen:  # "## 如何请假？" is a heading and a question: once
                continue
            seen.add((m.start, label))
            while stack and stack[-1][0] >= m.level:
                stack.pop()
            stack.append((m.level, label))
        path = HEADING_SEP.join(h for _, h in stack if h)
        if cuts and cuts[-1][0] == m.start:
            cuts[-1] = (m.start, max(cuts[-1][1], m.end), path)
        else:
            cuts.append((m.start, m.end, path))
    out: list[Section] = []
    carry: int | None = None  # start of a heading-only section waiting for its body
    for i, (start, head_end, path) in enumerate(cuts):
        nxt = cuts[i + 1][0] if i + 1 < len(cuts) else len(text)
        s, e = trim_span(text, carry if carry is not None else start, nxt)
        if e <= s:
            continue
        body_s, _ = trim_span(text, max(head_end, start), nxt)
        bare = body_s >= e or bare_span(text, s, e, min_content=1)  # a heading the marks missed too
        if bare and i + 1 < len(cuts):  # heading only: open the next section here
            carry = s if carry is None else carry
            continue
        carry = None
        if bare and out:  # a heading at the very end heads nothing: the section before takes it
            out[-1] = Section(out[-1].start, e, out[-1].heading, out[-1].ordinal)
            continue
        out.append(Section(s, e, path, len(out)))
    return out


def _sub_spans(text: str, s: int, e: int, max_chars: int, overlap_chars: int) -> list[tuple[int, int]]:
    """Paragraph-rule spans of ``text[s:e]`` (one span when it fits), as source offsets."""
    if e - s <= max_chars:
        return [(s, e)]
    return [(s + a, s + b) for a, b in chunk_spans(text[s:e], max_chars, overlap_chars)]


def parent_id_for(doc_id: str, ordinal: int, start: int, end: int) -> str:
    h = hashlib.sha1(f"{doc_id}\x1f{start}\x1f{end}".encode()).hexdigest()[:8]
    return f"{doc_id}^{ordinal:04d}-{h}"


def build_chunk(doc: DocumentLike, fields: dict[str, str], ordinal: int, s: int, e: int, **extra: Any) -> Chunk:
    piece = doc.text[s:e]
    return Chunk(chunk_id=make_chunk_id(doc.doc_id, ordinal, s, e, piece), doc_id=doc.doc_id, title=doc.title,
                 text=piece, source_locator=SourceLocator(doc.doc_id, s, e, doc.source_path), ordinal=ordinal,
                 **fields, **extra)


@dataclass(frozen=True)
class LayoutChunker:
    """Sections by structure; ``preset`` picks the heading kinds (layout / laws / book / qa)."""

    max_chars: int = DEFAULT_CHUNK_CHARS
    overlap_chars: int = DEFAULT_OVERLAP_CHARS
    preset: str = "layout"

    def __post_init__(self) -> None:
        check_chunk_params(self.max_chars, self.overlap_chars)
        if self.preset not in PRESET_KINDS:
            raise ChunkerError(f"unknown layout preset {self.preset!r}; use one of {', '.join(PRESET_KINDS)}")

    @property
    def key(self) -> str:
        return f"{self.preset}:{self.max_chars}:{self.overlap_chars}"

    def sections(self, doc: DocumentLike) -> list[Section]:
        marks = list(document_marks(doc))
        if self.preset == "qa":
            marks += question_marks(doc.text)
        return sections(doc.text, marks, PRESET_KINDS[self.preset])

    def __call__(self, doc: DocumentLike) -> list[Chunk]:
        fields = chunk_fields(doc)
        text = doc.text
        out: list[Chunk] = []
        for sec in self.sections(doc):
            spans = _sub_spans(text, sec.start, sec.end, self.max_chars, self.overlap_chars)
            split = len(spans) > 1
            window = text[sec.start:sec.end] if split and sec.end - sec.start <= WINDOW_FACTOR * self.max_chars else ""
            pid = parent_id_for(doc.doc_id, sec.ordinal, sec.start, sec.end)
            ploc = SourceLocator(doc.doc_id, sec.start, sec.end, doc.source_path)
            for s, e in spans:
                out.append(build_chunk(doc, fields, len(out), s, e, parent_id=pid, heading=sec.heading,
                                  window_text=window, parent_locator=ploc, chunker=self.preset))
        return out


@dataclass(frozen=True)
class ParentChildChunker:
    """Parents = sections up to ``parent_max_chars``; children (indexed, cited) inside them."""

    parent_max_chars: int = DEFAULT_PARENT_CHARS
    child_max_chars: int = DEFAULT_CHILD_CHARS
    child_overlap_chars: int = DEFAULT_CHILD_OVERLAP

    def __post_init__(self) -> None:
        check_chunk_params(self.child_max_chars, self.child_overlap_chars)
        if self.parent_max_chars < self.child_max_chars:
            raise ChunkerError(f"parent_max_chars ({self.parent_max_chars}) must be >= child_max_chars "
                               f"({self.child_max_chars})")

    @property
    def key(self) -> str:
        return f"parent_child:{self.parent_max_chars}:{self.child_max_chars}:{self.child_overlap_chars}"

    def __call__(self, doc: DocumentLike) -> list[Chunk]:
        fields = chunk_fields(doc)
        text = doc.text
        out: list[Chunk] = []
        n_parent = 0
        for sec in sections(text, document_marks(doc)):
            for ps, pe in _sub_spans(text, sec.start, sec.end, self.parent_max_chars, 0):
                pid = parent_id_for(doc.doc_id, n_parent, ps, pe)
                n_parent += 1
                ploc = SourceLocator(doc.doc_id, ps, pe, doc.source_path)
                for s, e in _sub_spans(text, ps, pe, self.child_max_chars, self.child_overlap_chars):
                    out.append(build_chunk(doc, fields, len(out), s, e, parent_id=pid, heading=sec.heading,
                                      window_text=text[ps:pe], parent_locator=ploc, chunker="parent_child"))
        return out
