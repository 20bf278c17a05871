"""The relation extractor slot: relations that exist only in narrative text.

Beside ``build_graph`` (controlled dimensions + cited metric facts), an opt-in extractor
adds edges between the graph's entities that the dimensions do not declare. Chosen by
``make_relation_extractor(spec)`` or ``RAGSPINE_RELATION_EXTRACTOR``:

* ``none`` (the default): nothing is added, the graph is byte-identical to the base one;
* ``cooccurrence``: deterministic ``co_occurs_with`` edges between two entities named in
  one served chunk, with clean provenance (the chunk ids and doc ids where both appear);
* ``llm`` (``[llm]``, over ``LLMProvider.chat``): the model proposes relations between
  entities named in a chunk; every edge is stamped ``model_derived: true, verified:
  false``, both endpoint names pass the ``SecurityGate`` (a competitor is refused), and a
  RESTRICTED chunk's text is never put into a prompt (checked here again, fail closed).

Why a slot and not a default: such edges are not cited numbers, so they never feed a
roll-up, a peer comparison or a trace; they are context for multi-hop exploration.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from .. import settings
from ..llm.provider import provider_from_env
from ..retrieval.query.gate import SecurityGate
from ..sensitivity import is_restricted
from .dimensions import Dimensions
from .extract import _alias_re
from .store import GraphStore

EXTRACTOR_ENV = "RAGSPINE_RELATION_EXTRACTOR"
EXTRACTORS = ("none", "cooccurrence", "llm")
CO_OCCURS = "co_occurs_with"
LLM_RELATION = "llm_relation"
_LABEL = re.compile(r"^[a-z][a-z_]{0,39}$")


class RelationExtractorError(ValueError):
    """An unknown extractor spec, or ``llm`` without a provider."""


@dataclass(frozen=True)
class RelationEdge:
    src: str
    dst: str
    type: str
    attrs: dict[str, Any]


@runtime_checkable
class RelationExtractor(Protocol):
    name: str

    def extract(self, chunks: Sequence[Any], dims: Dimensions) -> list[RelationEdge]: ...


def _served(chunks: Sequence[Any]) -> list[Any]:
    """Chunks whose text may be read: never a RESTRICTED (or oddly labelled) one."""
    return sorted((c for c in chunks if not is_restricted(getattr(c, "sensitivity", None))),
                  key=lambda c: (c.doc_id, c.source_locator.start, c.chunk_id))


class _EntityFinder:
    def __init__(self, dims: Dimensions) -> None:
        self._re, self._map = _alias_re((a, e.id) for e in dims.entities
                                        for a in (*e.aliases, e.name_en, e.name_zh) if a)

    def __call__(self, text: str) -> list[str]:
        return sorted({self._map[m.group(0).lower()] for m in self._re.finditer(text)})

    def resolve(self, name: str) -> str | None:
        m = self._re.fullmatch(name.strip())
        return self._map[m.group(0).lower()] if m else None


@dataclass
class CooccurrenceExtractor:
    """Two entities named in one chunk: a ``co_occurs_with`` edge (each direction once, a<b)."""

    name: str = "cooccurrence"

    def extract(self, chunks: Sequence[Any], dims: Dimensions) -> list[RelationEdge]:
        find = _EntityFinder(dims)
        seen: dict[tuple[str, str], list[Any]] = {}
        for c in _served(chunks):
            ents = find(c.text)
            for i, a in enumerate(ents):
                for b in ents[i + 1:]:
                    seen.setdefault((a, b), []).append(c)
        return [RelationEdge(f"entity:{a}", f"entity:{b}", CO_OCCURS, {
            "extractor": self.name, "chunks": [c.chunk_id for c in cs],
            "doc_ids": sorted({c.doc_id for c in cs}), "count": len(cs)}) for (a, b), cs in sorted(seen.items())]


RELATION_PROMPT = (
    "You extract relations between named organisations from one passage of a company report. "
    "Answer with JSON only: a list of objects {\"src\": name, \"relation\": snake_case_label, \"dst\": name}, "
    "names exactly as written in the passage; [] when there is none.")


@dataclass
class LLMRelationExtractor:
    """Relations proposed by a model, stamped unverified; the gate checks both endpoints.

    Only chunks naming at least one known entity are sent (no prompt is wasted on, and no
    text leaves for, passages the graph cannot attach to). A provider error or a reply
    that is not the expected JSON drops that chunk's edges (counted in ``report``).
    """

    provider: Any
    gate: Any = None
    model: str = ""
    max_chunks: int = 200
    name: str = "llm"
    report: dict[str, Any] = field(default_factory=dict)

    def _gate(self) -> Any:
        if self.gate is None:
            self.gate = SecurityGate.from_env()
        return self.gate

    def extract(self, chunks: Sequence[Any], dims: Dimensions) -> list[RelationEdge]:
        find = _EntityFinder(dims)
        gate = self._gate()
        model = self.model or str(getattr(self.provider, "model", "") or type(self.provider).__name__)
        self.report = {"sent": 0, "failed": 0, "refused": [], "unknown_endpoints": 0}
        edges: dict[tuple[str, str, str], dict[str, Any]] = {}
        for c in _served(chunks):
            if self.report["sent"] >= self.max_chunks:
                break
            if is_restricted(getattr(c, "sensitivity", None)) or not find(c.text):
                continue  # (restricted chunks were removed above; checked again at the prompt)
            self.report["sent"] += 1
            try:
                reply = self.provider.chat([{"role": "system", "content": RELATION_PROMPT},
                                            {"role": "user", "content": c.text}], temperature=0)
                items = json.loads(reply)
                if not isinstance(items, list):
                    raise ValueError("not a list")
            except Exception:  # noqa: BLE001 - a failed chunk adds nothing, the build goes on
                self.report["failed"] += 1
                continue
            for it in items:
                if not isinstance(it, dict) or not all(isinstance(it.get(k), str) for k in ("src", "relation", "dst")):
                    continue
                label = it["relation"].strip().lower()
                refused = [r for r in (gate.check_text(it["src"], "graph_endpoint"),
                                       gate.check_text(it["dst"], "graph_endpoint")) if r is not None]
                if refused:
                    self.report["refused"].extend(r.to_dict() for r in refused)
                    continue
                a, b = find.resolve(it["src"]), find.resolve(it["dst"])
                if a is None or b is None or a == b or not _LABEL.match(label):
                    self.report["unknown_endpoints"] += 1
                    continue
                e = edges.setdefault((a, b, label), {"extractor": self.name, "relation": label,
                                                     "model_derived": True, "verified": False, "model": model,
                                                     "chunks": [], "doc_ids": []})
                e["chunks"].append(c.chunk_id)
                e["doc_ids"] = sorted({*e["doc_ids"], c.doc_id})
        return [RelationEdge(f"entity:{a}", f"entity:{b}", LLM_RELATION, attrs)
                for (a, b, _), attrs in sorted(edges.items())]


def make_relation_extractor(spec: str | None = None, *, provider: Any = None,
                            gate: Any = None) -> RelationExtractor | None:
    """``none`` | ``cooccurrence`` | ``llm`` (``spec``, else ``RAGSPINE_RELATION_EXTRACTOR``);
    None for ``none``. ``llm`` uses ``provider``, else the service LLM (``RAGSPINE_LLM_BASE_URL``)."""
    choice = ((spec.strip().lower() or "none") if spec is not None
              else settings.get(EXTRACTOR_ENV, error=RelationExtractorError))
    if choice in ("none", "off"):
        return None
    if choice == "cooccurrence":
        return CooccurrenceExtractor()
    if choice == "llm":
        if provider is None:
            provider = provider_from_env()
        if provider is None:
            raise RelationExtractorError(f"{EXTRACTOR_ENV}=llm needs an LLM provider (set RAGSPINE_LLM_BASE_URL)")
        return LLMRelationExtractor(provider, gate=gate)
    raise RelationExtractorError(f"unknown relation extractor {choice!r} ({EXTRACTOR_ENV}); expected one of "
                                 f"{EXTRACTORS}")


def add_relations(store: GraphStore, edges: Sequence[RelationEdge]) -> int:
    """Add extracted edges whose endpoints are in the graph; returns how many were added."""
    n = 0
    for e in edges:
        if store.node(e.src) is not None and store.node(e.dst) is not None:
            store.add_edge(e.src, e.dst, e.type, e.attrs)
            n += 1
    return n
