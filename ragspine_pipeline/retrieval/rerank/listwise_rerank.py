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
import numbers
import re
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from ...llm.provider import LLMProvider
from ...sensitivity import RESTRICTED_SENSITIVITY, is_restricted
from .base import Reranker, annotate_snippet, guarded_rerank
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
