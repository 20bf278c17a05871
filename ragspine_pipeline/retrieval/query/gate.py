"""SecurityGate: the deterministic check every generated query variant passes first.

A query layer (glossary rewrite, RAG-Fusion paraphrase, sub-question, HyDE document,
step-back question, CRAG rewrite, extracted filter) produces text the user never typed.
Before any of it is searched, the gate refuses:

* a variant that is not a non-empty string or is past the query length limit;
* a variant naming a configured **competitor** entity (any alias), so the group's own
  figures are never pulled into an answer about a competitor;
* a variant's filters that **widen** the user's: every predicate of the user's filters
  must still be there (AND semantics: adding predicates narrows, removing one widens);
  an extracted filter naming a competitor is refused too.

Refusals are returned as ``Refusal`` records and reported by the pipeline in
``result.report["refused"]``; nothing is dropped silently. The gate is pure and
deterministic: no model, no network.

Competitors come from a config file (``RAGSPINE_SECURITY_CONFIG``): JSON with
``{"competitors": ["Globex", ["Initech", "英尼泰克"], ...]}`` (a name or a list of
aliases), and/or glossary groups of ``"kind": "competitor"``; ``RAGSPINE_COMPETITORS``
adds a comma-separated list.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ... import settings
from ..filters import FilterError, compile_filters
from ..hybrid.retriever import FILTER_FIELDS
from ..lexical.analysis.analyzer import normalize
from ..lexical.analysis.glossary import QueryVariant, query_variants
from ..limits import InvalidText, QueryTooLong, check_query
from .result import CURRENT_PROBE, CURRENT_REPORT, Refusal

SECURITY_CONFIG_ENV = "RAGSPINE_SECURITY_CONFIG"
COMPETITORS_ENV = "RAGSPINE_COMPETITORS"


class SecurityConfigError(ValueError):
    """The security gate's configuration file is missing or malformed."""


def _term_pattern(term: str) -> re.Pattern[str]:
    t = normalize(term)
    if t.isascii():  # ASCII names match on word boundaries ("Globex" not in "Globexx")
        return re.compile(rf"(?<![a-z0-9]){re.escape(t)}(?![a-z0-9])")
    return re.compile(re.escape(t))


def _filter_key(pred: Any) -> tuple[str, str, str]:
    operand = pred.operand
    if isinstance(operand, frozenset):
        operand = sorted(operand, key=repr)
    return (pred.field, pred.op, json.dumps(operand, sort_keys=True, default=str, ensure_ascii=False))


def _competitor_entries(raw: Any, source: str) -> list[str]:
    out: list[str] = []
    if raw is None:
        return out
    if not isinstance(raw, list):
        raise SecurityConfigError(f"{source}: 'competitors' must be a list")
    for item in raw:
        names = item if isinstance(item, list) else [item]
        for n in names:
            if not isinstance(n, str) or not n.strip():
                raise SecurityConfigError(f"{source}: competitor names must be non-empty strings (got {n!r})")
            out.append(n.strip())
    return out


def load_competitors(path: str | os.PathLike[str]) -> list[str]:
    """Competitor names from a security config or a glossary file (see module doc)."""
    p = Path(path)
    try:
        raw = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise SecurityConfigError(f"security config not found: {p}") from None
    except json.JSONDecodeError as exc:
        raise SecurityConfigError(f"security config {p} is not valid JSON: {exc}") from None
    names: list[str] = []
    groups = raw.get("groups", []) if isinstance(raw, dict) else raw
    if isinstance(raw, dict):
        names += _competitor_entries(raw.get("competitors"), str(p))
    if isinstance(groups, list):
        for g in groups:
            if isinstance(g, dict) and str(g.get("kind", "")).lower() == "competitor":
                names += _competitor_entries(g.get("terms"), str(p))
    return names


