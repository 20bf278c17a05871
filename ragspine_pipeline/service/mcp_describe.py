"""MCP tool descriptions written for the caller's own corpus.

Why per caller and per request: an agent learns what to send from the tool list, so the
examples must be values that exist in the libraries its key may read (``discovery.py``:
open, published data only), never a fixed demo's (an agent on another corpus was shown
companies that did not exist there). ``tools/list`` is answered per request
(``RagspineMCP._handle_list_tools``): the static descriptions carry no example, and this
module adds the caller's (library ids, field values, entities, metrics, periods) to the
tool descriptions and to their parameters' descriptions.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Sequence
from typing import Any

from .discovery import Profile

# The fields whose values make useful examples, in the order they are offered.
EXAMPLE_FIELDS = ("entity", "period", "topic", "geography", "language")
SHOWN = 3  # example values per field


def _quoted(values: Sequence[Any]) -> str:
    return ", ".join(json.dumps(v, ensure_ascii=False) for v in values)


def filter_example(profile: Profile) -> str:
    """A filter built from the corpus's own values (empty when no field has a value)."""
    for name in EXAMPLE_FIELDS:
        top = profile.top(name, 1)
        if top:
            return json.dumps({name: top[0]}, ensure_ascii=False)
    return ""


def fields_line(profile: Profile) -> str:
    parts = []
    for name in EXAMPLE_FIELDS:
        top = profile.top(name, SHOWN)
        if top:
            parts.append(f"{name} (e.g. {_quoted(top)})")
    return ("Values in your libraries: " + "; ".join(parts) + ". ") if parts else ""


def _terms(counter: Any, n: int = SHOWN) -> list[str]:
    return [t for t, _ in sorted(counter.items(), key=lambda kv: (-kv[1], kv[0]))[:n]]


def describe_tools(tools: Sequence[Any], profile: Profile | None, libraries: Sequence[str],
                   graph_libraries: Sequence[str]) -> list[Any]:
    """Copies of the SDK's ``Tool`` objects with the caller's examples added; ``profile``
    None (still loading, or nothing readable): the static descriptions as they are."""
    if profile is None:
        return list(tools)
    libs = ", ".join(libraries) or "none"
    example = filter_example(profile)
    entities, metrics, periods = _terms(profile.entities), _terms(profile.metrics), _terms(profile.periods)
    params = {
        "libraries": f"Your libraries: {libs}.",
        "filters": (f"Example: {example}. " if example else "") + fields_line(profile),
        "entity": f"Entities with figures: {_quoted(entities)}." if entities else "No entity has figures here.",
        "metric": f"Metrics with figures: {_quoted(metrics)}." if metrics else "No metric has figures here.",
        "period": f"Periods with figures: {_quoted(periods)}." if periods else "",
    }
    out = []
    for tool in tools:
        extra = ""
        if tool.name == "search":
            extra = f" Your libraries: {libs}. " + fields_line(profile) + (f"Filter example: {example}." if example
                                                                          else "")
        elif tool.name.startswith("graph_"):
            extra = (f" Libraries with a relation graph: {', '.join(graph_libraries)}." if graph_libraries
                     else " No library you may read has a relation graph: this tool answers no row.")
            if entities and metrics:
                extra += f" e.g. entity {json.dumps(entities[0])}, metric {json.dumps(metrics[0])}" + (
                    f", period {json.dumps(periods[0])}." if periods else ".")
        schema = copy.deepcopy(tool.input_schema)
        for name, prop in (schema.get("properties") or {}).items():
            if params.get(name):
                prop["description"] = (prop.get("description", "") + " " + params[name]).strip()
        out.append(tool.model_copy(update={"description": (tool.description or "") + extra,
                                           "input_schema": schema}))
    return out


__all__ = ["EXAMPLE_FIELDS", "describe_tools", "fields_line", "filter_example"]
