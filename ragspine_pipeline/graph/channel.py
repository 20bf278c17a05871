"""The graph channel: graph queries as cited answer rows, and a question's graph reading.

Rows are flat dicts an agent (or the CLI's ``--json``) can print: each names its
``channel`` (``graph``), what it is (``kind``), the numbers, and ``citations`` — every one
with ``doc_id``, ``chunk_id``, ``source_locator`` {start, end} and the quoted figure. A row
that would carry a number without a citation is never produced (``rows_of`` refuses).

``GraphChannel.ask(question)`` reads a question deterministically: the metric and the
entities it names (dimension aliases), the period, and the intent (roll-up, peers, trace,
else the figures themselves). ``ask_both`` puts the graph rows beside the narrative
snippets, each labelled with its channel: two independent channels, not a router branch.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from .dimensions import Dimensions
from .extract import _alias_re, period_of
from .queries import (
    Citation,
    FactRow,
    GraphQueryError,
    PeerComparison,
    Rollup,
    Trace,
    compare_peers,
    fact_rows,
    rollup,
    trace,
)
from .store import GraphStore

QUERY_KINDS = ("rollup", "peers", "trace", "facts")
_ROLLUP = re.compile(r"roll[\s-]?up|by subsidiar|subsidiaries|sum of|汇总|合计|各子公司|分子公司|按子公司", re.I)
_PEERS = re.compile(r"compar|peers?\b|versus|\bvs\.?|rank|同业|对比|比较|相比|排名", re.I)
_TRACE = re.compile(r"where does|come from|derive|derivation|trace|how is .* calculated|来源|推导|怎么算|如何计算|出处",
                    re.I)


class UncitedNumberError(AssertionError):
    """A graph answer row carried a number without a citation (a defect, never shown)."""


def citation_dict(c: Citation) -> dict[str, Any]:
    return {"doc_id": c.doc_id, "chunk_id": c.chunk_id, "source_locator": {"start": c.start, "end": c.end},
            "quote": c.quote}


def _fact(kind: str, r: FactRow, **extra: Any) -> dict[str, Any]:
    return {"channel": "graph", "kind": kind, "entity": r.entity, "metric": r.metric, "period": r.period,
            "value": r.value, "unit": r.unit, "citations": [citation_dict(c) for c in r.citations], **extra}


def rows_of(answer: Rollup | PeerComparison | Trace | list[FactRow]) -> list[dict[str, Any]]:
    """Flat cited rows of a graph answer (see the module docstring)."""
    rows: list[dict[str, Any]] = []
    if isinstance(answer, Rollup):
        rows += [_fact("subsidiary_figure", r, parent=answer.parent) for r in answer.rows]
        for t in answer.totals:
            rows.append({"channel": "graph", "kind": "rollup_total", "entity": answer.parent, "metric": answer.metric,
                         "period": answer.period, "value": t.total, "unit": t.unit, "complete": t.complete,
                         "missing": list(t.missing), "consistent_with_reported": t.consistent,
                         "citations": [citation_dict(c) for c in t.citations]})
            rows += [_fact("reported_total", r, consistent=t.consistent) for r in t.reported]
    elif isinstance(answer, PeerComparison):
        rows += [_fact("peer_figure", r, rank=i, subject=r.entity == answer.entity)
                 for i, r in enumerate(answer.rows, start=1)]
    elif isinstance(answer, Trace):
        for role, r in (("numerator", answer.numerator), ("denominator", answer.denominator)):
            if r is not None:
                rows.append(_fact("trace_input", r, role=role, formula=answer.formula))
        if answer.derived is not None and answer.numerator and answer.denominator:
            cites = [*answer.numerator.citations, *answer.denominator.citations]
            rows.append({"channel": "graph", "kind": "derived", "entity": answer.entity, "metric": answer.metric,
                         "period": answer.period, "value": answer.derived, "unit": "%", "tolerance": answer.tolerance,
                         "formula": answer.formula, "citations": [citation_dict(c) for c in cites]})
        rows += [_fact("reported", c.row, consistent=c.consistent, difference=c.difference, tolerance=c.tolerance,
                       flagged=not c.consistent) for c in answer.reported]
    else:
        rows += [_fact("figure", r) for r in answer]
    for r in rows:
        if r.get("value") is not None and not r["citations"]:
            raise UncitedNumberError(f"uncited graph row: {r}")
    return rows


def query_rows(store: GraphStore, kind: str, entity: str, metric: str, period: str) -> list[dict[str, Any]]:
    """One graph query (``rollup`` | ``peers`` | ``trace`` | ``facts``) as cited rows."""
    if kind == "rollup":
        return rows_of(rollup(store, entity, metric, period))
    if kind == "peers":
        return rows_of(compare_peers(store, entity, metric, period))
    if kind == "trace":
        return rows_of(trace(store, entity, metric, period))
    if kind == "facts":
        return rows_of(fact_rows(store, entity, metric, period))
    raise GraphQueryError(f"unknown graph query {kind!r}; expected one of {QUERY_KINDS}")


@dataclass(frozen=True)
class GraphReading:
    """What a question asks of the graph (empty ``metric`` or ``entities``: nothing)."""

    kind: str
    metric: str
    entities: tuple[str, ...]
    period: str


class GraphChannel:
    """Questions answered from one library's relation graph (rows cite; none when unreadable)."""

    def __init__(self, store: GraphStore, dims: Dimensions, *, default_period: str = "") -> None:
        self.store = store
        self.dims = dims
        self.default_period = default_period
        self._ent, self._ent_map = _alias_re((a, e.id) for e in dims.entities
                                             for a in (*e.aliases, e.name_en, e.name_zh, e.id) if a)
        self._met, self._met_map = _alias_re((a, m.id) for m in dims.metrics
                                             for a in (*m.aliases, m.name_en, m.name_zh, m.id) if a)

    def read(self, question: str) -> GraphReading:
        ents = tuple(dict.fromkeys(self._ent_map[m.group(0).lower()] for m in self._ent.finditer(question)))
        mets = [self._met_map[m.group(0).lower()] for m in self._met.finditer(question)]
        kind = ("trace" if _TRACE.search(question) else "rollup" if _ROLLUP.search(question)
                else "peers" if _PEERS.search(question) else "facts")
        return GraphReading(kind, mets[0] if mets else "", ents, period_of(question) or self.default_period)

    def ask(self, question: str) -> list[dict[str, Any]]:
        r = self.read(question)
        if not r.metric or not r.entities or not r.period:
            return []
        out: list[dict[str, Any]] = []
        for ent in r.entities if r.kind == "facts" else r.entities[:1]:
            # e.g. a roll-up of an entity without subsidiaries: then its own figures
            for kind in dict.fromkeys((r.kind, "facts")):
                try:
                    out += query_rows(self.store, kind, ent, r.metric, r.period)
                    break
                except GraphQueryError:
                    continue
        return out


def ask_both(question: str, narrative: Any, graph: GraphChannel | None, *, filters: Any = None,
             top_k: int = 5) -> dict[str, list[dict[str, Any]]]:
    """``{"graph": rows, "narrative": snippets}``, every item labelled with its ``channel``."""
    snippets = [{**s, "channel": "narrative"} for s in narrative.retrieve(question, filters=filters, top_k=top_k)]
    return {"graph": graph.ask(question) if graph is not None else [], "narrative": snippets}