@dataclass
class SecurityGate:
    """Deterministic check of generated query variants (see the module docstring)."""

    competitors: Sequence[str] = ()
    name: str = "security_gate"
    _patterns: list[tuple[str, re.Pattern[str]]] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        if isinstance(self.competitors, str):
            raise TypeError("competitors must be a list of names, not one string")
        names = []
        for c in self.competitors:
            if not isinstance(c, str) or not c.strip():
                raise ValueError(f"competitor names must be non-empty strings (got {c!r})")
            names.append(c.strip())
        self.competitors = tuple(dict.fromkeys(names))
        self._patterns = [(c, _term_pattern(c)) for c in self.competitors]

    @classmethod
    def from_config(cls, *paths: str | os.PathLike[str], extra: Iterable[str] = ()) -> SecurityGate:
        names: list[str] = []
        for p in paths:
            names += load_competitors(p)
        return cls(competitors=[*names, *extra])

    @classmethod
    def from_env(cls, glossary: str | os.PathLike[str] | None = None) -> SecurityGate:
        """``RAGSPINE_SECURITY_CONFIG`` + the glossary's competitor groups +
        ``RAGSPINE_COMPETITORS``."""
        paths: list[str | os.PathLike[str]] = []
        cfg = (settings.get(SECURITY_CONFIG_ENV) or "").strip()
        if cfg:
            paths.append(cfg)
        if glossary is not None and Path(glossary).is_file():
            paths.append(glossary)
        extra = list(settings.get(COMPETITORS_ENV) or ())
        return cls.from_config(*paths, extra=extra)

    def competitor_in(self, text: str) -> str | None:
        """The first configured competitor named in ``text`` (None if none)."""
        norm = normalize(text)
        return next((c for c, pat in self._patterns if pat.search(norm)), None)

    def check_text(self, variant: Any, kind: str = "variant") -> Refusal | None:
        if not isinstance(variant, str) or not variant.strip():
            return Refusal(repr(variant)[:200], "empty or not a string", kind)
        try:
            check_query(variant)
        except QueryTooLong as exc:
            return Refusal(variant[:200], f"too long: {exc}", kind)
        except InvalidText as exc:  # a provider's NUL or lone surrogate: refused, never raised
            return Refusal(repr(variant)[:200], f"not text: {exc}", kind)
        hit = self.competitor_in(variant)
        if hit is not None:
            return Refusal(variant, f"names competitor entity {hit!r}", kind)
        return None

    def check_filters(self, user_filters: Any, variant_filters: Any, kind: str = "filter") -> Refusal | None:
        """Refuse ``variant_filters`` that drop any predicate of ``user_filters`` or
        name a competitor; the user's own filters must compile (a FilterError otherwise)."""
        user = {_filter_key(p) for p in compile_filters(user_filters, FILTER_FIELDS)}
        shown = json.dumps(variant_filters, ensure_ascii=False, sort_keys=True, default=str)
        try:
            preds = compile_filters(variant_filters, FILTER_FIELDS)
        except FilterError as exc:
            return Refusal(shown, f"invalid filter: {exc}", kind)
        have = {_filter_key(p) for p in preds}
        missing = user - have
        if missing:
            return Refusal(shown, f"widens the user's filters (drops {sorted(missing)[0][:2]})", kind)
        for p in preds:
            values = p.operand if isinstance(p.operand, frozenset | tuple) else (p.operand,)
            for v in values:
                if isinstance(v, str) and self.competitor_in(v):
                    return Refusal(shown, f"filter names competitor entity {self.competitor_in(v)!r}", kind)
        return None

    def check(self, variant: Any, kind: str = "variant", *, user_filters: Any = None,
              variant_filters: Any = None) -> Refusal | None:
        """Text check, then (when the variant carries filters) the filter check."""
        refusal = self.check_text(variant, kind)
        if refusal is None and variant_filters is not None:
            refusal = self.check_filters(user_filters, variant_filters, kind)
        return refusal

    def __bool__(self) -> bool:  # a gate is always on, even with no competitors configured
        return True


def mapping_or_none(filters: Any) -> Mapping[str, Any] | Sequence[Any] | None:
    return filters if filters else None


@dataclass
class GatedRewriter:
    """A glossary rewriter whose generated variants pass the gate before BM25/dense see
    them. The original query (first) is gated by the pipeline itself; refused variants
    go to the running call's report (``CURRENT_REPORT``)."""

    inner: Any
    gate: SecurityGate

    @property
    def groups(self) -> Any:
        return getattr(self.inner, "groups", [])

    @property
    def max_queries(self) -> int:
        return getattr(self.inner, "max_queries", 1)

    def rewrite(self, query: str) -> list[str]:
        return [v.text for v in self.variants(query)]

    def variants(self, query: str) -> list[QueryVariant]:
        """The inner rewriter's weighted variants that pass the gate (weights unchanged:
        a refused variant's share is not handed to the others)."""
        variants = query_variants(self.inner, query)
        out = variants[:1]
        report = CURRENT_REPORT.get()
        probe = CURRENT_PROBE.get()
        for v in variants[1:]:
            refusal = self.gate.check_text(v.text, "glossary")
            if refusal is None:
                out.append(v)
                continue
            entry = refusal.to_dict()
            if probe is not None:  # derived from a HyDE probe: never show its text
                entry["variant"] = f"<glossary variant of the {probe} probe>"
            if report is not None and entry not in report["refused"]:
                report["refused"].append(entry)
        return out
