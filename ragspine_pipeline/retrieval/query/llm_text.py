"""Calling the LLM for a query layer, and reading its answer defensively.

Query-layer prompts carry only the user's question (never a snippet), so no RESTRICTED
text can reach the model through them. A provider error, a non-string answer or an
answer with nothing usable in it is a ``LayerFailure`` the pipeline reports as
``degraded`` and steps around (the plain path); it never escapes to the caller.
"""

from __future__ import annotations

import json
import re
from typing import Any

from ...llm.provider import LLMProvider

_BULLET = re.compile(r"^\s*(?:[-*•·]+|\(?\d{1,2}[.)、:：]|\d{1,2}\s*[-–])\s*")
MAX_LINE_CHARS = 500


class LayerFailure(RuntimeError):
    """An LLM-backed layer got no usable answer; the pipeline degrades past it."""


def require_provider(provider: Any, layer: str) -> LLMProvider:
    if provider is None or not callable(getattr(provider, "chat", None)):
        raise TypeError(f"{layer} needs an LLMProvider with chat(messages, **options) -> str "
                        f"(got {type(provider).__name__})")
    return provider


def ask(provider: LLMProvider, system: str, user: str, *, max_tokens: int = 256) -> str:
    """One chat call; any failure becomes a LayerFailure."""
    try:
        out = provider.chat([{"role": "system", "content": system}, {"role": "user", "content": user}],
                            temperature=0, max_tokens=max_tokens)
    except Exception as exc:  # noqa: BLE001 - any provider failure degrades the layer
        raise LayerFailure(f"{type(exc).__name__}: {str(exc)[:200]}") from None
    if not isinstance(out, str) or not out.strip():
        raise LayerFailure("empty or non-string answer")
    return out


def parse_lines(text: str, *, limit: int) -> list[str]:
    """Items of a list answer: a JSON list of strings, or one item per line (bullets and
    numbering stripped). Items that are empty, too long or repeated are left out."""
    items: list[Any]
    stripped = text.strip()
    try:
        parsed = json.loads(stripped)
        items = parsed if isinstance(parsed, list) else [stripped]
    except json.JSONDecodeError:
        items = stripped.splitlines()
    out: list[str] = []
    for item in items:
        if not isinstance(item, str):
            continue
        line = _BULLET.sub("", item).strip().strip('"').strip()
        if not line or len(line) > MAX_LINE_CHARS or line in out:
            continue
        out.append(line)
        if len(out) >= limit:
            break
    return out
