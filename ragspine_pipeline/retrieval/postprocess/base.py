"""Shared pieces of the post-processors: lineage marking and the chain.

Every post-processor works on copies: the snippet dicts the retriever built are never
mutated, and ``text`` plus every reference field (doc_id, chunk_id, source_locator,
rank, scores, metadata) are carried over unchanged. Each snippet a layer touched lists
that layer's name in ``layers`` (in the order they ran), so an answer can say which
layers shaped its context.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from ...sensitivity import is_restricted

LAYERS_KEY = "layers"


@runtime_checkable
class Postprocessor(Protocol):
    """Reorders/trims snippets, or adds ``prompt_text``; never sees restricted text.

    It lives here, beside the chain, so the link layer (which runs one per index) and the
    query layers (which run one after fusion) both import it downwards.
    """

    def process(self, query: str, snippets: list[dict[str, Any]]) -> list[dict[str, Any]]: ...


def mark_layer(snippet: dict[str, Any], name: str, **updates: Any) -> dict[str, Any]:
    """A copy of ``snippet`` with ``name`` appended to its ``layers`` and ``updates`` set."""
    out = dict(snippet)
    out[LAYERS_KEY] = [*snippet.get(LAYERS_KEY, []), name]
    out.update(updates)
    return out


@dataclass
class PostprocessorChain:
    """Runs post-processors in the given order; a RESTRICTED snippet is dropped before
    the first step and after every step (defence in depth: no step can reintroduce one)."""

    steps: Sequence[Any]

    def __post_init__(self) -> None:
        self.steps = tuple(self.steps)
        for s in self.steps:
            if not callable(getattr(s, "process", None)):
                raise TypeError(f"{type(s).__name__} is not a Postprocessor: it needs process(query, snippets)")

    @property
    def names(self) -> list[str]:
        return [getattr(s, "name", type(s).__name__) for s in self.steps]

    def process(self, query: str, snippets: list[dict[str, Any]]) -> list[dict[str, Any]]:
        out = [s for s in snippets if not is_restricted(s.get("sensitivity"))]
        for step in self.steps:
            out = [s for s in step.process(query, out) if not is_restricted(s.get("sensitivity"))]
        return out
