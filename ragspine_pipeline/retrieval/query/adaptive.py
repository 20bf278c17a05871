"""Adaptive-RAG (``RAGSPINE_ADAPTIVE``): route a question to single-shot or decomposition.

The default classifier is deterministic and reads surface features, in Chinese and
English: question words, clause separators, entities named (glossary entity groups),
periods named (years, FY, halves, quarters) and comparison markers. Two or more points
route to ``decompose``. An LLM classifier is opt-in (``LLMComplexityClassifier``); when it
fails, the deterministic one decides. The route and its reasons are reported.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from ..lexical.analysis.analyzer import normalize
from ..lexical.analysis.glossary import GlossaryQueryRewriter
from .llm_text import LayerFailure, ask, require_provider

SINGLE = "single"
DECOMPOSE = "decompose"

_QUESTION_WORDS = re.compile(r"(?<![a-z])(why|what|how|which|when|where|who)(?![a-z])|为什么|为何|如何|怎么|"
                             r"什么|哪些|哪个|是否|多少")
_COMPARISON = re.compile(r"(?<![a-z])(compare[ds]?|comparison|versus|vs\.?|differ(?:ence|ent)?|than|"
                         r"between)(?![a-z])|比较|对比|相比|区别|差异|差别|还是")
_CLAUSE = re.compile(r"[,;，；、]|(?<![a-z])(and|or|while|whereas)(?![a-z])|以及|并且|而且|同时|和|与|及")
_PERIOD = re.compile(r"(?:fy\s?)?(?:19|20)\d{2}(?:年)?|上半年|下半年|[一二三四1-4]季度|(?<![a-z])(?:h[12]|q[1-4])(?![a-z0-9])")


@dataclass(frozen=True)
class Route:
    route: str
    score: int
    reasons: tuple[str, ...] = ()
    classifier: str = "heuristic"

    def to_dict(self) -> dict[str, Any]:
        return {"route": self.route, "score": self.score, "reasons": list(self.reasons),
                "classifier": self.classifier}


@dataclass
class HeuristicComplexityClassifier:
    rewriter: GlossaryQueryRewriter | None = None
    threshold: int = 2
    name: str = "adaptive"
    _entity_groups: list[list[str]] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        groups = getattr(self.rewriter, "groups", None) or []
        self._entity_groups = [[normalize(t) for t in g.terms] for g in groups if g.kind == "entity"]

    def classify(self, query: str) -> Route:
        q = normalize(query)
        reasons = []
        score = 0
        qwords = len(_QUESTION_WORDS.findall(q))
        if qwords >= 2:
            score += 1
            reasons.append(f"{qwords} question words")
        if _COMPARISON.search(q):
            score += 1
            reasons.append("comparison marker")
        clauses = len(_CLAUSE.findall(q)) + 1
        if clauses >= 3:
            score += 1
            reasons.append(f"{clauses} clauses")
        entities = sum(1 for terms in self._entity_groups if any(t in q for t in terms))
        if entities >= 2:
            score += 1
            reasons.append(f"{entities} entities")
        periods = len(set(_PERIOD.findall(q)))
        if periods >= 2:
            score += 1
            reasons.append(f"{periods} periods")
        return Route(DECOMPOSE if score >= self.threshold else SINGLE, score, tuple(reasons))


@dataclass
class LLMComplexityClassifier:
    """Opt-in: the model answers SIMPLE or COMPLEX; on failure the fallback decides."""

    provider: Any
    fallback: HeuristicComplexityClassifier = field(default_factory=HeuristicComplexityClassifier)
    name: str = "adaptive"

    def __post_init__(self) -> None:
        require_provider(self.provider, "adaptive")

    def classify(self, query: str) -> Route:
        try:
            text = ask(self.provider, "Answer SIMPLE if one search can answer the question, COMPLEX if it "
                       "needs several (comparison, several entities or periods). One word.", query,
                       max_tokens=4).strip().upper()
            if text.startswith("COMPLEX"):
                return Route(DECOMPOSE, 1, ("llm: complex",), "llm")
            if text.startswith("SIMPLE"):
                return Route(SINGLE, 0, ("llm: simple",), "llm")
            raise LayerFailure(f"unreadable answer {text[:40]!r}")
        except LayerFailure as exc:
            r = self.fallback.classify(query)
            return Route(r.route, r.score, (*r.reasons, f"llm failed: {exc}"), "heuristic")
