"""Automatic filter extraction (``RAGSPINE_AUTO_FILTERS``): metadata filters from the question.

Glossary rules, in Chinese and English: an entity alias of a glossary ``entity`` group
(``"艾克美中国"``, ``"ACME China"``) gives ``entity`` = the group's canonical id (its
term written like an id, ``ACME_CN``, else its last term); years (``2023年``,
``FY2023``, ``2023``) give ``period``; halves and quarters (``上半年``, ``H1``, ``Q3``)
are reported as notes but do not filter (the corpus labels periods by year);
geography words give ``geography`` only when no entity was found (an entity already
implies its geography). Several values become an ``in`` filter.

An explicit user filter always wins (no extraction at all); extracted filters are
reported; an extraction that fails, is empty, or matches nothing never narrows the
search — the pipeline falls back to the unfiltered candidate set, never wider.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from ..lexical.analysis.analyzer import normalize
from ..lexical.analysis.glossary import GlossaryQueryRewriter
from .llm_text import LayerFailure, ask, require_provider

_YEAR = re.compile(r"(?:(?<![a-z0-9])fy\s?)?(?<!\d)((?:19|20)\d{2})(?!\d)")
_SUBPERIOD = re.compile(r"上半年|下半年|[一二三四]季度|(?<![a-z0-9])(?:h[12]|q[1-4])(?![a-z0-9])")
DEFAULT_GEOGRAPHY = {"CN": ("中国", "china", "chinese"), "EU": ("欧洲", "europe", "european"),
                     "US": ("美国", "united states", "u.s.", "america")}


def _canonical(terms: tuple[str, ...]) -> str:
    ids = [t for t in terms if re.fullmatch(r"[A-Z0-9_]+", t)]
    return ids[0] if ids else terms[-1]


@dataclass
class AutoFilterExtractor:
    rewriter: GlossaryQueryRewriter | None = None
    geography: dict[str, tuple[str, ...]] = field(default_factory=lambda: dict(DEFAULT_GEOGRAPHY))
    name: str = "auto_filters"

    def __post_init__(self) -> None:
        groups = getattr(self.rewriter, "groups", None) or []
        self._entities = []
        for g in groups:
            if g.kind == "entity":
                pats = [self._pattern(t) for t in sorted(g.terms, key=len, reverse=True)]
                self._entities.append((_canonical(g.terms), pats))

    @staticmethod
    def _pattern(term: str) -> re.Pattern[str]:
        t = normalize(term)
        if t.isascii():
            return re.compile(rf"(?<![a-z0-9_]){re.escape(t)}(?![a-z0-9_])")
        return re.compile(re.escape(t))

    def extract(self, query: str) -> tuple[dict[str, Any], list[str]]:
        """``(filters, notes)``; ``filters`` is ``{}`` when nothing was recognised."""
        q = normalize(query)
        filters: dict[str, Any] = {}
        entities = []
        for canon, pats in self._entities:
            if any(p.search(q) for p in pats) and canon not in entities:
                entities.append(canon)
        if entities:
            filters["entity"] = entities[0] if len(entities) == 1 else {"in": entities}
        years = list(dict.fromkeys(_YEAR.findall(q)))
        if years:
            filters["period"] = years[0] if len(years) == 1 else {"in": years}
        notes = [f"sub-period {m!r} not filtered" for m in dict.fromkeys(_SUBPERIOD.findall(q))]
        if not entities:
            geos = [code for code, words in self.geography.items()
                    if any(self._pattern(w).search(q) for w in words)]
            if geos:
                filters["geography"] = geos[0] if len(geos) == 1 else {"in": geos}
        return filters, notes


ALLOWED_FIELDS = ("entity", "period", "geography")


@dataclass
class LLMFilterExtractor:
    """Opt-in (``RAGSPINE_AUTO_FILTERS=llm``): the model proposes ``{"entity", "period",
    "geography"}`` as JSON; only those fields with string values (or lists of strings)
    are kept. The glossary rules run first and win field by field; a failed or garbage
    answer leaves just the rules' result. Only the question reaches the model."""

    provider: Any
    fallback: AutoFilterExtractor = field(default_factory=AutoFilterExtractor)
    name: str = "auto_filters"

    def __post_init__(self) -> None:
        require_provider(self.provider, "auto_filters")

    def extract(self, query: str) -> tuple[dict[str, Any], list[str]]:
        filters, notes = self.fallback.extract(query)
        try:
            text = ask(self.provider, "Extract metadata filters from the question as one JSON object with "
                       "optional keys entity, period (a year), geography. Strings only. {} if none.", query,
                       max_tokens=80)
            proposed = json.loads(text.strip())
        except (LayerFailure, json.JSONDecodeError) as exc:
            return filters, [*notes, f"llm extraction failed: {str(exc)[:120]}"]
        if not isinstance(proposed, dict):
            return filters, [*notes, "llm extraction was not a JSON object"]
        for key in ALLOWED_FIELDS:
            value = proposed.get(key)
            if key in filters or value in (None, "", []):
                continue
            if isinstance(value, str) and len(value) <= 64:
                filters[key] = value.strip()
            elif isinstance(value, list) and value and all(isinstance(v, str) and len(v) <= 64 for v in value):
                filters[key] = {"in": sorted({v.strip() for v in value})}
            else:
                notes.append(f"llm value for {key!r} ignored")
        return filters, notes
