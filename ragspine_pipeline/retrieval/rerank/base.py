"""The ``Reranker`` protocol and exit #1 (``guarded_rerank``): the one seam every reranker
goes through, so the RESTRICTED rule is kept in one place.

Every reranker family (the listwise LLM judge, the cross-encoder, late interaction,
SPLADE, the visual slot) implements ``Reranker`` and is only ever called through
``guarded_rerank``: restricted candidates are never shown to a model and keep their
slots, and a model failure keeps the fused order. The protocol lives here, below the
families, so each of them and the link layer import it downwards
(``listwise_rerank`` re-exports both names, their older import path).
"""

from __future__ import annotations

import logging
import math
import numbers
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from ...sensitivity import is_restricted
from .scoring import candidate_field

_log = logging.getLogger(__name__)

__all__ = ["Reranker", "annotate_snippet", "guarded_rerank"]


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
