"""What a caller may filter on and ask the graph about: the discovery answer and the
examples of the MCP tool descriptions, built from the served corpus in the caller's scope.

Why from the served snapshot and nothing else: the served index holds open chunks only
(``LibrarySnapshot``: no RESTRICTED or withheld chunk; the catalog's redacted view keeps
the same allow-list), the relation graph is built from served chunks only
(``graph.build``), and the values are counted over chunks that ``sensitivity.is_restricted``
passes (checked again here, fail closed), as ``filter_input.check_filter_values`` already
shows them in its errors. So the answer is the same whether restricted documents exist or
what they say (``tests/test_service_mcp_discovery.py`` compares both worlds).

A library's profile (values and document counts per field, graph terms) is computed once
per published snapshot and cached on it: an immutable snapshot has one answer. A scope's
answer sums its libraries' profiles (document ids carry their library, so no document is
counted twice).
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..filter_input import hybrid_retrievers
from ..retrieval.hybrid.retriever import FILTER_FIELDS
from ..sensitivity import is_restricted

TOP_VALUES = 10  # values shown per field
MAX_TERMS = 50  # entities / metrics shown
ID_FIELDS = ("doc_id", "chunk_id", "parent_id", "title")  # one value per document or chunk: counted, not listed
HIDDEN_FIELDS = ("sensitivity",)  # an access label, not content: never offered as a filter here
_TYPES = {str: "string", int: "integer", float: "number"}


@dataclass(frozen=True)
class Profile:
    """One library's (or a scope's) filterable values and graph terms."""

    values: dict[str, Counter] = field(default_factory=dict)  # field -> value -> open documents
    entities: Counter = field(default_factory=Counter)  # entity id -> cited facts
    metrics: Counter = field(default_factory=Counter)
    periods: Counter = field(default_factory=Counter)
    names: dict[str, str] = field(default_factory=dict)  # entity/metric id -> English name

    def merged(self, other: Profile) -> Profile:
        values = {f: self.values.get(f, Counter()) + other.values.get(f, Counter())
                  for f in {*self.values, *other.values}}
        return Profile(values, self.entities + other.entities, self.metrics + other.metrics,
                       self.periods + other.periods, {**self.names, **other.names})

    def top(self, name: str, n: int = TOP_VALUES) -> list[Any]:
        """The ``n`` values of ``name`` most documents have (ties by value)."""
        counts = self.values.get(name, Counter())
        return [v for v, _ in sorted(counts.items(), key=lambda kv: (-kv[1], str(kv[0])))[:n]]


def chunk_profile(chunks: Iterable[Any]) -> dict[str, Counter]:
    """field -> value -> open documents having it, over ``chunks`` (restricted ones skipped)."""
    seen: set[tuple[str, Any, str]] = set()
    for c in chunks:
        if is_restricted(getattr(c, "sensitivity", None)):
            continue
        doc = str(getattr(c, "doc_id", ""))
        for name in FILTER_FIELDS:
            if name in HIDDEN_FIELDS:
                continue
            v = getattr(c, name, None)
            if v not in (None, "") and isinstance(v, (str, int, float)):
                seen.add((name, v, doc))
    values: dict[str, Counter] = {}
    for name, v, _ in seen:
        values.setdefault(name, Counter())[v] += 1
    return values


def graph_profile(channel: Any) -> tuple[Counter, Counter, Counter, dict[str, str]]:
    """Entities, metrics and periods with cited facts in a library's graph (a dimension
    with no figure in this library is not offered), and their English names."""
    entities, metrics, periods = Counter(), Counter(), Counter()
    names: dict[str, str] = {}
    if channel is None:
        return entities, metrics, periods, names
    store = channel.store
    for _, attrs in store.nodes("fact"):
        for counter, key in ((entities, "entity"), (metrics, "metric"), (periods, "period")):
            v = attrs.get(key)
            if isinstance(v, str) and v:
                counter[v] += 1
    for kind, counter in (("entity", entities), ("metric", metrics)):
        for term in counter:
            node = store.node(f"{kind}:{term}") or {}
            if isinstance(node.get("name_en"), str) and node["name_en"]:
                names[term] = node["name_en"]
    return entities, metrics, periods, names


_lock = threading.Lock()


def library_profile(snapshot: Any, root: Path) -> Profile:
    """The profile of one served library snapshot (computed once, cached on it)."""
    cached = getattr(snapshot, "_profile", None)
    if cached is not None:
        return cached
    with _lock:
        cached = getattr(snapshot, "_profile", None)
        if cached is not None:
            return cached
        retriever = next(iter(snapshot.retrievers.values()), None)
        chunks = (c for h in hybrid_retrievers(retriever) for c in h.chunks) if retriever is not None else ()
        entities, metrics, periods, names = graph_profile(snapshot.graph(root))
        profile = Profile(chunk_profile(chunks), entities, metrics, periods, names)
        snapshot._profile = profile
        return profile


def scope_profile(gen: Any, libraries: Sequence[str]) -> Profile:
    out = Profile()
    for lib in libraries:
        out = out.merged(library_profile(gen.libraries[lib], gen.assembly.root))
    return out


def _terms(counter: Counter, names: dict[str, str]) -> list[dict[str, Any]]:
    ranked = sorted(counter.items(), key=lambda kv: (-kv[1], kv[0]))[:MAX_TERMS]
    return [{"id": t, "name": names.get(t), "facts": n} for t, n in ranked]


def describe(gen: Any, libraries: Sequence[str]) -> dict[str, Any]:
    """The discovery answer (``GET /v1/discover``, the ``discover`` tool) over ``libraries``
    (already checked against the caller's scope)."""
    p = scope_profile(gen, libraries)
    fields: dict[str, Any] = {}
    for name, kind in FILTER_FIELDS.items():
        if name in HIDDEN_FIELDS:
            continue
        counts = p.values.get(name, Counter())
        top = [] if name in ID_FIELDS else [{"value": v, "documents": counts[v]} for v in p.top(name)]
        fields[name] = {"type": _TYPES.get(kind, "string"), "distinct": len(counts), "top_values": top}
    return {"libraries": [gen.libraries[lib].describe() for lib in libraries],
            "fields": fields, "entities": _terms(p.entities, p.names), "metrics": _terms(p.metrics, p.names),
            "periods": sorted(p.periods, reverse=True)[:MAX_TERMS]}


__all__ = ["HIDDEN_FIELDS", "ID_FIELDS", "MAX_TERMS", "TOP_VALUES", "Profile", "chunk_profile", "describe",
           "graph_profile", "library_profile", "scope_profile"]
