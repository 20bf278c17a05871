"""Library routing for ``MultiIndexRetriever``: which libraries a question is about.

``MetadataRouter`` is deterministic: each library gets a profile from its *served*
chunks (never a RESTRICTED one, so a route cannot depend on restricted content) — the
entities and topics its documents carry and the glossary groups its text mentions. A
question is matched against the glossary (entity, metric, term and event groups) and the
topic names; every library is scored by how many of the question's features it covers,
and the best-scoring ones are picked. A question that matches nothing gives ``[]``, and
``MultiIndexRetriever`` then searches every library (routing never drops scope silently).

``ProviderRouter`` (optional, over ``LLMProvider.chat``) asks a model to pick from the
library descriptions; any failure raises, which the retriever turns into "search all".
``FallbackRouter`` tries routers in order and returns the first non-empty choice.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ... import settings
from ...llm.provider import provider_from_env
from ...sensitivity import is_restricted
from ..lexical.analysis.analyzer import normalize
from ..lexical.analysis.glossary import GlossaryGroup, load_glossary

# Words that name a topic in a question, per topic value found in the metadata.
DEFAULT_TOPIC_WORDS: dict[str, tuple[str, ...]] = {
    "policy": ("policy", "policies", "rule", "rules", "procedure", "guideline", "政策", "制度", "规范", "规定"),
    "hr": ("hr", "layoff", "layoffs", "headcount", "人事", "裁员", "人员"),
    "risk": ("risk", "risks", "风险"),
    "r_and_d": ("r&d", "research", "研发"),
    "finance": ("finance", "revenue", "margin", "profit", "财务", "收入", "利润"),
}


def _term_re(term: str) -> re.Pattern[str]:
    t = re.escape(normalize(term))
    return re.compile(rf"(?<![a-z0-9]){t}(?![a-z0-9])" if term[:1].isascii() and term[:1].isalnum() else t)


@dataclass(frozen=True)
class LibraryProfile:
    library_id: str
    entities: frozenset[str]
    topics: frozenset[str]
    groups: frozenset[int]  # indexes of the glossary groups the library's served text mentions


def _chunks_of(retriever: Any) -> list[Any]:
    hybrid = getattr(getattr(retriever, "index", None), "retriever", None)
    return list(getattr(hybrid, "chunks", None) or [])


@dataclass
class MetadataRouter:
    """Rules over library profiles (see the module docstring). Callable: ``router(query)``."""

    profiles: Sequence[LibraryProfile]
    groups: Sequence[GlossaryGroup] = ()
    topic_words: Mapping[str, Sequence[str]] = field(default_factory=lambda: dict(DEFAULT_TOPIC_WORDS))
    last: dict[str, Any] = field(default_factory=dict)  # the last decision (features, scores), for reports

    def __post_init__(self) -> None:
        self._group_res = [[_term_re(t) for t in g.terms] for g in self.groups]
        self._topic_res = {topic: [_term_re(w) for w in (*words, topic)] for topic, words in self.topic_words.items()}

    @classmethod
    def from_retrievers(cls, retrievers: Mapping[str, Any], groups: Sequence[GlossaryGroup] = (),
                        topic_words: Mapping[str, Sequence[str]] | None = None) -> MetadataRouter:
        """Profiles from each library's served chunks (RESTRICTED ones are skipped)."""
        group_res = [[_term_re(t) for t in g.terms] for g in groups]
        profiles = []
        for lib in sorted(retrievers):
            chunks = [c for c in _chunks_of(retrievers[lib]) if not is_restricted(getattr(c, "sensitivity", None))]
            text = normalize(" ".join(f"{c.title} {c.text}" for c in chunks))
            profiles.append(LibraryProfile(
                lib, frozenset(c.entity for c in chunks if c.entity), frozenset(c.topic for c in chunks if c.topic),
                frozenset(i for i, res in enumerate(group_res) if any(r.search(text) for r in res))))
        return cls(profiles, groups, dict(topic_words if topic_words is not None else DEFAULT_TOPIC_WORDS))

    def features(self, query: str) -> dict[str, list[Any]]:
        q = normalize(query)
        groups = [i for i, res in enumerate(self._group_res) if any(r.search(q) for r in res)]
        entity_ids = sorted({t for i in groups if self.groups[i].kind == "entity" for t in self.groups[i].terms
                             if re.fullmatch(r"[A-Z][A-Z0-9_]+", t)})
        topics = sorted(t for t, res in self._topic_res.items() if any(r.search(q) for r in res))
        return {"groups": groups, "entities": entity_ids, "topics": topics}

    def __call__(self, query: str) -> list[str]:
        f = self.features(query)
        scores: dict[str, int] = {}
        for p in self.profiles:
            s = sum(1 for i in f["groups"] if i in p.groups and self.groups[i].kind != "entity")
            s += sum(2 for e in f["entities"] if e in p.entities)
            s += sum(3 for t in f["topics"] if t in p.topics)
            scores[p.library_id] = s
        top = max(scores.values(), default=0)
        picked = sorted(lib for lib, s in scores.items() if s == top) if top > 0 else []
        self.last = {"features": f, "scores": scores, "picked": picked}
        return picked


