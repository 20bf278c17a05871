"""The no-bare-heading rule every chunker applies: a heading travels with the text it heads.

Why: a chunk that is only a heading ("3. Grant of Patent License.", "## Scope", "第三章 总则")
matches a question's words and carries no answer, so it was returned as one (issue 43).

A piece is *bare* when it holds less than ``MIN_CONTENT_CHARS`` of content (letters and
digits; a CJK character counts ``CJK_WEIGHT``) or when every worded line of it is a
heading: a markdown ``#`` line, a numbered or legal heading as the parsers find them, a
numbered title ("3. Grant of Patent License.", "IV. Remedies") and, for a span that is
whole lines of the source, a plain title line ("Preamble", "TERMS AND CONDITIONS"); lines
of only rules or box drawing ("-----", "*****") are ignored. A title has no word opening
in lower case but the small words titles keep lower case, so "Section 6 states terms ..."
is a sentence.

At chunking time a bare piece is merged with the piece after it (the text it heads); when
the two together exceed the chunker's budget, the merged span is cut again so that the
heading opens a chunk holding as much of its body as fits (cut after a sentence end, else
at a space, else hard). A bare piece at the very end (nothing follows it) joins the piece
before it, or takes enough words from it (``rebalance``). Either way the result is a
contiguous span of the source, so ``source[start:end] == text`` still holds; the budget
holds too, so a bare piece survives only where no neighbour can take it within the budget
(a one-piece document, a budget too small for heading and body).
"""

from __future__ import annotations

import re

from ...text_spans import trim_span
from ...text_structure import MAX_HEADING_LINE, line_heading

MIN_CONTENT_CHARS = 20
"""Less content than this (``content_chars``) and a piece is bare (docs/layers/chunking.md)."""
MIN_SENTENCE_CONTENT_CHARS = 8
"""The sentence-window chunker's minimum: its unit is one sentence ("第二句。" counts 9,
"First rule." 9), so only a scrap such as "3.", "(a)" or "and" is bare there, besides
heading lines."""
CJK_WEIGHT = 3  # a CJK character carries about a word: it counts as three letters

_MD_HEADING = re.compile(r"#{1,6}[ \t]+\S")
# A numbered title that ends with a period, as plain-text licences write them:
# "3. Grant of Patent License.", "1.2 Scope.", "IV. Remedies.", "Section 5. Termination."
_NUMBER = r"(?:(?:Section|SECTION|§)\s*)?(?:\d{1,3}(?:\.\d{1,3}){0,5}[.)]?|(?:[IVXLC]{1,6}|[A-Z])[.)])[ \t\u3000]+"
_NUMBERED_TITLE = re.compile(_NUMBER + r"(?P<title>[^.!?。！？;；:：\n]{1,70})[.:：]?")
_PREFIX = re.compile(_NUMBER)
_SENT_END = re.compile(r"[。！？；]+|[.!?;]+(?=\s)")
MAX_TITLE_WORDS = 10
_WORDS = re.compile(r"[^\W\d_][\w'’-]*")
_TITLE_SMALL_WORDS = frozenset(["a", "an", "and", "as", "at", "but", "by", "for", "from", "in", "into", "nor", "of",
                                "on", "or", "per", "the", "to", "upon", "via", "vs", "with"])
_LINE_ENDS = (".", "!", "?", ";", ",", ":", "。", "！", "？", "；", "，", "：", "、")


def _is_cjk(ch: str) -> bool:
    cp = ord(ch)
    return 0x3040 <= cp <= 0x30FF or 0x3400 <= cp <= 0x4DBF or 0x4E00 <= cp <= 0x9FFF or 0xAC00 <= cp <= 0xD7AF


def content_chars(piece: str) -> int:
    """Letters and digits in ``piece`` (a CJK character counts ``CJK_WEIGHT``): what a
    reader gets from it."""
    return sum(CJK_WEIGHT if _is_cjk(ch) else 1 for ch in piece if ch.isalnum())


