"""``make_reranker``: choose a reranker by name (the spec's module path).

``none`` (default) -> no reranking. ``llm`` / ``listwise`` -> the listwise LLM judge over
an OpenAI-compatible endpoint (RAGSPINE_LLM_BASE_URL / _MODEL / _API_KEY). Local neural
rerankers (``cross_encoder`` / ``ce``, ``colbert``, ``splade``) need model weights from a
package that ships them; until such a backend is wired, naming one raises
``RerankerUnavailable`` rather than silently reranking with nothing. ``auto`` resolves
instead of raising: the first local reranker that can be built here, else None (no
reranking), so ``RAGSPINE_RERANKER=auto`` is safe to set everywhere.

The service wiring (CLI, RetrievalResource, the ``ask`` job) calls ``reranker_from_env``
so ``RAGSPINE_RERANKER`` means the same thing on every path.
"""

from __future__ import annotations

import os

from ...llm.provider import OpenAICompatibleProvider
from .listwise_rerank import ListwiseReranker, ProviderListwiseJudge, Reranker

RERANKER_ENV = "RAGSPINE_RERANKER"
LOCAL_RERANKERS = ("cross_encoder", "ce", "colbert", "splade")
# What ``auto`` tries, best first.
AUTO_ORDER = ("cross_encoder", "colbert", "splade")
ACCEPTED = ("none", "auto", "llm", "listwise", *LOCAL_RERANKERS)


class RerankerUnavailable(RuntimeError):
    """The named reranker cannot be built here; the message says what is missing."""


def _make_local(name: str) -> Reranker:
    """A local neural reranker by name; RerankerUnavailable when it cannot be built."""
    kind = "cross_encoder" if name == "ce" else name
    raise RerankerUnavailable(
        f"reranker {name!r} needs local {kind} model weights, and no installed package "
        "ships them (no network at run time); use 'llm' with a local endpoint, or 'none'"
    )


def make_reranker(spec: str | None = None) -> Reranker | None:
    """Reranker for ``spec`` (``RAGSPINE_RERANKER`` when None; unset means none)."""
    raw = spec if spec is not None else os.environ.get(RERANKER_ENV, "none")
    if not isinstance(raw, str):
        raise TypeError(f"reranker spec must be a string or None (got {type(raw).__name__})")
    name = raw.strip().lower()
    if name in ("", "none", "off"):
        return None
    if name in ("llm", "listwise"):
        return ListwiseReranker(ProviderListwiseJudge(OpenAICompatibleProvider.from_env()))
    if name == "auto":
        for candidate in AUTO_ORDER:
            try:
                return _make_local(candidate)
            except RerankerUnavailable:
                continue
        return None
    if name in LOCAL_RERANKERS:
        return _make_local(name)
    raise ValueError(f"unknown reranker {raw!r}; use one of: {', '.join(ACCEPTED)}")


def reranker_from_env() -> Reranker | None:
    """The reranker the service wiring uses: ``RAGSPINE_RERANKER`` (default none)."""
    return make_reranker(os.environ.get(RERANKER_ENV, "none"))