ROUTER_PROMPT = ("Pick the libraries that can answer the question. Answer with a JSON list of library ids "
                 "only, chosen from the ones listed.")


@dataclass
class ProviderRouter:
    """A model picks library ids from short descriptions; a bad reply raises (-> search all)."""

    provider: Any
    descriptions: Mapping[str, str]

    def __call__(self, query: str) -> list[str]:
        listing = "\n".join(f"- {lib}: {d}" for lib, d in sorted(self.descriptions.items()))
        reply = self.provider.chat([{"role": "system", "content": ROUTER_PROMPT},
                                    {"role": "user", "content": f"Libraries:\n{listing}\n\nQuestion: {query}"}],
                                   temperature=0)
        picked = json.loads(reply)
        if not isinstance(picked, list) or not all(isinstance(x, str) for x in picked):
            raise ValueError(f"router reply is not a list of library ids: {reply!r:.200}")
        return [x for x in picked if x in self.descriptions]


@dataclass
class FallbackRouter:
    """The first router whose choice is non-empty (a raising router is skipped)."""

    routers: Sequence[Callable[[str], Iterable[str]]]

    def __call__(self, query: str) -> list[str]:
        for r in self.routers:
            try:
                picked = list(r(query))
            except Exception:  # noqa: BLE001 - the next router, then "search all"
                continue
            if picked:
                return picked
        return []


def describe_library(profile: LibraryProfile) -> str:
    """A one-line description for a model router (metadata only, never chunk text)."""
    return f"topics {sorted(profile.topics)}; entities {sorted(profile.entities)}"


ROUTER_ENV = "RAGSPINE_ROUTER"
ROUTERS = ("rules", "llm", "none")


def make_router(spec: str | None, retrievers: Mapping[str, Any], *, glossary: Any = None,
                provider: Any = None) -> Callable[[str], list[str]] | None:
    """``rules`` (default) | ``llm`` (the model, rules as fallback) | ``none`` (search all), from
    ``spec`` or ``RAGSPINE_ROUTER``. ``glossary``: a glossary JSON path for the rules."""
    choice = (spec.strip().lower() or "rules") if spec is not None else settings.get(ROUTER_ENV)
    if choice not in ROUTERS:
        raise ValueError(f"unknown router {choice!r} ({ROUTER_ENV}); expected one of {ROUTERS}")
    if choice == "none":
        return None
    groups = load_glossary(Path(glossary)) if glossary is not None and Path(glossary).is_file() else []
    rules = MetadataRouter.from_retrievers(retrievers, groups)
    if choice == "rules":
        return rules
    if provider is None:
        provider = provider_from_env()
    if provider is None:
        raise ValueError(f"{ROUTER_ENV}=llm needs an LLM provider (set RAGSPINE_LLM_BASE_URL)")
    return FallbackRouter([ProviderRouter(provider, {p.library_id: describe_library(p) for p in rules.profiles}),
                           rules])
