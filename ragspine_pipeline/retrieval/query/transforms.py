"""Query transforms: RAG-Fusion, HyDE and step-back (``RAGSPINE_QUERY_TRANSFORM``).

A transform turns the user's question into query *variants*; the pipeline gates each
variant, searches each through the whole guarded base retriever, and fuses the result
lists with ``rrf_fuse`` (so every variant keeps rerank and both RESTRICTED exits).

* ``RAGFusion`` — the glossary rewriter's variants (no LLM needed) plus, with a
  provider, LLM paraphrases;
* ``HyDE`` — the LLM writes a hypothetical answer passage, used as a search probe only:
  its text is never returned, never cited, and listed in the report by length only;
* ``StepBack`` — the LLM writes the more general question behind the question.

The original question is always the first variant, so a failed transform degrades to
the plain search.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import zip_longest
from typing import Any, Protocol

from ..lexical.analysis.glossary import GlossaryQueryRewriter
from .llm_text import LayerFailure, ask, parse_lines, require_provider

#: Ceiling on a transform's variants besides the original (RAG-Fusion's ``max_variants``;
#: HyDE and step-back make one each): every variant is a whole guarded search. A larger
#: ``max_variants`` is a ValueError; extra variants a custom transform returns are dropped
#: by the pipeline and reported under ``degraded``.
MAX_VARIANTS = 8


@dataclass(frozen=True)
class Variant:
    """One query to search: ``kind`` names the layer that made it; ``probe`` marks text
    that is a search probe only (HyDE) and must never appear in any output."""

    kind: str
    text: str
    probe: bool = False

    def shown(self) -> str:
        return f"<{self.kind} probe, {len(self.text)} chars>" if self.probe else self.text


class QueryTransform(Protocol):
    name: str

    def variants(self, query: str) -> list[Variant]: ...


@dataclass
class RAGFusion:
    rewriter: GlossaryQueryRewriter | None = None
    provider: Any = None
    max_variants: int = 4
    name: str = "rag_fusion"

    def __post_init__(self) -> None:
        if self.provider is not None:
            require_provider(self.provider, "rag_fusion")
        if isinstance(self.max_variants, bool) or not isinstance(self.max_variants, int) \
                or not 1 <= self.max_variants <= MAX_VARIANTS:
            raise ValueError(f"max_variants must be an integer from 1 to {MAX_VARIANTS} (got {self.max_variants!r})")

    def variants(self, query: str) -> list[Variant]:
        glossary = ([Variant("glossary", v) for v in self.rewriter.rewrite(query)[1:]]
                    if self.rewriter is not None else [])
        paras: list[Variant] = []
        if self.provider is not None:
            text = ask(self.provider, "Rewrite the search question in different words. Answer with "
                       f"up to {self.max_variants} alternative questions, one per line, nothing else.",
                       query)
            paras = [Variant("paraphrase", p) for p in parse_lines(text, limit=self.max_variants) if p != query]
            if not paras and not glossary:
                raise LayerFailure("no usable paraphrase in the answer")
        # Interleave the two sources so neither takes every slot.
        mixed = [v for pair in zip_longest(glossary, paras) for v in pair if v is not None]
        out = [Variant("original", query)]
        seen = {query}
        for v in mixed:
            if v.text not in seen and len(out) < 1 + self.max_variants:
                seen.add(v.text)
                out.append(v)
        return out


@dataclass
class HyDE:
    provider: Any
    max_chars: int = 1200
    name: str = "hyde"

    def __post_init__(self) -> None:
        require_provider(self.provider, "hyde")

    def variants(self, query: str) -> list[Variant]:
        text = ask(self.provider, "Write one short passage, in the question's language, that would "
                   "answer the question as an annual report or press release might. Plain text only.",
                   query, max_tokens=320).strip()
        return [Variant("original", query), Variant("hyde", text[: self.max_chars], probe=True)]


@dataclass
class StepBack:
    provider: Any
    name: str = "step_back"

    def __post_init__(self) -> None:
        require_provider(self.provider, "step_back")

    def variants(self, query: str) -> list[Variant]:
        text = ask(self.provider, "Write the more general, step-back question behind this question "
                   "(the principle or background it depends on). One line, nothing else.", query)
        lines = parse_lines(text, limit=1)
        if not lines:
            raise LayerFailure("no usable step-back question in the answer")
        return [Variant("original", query), Variant("step_back", lines[0])]


TRANSFORMS = ("none", "rag_fusion", "hyde", "step_back")
