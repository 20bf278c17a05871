"""Extractive context compression into ``prompt_text``.

Keeps the sentences of each snippet that share the most query tokens, in their
original order, within a character budget, and writes them to ``prompt_text`` (the key
the answer prompt prefers). ``text`` and every reference field stay byte-identical, so
citations still point at the stored chunk; the kept sentences are verbatim pieces of
the source (``prompt_text`` of an expanded snippet, else ``text``), never paraphrase.
A snippet with no sentence sharing a query token keeps its leading sentences; one
already within budget is left as it is (no ``prompt_text`` written).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from ..lexical.analysis.analyzer import tokenize
from .base import mark_layer

DEFAULT_COMPRESS_CHARS = 240
_SENTENCE_END = re.compile(r"(?<=[。！？；!?;])|(?<=[.])(?=\s)|\n+")


def split_sentences(text: str) -> list[str]:
    """Sentences of ``text``, each with its trailing punctuation; ``"".join`` of the
    result (ignoring removed blank-line runs) is the text."""
    parts = [p for p in _SENTENCE_END.split(text) if p and p.strip()]
    return parts


@dataclass
class ExtractiveCompressor:
    max_chars: int = DEFAULT_COMPRESS_CHARS
    name: str = "compress"

    def __post_init__(self) -> None:
        if isinstance(self.max_chars, bool) or not isinstance(self.max_chars, int) or self.max_chars < 1:
            raise ValueError(f"compress max_chars must be a positive integer (got {self.max_chars!r})")

    def compress(self, query: str, source: str) -> str | None:
        """The extract of ``source`` for ``query``, or None when ``source`` already fits."""
        if len(source) <= self.max_chars:
            return None
        sents = split_sentences(source)
        q = set(tokenize(query))
        overlap = [len(q & set(tokenize(s))) for s in sents]
        # Only sentences sharing a query token; none: the leading sentences.
        scored = sorted((i for i in range(len(sents)) if overlap[i]), key=lambda i: (-overlap[i], i))
        leading = not scored
        if leading:
            scored = list(range(len(sents)))
        keep: list[int] = []
        used = 0
        for i in scored:
            piece = sents[i].strip()
            if keep and used + len(piece) > self.max_chars:
                if leading:
                    break  # a contiguous head, not a patchwork
                continue
            keep.append(i)
            used += len(piece)
            if used >= self.max_chars:
                break
        out = ""
        for i in sorted(keep):
            piece = sents[i].strip()
            # CJK sentences join without a space; Latin ones with one.
            out += piece if not out or not out[-1].isascii() else " " + piece
        if len(out) > self.max_chars:
            out = out[: self.max_chars]  # one sentence longer than the budget: its head
        return out

    def process(self, query: str, snippets: list[dict[str, Any]]) -> list[dict[str, Any]]:
        out = []
        for s in snippets:
            source = s.get("prompt_text") or s.get("text") or ""
            extract = self.compress(query, str(source))
            out.append(mark_layer(s, self.name) if extract is None
                       else mark_layer(s, self.name, prompt_text=extract))
        return out
