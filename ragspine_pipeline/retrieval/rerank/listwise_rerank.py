"""Listwise reranking with RESTRICTED exit #1.

Restricted candidates never reach a judge or a reranker: they keep their RRF position
and only the open candidates are permuted among the open slots. If every candidate in
the head is restricted the judge is not called. A judge that raises, times out or
answers something that is not a permutation -- or an object that is no judge at all --
leaves the order as it was, with a logged warning: ``listwise_rerank`` never raises (the
spec), because reranking is an improvement layer and must never lose or reorder results
on failure. The wiring points (``ListwiseReranker``, ``require_judge``) still refuse a
wrong shape with a TypeError where it is assembled.
"""

from __future__ import annotations

import logging
import math
import numbers
import re
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from ...llm.provider import LLMProvider
from ...sensitivity import RESTRICTED_SENSITIVITY, is_restricted
from .scoring import candidate_field

_log = logging.getLogger(__name__)
DEFAULT_TOP_N = 10
__all__ = ["DEFAULT_TOP_N", "RESTRICTED_SENSITIVITY", "ListwiseJudge", "ListwiseReranker",
           "ProviderListwiseJudge", "Reranker", "annotate_snippet", "build_listwise_prompt", "guarded_rerank",
           "listwise_rerank", "parse_listwise_response", "require_judge", "require_reranker"]
MAX_PASSAGE_CHARS = 700


@runtime_checkable
class ListwiseJudge(Protocol):
    """Orders candidate texts for a query; returns a permutation of range(len(candidates))."""

    def judge(self, query: str, candidates: list[str]) -> list[int]: ...


@runtime_checkable
class Reranker(Protocol):
    """Scores candidate records (dicts with at least chunk_id, text and sensitivity).

    ``rerank(query, candidates)`` returns one float per candidate, aligned, higher is
    better (the model rerankers: ``scoring.ScoringReranker``). For the listwise judge, and
    for rerankers written before scores, returning the candidates themselves reordered is
    also accepted. Either way only ``guarded_rerank`` turns the answer into an order, so
    exit #1 holds for every reranker.
    """

    def rerank(self, query: str, candidates: Sequence[Mapping[str, Any]]) -> Sequence[float] | list[Mapping[str, Any]]: ...


def _not_a_judge(judge: Any) -> str | None:
    """Why ``judge`` is not a ListwiseJudge (with a hint naming what it looks like), or None."""
    if callable(getattr(judge, "judge", None)):
        return None
    hint = ""
    if callable(getattr(judge, "chat", None)):
        hint = " (it looks like an LLMProvider: wrap it in ProviderListwiseJudge(provider))"
    elif callable(getattr(judge, "rerank", None)):
        hint = " (it looks like a Reranker: pass it as reranker=, not as a judge)"
    return (f"{type(judge).__name__} is not a ListwiseJudge: it needs a "
            f"judge(query, candidates) -> list[int] method{hint}")


def require_judge(judge: Any) -> ListwiseJudge:
    """``judge`` if it has a callable ``judge(query, candidates)``; else a TypeError.

    For the wiring points (``ListwiseReranker``, ``ProviderListwiseJudge`` users): a wrong
    shape fails where it is assembled. ``listwise_rerank`` itself never raises (the spec):
    it logs the same message and keeps the RRF order.
    """
    problem = _not_a_judge(judge)
    if problem is not None:
        raise TypeError(problem)
    return judge


def require_reranker(reranker: Any) -> Reranker:
    """A Reranker as given, a ListwiseJudge wrapped in ListwiseReranker; else a TypeError."""
    if callable(getattr(reranker, "rerank", None)):
        return reranker
    if callable(getattr(reranker, "judge", None)):
        return ListwiseReranker(reranker)
    hint = (" (it looks like an LLMProvider: pass it as provider=)"
            if callable(getattr(reranker, "chat", None)) else "")
    raise TypeError(f"{type(reranker).__name__} is neither a Reranker (rerank(query, candidates)) "
                    f"nor a ListwiseJudge (judge(query, candidates)){hint}")


def _is_permutation(perm: Any, n: int) -> bool:
    """Exactly the integers 0..n-1, each once (bools and floats are not ids)."""
    try:
        seq = list(perm)
    except TypeError:
        return False
    if not all(isinstance(i, numbers.Integral) and not isinstance(i, bool) for i in seq):
        return False
    return sorted(int(i) for i in seq) == list(range(n))


