"""LLM decomposition (``RAGSPINE_QUERY_DECOMPOSE=llm``): a question into sub-questions.

The pipeline runs each sub-question through the whole guarded path (gate, transform,
corrective loop, base retriever with rerank and both exits) and merges the legs
deterministically (``rrf_fuse`` over the legs in order; ties by key), de-duplicated by
chunk; each snippet lists in ``sub_questions`` the legs that found it. The original
question is always leg 0, so a useless decomposition cannot lose what the plain search
finds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .llm_text import LayerFailure, ask, parse_lines, require_provider

DEFAULT_MAX_SUBQUESTIONS = 4
#: Ceiling on sub-questions (``RAGSPINE_QUERY_DECOMPOSE=llm:N``: N from 1 to this; a larger
#: N is a SettingsError, never clamped): each leg re-runs the whole guarded search, so N
#: multiplies the searches of one question (``llm:1000`` once ran 301 of them).
MAX_SUBQUESTIONS = 8


@dataclass
class LLMDecomposer:
    provider: Any
    max_subquestions: int = DEFAULT_MAX_SUBQUESTIONS
    name: str = "decompose"

    def __post_init__(self) -> None:
        require_provider(self.provider, "decompose")
        if isinstance(self.max_subquestions, bool) or not isinstance(self.max_subquestions, int) \
                or not 1 <= self.max_subquestions <= MAX_SUBQUESTIONS:
            raise ValueError(f"max_subquestions must be an integer from 1 to {MAX_SUBQUESTIONS} "
                             f"(got {self.max_subquestions!r})")

    def decompose(self, query: str) -> list[str]:
        text = ask(self.provider, "Split the question into at most "
                   f"{self.max_subquestions} simpler, self-contained search questions, one per line, "
                   "in the question's language. Nothing else.", query)
        subs = [s for s in parse_lines(text, limit=self.max_subquestions + 1) if s != query]
        if not subs:
            raise LayerFailure("no usable sub-question in the answer")
        return subs[: self.max_subquestions]
