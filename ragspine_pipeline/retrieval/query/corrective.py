"""Corrective retrieval / CRAG (``RAGSPINE_CORRECTIVE``): grade the context, then act.

Replaces the base retriever's single retry-without-filters with a bounded loop of at
most ``max_rounds`` (≤ 2) grade → act rounds. Actions, in order: drop the filters (only
when the caller allows relaxation, as ``retry_without_filters`` did), rewrite the query,
and finally refuse. Refusing weak context is a reported outcome
(``report["status"] == "refused_weak_context"``, an empty list) — not an exception.

The default grader is deterministic: the share of the question's content tokens that
the top snippets contain (coverage) and whether the best hit has any lexical score at
all. An LLM grader is opt-in and sees only exit-filtered snippet text.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..lexical.analysis.analyzer import normalize, tokenize
from .llm_text import LayerFailure, ask, parse_lines, require_provider

MAX_ROUNDS = 2
DEFAULT_MIN_COVERAGE = 0.5

# Question words carry no content: they are ignored by the coverage grade and dropped by
# the deterministic rewrite.
_STOP = {"why", "what", "how", "which", "when", "where", "who", "did", "does", "do", "is", "are", "was",
         "were", "the", "a", "an", "of", "in", "at", "for", "to", "on", "and", "or",
         "为", "什", "么", "为什", "什么", "么为", "如", "何", "如何", "怎", "怎么", "的", "了", "吗", "呢",
         "是", "否", "是否"}


def content_tokens(text: str) -> set[str]:
    return {t for t in tokenize(text) if t not in _STOP}


@dataclass(frozen=True)
class Grade:
    ok: bool
    coverage: float
    top_bm25: float
    grader: str = "heuristic"

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "coverage": round(self.coverage, 4), "top_bm25": round(self.top_bm25, 4),
                "grader": self.grader}


@dataclass
class HeuristicGrader:
    min_coverage: float = DEFAULT_MIN_COVERAGE
    top_n: int = 3

    def __post_init__(self) -> None:
        if not 0.0 <= self.min_coverage <= 1.0:
            raise ValueError("min_coverage must be in [0, 1]")

    def grade(self, query: str, snippets: Sequence[dict[str, Any]]) -> Grade:
        if not snippets:
            return Grade(False, 0.0, 0.0)
        q = content_tokens(query)
        have: set[str] = set()
        for s in snippets[: self.top_n]:
            have |= set(tokenize(str(s.get("text") or "")))
        coverage = len(q & have) / len(q) if q else 1.0
        top = max(float((s.get("scores") or {}).get("bm25") or 0.0) for s in snippets[: self.top_n])
        vec = max(float((s.get("scores") or {}).get("vector") or 0.0) for s in snippets[: self.top_n])
        return Grade(coverage >= self.min_coverage and (top > 0 or vec > 0), coverage, top)


@dataclass
class LLMGrader:
    """Opt-in: the model answers YES/NO on whether the context answers the question; on
    failure the deterministic grade stands. Only exit-filtered snippets reach it."""

    provider: Any
    fallback: HeuristicGrader | None = None

    def __post_init__(self) -> None:
        require_provider(self.provider, "corrective grader")
        self.fallback = self.fallback or HeuristicGrader()

    def grade(self, query: str, snippets: Sequence[dict[str, Any]]) -> Grade:
        base = self.fallback.grade(query, snippets)  # type: ignore[union-attr]
        if not snippets:
            return base
        context = "\n".join(f"[{i}] {str(s.get('text') or '')[:400]}" for i, s in enumerate(snippets[:3], 1))
        try:
            text = ask(self.provider, "Does the context answer the question? Answer YES or NO.",
                       f"Question: {query}\nContext:\n{context}", max_tokens=4).strip().upper()
        except LayerFailure:
            return base
        if text.startswith(("YES", "NO")):
            return Grade(text.startswith("YES"), base.coverage, base.top_bm25, "llm")
        return base


@dataclass
class CorrectiveConfig:
    """The CRAG loop's settings: grader, round bound, and the rewrite step."""

    grader: Any = None
    max_rounds: int = MAX_ROUNDS
    provider: Any = None  # LLM rewrite when given; else the deterministic keyword rewrite
    name: str = "corrective"

    def __post_init__(self) -> None:
        if isinstance(self.max_rounds, bool) or not isinstance(self.max_rounds, int) \
                or not 1 <= self.max_rounds <= MAX_ROUNDS:
            raise ValueError(f"CRAG max_rounds must be 1 or 2 (got {self.max_rounds!r})")
        self.grader = self.grader or HeuristicGrader()
        if not callable(getattr(self.grader, "grade", None)):
            raise TypeError("grader needs grade(query, snippets) -> Grade")
        if self.provider is not None:
            require_provider(self.provider, "corrective rewrite")

    def rewrite(self, query: str) -> str:
        """A rewritten query for the second search (LLM when configured, falling back to
        the keyword rewrite: the question's words without question words)."""
        if self.provider is not None:
            try:
                lines = parse_lines(ask(self.provider, "Rewrite the question as a short keyword search "
                                        "query. One line, nothing else.", query), limit=1)
                if lines and lines[0] != query:
                    return lines[0]
            except LayerFailure:
                pass
        words = re.findall(r"[a-z0-9]+|[^\sa-z0-9]+", normalize(query))
        kept = [w for w in words if w not in _STOP and not re.fullmatch(r"[?？!！,，.。]+", w)]
        out = " ".join(kept)
        for w in ("为什么", "为何", "如何", "怎么", "是否"):
            out = out.replace(w, "")
        return out.strip() or query
