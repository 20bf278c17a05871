"""Retrieval-time expansion of selected chunks into ``prompt_text`` (generation only).

Chunkers that keep context around a chunk (``parent_child``, ``layout`` when a section
was split, ``sentence_window``) store it as the chunk's ``window_text``: a contiguous
span of the chunk's *own* document at ``parent_locator``. After the RESTRICTED exits,
each selected snippet of such a chunk gets ``prompt_text`` = that span, for the prompt
builder only; ``text``, ``source_locator`` and every citation field stay byte-identical.

Siblings (several selected children of one parent) are de-duplicated: the first, best
ranked, carries the parent text; each later sibling carries ``prompt_text = ""`` and
``prompt_text_ref`` = the chunk id whose ``prompt_text`` already holds it. Chunks
without ``window_text`` (the paragraph chunker) get no key at all, so default output is
unchanged.

RESTRICTED: the text comes only from the chunk record itself, never from a lookup of
another document; a restricted chunk, or one whose parent locator names another
document, gets nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ...sensitivity import is_restricted
from .chunking import Chunk


def _parent_key(c: Chunk) -> tuple[str, Any]:
    loc = c.parent_locator
    return (c.doc_id, (loc.start, loc.end) if loc is not None else c.parent_id or c.chunk_id)


def expand_prompt_text(snippets: list[dict[str, Any]], chunks: Sequence[Chunk]) -> list[dict[str, Any]]:
    """Add ``prompt_text`` to the snippets (aligned with ``chunks``) whose chunk has a window."""
    if len(snippets) != len(chunks):
        raise ValueError("expand_prompt_text: snippets and chunks must align")
    first: dict[tuple[str, Any], str] = {}
    for snip, c in zip(snippets, chunks, strict=True):
        if not c.window_text or is_restricted(c.sensitivity) or is_restricted(snip.get("sensitivity")):
            continue
        if c.parent_locator is not None and c.parent_locator.doc_id != c.doc_id:
            continue  # a window must be a span of the chunk's own document
        key = _parent_key(c)
        if key in first:
            snip["prompt_text"] = ""
            snip["prompt_text_ref"] = first[key]
        else:
            first[key] = c.chunk_id
            snip["prompt_text"] = c.window_text
    return snippets


def settle_prompt_refs(snippets: list[dict[str, Any]], chunks_by_id: Mapping[str, Chunk]) -> list[dict[str, Any]]:
    """After a post-processor dropped or reordered snippets: a sibling whose
    ``prompt_text_ref`` points at a snippet no longer there (or no longer holding the
    text) takes the parent text itself, and the other siblings point at it."""
    holders = {s.get("chunk_id") for s in snippets if s.get("prompt_text")}
    for s in snippets:
        ref = s.get("prompt_text_ref")
        if ref is None or ref in holders:
            continue
        c = chunks_by_id.get(s.get("chunk_id", ""))
        del s["prompt_text_ref"]
        if c is None or not c.window_text or is_restricted(c.sensitivity) or is_restricted(s.get("sensitivity")):
            s.pop("prompt_text", None)
            continue
        s["prompt_text"] = c.window_text
        holders.add(c.chunk_id)
        for t in snippets:
            if t is not s and t.get("prompt_text_ref") == ref:
                t["prompt_text_ref"] = c.chunk_id
    return snippets
