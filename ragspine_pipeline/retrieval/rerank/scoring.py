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
import logging
import math
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ...sensitivity import is_restricted

_log = logging.getLogger(__name__)

DEFAULT_RERANK_TOP_N = 100  # candidates in; the retriever's top_k comes out
DEFAULT_BATCH_SIZE = 16

__all__ = ["DEFAULT_BATCH_SIZE", "DEFAULT_RERANK_TOP_N", "RerankScores", "ScoringReranker",
           "candidate_field", "text_key"]


class RerankScores(list):
    """Scores aligned with the candidates (a plain ``list[float]``), plus optional
    per-candidate ``details`` (e.g. SPLADE's top expansion terms) that end up in the
    snippet next to ``scores.rerank``."""

    def __init__(self, scores: Sequence[float], details: Sequence[Any] | None = None) -> None:
        super().__init__(float(s) for s in scores)
        self.details: list[Any] | None = list(details) if details is not None else None
        if self.details is not None and len(self.details) != len(self):
            raise ValueError("details must align with scores")


def text_key(text: str) -> str:
    """The content key of a passage text, shared by the passage cache and the precomputed
    document vectors (``warehouse.rerank_vectors``)."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


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
    rerankers (SPLADE, late interaction) keep their passage vectors here.

    ``attach`` adds backing sources (``warehouse.rerank_vectors.RerankVectorStore``: a
    library's precomputed document vectors) consulted before anything is encoded; a text
    none of them holds is encoded on the fly. A source that fails is logged and skipped —
    precomputed vectors are an optimisation, never a reason for a query to fail. With
    ``write_back`` the first source also receives what was encoded (a disk cache)."""

    def __init__(self, size: int) -> None:
        self._items: OrderedDict[str, Any] = OrderedDict()
        self._size = size
        self._lock = threading.Lock()
        self._sources: list[Any] = []
        self._model_id = ""
        self._write_back = False
        self.stats = {"memory": 0, "stored": 0, "encoded": 0}

    def attach(self, sources: Sequence[Any], model_id: str, *, write_back: bool = False) -> None:
        """Serve from ``sources`` (objects with ``get_many(model_id, keys)``) under ``model_id``."""
        for src in sources:
            if not callable(getattr(src, "get_many", None)):
                raise TypeError(f"{type(src).__name__} has no get_many(model_id, keys)")
        if write_back and (not sources or not callable(getattr(sources[0], "put_many", None))):
            raise TypeError("write_back needs a first source with put_many(model_id, items)")
        self._sources, self._model_id, self._write_back = list(sources), model_id, write_back

    @property
    def sources(self) -> tuple[Any, ...]:
        return tuple(self._sources)

    def clear(self) -> None:
        with self._lock:
            self._items.clear()

    def _from_sources(self, keys: list[str]) -> dict[str, Any]:
        found: dict[str, Any] = {}
        for src in self._sources:
            want = [k for k in keys if k not in found]
            if not want:
                break
            try:
                found.update(src.get_many(self._model_id, want))
            except Exception as exc:  # noqa: BLE001 - degrade to on-the-fly encoding
                _log.warning("document vectors from %s unavailable (%s: %s); encoding on the fly",
                             getattr(src, "path", type(src).__name__), type(exc).__name__, exc)
        return found

    def encode(self, texts: Sequence[str], encode_batch: Callable[[list[str]], Sequence[Any]],
               batch_size: int) -> list[Any]:
        keys = [text_key(t) for t in texts]
        with self._lock:
            have = {k: self._items[k] for k in keys if k in self._items}
        todo = list(dict.fromkeys(k for k in keys if k not in have))
        self.stats["memory"] += len(set(have))
        if todo and self._sources:
            stored = self._from_sources(todo)
            have.update(stored)
            self.stats["stored"] += len(stored)
            todo = [k for k in todo if k not in stored]
        fresh: dict[str, Any] = {}
        if todo:
            first = dict(zip(keys, texts, strict=True))
            for start in range(0, len(todo), batch_size):
                part = todo[start: start + batch_size]
                for k, v in zip(part, encode_batch([first[k] for k in part]), strict=True):
                    fresh[k] = v
            have.update(fresh)
            self.stats["encoded"] += len(fresh)
            if self._write_back:
                try:
                    self._sources[0].put_many(self._model_id, fresh)
                except Exception as exc:  # noqa: BLE001 - the cache is optional
                    _log.warning("could not write document vectors back (%s: %s)", type(exc).__name__, exc)
        new = [k for k in dict.fromkeys(keys) if k not in self._items]
        with self._lock:
            for k in new:
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

    def use_document_vectors(self, sources: Any, *, write_back: bool = False) -> None:
        """Serve passage encodings from precomputed document vectors (one store or a list),
        falling back to on-the-fly encoding for texts they lack. Only rerankers that keep
        passage encodings (``_passages``) support it."""
        cache = getattr(self, "_passages", None)
        if cache is None:
            raise TypeError(f"{self.name} does not use document vectors")
        srcs = list(sources) if isinstance(sources, list | tuple) else [sources]
        cache.attach(srcs, self.vectors_id, write_back=write_back)

    @property
    def vectors_id(self) -> str:
        """What precomputed passage encodings are keyed by: the model id (content-hashed
        weights) and the truncation length, so a vector made under other settings is never
        served."""
        length = getattr(self, "max_length", None)
        return f"{getattr(self, 'model_id', self.name)}|max_length={length}"

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
