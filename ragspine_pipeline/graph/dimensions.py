"""Controlled dimensions of the relation graph: entities, peers, metrics, derivations.

Why a separate file: the graph must be deterministic and auditable, so which names count
as an entity or a metric, who owns whom and how a ratio is derived are declared data,
not guesses. The glossary (``demo_corpus/glossary.json`` in the package) adds aliases to these; it does
not create new entities or metrics (it has no parent or unit information).

Whose dimensions: ``RAGSPINE_GRAPH_DIMENSIONS`` (a file, or none/off), else the corpus's own
``dimensions.json`` (``paths.corpus_dimensions`` of ``RAGSPINE_CORPUS_ROOT``), else none.
The shipped ``dimensions.json`` (the ACME entities and metrics) is the demo corpus's: an
unrelated corpus gets an empty set (a graph of documents only), never the demo's.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from .. import paths, settings
from ..retrieval.lexical.analysis.glossary import GlossaryGroup

DIMENSIONS_ENV = "RAGSPINE_GRAPH_DIMENSIONS"
DEFAULT_DIMENSIONS = paths.SHIPPED_DIMENSIONS  # the demo corpus's
NO_DIMENSIONS = ("none", "off")
METRIC_KINDS = ("money", "ratio")


class DimensionsError(ValueError):
    """The dimensions file is missing, malformed or inconsistent."""


@dataclass(frozen=True)
class Entity:
    id: str
    name_en: str = ""
    name_zh: str = ""
    parent: str = ""
    aliases: tuple[str, ...] = ()


@dataclass(frozen=True)
class Metric:
    id: str
    kind: str  # "money" or "ratio"
    unit: str = ""
    name_en: str = ""
    name_zh: str = ""
    aliases: tuple[str, ...] = ()


@dataclass(frozen=True)
class Derivation:
    """``metric = numerator / denominator * 100`` (op ``ratio_pct``)."""

    metric: str
    numerator: str
    denominator: str
    op: str = "ratio_pct"


@dataclass(frozen=True)
class Dimensions:
    entities: tuple[Entity, ...]
    metrics: tuple[Metric, ...]
    peer_groups: tuple[tuple[str, tuple[str, ...]], ...] = ()
    segments: tuple[str, ...] = ()
    derivations: tuple[Derivation, ...] = field(default_factory=tuple)

    def entity(self, eid: str) -> Entity | None:
        return next((e for e in self.entities if e.id == eid), None)

    def metric(self, mid: str) -> Metric | None:
        return next((m for m in self.metrics if m.id == mid), None)


def _strs(raw: Any, where: str) -> tuple[str, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list) or not all(isinstance(x, str) and x.strip() for x in raw):
        raise DimensionsError(f"{where}: expected a list of non-empty strings")
    return tuple(x.strip() for x in raw)


def parse_dimensions(raw: Any, where: str = "dimensions") -> Dimensions:
    """Validate a dimensions mapping; every reference must name a declared id."""
    if not isinstance(raw, dict):
        raise DimensionsError(f"{where}: expected an object")
    entities: list[Entity] = []
    for i, e in enumerate(raw.get("entities") or []):
        if not isinstance(e, dict) or not isinstance(e.get("id"), str) or not e["id"]:
            raise DimensionsError(f"{where}: entity {i} needs an id")
        entities.append(Entity(e["id"], str(e.get("name_en", "")), str(e.get("name_zh", "")),
                               str(e.get("parent", "")), _strs(e.get("aliases"), f"{where}: entity {e['id']}")))
    ids = {e.id for e in entities}
    if len(ids) != len(entities):
        raise DimensionsError(f"{where}: duplicate entity ids")
    for e in entities:
        if e.parent and e.parent not in ids:
            raise DimensionsError(f"{where}: entity {e.id} has unknown parent {e.parent!r}")
    metrics: list[Metric] = []
    for i, m in enumerate(raw.get("metrics") or []):
        if not isinstance(m, dict) or not isinstance(m.get("id"), str) or not m["id"]:
            raise DimensionsError(f"{where}: metric {i} needs an id")
        if m.get("kind") not in METRIC_KINDS:
            raise DimensionsError(f"{where}: metric {m['id']} kind must be one of {METRIC_KINDS}")
        metrics.append(Metric(m["id"], m["kind"], str(m.get("unit", "")), str(m.get("name_en", "")),
                              str(m.get("name_zh", "")), _strs(m.get("aliases"), f"{where}: metric {m['id']}")))
    mids = {m.id for m in metrics}
    peers = []
    for g in raw.get("peer_groups") or []:
        members = _strs(g.get("members") if isinstance(g, dict) else None, f"{where}: peer group")
        unknown = [x for x in members if x not in ids]
        if unknown:
            raise DimensionsError(f"{where}: peer group names unknown entities {unknown}")
        peers.append((str(g.get("id", "")), members))
    derivations = []
    for d in raw.get("derivations") or []:
        if not isinstance(d, dict) or d.get("op", "ratio_pct") != "ratio_pct":
            raise DimensionsError(f"{where}: a derivation needs op 'ratio_pct'")
        der = Derivation(str(d.get("metric")), str(d.get("numerator")), str(d.get("denominator")))
        if {der.metric, der.numerator, der.denominator} - mids:
            raise DimensionsError(f"{where}: derivation {der} names an unknown metric")
        derivations.append(der)
    return Dimensions(tuple(entities), tuple(metrics), tuple(peers), _strs(raw.get("segments"), f"{where}: segments"),
                      tuple(derivations))


def dimensions_path(path: str | os.PathLike[str] | None = None) -> Path | None:
    """The dimensions file in force: ``path``, else ``RAGSPINE_GRAPH_DIMENSIONS`` (none/off:
    none), else the corpus root's own (the shipped one for the demo corpus), else None."""
    if path:
        return Path(path)
    env = (settings.get(DIMENSIONS_ENV) or "").strip()
    if env.lower() in NO_DIMENSIONS:
        return None
    return Path(env) if env else paths.corpus_dimensions(paths.default_corpus_root())


def load_dimensions(path: str | os.PathLike[str] | None = None) -> Dimensions:
    """The dimensions of ``dimensions_path(path)``; none declared: an empty set (no
    entity or metric is recognised, so no fact is extracted)."""
    p = dimensions_path(path)
    if p is None:
        return Dimensions((), ())
    try:
        raw = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise DimensionsError(f"dimensions file not found: {p}") from None
    except json.JSONDecodeError as exc:
        raise DimensionsError(f"dimensions file {p} is not valid JSON: {exc}") from None
    return parse_dimensions(raw, str(p))


def _widen(aliases: tuple[str, ...], names: set[str], groups: list[GlossaryGroup], kind: str) -> tuple[str, ...]:
    """``aliases`` plus the terms of every ``kind`` glossary group sharing a name (case-blind)."""
    low = {n.lower() for n in names}
    extra = [t for g in groups if g.kind == kind and low & {x.lower() for x in g.terms} for t in g.terms]
    return tuple(dict.fromkeys([*aliases, *extra]))


def with_glossary(dims: Dimensions, groups: list[GlossaryGroup]) -> Dimensions:
    """Add glossary synonyms as aliases: an entity group that names an entity id (or one of
    its aliases), a metric group that shares a term with a metric. Nothing new is created."""
    entities = tuple(replace(e, aliases=_widen(e.aliases, {e.id, *e.aliases}, groups, "entity"))
                     for e in dims.entities)
    metrics = tuple(replace(m, aliases=_widen(m.aliases, set(m.aliases), groups, "metric")) for m in dims.metrics)
    return replace(dims, entities=entities, metrics=metrics)
