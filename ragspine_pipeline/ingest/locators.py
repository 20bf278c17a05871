"""What a citation's span points into, per file type.

A snippet's ``source_locator`` gives ``start``/``end`` into the document's text. For a
``.md`` or ``.txt`` file that text is the file's decoded text, so the span indexes the file
(``space: "file"``, ``source[start:end] == text``; after YAML front matter the locator adds
``body_offset``, the characters it took, and ``source[body_offset + start:body_offset + end] == text``). For a PDF, Word or HTML file the text is
what the parser extracted (``space: "extracted"``): the span cannot be applied to the
file's bytes, so the parser also records *anchors* — where each extracted block came from —
and ``locate`` turns a span into file coordinates a reader can follow:

- PDF: ``pages: [{page, start, end}]``, the 1-based page numbers the span covers and the
  span within each page's ``pypdf`` ``extract_text()`` string (unstripped);
- DOCX: ``blocks: [{paragraph: i}]`` (index into python-docx ``Document.paragraphs``) or
  ``{table: t, row: r}`` (``Document.tables[t].rows[r]``) for each block the span covers;
- HTML: ``element``, a CSS path (``html > body > p:nth-of-type(2)``) that BeautifulSoup's
  ``select_one`` (``html.parser``) resolves to the block element holding the span's start.

Why anchors rather than re-parsing at query time: the served index holds no file, and the
parser already walks these units, so recording where each begins costs nothing extra.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ..text_spans import locator_space

__all__ = ["Anchor", "anchors_from_json", "anchors_to_json", "locate", "locator_space"]

@dataclass(frozen=True)
class Anchor:
    """One extracted block: ``text[start:end]`` came from ``ref`` in the file, and
    ``text[start + i]`` is character ``offset + i`` of that unit (a PDF page's text)."""

    start: int
    end: int
    ref: tuple[tuple[str, Any], ...]
    offset: int = 0

    def to_list(self) -> list[Any]:
        return [self.start, self.end, dict(self.ref), self.offset]

    @classmethod
    def from_list(cls, row: Any) -> Anchor:
        start, end, ref, offset = row
        if not isinstance(ref, dict) or not (0 <= int(start) <= int(end)):
            raise ValueError("not a locator anchor")
        return cls(int(start), int(end), tuple(ref.items()), int(offset))


def anchors_to_json(anchors: tuple[Anchor, ...] | list[Anchor]) -> str:
    return json.dumps([a.to_list() for a in anchors], separators=(",", ":"))


def anchors_from_json(raw: str | None) -> tuple[Anchor, ...]:
    return tuple(Anchor.from_list(r) for r in json.loads(raw)) if raw else ()


def _covered(anchors: tuple[Anchor, ...] | list[Anchor], start: int, end: int) -> list[Anchor]:
    """Anchors overlapping ``[start, end)`` (an empty span: the one holding ``start``)."""
    if end <= start:
        return [a for a in anchors if a.start <= start < a.end][:1]
    return [a for a in anchors if a.start < end and start < a.end]


def locate(anchors: tuple[Anchor, ...] | list[Anchor], start: int, end: int, source_path: str) -> dict[str, Any]:
    """The locator fields beyond ``start``/``end`` for a span of a document: ``space``
    always (when there is a file), then ``pages`` / ``blocks`` / ``element`` by file type."""
    out: dict[str, Any] = {}
    space = locator_space(source_path)
    if space:
        out["space"] = space
    hit = _covered(anchors, start, end)
    if not hit:
        return out
    kind = hit[0].ref[0][0] if hit[0].ref else ""
    if kind == "body_offset":
        out["body_offset"] = dict(hit[0].ref)["body_offset"]
    elif kind == "page":
        out["pages"] = [{"page": dict(a.ref)["page"],
                         "start": a.offset + max(start, a.start) - a.start,
                         "end": a.offset + min(end, a.end) - a.start} for a in hit]
    elif kind in ("paragraph", "table"):
        out["blocks"] = [dict(a.ref) for a in hit]
    elif kind == "element":
        first = next((a for a in hit if a.start <= start < a.end), hit[0])
        out["element"] = dict(first.ref)["element"]
    return out
