"""Snippet dicts as text for people: the CLI's plain output, the ``ask`` job's markdown
and the demo's printout share these, so a snippet reads the same wherever it is shown.

Formatting only: it never changes a snippet, and it reads nothing but the dict.
"""

from __future__ import annotations

import re
from typing import Any

_CJK = re.compile(r"[\u3000-\u9fff\uac00-\ud7af\uf900-\ufaff\uff00-\uffef]")


def preview(text: str, width: int = 220) -> str:
    """``text`` on one line, at most ``width`` characters; cut at a word boundary when the
    text is spaced (English …), at the character for CJK, which has no spaces."""
    flat = " ".join(text.split())
    if len(flat) <= width:
        return flat
    cut = flat[:width]
    space = cut.rfind(" ")
    if space > width // 2 and not _CJK.search(flat[width - 1: width + 1]):
        cut = cut[:space]
    return cut.rstrip() + " …"


def snippet_channels(s: dict[str, Any]) -> str:
    """Which channels served a snippet: bm25 when it matched lexically, dense when the
    vector channel ran for it."""
    sc = s.get("scores", {})
    used = [name for name, on in (("bm25", (sc.get("bm25") or 0) > 0), ("dense", sc.get("vector") is not None)) if on]
    return "+".join(used) or "none"


def also_in(s: dict[str, Any]) -> str:
    """The other documents holding the same passage (``duplicates``), as one short list."""
    docs = list(dict.fromkeys(d["doc_id"] for d in s.get("duplicates") or ()))
    return ", ".join(docs[:5]) + (f" (+{len(docs) - 5} more)" if len(docs) > 5 else "")


def where_in_file(loc: dict[str, Any]) -> str:
    """The file-side part of a locator for people: `` p. 3-4`` (PDF pages), `` para 2``
    (a Word paragraph), `` table 0 row 1`` or `` at html > body > p:nth-of-type(2)``; ""
    for a .md/.txt span, which indexes the file itself."""
    pages = [p["page"] for p in loc.get("pages") or ()]
    if pages:
        return f" p. {pages[0]}" + (f"-{pages[-1]}" if pages[-1] != pages[0] else "")
    blocks = loc.get("blocks") or ()
    if blocks:
        b = blocks[0]
        return f" para {b['paragraph']}" if "paragraph" in b else f" table {b.get('table')} row {b.get('row')}"
    return f" at {loc['element']}" if loc.get("element") else ""


def format_snippet(s: dict[str, Any], width: int = 220) -> str:
    """A snippet as four lines of plain text: rank and title, citation, scores, preview
    (and a fifth naming the other documents with the same passage, when there are some)."""
    loc = s["source_locator"]
    sc = s["scores"]
    vec = "" if sc["vector"] is None else f" vector={sc['vector']:.3f}"
    meta = " ".join(f"{k}={s[k]}" for k in ("entity", "period", "topic", "language") if s.get(k))
    return (f"[{s['rank']}] {s['title']}\n"
            f"    cite: {s['doc_id']} chars {loc['start']}-{loc['end']}{where_in_file(loc)} (v{s['version']}, {s['sensitivity']}; {meta})\n"
            f"    score: fused={sc['fused']:.4f} bm25={sc['bm25']:.3f}{vec}  channels={snippet_channels(s)}"
            f"{'  [filters relaxed: no match under the filter]' if s.get('filters_relaxed') else ''}"
            f"{'  [every library searched: the routed ones had no match]' if s.get('route_widened') else ''}\n"
            f"    {preview(s['text'], width)}"
            f"{chr(10) + '    also in: ' + also_in(s) if s.get('duplicates') else ''}")


def snippet_markdown(s: dict[str, Any], width: int = 300) -> str:
    """A snippet as one markdown list item (the ``ask`` job's answer in the Dagster UI)."""
    loc = s["source_locator"]
    return (f"{s['rank']}. **{s['title']}** — `{s['doc_id']}` chars {loc['start']}–{loc['end']}{where_in_file(loc)} "
            f"(v{s['version']}, {s['sensitivity']}, fused {s['scores']['fused']:.4f}, "
            f"{snippet_channels(s)}{', filters relaxed' if s.get('filters_relaxed') else ''}"
            f"{', also in ' + also_in(s) if s.get('duplicates') else ''})  \n"
            f"   {preview(s['text'], width)}")


__all__ = ["also_in", "format_snippet", "preview", "snippet_channels", "snippet_markdown", "where_in_file"]
