"""MCP tool results as compact text within a character budget.

Why text and not the HTTP API's JSON: agent clients cap what a tool result may cost
(tokens), and indented JSON spent five characters of structure per character of snippet
text (4,393 characters for 3 snippets holding 853). A search result here is, per snippet,
one citation line and the snippet's text (whitespace runs folded, no indentation);
``detail`` adds one line of scores and lineage. Graph rows and the discovery answer are
one compact JSON value per line.

The budget (``ServiceLimits.mcp_result_chars``, documented in docs/service.md) holds for
every result: when the snippets' texts do not fit, each text is cut to an equal share
(short ones keep all of theirs), marked ``…[+N chars]``; when even 200 characters each do
not fit, the last snippets are left out and a closing line says how many. The result is
never longer than the budget.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

MIN_TEXT = 200  # a snippet shown with less text than this is not worth its citation line


def _compact(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)


def _flat(text: Any) -> str:
    return " ".join(str(text or "").split())


def citation_line(rank: int, s: dict[str, Any]) -> str:
    loc = s.get("source_locator") or {}
    flags = []
    if s.get("filters_relaxed"):
        flags.append("filters relaxed: nothing matched them")
    if s.get("route_widened"):
        flags.append("every library searched")
    title = _flat(s.get("title")) or s.get("doc_id", "")
    return (f"[{rank}] {title} | {s.get('doc_id')} chars {loc.get('start')}-{loc.get('end')} | chunk {s.get('chunk_id')}"
            + (f" ({'; '.join(flags)})" if flags else ""))


def detail_line(s: dict[str, Any], versions: dict[str, str]) -> str:
    sc = s.get("scores") or {}
    scores = " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in sc.items() if v is not None)
    loc = s.get("source_locator") or {}
    lib = s.get("library_id") or str(s.get("doc_id", "")).split("/", 1)[0]
    lineage = {"library": lib, "snapshot": versions.get(lib), "source_path": loc.get("source_path"),
               "doc_version": s.get("version"), "parent_id": s.get("parent_id"), "chunker": s.get("chunker")}
    meta = {k: s.get(k) for k in ("entity", "period", "topic", "geography", "language", "valid_as_of")}
    parts = [f"scores: {scores}" if scores else "",
             "lineage: " + " ".join(f"{k}={v}" for k, v in lineage.items() if v not in (None, "")),
             "meta: " + " ".join(f"{k}={v}" for k, v in meta.items() if v not in (None, ""))]
    return " | ".join(p for p in parts if p and not p.endswith(": "))


def _share(lengths: Sequence[int], room: int) -> int:
    """The largest cap c with sum(min(n, c)) <= room (water filling)."""
    lo, hi = 0, max(lengths, default=0)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if sum(min(n, mid) for n in lengths) <= room:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _cut(text: str, cap: int) -> str:
    if len(text) <= cap:
        return text
    mark = f" …[+{len(text) - cap} chars]"
    return text[:max(0, cap - len(mark))].rstrip() + mark


def fit(text: str, budget: int) -> str:
    """The last guard: never more than ``budget`` characters."""
    return text if len(text) <= budget else text[:budget - 1] + "…"


def render_search(out: dict[str, Any], *, detail: bool, budget: int) -> str:
    """A search answer as citation lines and texts within ``budget`` characters."""
    snippets = list(out.get("snippets") or [])
    versions = dict(out.get("versions") or {})
    footer = "versions: " + ", ".join(f"{k}={v}" for k, v in versions.items()) + f" | mode: {out.get('mode')}"
    if out.get("partial"):
        footer += " | partial: shards missing " + ", ".join(out.get("missing_shards") or {})
    if not snippets:
        return fit("No snippet matched.\n" + footer, budget)
    heads = [citation_line(i, s) + ("\n" + detail_line(s, versions) if detail else "")
             for i, s in enumerate(snippets, start=1)]
    texts = [_flat(s.get("text")) for s in snippets]
    shown = len(snippets)
    while True:
        left_out = len(snippets) - shown
        note = (f"\n({left_out} more snippet(s) left out: the result is capped at {budget} characters; ask for "
                "fewer with top_k)") if left_out else ""
        fixed = sum(len(h) + 2 for h in heads[:shown]) + len(footer) + len(note) + 4 * shown
        room = budget - fixed
        if shown == 1 or room >= MIN_TEXT * shown or room >= sum(len(t) for t in texts[:shown]):
            break
        shown -= 1
    cap = _share([len(t) for t in texts[:shown]], max(0, room))
    blocks = [f"{heads[i]}\n{_cut(texts[i], cap)}" for i in range(shown)]
    return fit("\n\n".join(blocks) + "\n\n" + footer + note, budget)


def render_lines(items: Sequence[Any], footer: str, *, budget: int, what: str) -> str:
    """One compact JSON value per line (graph rows), the last ones left out past ``budget``."""
    lines = [_compact(x) for x in items]
    for shown in range(len(lines), -1, -1):
        left_out = len(lines) - shown
        note = f"\n({left_out} more {what} left out: the result is capped at {budget} characters)" if left_out else ""
        text = "\n".join([*lines[:shown], footer]) + note
        if len(text) <= budget:
            return text
    return fit(footer, budget)


def render_shrinking(build: Callable[[int], Any], sizes: Sequence[int], *, budget: int) -> str:
    """Compact JSON of ``build(size)`` for the first size in ``sizes`` that fits the budget
    (a JSON value cut in the middle is unreadable: it is made smaller instead)."""
    text = ""
    for size in sizes:
        text = _compact(build(size))
        if len(text) <= budget:
            return text
    return fit(text, budget)


__all__ = ["MIN_TEXT", "citation_line", "detail_line", "fit", "render_lines", "render_search", "render_shrinking"]