def listwise_rerank(query: str, results: Sequence[Any], judge: ListwiseJudge, *,
                    top_n: int = DEFAULT_TOP_N) -> list[Any]:
    """Rerank the first ``top_n`` results with ``judge``; never raises (the spec).

    Exit #1: restricted candidates are never shown to the judge and keep their position;
    only the open slots are permuted. Fewer than two open candidates -> the judge is not
    called. Anything else that goes wrong -- ``judge`` is not a ListwiseJudge at all, it
    raises, or it answers something that is not a permutation -- keeps the identity (RRF)
    order and logs a warning saying why, so a wiring mistake is visible without costing
    the answer.
    """
    try:
        items = list(results)
    except Exception:  # noqa: BLE001 - never raises, by contract
        _log.warning("listwise_rerank: results are not iterable (%s); nothing to rerank",
                     type(results).__name__)
        return []
    problem = _not_a_judge(judge)
    if problem is not None:
        _log.warning("listwise_rerank: %s; the RRF order is kept", problem)
        return items
    try:
        head, tail = items[: max(top_n, 0)], items[max(top_n, 0):]
        open_slots = [i for i, r in enumerate(head) if not is_restricted(candidate_field(r, "sensitivity"))]
        if len(open_slots) < 2:
            return items  # nothing to order (all restricted -> judge never called)
        passages = [str(candidate_field(head[i], "text") or "") for i in open_slots]
        perm = judge.judge(query, passages)
        if not _is_permutation(perm, len(open_slots)):
            _log.warning("listwise_rerank: %s answered %.80r, not a permutation of %d candidates; "
                         "the RRF order is kept", type(judge).__name__, perm, len(open_slots))
            return items
        new_head = list(head)
        for slot, j in zip(open_slots, [int(i) for i in perm], strict=True):
            new_head[slot] = head[open_slots[j]]
        return new_head + tail
    except Exception as exc:  # noqa: BLE001 - judge failures fall back to identity order
        _log.warning("listwise_rerank: %s failed (%s: %s); the RRF order is kept",
                     type(judge).__name__, type(exc).__name__, exc)
        return items


def _reranker_name(reranker: Any) -> str:
    name = getattr(reranker, "name", None)
    return name if isinstance(name, str) and name else type(reranker).__name__


def _is_scores(out: Sequence[Any], n: int) -> bool:
    """Exactly ``n`` finite real numbers (bools are not scores)."""
    return len(out) == n and all(
        isinstance(s, numbers.Real) and not isinstance(s, bool) and math.isfinite(float(s)) for s in out)


def _annotated(c: Any, **fields: Any) -> Any:
    """A copy of a dict candidate with ``fields`` added (other candidates as they are)."""
    return {**c, **fields} if isinstance(c, Mapping) else c


def guarded_rerank(query: str, candidates: Sequence[Mapping[str, Any]], reranker: Reranker) -> list[Mapping[str, Any]]:
    """Exit #1 for *any* reranker: only open candidates are shown, restricted keep slots.

    The reranker answers either scores aligned with the open candidates (the ``Reranker``
    protocol: the model rerankers) or, as the listwise judge does, the open candidates
    reordered (accepted only if it is exactly them, by chunk_id). Open candidates are
    ordered by score (ties keep the incoming order) and placed back into the open slots.
    Scored dict candidates come back as copies carrying ``rerank_score`` and ``reranker``
    (and ``rerank_detail`` when the reranker explains itself), which the snippet records;
    the listwise form leaves the candidates as they are (its snippets stay as the spec has them).
    A reranker that raises or answers anything else leaves the incoming order; the
    failure is logged and, on dict candidates, recorded as ``rerank_error`` — never raised.
    """
    items = list(candidates)
    open_slots = [i for i, c in enumerate(items) if not is_restricted(candidate_field(c, "sensitivity"))]
    if len(open_slots) < 2:
        return items
    shown = [items[i] for i in open_slots]
    name = _reranker_name(reranker)

    def failed(why: str) -> list[Any]:
        _log.warning("reranker %s failed (%s); the fused order is kept", name, why)
        return [_annotated(c, reranker=name, rerank_error=why) if k in open_slots else c
                for k, c in enumerate(items)]

    try:
        answer = reranker.rerank(query, shown)
        details = getattr(answer, "details", None)  # RerankScores' explanations, if any
        out = list(answer)
    except Exception as exc:  # noqa: BLE001 - a model failure degrades, never raises
        return failed(type(exc).__name__)
    if _is_scores(out, len(shown)):
        if details is not None and len(details) != len(out):
            details = None
        order = sorted(range(len(shown)), key=lambda j: (-float(out[j]), j))
        ranked = []
        for j in order:
            extra = {"rerank_score": float(out[j]), "reranker": name}
            if details is not None and details[j] is not None:
                extra["rerank_detail"] = details[j]
            ranked.append(_annotated(shown[j], **extra))
    elif sorted(str(candidate_field(c, "chunk_id")) for c in out) == sorted(str(candidate_field(c, "chunk_id")) for c in shown):
        # The listwise form: an order, no score; candidates as they are (the judge's own
        # failures already fall back to the identity order inside listwise_rerank).
        ranked = out
    else:
        return failed("answer was neither scores nor a permutation of the candidates")
    merged = list(items)
    for slot, c in zip(open_slots, ranked, strict=True):
        merged[slot] = c
    return merged


