"""Offset helpers over a document's text, shared by the parsers and the chunkers.

Structure marks (``ingest/parsers.py``) and structured chunks (``retrieval/chunking/``)
are both spans ``text[start:end]`` of the same source, and both must agree on where a
line starts and which whitespace is not part of it, or a heading mark and the chunk
built on it drift apart by a character. Keeping the two helpers here, at the bottom of
the house beside ``sensitivity.py`` (this module imports nothing from the package), lets
both sides import one definition without ``ingest`` and ``retrieval`` importing each other.
"""

from __future__ import annotations

from collections.abc import Iterator

__all__ = ["line_spans", "locator_space", "trim_span"]

_FILE_SPACE_SUFFIXES = (".md", ".txt")


def locator_space(source_path: str) -> str:
    """What a citation span indexes: ``"file"`` for a .md/.txt file (the decoded file text, so
    ``source[start:end] == text``), ``"extracted"`` for PDF/DOCX/HTML (the parsed text; see
    ``ingest/locators.py``), ``""`` when there is no file (a summary node). Here, beside the
    offset helpers, because both the chunks (``SourceLocator``) and the parsers need it."""
    if not source_path:
        return ""
    return "file" if source_path.lower().endswith(_FILE_SPACE_SUFFIXES) else "extracted"


def line_spans(text: str) -> Iterator[tuple[int, int]]:
    """``(start, end)`` of every line of ``text``, without its ``\\n`` (a last line with
    no newline included; an empty text has no lines)."""
    pos = 0
    n = len(text)
    while pos < n:
        nl = text.find("\n", pos)
        end = n if nl < 0 else nl
        yield pos, end
        pos = end + 1


def trim_span(text: str, s: int, e: int) -> tuple[int, int]:
    """``(s, e)`` narrowed past leading and trailing whitespace of ``text[s:e]``; an
    all-blank span comes back empty (``s == e``)."""
    while s < e and text[s].isspace():
        s += 1
    while e > s and text[e - 1].isspace():
        e -= 1
    return s, e
