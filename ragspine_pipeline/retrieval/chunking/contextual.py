"""Contextual retrieval: a deterministic header on the text that is indexed and embedded.

``RAGSPINE_CONTEXTUAL`` (off by default) turns it on: each chunk is indexed (BM25) and
embedded (dense) as ``"<title · entity · period · heading>\\n\\n<chunk text>"``, built
from the chunk's own metadata only — nothing is summarised, guessed or invented, and an
empty field is left out. Snippet ``text``, ``source_locator`` and citations are the
chunk's as stored: the header exists only inside the indexes.

Values: ``off`` / ``0`` / ``false`` / ``none`` / empty (default: no header); ``on`` /
``1`` / ``true`` / ``header`` (title, entity, period, heading); or a comma list of
fields from ``HEADER_FIELDS`` in the order wanted (``title,heading``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ... import settings
from .chunking import Chunk

CONTEXTUAL_ENV = "RAGSPINE_CONTEXTUAL"
DEFAULT_HEADER_FIELDS: tuple[str, ...] = ("title", "entity", "period", "heading")
HEADER_FIELDS: tuple[str, ...] = ("title", "entity", "period", "heading", "topic", "geography")
HEADER_SEP = " · "
_OFF = ("", "0", "off", "false", "no", "none")
_ON = ("1", "on", "true", "yes", "header")

IndexTextFn = Callable[[Chunk], str]


def plain_index_text(chunk: Chunk) -> str:
    """The default: a chunk is indexed and embedded as its text."""
    return chunk.text


def contextual_fields(spec: str | None = None) -> tuple[str, ...]:
    """The header fields ``spec`` (``RAGSPINE_CONTEXTUAL`` when None) asks for; () is off."""
    raw = (spec if spec is not None else settings.get(CONTEXTUAL_ENV)).strip().lower()
    if raw in _OFF:
        return ()
    if raw in _ON:
        return DEFAULT_HEADER_FIELDS
    fields = tuple(f.strip() for f in raw.split(",") if f.strip())
    bad = [f for f in fields if f not in HEADER_FIELDS]
    if bad or not fields:
        raise ValueError(f"{CONTEXTUAL_ENV}={spec if spec is not None else settings.raw(CONTEXTUAL_ENV)!r}: "
                         f"use on/off or a comma list of {', '.join(HEADER_FIELDS)} (unknown: {', '.join(bad)})")
    return fields


def contextual_header(chunk: Chunk, fields: Sequence[str] = DEFAULT_HEADER_FIELDS) -> str:
    """``title · entity · period · heading`` of the chunk's metadata (empty parts left out,
    whitespace folded, a part equal to the previous one not repeated)."""
    parts: list[str] = []
    for f in fields:
        value = " ".join(str(getattr(chunk, f, "") or "").split())
        if value and (not parts or parts[-1] != value):
            parts.append(value)
    return HEADER_SEP.join(parts)


def make_index_text_fn(spec: str | None = None) -> IndexTextFn:
    """What the indexes see for a chunk: its text, or header + text when contextual
    retrieval is on (``spec`` or ``RAGSPINE_CONTEXTUAL``). Bad values fail here."""
    fields = contextual_fields(spec)
    if not fields:
        return plain_index_text

    def contextual_index_text(chunk: Chunk) -> str:
        header = contextual_header(chunk, fields)
        return f"{header}\n\n{chunk.text}" if header else chunk.text

    contextual_index_text.fields = fields  # type: ignore[attr-defined]  # lineage: which header
    return contextual_index_text