def is_heading_line(line: str, plain: bool = True) -> bool:
    """Whether one stripped line is a heading and nothing else. ``plain``: also an
    unnumbered title line ("Preamble", "TERMS AND CONDITIONS"), which only a whole line of
    the source can be (``bare_span``)."""
    if not line or len(line) > MAX_HEADING_LINE:
        return False
    if _MD_HEADING.match(line):
        return True
    title = _PREFIX.sub("", line, count=1).rstrip(".:：。")
    if _SENT_END.search(title):  # "3. Grant of Patent License. Subject to ..." runs on: a sentence
        return False
    hit = line_heading(line)
    if hit is not None and hit[2] >= len(line) and (hit[0] != "numbered" or _titled(title)):
        return True
    m = _NUMBERED_TITLE.fullmatch(line)
    if m:
        return len(m.group("title").split()) <= MAX_TITLE_WORDS and _titled(m.group("title"))
    # A plain title line: "Preamble", "TERMS AND CONDITIONS", "How to Apply These Terms".
    words = _WORDS.findall(line)
    return (plain and bool(words) and words[0][:1].isupper() and len(line.split()) <= MAX_TITLE_WORDS
            and not line.endswith(_LINE_ENDS) and _titled(line))


def _titled(title: str) -> bool:
    """Whether numbered words read as a title ("Grant of Patent License", "范围"), not as a
    sentence ("Section 6 states terms for ..."): no word opens in lower case but the small
    words a title keeps lower case."""
    return not any(w[:1].islower() and w.lower() not in _TITLE_SMALL_WORDS for w in _WORDS.findall(title))


def is_bare(piece: str, min_content: int = MIN_CONTENT_CHARS, *, plain: bool = True) -> bool:
    """Only heading lines, or under ``min_content`` letters and digits."""
    if content_chars(piece) < min_content:
        return True
    if len(piece) > MAX_HEADING_LINE * 3:
        return False
    # Rule lines ("-----", "=====", "*****" around a title) say nothing: only worded lines count.
    lines = [ln.strip(" \t*|=") for ln in piece.splitlines() if any(ch.isalnum() for ch in ln)]
    return bool(lines) and all(is_heading_line(ln, plain) for ln in lines)


def _whole_lines(text: str, s: int, e: int) -> bool:
    """Whether ``text[s:e]`` starts and ends on line boundaries (spaces aside)."""
    before = text.rfind("\n", 0, s)
    after = text.find("\n", e)
    return not text[before + 1:s].strip() and not text[e:len(text) if after < 0 else after].strip()


def bare_span(text: str, s: int, e: int, min_content: int = MIN_CONTENT_CHARS) -> bool:
    """``is_bare`` for a span of ``text``: a heading is whole lines, so a piece cut out of
    a line ("OTHER PARTY HAS BEEN ADVISED" inside a capitalised paragraph) is bare only
    by the content minimum."""
    return is_bare(text[s:e], min_content, plain=_whole_lines(text, s, e))


def _cut(text: str, lo: int, hi: int, sentences: bool = True) -> int:
    """Where a piece ending in ``(lo, hi]`` ends best: after the last sentence end
    (``sentences``), else at the last whitespace, else ``hi`` (a hard cut)."""
    best = None
    for m in _SENT_END.finditer(text, lo, hi) if sentences else ():
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
        if e - s < max_chars and bare_span(text, s, e, min_content):
            pending = (s, e)
            continue
        out.append((s, e))
    if pending is not None:
        if out and pending[1] - out[-1][0] <= max_chars:
            out[-1] = (out[-1][0], pending[1])
        elif out:
            out[-1:] = rebalance(text, out[-1][0], pending[0], pending[1], max_chars, min_content) or [out[-1], pending]
        else:
            out.append(pending)
    return out


def rebalance(text: str, a: int, bare: int, e: int, max_chars: int,
              min_content: int = MIN_CONTENT_CHARS) -> list[tuple[int, int]]:
    """``text[a:e]`` as two pieces within budget where ``text[bare:e]`` (a bare last piece)
    takes ``min_content`` letters/digits of the text before it; [] if impossible."""
    need, hi = min_content, bare
    while hi > a and need > 0:
        hi -= 1
        need -= text[hi].isalnum()
    lo = max(a, e - max_chars)
    if need > 0 or hi <= lo:
        return []
    for c in (_cut(text, lo, hi), _cut(text, lo, hi, sentences=False)):  # a sentence end, else a space
        first, second = trim_span(text, a, c), trim_span(text, c, e)
        if first[1] > first[0] and second[1] > second[0] and first[1] - first[0] <= max_chars \
                and not bare_span(text, *first, min_content):  # never a heading cut off its body again
            return [first, second]
    return []


__all__ = ["MIN_CONTENT_CHARS", "MIN_SENTENCE_CONTENT_CHARS", "absorb_bare", "bare_span", "content_chars", "is_bare", "is_heading_line",
           "rebalance"]
