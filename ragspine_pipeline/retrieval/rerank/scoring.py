"""The shared shape of every local (model) reranker: score candidates, never reorder them.

A local reranker answers ``rerank(query, candidates) -> RerankScores``: one float per
candidate, aligned with the input, higher is better. ``guarded_rerank`` (exit #1) turns
the scores into an order, keeps RESTRICTED candidates in their slots and falls back to
the fused order when anything goes wrong, so a model never decides what is shown, only
how open candidates are ordered among themselves.

``ScoringReranker`` holds what every model reranker needs and none should re-implement:
batching, the top-N window (only the first ``top_n`` candidates are scored; the rest keep
their fused order below them), and a second RESTRICTED guard of its own — a restricted
candidate handed to a reranker directly is never passed to the model and scores ``-inf``.
Subclasses implement ``score_texts(query, texts) -> list[float]`` (truncation to the
model's max length happens in their tokenizer).
"""

from __future__ import annotations

import hashlib
import math
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ...sensitivity import is_restricted

DEFAULT_RERANK_TOP_N = 100  # candidates in; the retriever's top_k comes out
DEFAULT_BATCH_SIZE = 16

__all__ = ["DEFAULT_BATCH_SIZE", "DEFAULT_RERANK_TOP_N", "RerankScores", "ScoringReranker",
           "candidate_field"]


class RerankScores(list):
    """Scores aligned with the candidates (a plain ``list[float]``), plus optional
    per-candidate ``details`` (e.g. SPLADE's top expansion terms) that end up in the
    snippet next to ``scores.rerank``."""

    def __init__(self, scores: Sequence[float], details: Sequence[Any] | None = None) -> None:
        super().__init__(float(s) for s in scores)
        self.details: list[Any] | None = list(details) if details is not None else None
        if self.details is not None and len(self.details) != len(self):
            raise ValueError("details must align with scores")


def candidate_field(c: Any, name: str) -> Any:
    """A candidate's field: a dict key, a RetrievalHit's ``chunk.<name>``, or an attribute."""
    if isinstance(c, Mapping):
        return c.get(name)
    chunk = getattr(c, "chunk", None)
    if chunk is not None and hasattr(chunk, name):
        return getattr(chunk, name)
    return getattr(c, name, None)


class PassageCache:
    """Passage encodings by content hash: a bounded LRU shared by threads. ``encode``
    encodes each distinct unseen text once, in batches of ``batch_size``; the model
    rerankers (SPLADE, late interaction) keep their passage vectors here."""

    def __init__(self, size: int) -> None:
        self._items: OrderedDict[str, Any] = OrderedDict()
        self._size = size
        self._lock = threading.Lock()

    def encode(self, texts: Sequence[str], encode_batch: Callable[[list[str]], Sequence[Any]],
               batch_size: int) -> list[Any]:
        keys = [hashlib.sha1(t.encode("utf-8")).hexdigest() for t in texts]
        with self._lock:
            have = {k: self._items[k] for k in keys if k in self._items}
        todo = list(dict.fromkeys(k for k in keys if k not in have))
        if todo:
            first = dict(zip(keys, texts, strict=True))
            for start in range(0, len(todo), batch_size):
                part = todo[start: start + batch_size]
                for k, v in zip(part, encode_batch([first[k] for k in part]), strict=True):
                    have[k] = v
            with self._lock:
                for k in todo:
                    self._items[k] = have[k]
                while len(self._items) > self._size:
                    self._items.popitem(last=False)
        return [have[k] for k in keys]


class ScoringReranker:
    """Base of the model rerankers: top-N window, batching, restricted never scored."""

    name = "scoring"

    def __init__(self, *, top_n: int = DEFAULT_RERANK_TOP_N, batch_size: int = DEFAULT_BATCH_SIZE) -> None:
        for label, v in (("top_n", top_n), ("batch_size", batch_size)):
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise ValueError(f"{label} must be a positive int (got {v!r})")
        self.top_n = top_n
        self.batch_size = batch_size

    @property
    def rerank_depth(self) -> int:
        """How many fused candidates the retriever hands over (read by NarrativeIndexRetriever)."""
        return self.top_n

    def score_texts(self, query: str, texts: Sequence[str]) -> Sequence[float]:
        """One model call over a batch: one float per text. May return ``RerankScores``
        with ``details`` (an explanation per text)."""
        raise NotImplementedError

    def rerank(self, query: str, candidates: Sequence[Any]) -> RerankScores:
        """Scores for ``candidates`` (aligned). Only the first ``top_n`` open candidates
        are scored by the model; later ones score below every scored one, in their
        incoming order; restricted ones are never shown to the model and score -inf."""
        if not isinstance(query, str):
            raise TypeError(f"query must be a string (got {type(query).__name__})")
        items = list(candidates)
        open_idx = [i for i, c in enumerate(items) if not is_restricted(candidate_field(c, "sensitivity"))]
        head, rest = open_idx[: self.top_n], open_idx[self.top_n:]
        scores = [-math.inf] * len(items)
        details: list[Any] = [None] * len(items)
        any_detail = False
        for start in range(0, len(head), self.batch_size):
            batch = head[start: start + self.batch_size]
            texts = [str(candidate_field(items[i], "text") or "") for i in batch]
            answer = self.score_texts(query, texts)
            expl = getattr(answer, "details", None)
            got = [float(s) for s in answer]
            if len(got) != len(batch) or not all(math.isfinite(s) for s in got):
                raise ValueError(f"{self.name}: model returned {len(got)} scores for {len(batch)} "
                                 "texts, or a non-finite score")
            for j, i in enumerate(batch):
                scores[i] = got[j]
                if expl is not None:
                    details[i] = expl[j]
                    any_detail = True
        floor = min((scores[i] for i in head), default=0.0)
        for rank, i in enumerate(rest, start=1):
            scores[i] = floor - rank  # below every scored candidate, incoming order kept
        return RerankScores(scores, details if any_detail else None)
