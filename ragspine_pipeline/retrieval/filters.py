"""Metadata predicates for the pre-filter of every channel (eq ne in nin gt gte lt lte between).

Filters are a mapping ``{field: value}`` (equality) or ``{field: {op: operand}}``, or a
sequence of ``(field, op, operand)`` triples; all are AND-combined. Compilation is strict:
an unknown field or operator, a wrong arity or an operand of the wrong type raises
``FilterError`` naming the field — a bad filter never silently matches everything.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

OPERATORS = ("eq", "ne", "in", "nin", "gt", "gte", "lt", "lte", "between")
_SCALAR = (str, int, float, bool)


class FilterError(ValueError):
    """A metadata filter cannot be compiled; the message names the field."""


@dataclass(frozen=True)
class Predicate:
    field: str
    op: str
    operand: Any

    def matches(self, value: Any) -> bool:
        return _eval(self.op, value, self.operand)


def _eval(op: str, value: Any, operand: Any) -> bool:
    if op == "eq":
        return value == operand
    if op == "ne":
        return value != operand
    if op == "in":
        return value in operand
    if op == "nin":
        return value not in operand
    if value is None or value == "":
        return False  # ordered comparisons never match a missing value
    try:
        if op == "gt":
            return value > operand
        if op == "gte":
            return value >= operand
        if op == "lt":
            return value < operand
        if op == "lte":
            return value <= operand
        if op == "between":
            lo, hi = operand
            return lo <= value <= hi
    except TypeError:
        return False
    raise FilterError(f"unknown operator {op!r}")


def _check_operand(field: str, op: str, operand: Any, kind: type | None) -> Any:
    def typed(x: Any) -> Any:
        if not isinstance(x, _SCALAR) or x is None:
            raise FilterError(f"filter on {field!r}: operand {x!r} of {op!r} must be a scalar")
        if kind is not None and kind is not bool and isinstance(x, bool):
            raise FilterError(f"filter on {field!r}: {op!r} got a bool for a {kind.__name__} field")
        if kind is str and not isinstance(x, str):
            raise FilterError(
                f"filter on {field!r}: {op!r} needs a string operand (got {type(x).__name__})"
            )
        if kind in (int, float) and not isinstance(x, (int, float)):
            raise FilterError(
                f"filter on {field!r}: {op!r} needs a number operand (got {type(x).__name__})"
            )
        return x

    if op in ("in", "nin"):
        if isinstance(operand, (str, bytes)) or not isinstance(operand, (list, tuple, set, frozenset)):
            raise FilterError(f"filter on {field!r}: {op!r} needs a list of values")
        return frozenset(typed(x) for x in operand)
    if op == "between":
        if isinstance(operand, (str, bytes)) or not isinstance(operand, (list, tuple)) or len(operand) != 2:
            raise FilterError(f"filter on {field!r}: 'between' needs exactly two bounds [lo, hi]")
        lo, hi = typed(operand[0]), typed(operand[1])
        if type(lo) is not type(hi) and not (
            isinstance(lo, (int, float)) and isinstance(hi, (int, float))
        ):
            raise FilterError(f"filter on {field!r}: 'between' bounds must have the same type")
        return (lo, hi)
    return typed(operand)


def compile_filters(
    filters: Mapping[str, Any] | Sequence[tuple[str, str, Any]] | None,
    fields: Mapping[str, type],
) -> list[Predicate]:
    """Validate ``filters`` against the known ``fields`` (name -> value type)."""
    if filters is None:
        return []
    triples: list[tuple[str, str, Any]] = []
    if isinstance(filters, Mapping):
        for fname, spec in filters.items():
            if isinstance(spec, Mapping):
                if not spec:
                    raise FilterError(f"filter on {fname!r}: empty operator mapping")
                for op, operand in spec.items():
                    triples.append((fname, op, operand))
            else:
                triples.append((fname, "eq", spec))
    elif isinstance(filters, Sequence) and not isinstance(filters, (str, bytes)):
        for item in filters:
            if not isinstance(item, (list, tuple)) or len(item) != 3:
                raise FilterError(f"filter {item!r}: expected (field, op, operand)")
            triples.append(tuple(item))  # type: ignore[arg-type]
    else:
        raise FilterError(f"filters must be a mapping or a list of triples, got {type(filters).__name__}")
    preds: list[Predicate] = []
    for fname, op, operand in triples:
        if not isinstance(fname, str) or fname not in fields:
            raise FilterError(f"unknown filter field {fname!r}; known fields: {sorted(fields)}")
        if op not in OPERATORS:
            raise FilterError(f"filter on {fname!r}: unknown operator {op!r}; use one of {OPERATORS}")
        preds.append(Predicate(fname, op, _check_operand(fname, op, operand, fields[fname])))
    return preds


def predicate_mask(
    preds: Sequence[Predicate], column: Callable[[str], np.ndarray], n: int
) -> np.ndarray:
    """AND of all predicates over columnar metadata (``column(field)`` -> object array)."""
    mask = np.ones(n, dtype=bool)
    for p in preds:
        col = column(p.field)
        if p.op == "eq":
            m = col == p.operand
        elif p.op == "ne":
            m = col != p.operand
        else:
            m = np.fromiter((p.matches(v) for v in col), dtype=bool, count=n)
        mask &= np.asarray(m, dtype=bool)
    return mask
