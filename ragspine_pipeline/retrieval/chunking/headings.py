"""The no-bare-heading rule every chunker applies: a heading travels with the text it heads.

Why: a chunk that is only a heading ("3. Grant of Patent License.", "## Scope", "第三章 总则")
matches a question's words and carries no answer, so it was returned as one (issue 43).
A piece of at most ``MAX_HEADING_LINE`` characters whose every line is a heading, or that
holds fewer than ``MIN_CONTENT_CHARS`` letters and digits, is *bare*. At chunking time a
bare piece is merged with the piece after it (the text it heads); when the two together
exceed the chunker's budget, the merged span is cut again so that the heading opens a
chunk holding as much of its body as fits (cut after a sentence end, else at a space,
else hard). A bare piece at the very end (nothing follows it) joins the piece before it
when that fits. Either way the result is a contiguous span of the source, so
``source[start:end] == text`` still holds; the budget holds too, so a bare piece survives
only where no neighbour can take it within the budget (a one-piece document, a budget
too small for heading and body).
"""

from __future__ import annotations

import re

from ...ingest.parsers import MAX_HEADING_LINE, line_heading
from ...text_spans import trim_span

MIN_CONTENT_CHARS = 20
"""Fewer letters/digits than this and a piece is bare (documented in docs/pipeline.md)."""
MIN_SENTENCE_CONTENT_CHARS = 3
"""The sentence-window chunker's minimum: its unit is one sentence ("第二句。" holds 3), so
only a scrap such as "3." or "(a)" is bare there, besides heading lines."""

_MD_HEADING = re.compile(r"#{1,6}[ \t]+\S")
# A numbered title that ends with a period, as plain-text licences write them:
# "3. Grant of Patent License.", "1.2 Scope.", "IV. Remedies.", "Section 5. Termination."
_NUMBER = r"(?:(?:Section|SECTION|§)\s*)?(?:\d{1,3}(?:\.\d{1,3}){0,5}[.)]?|(?:[IVXLC]{1,6}|[A-Z])[.)])[ \t\u3000]+"
_NUMBERED_TITLE = re.compile(_NUMBER + r"(?P<title>[^.!?。！？;；:：\n]{1,70})[.:：]?")
_PREFIX = re.compile(_NUMBER)
_SENT_END = re.compile(r"[。！？；]+|[.!?;]+(?=\s)")
MAX_TITLE_WORDS = 10


def content_chars(piece: str) -> int:
    """Letters and digits (any script) in ``piece``: what a reader gets from it."""
    return sum(ch.isalnum() for ch in piece)


def is_heading_line(line: str) -> bool:
    """Whether one stripped line is a heading and nothing else."""
    if not line or len(line) > MAX_HEADING_LINE:
        return False
    if _MD_HEADING.match(line):
        return True
    title = _PREFIX.sub("", line, count=1).rstrip(".:：。")
    if _SENT_END.search(title):  # "3. Grant of Patent License. Subject to ..." runs on: a sentence
        return False
    hit = line_heading(line)
    if hit is not None and hit[2] >= len(line):
        return True
    m = _NUMBERED_TITLE.fullmatch(line)
    return bool(m) and len(m.group("title").split()) <= MAX_TITLE_WORDS


def is_bare(piece: str, min_content: int = MIN_CONTENT_CHARS) -> bool:
    """Only heading lines, or under ``min_content`` letters and digits."""
    if content_chars(piece) < min_content:
        return True
    if len(piece) > MAX_HEADING_LINE * 3:
        return False
    lines = [ln.strip() for ln in piece.splitlines() if ln.strip()]
    return bool(lines) and all(is_heading_line(ln) for ln in lines)


def _cut(text: str, lo: int, hi: int) -> int:
    """Where a piece ending in ``(lo, hi]`` ends best: after the last sentence end, else at
    the last whitespace, else ``hi`` (a hard cut)."""
    best = None
    for m in _SENT_END.finditer(text, lo, hi):
        if m.end() > lo:
            best = m.end()
    if best is not None:
        return best
    for i in range(hi - 1, lo, -1):
        if text[i].isspace():
            return i
    return hi


def absorb_bare(text: str, spans: list[tuple[int, int]], max_chars: int,
                min_content: int = MIN_CONTENT_CHARS) -> list[tuple[int, int]]:
    """``spans`` (sorted, non-overlapping, trimmed) with every bare one merged into the
    text it heads, within ``max_chars`` (see the module docstring)."""
    out: list[tuple[int, int]] = []
    pending: tuple[int, int] | None = None
    for s, e in spans:
        if pending is not None:
            ps, pe = pending
            pending = None
            if e - ps <= max_chars:
                s = ps
            else:  # heading + body over budget: the heading opens a chunk with what fits
                c = _cut(text, pe + 1, ps + max_chars)
                a, b = trim_span(text, ps, c)
                s2, e2 = trim_span(text, c, e)
                if b > pe and e2 > s2:
                    out.append((a, b))
                    s, e = s2, e2
                else:
                    out.append((ps, pe))
        if e - s < max_chars and is_bare(text[s:e], min_content):
            pending = (s, e)
            continue
        out.append((s, e))
    if pending is not None:
        if out and pending[1] - out[-1][0] <= max_chars:
            out[-1] = (out[-1][0], pending[1])
        elif out:
            out[-1:] = _rebalance(text, out[-1][0], pending[1], max_chars, min_content) or [out[-1], pending]
        else:
            out.append(pending)
    return out


def _rebalance(text: str, a: int, e: int, max_chars: int, min_content: int) -> list[tuple[int, int]]:
    """``text[a:e]`` as two pieces within budget, the second holding ``min_content``
    letters/digits (a trailing scrap takes words from the piece before); [] if impossible."""
    need, hi = min_content, e
    while hi > a and need > 0:
        hi -= 1
        need -= text[hi].isalnum()
    lo = max(a, e - max_chars)
    if need > 0 or hi <= lo:
        return []
    c = _cut(text, lo, hi)
    first, second = trim_span(text, a, c), trim_span(text, c, e)
    if first[1] <= first[0] or second[1] <= second[0] or first[1] - first[0] > max_chars:
        return []
    return [first, second]


__all__ = ["MIN_CONTENT_CHARS", "MIN_SENTENCE_CONTENT_CHARS", "absorb_bare", "content_chars", "is_bare", "is_heading_line"]
