"""Snippet dicts as the flat metadata every framework object carries, and the last guard.

The three adapters build their own object (a LangChain ``Document``, a LlamaIndex
``TextNode``, a Haystack ``Document``) from the same two things this module gives them:
``open_snippets`` and ``snippet_metadata``. Flat metadata (strings and numbers only,
no nested dicts) because the frameworks' vector stores and prompt templates expect it;
the citation is one readable string (``doc_id chars start-end``) plus the fields it is
made of, so an answer can cite without re-reading the dict.

RESTRICTED: the served index holds no restricted chunk and the engine's exit #2 drops
any before a snippet exists, so ``open_snippets`` should never find one; it is defence in
depth, the same fail-closed test (``sensitivity.is_restricted``) applied once more at the
door where a framework object is made, so that a snippet with a restricted or unreadable
label (over HTTP, from a service this package does not control) never becomes one.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ..sensitivity import is_restricted

# Metadata fields of a snippet, copied as they are (strings and numbers).
PLAIN_FIELDS = ("doc_id", "title", "chunk_id", "library_id", "topic", "entity", "geography", "period", "language",
                "sensitivity", "valid_as_of", "version", "rank", "filters_relaxed")
# What a prompt shows of a snippet's metadata (the rest is lineage and scores, kept for code).
PROMPT_FIELDS = ("citation", "title")


def open_snippets(snippets: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The snippets whose label is open; a missing, odd or restricted label is dropped."""
    return [s for s in snippets if isinstance(s, Mapping) and not is_restricted(s.get("sensitivity"))]


def citation(snippet: Mapping[str, Any]) -> str:
    """``doc_id chars start-end`` (the CLI's cite line), ``doc_id`` alone without a locator."""
    loc = snippet.get("source_locator") or {}
    doc = str(snippet.get("doc_id", ""))
    if "start" in loc and "end" in loc:
        return f"{doc} chars {loc['start']}-{loc['end']}"
    return doc


def char_span(snippet: Mapping[str, Any]) -> tuple[int | None, int | None]:
    """The snippet's ``[start, end)`` character offsets in its source (None when unknown)."""
    loc = snippet.get("source_locator") or {}
    start, end = loc.get("start"), loc.get("end")
    return (start if isinstance(start, int) else None, end if isinstance(end, int) else None)


def snippet_metadata(snippet: Mapping[str, Any], *, library_id: str | None = None) -> dict[str, Any]:
    """Flat metadata of one snippet: the citation, its fields, the locator's offsets and
    source path, and one key per score (``score_fused``, ``score_bm25``, ``score_vector``)."""
    meta: dict[str, Any] = {"citation": citation(snippet)}
    for f in PLAIN_FIELDS:
        if f in snippet:
            meta[f] = snippet[f]
    if library_id and not meta.get("library_id"):
        meta["library_id"] = library_id
    loc = snippet.get("source_locator") or {}
    start, end = char_span(snippet)
    meta["start_char"], meta["end_char"] = start, end
    meta["source_path"] = str(loc.get("source_path", ""))
    scores = snippet.get("scores") or {}
    for name in ("fused", "bm25", "vector"):
        meta[f"score_{name}"] = scores.get(name)
    return meta


def score_of(snippet: Mapping[str, Any]) -> float | None:
    """The rank score a framework object carries: the fused score."""
    fused = (snippet.get("scores") or {}).get("fused")
    return float(fused) if isinstance(fused, (int, float)) else None


__all__ = ["PLAIN_FIELDS", "PROMPT_FIELDS", "char_span", "citation", "open_snippets", "score_of",
           "snippet_metadata"]
