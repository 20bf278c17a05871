"""Glossary-driven multi-query rewriting (entity and metric synonyms).

A glossary is a JSON file: ``{"groups": [{"kind": "metric", "terms": ["营收", "收入",
"revenue"]}, ...]}`` (a bare list of groups is accepted too). When a query contains one
term of a group, each other term of that group is substituted for it to make a variant.
The original query is always first; variants follow round-robin over the matched groups
(in glossary order), de-duplicated, capped at ``max_queries``.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .analyzer import normalize


@dataclass(frozen=True)
class GlossaryGroup:
    terms: tuple[str, ...]
    kind: str = "term"


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


@dataclass
class GlossaryQueryRewriter:
    """Expand a query into synonym variants; original first, at most ``max_queries``."""

    max_queries: int = 5
    groups: Sequence[GlossaryGroup] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.max_queries < 1:
            raise ValueError("max_queries must be >= 1")
        self._patterns = [
            [(t, self._pattern(t)) for t in g.terms] for g in self.groups
        ]

    @classmethod
    def from_file(cls, path: str | os.PathLike[str], max_queries: int = 5) -> GlossaryQueryRewriter:
        return cls(max_queries=max_queries, groups=load_glossary(path))

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
        norm_q = normalize(query)
        per_group: list[list[str]] = []
        for group in self._patterns:
            for term, pat in group:
                m = pat.search(norm_q)
                if not m:
                    continue
                per_group.append([
                    norm_q[: m.start()] + normalize(other) + norm_q[m.end():]
                    for other, _ in group if other != term
                ])
                break  # one matched term per group drives its substitutions
        out = [query]
        if self.max_queries <= 1:
            return out
        seen = {norm_q}
        for round_ in range(max((len(v) for v in per_group), default=0)):
            for variants in per_group:
                if round_ < len(variants) and variants[round_] not in seen:
                    seen.add(variants[round_])
                    out.append(variants[round_])
                    if len(out) >= self.max_queries:
                        return out
        return out