def annotate_snippet(snippet: dict[str, Any], candidate: Mapping[str, Any]) -> dict[str, Any]:
    """Record in a snippet what the reranker did to its candidate: ``scores.rerank`` and
    ``reranker`` (plus ``rerank_detail`` / ``rerank_error``). A candidate no reranker saw
    leaves the snippet unchanged, so output is byte-identical with reranking off."""
    if not isinstance(candidate, Mapping) or "reranker" not in candidate:
        return snippet
    snippet["reranker"] = candidate["reranker"]
    if "rerank_score" in candidate:
        snippet.setdefault("scores", {})["rerank"] = candidate["rerank_score"]
    for key in ("rerank_detail", "rerank_error"):
        if key in candidate:
            snippet[key] = candidate[key]
    return snippet


def build_listwise_prompt(query: str, candidates: Sequence[str], *,
                          max_passage_chars: int = MAX_PASSAGE_CHARS) -> str:
    """RankGPT-style prompt: numbered passages, answer as ``[2] > [1] > [3]``."""
    passages = list(candidates)
    lines = [
        f"I will give you {len(passages)} passages, each marked with a number in brackets.",
        f"Rank them by how well they answer the question: {query}",
        "",
    ]
    for i, p in enumerate(passages, start=1):
        text = " ".join(str(p).split())
        if len(text) > max_passage_chars:
            text = text[:max_passage_chars] + " …"
        lines.append(f"[{i}] {text}")
    lines += [
        "",
        f"Question: {query}",
        "Answer only with the ranking, most relevant first, in the form [2] > [1] > [3], "
        f"using every number from 1 to {len(passages)} exactly once.",
    ]
    return "\n".join(lines)


_NUM = re.compile(r"\d+")


def parse_listwise_response(text: Any, n_candidates: int) -> list[int]:
    """0-based permutation from a judge's answer; identity when nothing usable is there.

    Numbers are read as 1-based passage ids; out-of-range ids and repeats are dropped and
    missing ids are appended in their original order.
    """
    n = n_candidates
    if isinstance(n, bool) or not isinstance(n, int) or n <= 0:
        return []
    try:
        nums = [int(m) for m in _NUM.findall(str(text))]
    except Exception:  # noqa: BLE001
        return list(range(n))
    seen: list[int] = []
    for x in nums:
        i = x - 1
        if 0 <= i < n and i not in seen:
            seen.append(i)
    if not seen:
        return list(range(n))
    return seen + [i for i in range(n) if i not in seen]


SYSTEM_PROMPT = "You rank search results. Answer with the ranking only."


class ProviderListwiseJudge:
    """A ListwiseJudge backed by an LLMProvider: one ``provider.chat(...)`` call per
    judgement. Provider errors propagate to ``listwise_rerank``, which falls back to the
    identity order."""

    def __init__(self, provider: LLMProvider, *, max_passage_chars: int = MAX_PASSAGE_CHARS,
                 max_tokens: int = 256) -> None:
        if not callable(getattr(provider, "chat", None)):
            raise TypeError(f"{type(provider).__name__} is not an LLMProvider: it needs a "
                            "chat(messages, **options) -> str method")
        self.provider = provider
        self.max_passage_chars = max_passage_chars
        self.max_tokens = max_tokens

    def judge(self, query: str, candidates: list[str]) -> list[int]:
        prompt = build_listwise_prompt(query, candidates, max_passage_chars=self.max_passage_chars)
        answer = self.provider.chat(
            [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": prompt}],
            max_tokens=self.max_tokens, temperature=0.0,
        )
        return parse_listwise_response(answer, len(candidates))


class ListwiseReranker:
    """Reranker adapter over a ListwiseJudge (the LLM judge path)."""

    name = "listwise"

    def __init__(self, judge: ListwiseJudge, top_n: int = DEFAULT_TOP_N) -> None:
        self.judge = require_judge(judge)
        self.top_n = top_n

    def rerank(self, query: str, candidates: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
        return listwise_rerank(query, candidates, self.judge, top_n=self.top_n)
