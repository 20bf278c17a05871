"""Framework filters (Haystack filter dicts, LlamaIndex ``MetadataFilters``) as engine triples.

The engine's filter is a conjunction of ``(field, op, operand)`` triples over its metadata
fields (``filter_input``/``retrieval.filters``: eq ne in nin gt gte lt lte between). A
framework filter is a tree of AND / OR / NOT over comparisons; each adapter parses its own
spelling into the small tree below and ``to_triples`` lowers it. What lowers:

* AND of anything that lowers (nested ANDs flatten);
* OR of equalities / ``in`` on one field, which becomes one ``in`` (``entity == A OR
  entity == B`` is ``entity in [A, B]``);
* NOT of one equality / ``in`` / inequality / ``not in`` (``ne``, ``nin``, ``eq``, ``in``).

Anything else (an OR across fields, a NOT of a range, an unknown field or operator) raises
``UnsupportedFilter``, a ``ValueError`` that says what the engine can express: a filter
is never dropped or widened, because a silently ignored filter returns documents the
caller asked to exclude.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..filter_input import FILTER_FIELDS, as_triples

Triple = tuple[str, str, Any]

_NEGATE = {"eq": "ne", "ne": "eq", "in": "nin", "nin": "in"}


class UnsupportedFilter(ValueError):
    """A framework filter the engine cannot express exactly (never ignored, never widened)."""


@dataclass(frozen=True)
class Cmp:
    """One comparison: an engine field, an engine operator, an operand."""

    field: str
    op: str
    value: Any


@dataclass(frozen=True)
class Logic:
    """AND / OR / NOT over comparisons or other nodes."""

    op: str  # "and" | "or" | "not"
    children: tuple[Cmp | Logic, ...]


Node = Cmp | Logic


def engine_field(name: Any, *, prefix: str = "") -> str:
    """``name`` (after ``prefix``, e.g. Haystack's ``meta.``) as an engine filter field."""
    if not isinstance(name, str):
        raise UnsupportedFilter(f"filter field must be a string, got {name!r}")
    bare = name[len(prefix):] if prefix and name.startswith(prefix) else name
    if bare not in FILTER_FIELDS:
        raise UnsupportedFilter(f"unknown filter field {name!r}; the engine filters on "
                                f"{', '.join(prefix + f for f in sorted(FILTER_FIELDS))}")
    return bare


def _or(children: tuple[Node, ...]) -> Triple:
    triples = [t for c in children for t in _lower(c)]
    fields = {t[0] for t in triples}
    if len(triples) < len(children) or len(fields) != 1 or any(t[1] not in ("eq", "in") for t in triples):
        raise UnsupportedFilter("OR is supported only between equalities (or `in`) on one field, which is `in`; "
                                "the engine's filters are AND of conditions")
    values: list[Any] = []
    for _, op, operand in triples:
        for v in (operand if op == "in" else [operand]):
            if v not in values:
                values.append(v)
    return (fields.pop(), "in", values)


def _not(children: tuple[Node, ...]) -> Triple:
    inner = [t for c in children for t in _lower(c)]
    if len(inner) != 1 or inner[0][1] not in _NEGATE:
        raise UnsupportedFilter("NOT is supported only around one equality, inequality, `in` or `not in`")
    field, op, operand = inner[0]
    return (field, _NEGATE[op], operand)


def _lower(node: Node) -> list[Triple]:
    if isinstance(node, Cmp):
        return [(node.field, node.op, node.value)]
    if node.op == "and":
        return [t for c in node.children for t in _lower(c)]
    if not node.children:
        raise UnsupportedFilter(f"{node.op.upper()} with no conditions")
    if node.op == "or":
        return [_or(node.children)]
    if node.op == "not":
        return [_not(node.children)]
    raise UnsupportedFilter(f"unknown logical operator {node.op!r}; use AND, OR or NOT")


def to_triples(node: Node | None) -> list[Triple]:
    """The engine triples of ``node`` (AND), checked by the engine's own compiler (operand
    types: ``version`` is a whole number, ``in`` takes a list …)."""
    if node is None:
        return []
    triples = _lower(node)
    try:
        return as_triples(triples)
    except ValueError as exc:
        raise UnsupportedFilter(str(exc)) from None


__all__ = ["Cmp", "Logic", "Node", "Triple", "UnsupportedFilter", "engine_field", "to_triples"]
