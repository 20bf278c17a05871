"""Graph queries: subsidiary roll-up, peer comparison, derivation trace.

Every number in an answer cites: a reported figure cites its own span, a sum or a
derived ratio cites every input it was computed from. No currency conversion is ever
done (there is no cited rate), so a roll-up sums per unit. Queries see the graph only
through ``GraphStore``, so every store gives the same answer.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from .store import GraphStore

FACT_FIELDS = ("entity", "metric", "period", "kind", "value", "unit", "precision", "quote", "doc_id", "chunk_id",
               "start", "end", "segment")


class GraphQueryError(ValueError):
    """The query names an entity or metric the graph does not hold."""


@dataclass(frozen=True)
class Citation:
    doc_id: str
    chunk_id: str
    start: int
    end: int
    quote: str


@dataclass(frozen=True)
class FactRow:
    """One reported figure and every span that states it."""

    entity: str
    metric: str
    period: str
    value: float
    unit: str
    precision: float
    citations: tuple[Citation, ...]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class RollupTotal:
    unit: str
    total: float
    precision: float
    complete: bool  # every subsidiary has a figure in this unit
    missing: tuple[str, ...]
    reported: tuple[FactRow, ...]  # the parent's own figures in this unit
    consistent: bool | None  # reported vs total within the stated precision; None if nothing reported
    citations: tuple[Citation, ...]


@dataclass(frozen=True)
class Rollup:
    parent: str
    metric: str
    period: str
    rows: tuple[FactRow, ...]
    totals: tuple[RollupTotal, ...]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class PeerComparison:
    entity: str
    metric: str
    period: str
    rows: tuple[FactRow, ...]  # highest value first, the entity among them
    rank: int | None  # 1-based rank of ``entity`` in rows, None if it has no figure

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class ReportedCheck:
    row: FactRow
    difference: float  # reported - derived, in the metric's unit
    tolerance: float
    consistent: bool


@dataclass(frozen=True)
class Trace:
    entity: str
    metric: str
    period: str
    formula: str
    numerator: FactRow | None
    denominator: FactRow | None
    derived: float | None
    tolerance: float | None
    reported: tuple[ReportedCheck, ...] = field(default_factory=tuple)
    inconsistent: bool = False
    reason: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _require(store: GraphStore, node_id: str) -> None:
    if store.node(node_id) is None:
        raise GraphQueryError(f"the relation graph has no {node_id}")


def facts(store: GraphStore, entity: str, metric: str, period: str, kind: str = "value",
          segment: str = "") -> list[dict[str, Any]]:
    """Fact attributes of (entity, metric, period, kind, segment), in (doc_id, start) order."""
    _require(store, f"entity:{entity}")
    _require(store, f"metric:{metric}")
    out = []
    for e in store.in_edges(f"entity:{entity}", "fact_of"):
        a = store.node(e.src) or {}
        if a.get("metric") == metric and a.get("period") == period and a.get("kind") == kind \
                and a.get("segment", "") == segment:
            out.append({k: a[k] for k in FACT_FIELDS})
    return sorted(out, key=lambda a: (a["doc_id"], a["start"], a["chunk_id"]))


def fact_rows(store: GraphStore, entity: str, metric: str, period: str) -> list[FactRow]:
    """Distinct reported (value, unit) figures, each with all the spans that state it."""
    groups: dict[tuple[float, str], list[dict[str, Any]]] = {}
    for a in facts(store, entity, metric, period):
        groups.setdefault((a["value"], a["unit"]), []).append(a)
    rows = [FactRow(entity, metric, period, v, u, min(x["precision"] for x in g),
                    tuple(Citation(x["doc_id"], x["chunk_id"], x["start"], x["end"], x["quote"]) for x in g))
            for (v, u), g in groups.items()]
    return sorted(rows, key=lambda r: (r.unit, r.citations[0].doc_id, r.citations[0].start))


def _first_per_unit(rows: list[FactRow]) -> dict[str, FactRow]:
    out: dict[str, FactRow] = {}
    for r in rows:
        out.setdefault(r.unit, r)
    return out


def rollup(store: GraphStore, parent: str, metric: str, period: str) -> Rollup:
    """Sum a metric over ``parent``'s direct subsidiaries, per unit, against the parent's own figure."""
    _require(store, f"entity:{parent}")
    children = sorted(e.src.split(":", 1)[1] for e in store.in_edges(f"entity:{parent}", "subsidiary_of"))
    if not children:
        raise GraphQueryError(f"{parent} has no subsidiaries in the relation graph")
    per_child = {c: _first_per_unit(fact_rows(store, c, metric, period)) for c in children}
    rows = tuple(r for c in children for r in per_child[c].values())
    reported = fact_rows(store, parent, metric, period)
    totals = []
    for unit in sorted({r.unit for r in rows}):
        have = [per_child[c][unit] for c in children if unit in per_child[c]]
        total = sum(r.value for r in have)
        prec = sum(r.precision for r in have)
        mine = tuple(r for r in reported if r.unit == unit)
        missing = tuple(c for c in children if unit not in per_child[c])
        consistent = None
        if mine and not missing:
            consistent = all(abs(r.value - total) <= prec + r.precision for r in mine)
        totals.append(RollupTotal(unit, round(total, 6), prec, not missing, missing, mine, consistent,
                                  tuple(c for r in have for c in r.citations[:1])))
    return Rollup(parent, metric, period, rows, tuple(totals))


def compare_peers(store: GraphStore, entity: str, metric: str, period: str) -> PeerComparison:
    """``entity`` and its declared peers on one metric, highest first (one unit: the entity's)."""
    _require(store, f"entity:{entity}")
    peers = sorted({e.dst.split(":", 1)[1] for e in store.out_edges(f"entity:{entity}", "peer_of")})
    if not peers:
        raise GraphQueryError(f"{entity} has no peers in the relation graph")
    mine = fact_rows(store, entity, metric, period)
    unit = mine[0].unit if mine else None
    rows: list[FactRow] = list(mine[:1])
    for p in peers:
        theirs = [r for r in fact_rows(store, p, metric, period) if unit is None or r.unit == unit]
        if theirs:
            rows.append(theirs[0])
            unit = unit or theirs[0].unit
    rows.sort(key=lambda r: (-r.value, r.entity))
    rank = next((i + 1 for i, r in enumerate(rows) if r.entity == entity), None)
    return PeerComparison(entity, metric, period, tuple(rows), rank)


def trace(store: GraphStore, entity: str, metric: str, period: str) -> Trace:
    """A derived metric back to its cited inputs; flags a reported figure that disagrees.

    The tolerance is interval arithmetic on the stated precision of each input (half a
    unit of its last digit) plus the reported figure's own rounding, so a correctly
    rounded figure never flags and a real disagreement always does.
    """
    _require(store, f"metric:{metric}")
    parts = {e.attrs.get("role"): e.dst.split(":", 1)[1] for e in store.out_edges(f"metric:{metric}", "derived_from")}
    if {"numerator", "denominator"} - parts.keys():
        raise GraphQueryError(f"metric {metric} has no derivation in the relation graph")
    num_m, den_m = parts["numerator"], parts["denominator"]
    formula = f"{metric} = {num_m} / {den_m} × 100"
    reported_rows = [r for r in fact_rows(store, entity, metric, period) if r.unit == "%"]
    nums = _first_per_unit(fact_rows(store, entity, num_m, period))
    dens = _first_per_unit(fact_rows(store, entity, den_m, period))
    unit = next((u for u in sorted(nums) if u in dens), None)
    if unit is None:
        return Trace(entity, metric, period, formula, next(iter(nums.values()), None),
                     next(iter(dens.values()), None), None, None,
                     tuple(ReportedCheck(r, 0.0, 0.0, True) for r in ()), False,
                     f"no {num_m} and {den_m} of {entity} {period} in one unit")
    n, d = nums[unit], dens[unit]
    if d.value == 0:
        return Trace(entity, metric, period, formula, n, d, None, None, (), False, f"{den_m} is zero")
    ratio = n.value / d.value * 100
    tol = ratio * (n.precision / n.value + d.precision / d.value) if n.value else 0.0
    checks = []
    for r in reported_rows:
        diff = r.value - ratio
        allowed = tol + r.precision
        checks.append(ReportedCheck(r, round(diff, 6), round(allowed, 6), abs(diff) <= allowed))
    return Trace(entity, metric, period, formula, n, d, round(ratio, 6), round(tol, 6), tuple(checks),
                 any(not c.consistent for c in checks))
