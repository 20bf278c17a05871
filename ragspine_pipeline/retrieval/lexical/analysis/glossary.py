"""Glossary-driven multi-query rewriting (entity and metric synonyms).

A glossary is a JSON file: ``{"groups": [{"kind": "metric", "terms": ["营收", "收入",
"revenue"]}, ...]}`` (a bare list of groups is accepted too). When a query contains one
term of a group, each other term of that group is substituted for it to make a variant.
The original query is always first; variants follow round-robin over the matched groups
(in glossary order), de-duplicated, capped at ``max_queries``.

Each variant also carries a fusion weight (``variants``), because equal votes let the
synonyms outvote the user's own words: "revenue" has three Chinese synonyms in the demo
glossary, so three Chinese rankings against one English ranking put ten Chinese reports
above "ACME US revenue grew ..." (issue #28 item 5). The rule:

* the original query weighs 1;
* a variant whose substituted term is written in the same script as the term it replaces
  (``revenue`` -> ``sales``, ``ACME US`` -> ``ACME_US``) weighs 1 before the cap, one in
  another script (``revenue`` -> ``营收``: another language) ``cross_language_weight``
  (0.5): the query's own language first;
* the variants together weigh at most ``variant_budget`` (0.5) -- scaled down
  proportionally when they would weigh more.

With RRF (k=60) a document that only variants find then scores at most 0.5/61, below
any document the original query ranks in its first 61, while a document found by both
still moves up; when the original finds nothing (an English question over a Chinese-only
library) the variants rank alone, so cross-language recall is kept. Measured on the demo
golden set and every ``../shared/eval`` set: ``benchmarks/results/glossary.md``.
"""

from __future__ import annotations

import json
import math
import os
import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .analyzer import normalize
from .scripts import kind_of

DEFAULT_VARIANT_BUDGET = 0.5
DEFAULT_CROSS_LANGUAGE_WEIGHT = 0.5
#: Ceiling on ``max_queries`` (the multi-query fan-out inside one search; the spec's
#: default is 5): each variant is one more BM25 (+ dense) ranking to fuse.
MAX_QUERIES = 16


@dataclass(frozen=True)
class GlossaryGroup:
    terms: tuple[str, ...]
    kind: str = "term"


@dataclass(frozen=True)
class QueryVariant:
    """One query the index searches, with its weight in the fusion of the rankings.

    ``cross_language``: the substituted term is written in another script than the one
    it replaced (False for the original query)."""

    text: str
    weight: float = 1.0
    cross_language: bool = False


class GlossaryError(ValueError):
    """The glossary file is missing or malformed."""


def load_glossary(path: str | os.PathLike[str]) -> list[GlossaryGroup]:
    p = Path(path)
    try:
        raw = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise GlossaryError(f"glossary file not found: {p}") from None
    except json.JSONDecodeError as exc:
        raise GlossaryError(f"glossary {p} is not valid JSON: {exc}") from None
    groups = raw.get("groups") if isinstance(raw, dict) else raw
    if not isinstance(groups, list):
        raise GlossaryError(f"glossary {p}: expected a list of groups")
    out: list[GlossaryGroup] = []
    for i, g in enumerate(groups):
        terms = g.get("terms") if isinstance(g, dict) else g
        if not isinstance(terms, list) or len(terms) < 2 or not all(
            isinstance(t, str) and t.strip() for t in terms
        ):
            raise GlossaryError(f"glossary {p}: group {i} needs at least two non-empty terms")
        kind = g.get("kind", "term") if isinstance(g, dict) else "term"
        out.append(GlossaryGroup(tuple(t.strip() for t in terms), str(kind)))
    return out


def term_script(term: str) -> str:
    """The script a term is written in: that of its first letter (``cjk``, ``latin``,
    ``cyrillic``, ...), or ``other`` for a term of digits and symbols only."""
    for ch in term:
        if unicodedata.category(ch).startswith("L"):
            return kind_of(ch)
    return "other"


