"""Where a document's headings are, found in its text: the structure marks every parser
reports and every structure-aware chunker reads.

Why here, at the bottom of the house beside ``text_spans`` (this module imports nothing
from the package but it): the parsers (``ingest/parsers.py``) record the marks and the
chunkers (``retrieval/chunking/``) find them again in plain text and re-check heading
lines; both import one definition without ``retrieval`` importing ``ingest``. A mark is a
span ``text[start:end]`` (empty for a page start) with a heading level and a kind:
markdown ``#`` headings, HTML ``h1``-``h6`` (and Word ``Heading N``), PDF page starts,
numbered headings (``1.2 Scope``), Chinese legal divisions (``第三章 总则``,
``第十二条``) and ``Article 5``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from .text_spans import line_spans, trim_span

# Kinds of structure mark. Headings carry a level (1 = outermost); a page mark has level 0
# and only says where a page's text starts.
MARK_KINDS = ("markdown", "html", "numbered", "cn_part", "cn_chapter", "cn_section", "cn_article",
              "cn_clause", "article", "page", "question")  # "question": found by the qa chunker


@dataclass(frozen=True)
class StructureMark:
    """One structural boundary: ``text[start:end]`` is the heading line (empty for a page)."""

    start: int
    end: int
    level: int
    kind: str

    def to_list(self) -> list[Any]:
        return [self.start, self.end, self.level, self.kind]

    @classmethod
    def from_list(cls, row: Any) -> StructureMark:
        start, end, level, kind = row
        if kind not in MARK_KINDS or not (0 <= int(start) <= int(end)):
            raise ValueError(f"not a structure mark: {row!r}")
        return cls(int(start), int(end), int(level), str(kind))


_CN_NUM = "[0-9０-９一二三四五六七八九十百千零〇两]+"
# (pattern, kind, level). Lines only: a heading is a short line that opens with the marker.
_LINE_HEADINGS: tuple[tuple[re.Pattern[str], str, int], ...] = (
    (re.compile(rf"第{_CN_NUM}[编篇部](?:[ \t\u3000]|$)"), "cn_part", 1),
    (re.compile(rf"第{_CN_NUM}章"), "cn_chapter", 2),
    (re.compile(rf"第{_CN_NUM}节"), "cn_section", 3),
    (re.compile(rf"第{_CN_NUM}条"), "cn_article", 4),
    (re.compile(rf"第{_CN_NUM}[款项]"), "cn_clause", 5),
    (re.compile(r"(?:Article|ARTICLE|Art\.)[ \t]+\d+[A-Za-z]?\b"), "article", 4),
)
_NUMBERED = re.compile(r"(\d{1,3}(?:\.\d{1,3}){0,5})\.?[ \t\u3000]+(?=\S)")
_MD_HEADING = re.compile(r"(#{1,6})[ \t]+\S")
_FENCE = re.compile(r"(```|~~~)")
_MD_LIST = re.compile(r"\d{1,3}[.)][ \t]")
MAX_HEADING_LINE = 80  # a numbered "heading" longer than this is a numbered paragraph


def line_heading(line: str) -> tuple[str, int, int] | None:
    """(kind, level, heading length) when ``line`` (stripped) opens with a numbered or
    legal heading. An article line that goes on with its body (``第十二条 用人单位应当…。``)
    is a heading of just its marker; a short title line is a heading as a whole."""
    for pat, kind, level in _LINE_HEADINGS:
        m = pat.match(line)
        if not m:
            continue
        titled = len(line) <= MAX_HEADING_LINE and not line.endswith(_SENTENCE_END)
        if kind in ("cn_article", "cn_clause", "article"):
            return kind, level, len(line) if titled else m.end()
        if titled:
            return kind, level, len(line)
    m = _NUMBERED.match(line)
    if m and len(line) <= MAX_HEADING_LINE and not line.endswith(_SENTENCE_END):
        return "numbered", m.group(1).count(".") + 1, len(line)
    return None


_SENTENCE_END = ("。", ".", "；", ";", "，", ",", "！", "!", "？", "?", "：", ":")


def text_structure(text: str, *, markdown: bool = False) -> tuple[StructureMark, ...]:
    """Headings found in plain text: numbered and legal headings (and ``#`` headings
    outside code fences when ``markdown``), one mark per line that opens with one."""
    marks: list[StructureMark] = []
    in_fence = False
    for ls, le in line_spans(text):
        s, e = trim_span(text, ls, le)
        if s == e:
            continue
        line = text[s:e]
        if markdown and _FENCE.match(line):
            in_fence = not in_fence
            continue
        if in_fence:
            continue
        if markdown:
            m = _MD_HEADING.match(line)
            if m:
                marks.append(StructureMark(s, e, len(m.group(1)), "markdown"))
                continue
            if line.startswith(("#", ">", "|", "-", "*", "+")):
                continue
        hit = line_heading(line)
        if hit and markdown and hit[0] == "numbered" and _MD_LIST.match(line):
            continue  # "1. item" in markdown is an ordered list, not a heading
        if hit:
            marks.append(StructureMark(s, s + hit[2], hit[1], hit[0]))
    return tuple(marks)


__all__ = ["MARK_KINDS", "MAX_HEADING_LINE", "StructureMark", "line_heading", "text_structure"]
