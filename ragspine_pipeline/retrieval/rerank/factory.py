"""``make_reranker``: choose a reranker by name (``RAGSPINE_RERANKER`` when None).

``none`` (default) -> no reranking. ``llm`` / ``listwise`` -> the listwise LLM judge over
an OpenAI-compatible endpoint (RAGSPINE_LLM_BASE_URL / _MODEL / _API_KEY). Local neural
rerankers (``cross_encoder``/``ce``/``auto``, ``colbert``, ``splade``) need model weights
from a package that ships them; until that backend is wired they raise a clear error
rather than silently reranking with nothing.
"""

from __future__ import annotations

import os

from ...llm.provider import OpenAICompatibleProvider
from .listwise_rerank import ListwiseReranker, ProviderListwiseJudge, Reranker

LOCAL_RERANKERS = ("cross_encoder", "ce", "auto", "colbert", "splade")


class RerankerUnavailable(RuntimeError):
    """The named reranker cannot be built here; the message says what is missing."""


def make_reranker(spec: str | None = None) -> Reranker | None:
    name = (spec if spec is not None else os.environ.get("RAGSPINE_RERANKER", "none")).strip().lower()
    if name in ("", "none", "off"):
        return None
    if name in ("llm", "listwise"):
        return ListwiseReranker(ProviderListwiseJudge(OpenAICompatibleProvider.from_env()))
    if name in LOCAL_RERANKERS:
        raise RerankerUnavailable(
            f"reranker {name!r} needs local model weights: no installed package ships a "
            "cross-encoder or ColBERT model, and the SPLADE backend is not wired yet"
        )
    raise ValueError(f"unknown reranker {spec!r}; use none, llm, listwise, {', '.join(LOCAL_RERANKERS)}")