def _check_weight(name: str, value: float, *, upper: float | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0 \
            or (upper is not None and value > upper):
        bound = f"in [0, {upper}]" if upper is not None else ">= 0"
        raise ValueError(f"{name} must be a finite number {bound} (got {value!r})")


@dataclass
class GlossaryQueryRewriter:
    """Expand a query into synonym variants; original first, at most ``max_queries``.

    ``variant_budget`` and ``cross_language_weight`` set the variants' fusion weights (see
    the module docstring); ``rewrite`` returns the texts alone, in the same order."""

    max_queries: int = 5
    groups: Sequence[GlossaryGroup] = field(default_factory=list)
    variant_budget: float = DEFAULT_VARIANT_BUDGET
    cross_language_weight: float = DEFAULT_CROSS_LANGUAGE_WEIGHT

    def __post_init__(self) -> None:
        if isinstance(self.max_queries, bool) or not isinstance(self.max_queries, int) \
                or not 1 <= self.max_queries <= MAX_QUERIES:
            raise ValueError(f"max_queries must be an integer from 1 to {MAX_QUERIES} (got {self.max_queries!r})")
        _check_weight("variant_budget", self.variant_budget)
        _check_weight("cross_language_weight", self.cross_language_weight, upper=1.0)
        self._patterns = [
            [(t, self._pattern(t), term_script(t)) for t in g.terms] for g in self.groups
        ]

    @classmethod
    def from_file(cls, path: str | os.PathLike[str], max_queries: int = 5, **weights: float) -> GlossaryQueryRewriter:
        return cls(max_queries=max_queries, groups=load_glossary(path), **weights)

    @staticmethod
    def _pattern(term: str) -> re.Pattern[str]:
        t = normalize(term)
        # ASCII terms match on word boundaries; CJK terms match anywhere.
        if t.isascii():
            return re.compile(rf"(?<![a-z0-9]){re.escape(t)}(?![a-z0-9])")
        return re.compile(re.escape(t))

    def rewrite(self, query: str) -> list[str]:
        """Original query, then one substitution per matched group, round-robin.

        Round-robin keeps a large group (five revenue synonyms) from using every slot
        before a second matched group (decline synonyms) gets one.
        """
        return [v.text for v in self.variants(query)]

    def variants(self, query: str) -> list[QueryVariant]:
        """``rewrite``'s queries with their fusion weights: the original (weight 1)
        first, then the variants, weighing ``variant_budget`` at most together."""
        norm_q = normalize(query)
        per_group: list[list[tuple[str, bool]]] = []
        for group in self._patterns:
            for term, pat, script in group:
                m = pat.search(norm_q)
                if not m:
                    continue
                per_group.append([
                    (norm_q[: m.start()] + normalize(other) + norm_q[m.end():], other_script != script)
                    for other, _, other_script in group if other != term
                ])
                break  # one matched term per group drives its substitutions
        picked: list[tuple[str, bool]] = []
        seen = {norm_q}
        for round_ in range(max((len(v) for v in per_group), default=0)):
            for variants in per_group:
                if len(picked) + 1 >= self.max_queries:
                    break
                if round_ < len(variants) and variants[round_][0] not in seen:
                    seen.add(variants[round_][0])
                    picked.append(variants[round_])
        return [QueryVariant(query), *self._weighted(picked)]

    def _weighted(self, picked: list[tuple[str, bool]]) -> list[QueryVariant]:
        raw = [self.cross_language_weight if cross else 1.0 for _, cross in picked]
        total = sum(raw)
        scale = self.variant_budget / total if total > self.variant_budget else 1.0
        return [QueryVariant(text, w * scale, cross) for (text, cross), w in zip(picked, raw, strict=True)]


def query_variants(rewriter: Any, query: str) -> list[QueryVariant]:
    """The weighted queries to search for ``query``: only the query without a rewriter;
    a rewriter's ``variants`` when it has them; else (any object with ``rewrite``) its
    texts, each weighing 1 -- the unweighted multi-query of plain RRF."""
    if rewriter is None:
        return [QueryVariant(query)]
    weighted = getattr(rewriter, "variants", None)
    if callable(weighted):
        return list(weighted(query))
    return [QueryVariant(q) for q in rewriter.rewrite(query)]
