"""Filters typed by people (CLI flags, the ``ask`` job's launchpad) made into engine filters.

Two jobs, both before any search runs:

* **Parse and type.** ``field=value``, ``field>=value``, ``field:in=a,b`` … become
  ``(field, op, operand)`` triples, the operand coerced to the field's type
  (``version>=2`` is an int). Triples are AND-combined by the engine, so a repeated field
  (``period>=2022`` and ``period<=2023``) keeps both conditions; two equalities on one
  field can never both hold and are an error that suggests ``field:in=``.
* **Check values against the served corpus.** Relaxation (retry without filters) is for a
  valid filter that happens to leave nothing. A value that no document has for that
  field (``entity=NOPE``), or an ordered comparison whose operand does not look like the
  field's values (``period>=2023x`` against 4-digit periods, compared as text), is a typo,
  not an empty result: :func:`check_filter_values` raises :class:`FilterValueError`.
  Only open (non-RESTRICTED) chunks count, so the answer never depends on restricted
  content.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from .retrieval.filters import FilterError, compile_filters
from .retrieval.hybrid.retriever import FILTER_FIELDS, HybridRetriever
from .retrieval.hybrid.unwrap import hybrid_retrievers  # also the callers' name for it here
from .sensitivity import is_restricted

Triple = tuple[str, str, Any]

_EXPR_RE = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*(?::([A-Za-z]+))?\s*(!=|>=|<=|=|>|<)\s*(.*)$")
_OPS = {"=": "eq", "!=": "ne", ">=": "gte", "<=": "lte", ">": "gt", "<": "lt"}
_LIST_OPS = ("in", "nin", "between")
_EXCLUSIVE_OPS = ("eq", "in", "between")  # two of these on one field cannot both be meant
_ORDERED_OPS = ("gt", "gte", "lt", "lte", "between")
_DIGITS = re.compile(r"^\d+$")
_SHOW_VALUES = 8


class FilterValueError(FilterError):
    """A well-formed filter whose value no served document has, or of the wrong shape."""


def coerce_operand(field: str, value: str) -> Any:
    """A typed operand from text: int/float fields parse numbers, others keep the string."""
    kind = FILTER_FIELDS.get(field)
    value = value.strip()
    if kind is int:
        try:
            return int(value)
        except ValueError:
            raise FilterError(f"{field} is a whole number; got {value!r}") from None
    if kind is float:
        try:
            return float(value)
        except ValueError:
            raise FilterError(f"{field} is a number; got {value!r}") from None
    return value


def parse_filter_expr(raw: str) -> Triple:
    """``field=v``, ``field!=v``, ``field>=v`` …, ``field:in=a,b``, ``field:nin=a,b``,
    ``field:between=lo,hi`` -> ``(field, op, operand)``."""
    m = _EXPR_RE.match(raw)
    if not m:
        raise FilterError(f"cannot parse {raw!r}; use field=value, field>=value or field:in=a,b")
    field, listop, op, value = m.groups()
    if field not in FILTER_FIELDS:
        raise FilterError(f"unknown field {field!r} in {raw!r}; known fields: {', '.join(sorted(FILTER_FIELDS))}")
    if listop:
        if listop not in _LIST_OPS:
            raise FilterError(f"unknown list operator {listop!r} in {raw!r}; use :in, :nin or :between")
        if op != "=":
            raise FilterError(f"{raw!r}: write {field}:{listop}=a,b")
        items = [coerce_operand(field, v) for v in value.split(",")]
        if any(v == "" for v in items):
            raise FilterError(f"{raw!r}: empty value in the list")
        if listop == "between" and len(items) != 2:
            raise FilterError(f"{raw!r}: between needs exactly two bounds, lo,hi")
        return (field, listop, items)
    if not value.strip():
        raise FilterError(f"{raw!r}: missing value after {op!r}")
    return (field, _OPS[op], coerce_operand(field, value))


def as_triples(filters: Mapping[str, Any] | Sequence[Any] | None) -> list[Triple]:
    """Any engine filter shape (mapping or triples) as a list of triples, validated."""
    if filters is None:
        return []
    if isinstance(filters, Mapping):
        out: list[Triple] = []
        for fname, spec in filters.items():
            if isinstance(spec, Mapping):
                if not spec:
                    raise FilterError(f"filter on {fname!r}: empty operator mapping")
                out += [(fname, op, operand) for op, operand in spec.items()]
            else:
                out.append((fname, "eq", spec))
    elif isinstance(filters, Sequence) and not isinstance(filters, (str, bytes)):
        out = []
        for item in filters:
            if not isinstance(item, (list, tuple)) or len(item) != 3:
                raise FilterError(f"{item!r} is not a [field, op, operand] triple")
            out.append((item[0], item[1], item[2]))
    else:
        raise FilterError("filters must be an object {field: value | {op: operand}} or a list of "
                          f"[field, op, operand] triples, got {type(filters).__name__}")
    compile_filters(out, FILTER_FIELDS)  # unknown fields, operators, operand types
    return out


def conflicting(triples: Iterable[Triple]) -> str | None:
    """A message when two conditions on one field cannot both be meant (eq twice …)."""
    seen: dict[tuple[str, str], Any] = {}
    for field, op, operand in triples:
        if op in _EXCLUSIVE_OPS:
            key = (field, "eq/in/between")
            if key in seen:
                return (f"two exclusive conditions on {field!r} ({seen[key]!r} and {operand!r}); "
                        f"all filters must hold at once — use {field}:in=a,b for either value")
            seen[key] = operand
    return None


def open_values(hybrids: Iterable[HybridRetriever], field: str) -> set[Any]:
    """Distinct values of ``field`` over the open (non-RESTRICTED) chunks."""
    vals: set[Any] = set()
    for h in hybrids:
        for c in h.chunks:
            if not is_restricted(c.sensitivity):
                v = getattr(c, field, None)
                if v not in (None, ""):
                    vals.add(v)
    return vals


def _shown(values: set[Any]) -> str:
    ordered = sorted(values, key=str)
    more = f", … ({len(ordered) - _SHOW_VALUES} more)" if len(ordered) > _SHOW_VALUES else ""
    return ", ".join(map(str, ordered[:_SHOW_VALUES])) + more


def check_filter_values(retriever: Any, filters: Mapping[str, Any] | Sequence[Any] | None) -> None:
    """Raise :class:`FilterValueError` for a value no served document has, or an ordered
    operand that does not look like the field's values (see the module docstring)."""
    hybrids = hybrid_retrievers(retriever)
    if not hybrids:
        return
    for p in compile_filters(filters, FILTER_FIELDS):
        values = open_values(hybrids, p.field)
        if p.op in ("eq", "ne", "in", "nin"):
            wanted = [p.operand] if p.op in ("eq", "ne") else sorted(p.operand, key=str)
            unknown = [v for v in wanted if v not in values]
            if unknown:
                raise FilterValueError(
                    f"no document has {p.field}={unknown[0]!r}"
                    + (f" (values: {_shown(values)})" if values else f" (no document has a {p.field})"))
        elif p.op in _ORDERED_OPS and FILTER_FIELDS.get(p.field) is str:
            bounds = list(p.operand) if p.op == "between" else [p.operand]
            texts = [v for v in values if isinstance(v, str)]
            if texts and all(_DIGITS.match(v) for v in texts):
                widths = {len(v) for v in texts}
                for b in bounds:
                    if not (isinstance(b, str) and _DIGITS.match(b)) or (len(widths) == 1 and len(b) not in widths):
                        like = f"{next(iter(widths))}-digit" if len(widths) == 1 else "digit-only"
                        raise FilterValueError(
                            f"{p.field} values are {like} (e.g. {min(texts)}), compared as text; "
                            f"{b!r} does not look like one")
