"""Query-time layers: security gate, transforms, decomposition, Adaptive-RAG, CRAG,
automatic filters — and ``make_query_layers``, the one factory that wires them.

Each layer is off by default; with every layer off (and no competitor configured)
``make_query_layers`` returns the base retriever itself, so output is byte-identical.
Choices, each a keyword of ``make_query_layers`` or its variable when the keyword is None:

=========================  ===========================  ===================================
keyword                    variable                     values
=========================  ===========================  ===================================
``transform``              ``RAGSPINE_QUERY_TRANSFORM``  none, rag_fusion, hyde, step_back
``decompose``              ``RAGSPINE_QUERY_DECOMPOSE``  none, llm (``llm:3``: at most 3; N <= 8)
``adaptive``               ``RAGSPINE_ADAPTIVE``         off, on/heuristic, llm
``corrective``             ``RAGSPINE_CORRECTIVE``       off, on/heuristic, llm (LLM grader +
                                                         rewrite)
``auto_filters``           ``RAGSPINE_AUTO_FILTERS``     off, on (glossary rules), llm (rules +
                                                         LLM proposal)
``postprocessor``          ``RAGSPINE_POSTPROCESSOR``    see ``make_postprocessor``
competitors (gate)         ``RAGSPINE_SECURITY_CONFIG``  JSON file; ``RAGSPINE_COMPETITORS``
                                                         a comma list; glossary groups of
                                                         kind ``competitor``
=========================  ===========================  ===================================

LLM layers use ``provider`` (an ``LLMProvider``), else ``RAGSPINE_LLM_BASE_URL``'s
OpenAI-compatible endpoint; asking for one with neither is a ValueError naming them.
RAG-Fusion needs no LLM: with no provider it fuses the glossary rewriter's variants.
"""

from __future__ import annotations

import copy
import dataclasses
import os
from typing import Any

from ... import settings
from ...llm.provider import LLM_BASE_URL_ENV, provider_from_env
from ..hybrid.unwrap import hybrid_retrievers
from ..postprocess import IndexVectorLookup, make_postprocessor
from .adaptive import HeuristicComplexityClassifier, LLMComplexityClassifier, Route
from .auto_filters import AutoFilterExtractor, LLMFilterExtractor
from .corrective import CorrectiveConfig, Grade, HeuristicGrader, LLMGrader
from .decompose import MAX_SUBQUESTIONS, LLMDecomposer
from .gate import GatedRewriter, SecurityConfigError, SecurityGate, load_competitors
from .llm_text import LayerFailure
from .pipeline import LayeredRetriever
from .result import Refusal, RetrievalResult
from .transforms import HyDE, RAGFusion, StepBack, Variant

QUERY_TRANSFORM_ENV = "RAGSPINE_QUERY_TRANSFORM"
QUERY_DECOMPOSE_ENV = "RAGSPINE_QUERY_DECOMPOSE"
ADAPTIVE_ENV = "RAGSPINE_ADAPTIVE"
CORRECTIVE_ENV = "RAGSPINE_CORRECTIVE"
AUTO_FILTERS_ENV = "RAGSPINE_AUTO_FILTERS"
_OFF = ("", "0", "off", "none", "false", "no")
_ON = ("1", "on", "true", "yes", "heuristic", "auto")


def _spec(value: str | None, env: str) -> tuple[str, str]:
    """(text, folded name) of a layer's spec: ``value``, else the variable (checked by the
    settings registry: a bad one is a SettingsError naming it), else its default."""
    raw = value if value is not None else settings.get(env)
    if not isinstance(raw, str):
        raise TypeError(f"{env.removeprefix('RAGSPINE_').lower()} spec must be a string or None "
                        f"(got {type(raw).__name__})")
    return raw, raw.strip().lower()


def _provider(provider: Any, layer: str) -> Any:
    p = provider if provider is not None else provider_from_env()
    if p is None:
        raise ValueError(f"{layer} needs an LLM: pass provider=... or set {LLM_BASE_URL_ENV}")
    return p


def _rewriter(base: Any) -> Any:
    for h in hybrid_retrievers(base):
        rw = getattr(h, "rewriter", None)
        if rw is not None:
            return rw.inner if isinstance(rw, GatedRewriter) else rw
    return None


def _vector_lookup(base: Any) -> IndexVectorLookup:
    """MMR's view of the served vectors: library id -> HybridRetriever."""
    if hasattr(base, "retrievers"):
        return IndexVectorLookup({lib: h for lib, r in base.retrievers.items() for h in hybrid_retrievers(r)})
    hs = hybrid_retrievers(base)
    lib = getattr(getattr(base, "index", None), "library_id", "") or ""
    return IndexVectorLookup({lib: hs[0]} if hs else {})


def _gated_copy(base: Any, gate: SecurityGate) -> Any:
    """A copy of ``base`` whose glossary rewriters pass variants through ``gate``; the
    shared index, vectors and caches are reused, the original retriever is untouched."""
    if hasattr(base, "retrievers"):
        view = copy.copy(base)
        view.retrievers = {lib: _gated_copy(r, gate) for lib, r in base.retrievers.items()}
        return view
    index = getattr(base, "index", None)
    hybrid = getattr(index, "retriever", None)
    if hybrid is None or getattr(hybrid, "rewriter", None) is None or isinstance(hybrid.rewriter, GatedRewriter):
        return base
    h = copy.copy(hybrid)
    h.rewriter = GatedRewriter(hybrid.rewriter, gate)
    view = copy.copy(base)
    view.index = dataclasses.replace(index, retriever=h)
    return view


def make_query_transform(spec: str | None = None, *, provider: Any = None, rewriter: Any = None) -> Any:
    raw, name = _spec(spec, QUERY_TRANSFORM_ENV)
    if name in _OFF:
        return None
    if name in ("rag_fusion", "rag-fusion", "fusion"):
        p = provider if provider is not None else provider_from_env()
        if p is None and rewriter is None:
            raise ValueError("rag_fusion needs a glossary rewriter or an LLM (provider / "
                             f"{LLM_BASE_URL_ENV})")
        return RAGFusion(rewriter=rewriter, provider=p)
    if name == "hyde":
        return HyDE(_provider(provider, "hyde"))
    if name in ("step_back", "step-back", "stepback"):
        return StepBack(_provider(provider, "step_back"))
    raise ValueError(f"unknown query transform {raw!r}; accepted values: none, rag_fusion, hyde, step_back")


def make_query_layers(base: Any, *, transform: str | None = None, decompose: str | None = None,
                      adaptive: str | None = None, corrective: str | None = None,
                      auto_filters: str | None = None, postprocessor: Any = None,
                      provider: Any = None, gate: SecurityGate | None = None,
                      glossary: str | os.PathLike[str] | None = None, embedding_backend: Any = None) -> Any:
    """``base`` with the chosen layers around it (``LayeredRetriever``), or ``base``
    itself when every layer is off and no competitor is configured."""
    rewriter = _rewriter(base)
    tr = make_query_transform(transform, provider=provider, rewriter=rewriter)

    raw, name = _spec(decompose, QUERY_DECOMPOSE_ENV)
    dec = None
    if name not in _OFF:
        kind, _, n = name.partition(":")
        if kind != "llm":
            raise ValueError(f"unknown {QUERY_DECOMPOSE_ENV} value {raw!r}; accepted values: none, llm, llm:N")
        max_n = int(n) if n.strip().isdigit() else 0 if n else 4
        if not 1 <= max_n <= MAX_SUBQUESTIONS:  # the ceiling: an error, never clamped
            raise settings.SettingsError(QUERY_DECOMPOSE_ENV, raw, f"none, llm or llm:N with N from 1 to "
                                         f"{MAX_SUBQUESTIONS}", source="argument" if decompose else "environment")
        dec = LLMDecomposer(_provider(provider, "decompose"), max_subquestions=max_n)

    raw, name = _spec(adaptive, ADAPTIVE_ENV)
    ada = None
    if name in _ON:
        ada = HeuristicComplexityClassifier(rewriter=rewriter)
    elif name == "llm":
        ada = LLMComplexityClassifier(_provider(provider, "adaptive"),
                                      fallback=HeuristicComplexityClassifier(rewriter=rewriter))
    elif name not in _OFF:
        raise ValueError(f"unknown {ADAPTIVE_ENV} value {raw!r}; accepted values: off, on, llm")

    raw, name = _spec(corrective, CORRECTIVE_ENV)
    crag = None
    if name in _ON:
        crag = CorrectiveConfig()
    elif name == "llm":
        p = _provider(provider, "corrective")
        crag = CorrectiveConfig(grader=LLMGrader(p), provider=p)
    elif name not in _OFF:
        raise ValueError(f"unknown {CORRECTIVE_ENV} value {raw!r}; accepted values: off, on, llm")

    raw, name = _spec(auto_filters, AUTO_FILTERS_ENV)
    auto = None
    if name in _ON:
        auto = AutoFilterExtractor(rewriter=rewriter)
    elif name == "llm":
        auto = LLMFilterExtractor(_provider(provider, "auto_filters"), fallback=AutoFilterExtractor(rewriter=rewriter))
    elif name not in _OFF:
        raise ValueError(f"unknown {AUTO_FILTERS_ENV} value {raw!r}; accepted values: off, on, llm")

    post = postprocessor
    if post is None or isinstance(post, str):
        post = make_postprocessor(post, embedding_backend=embedding_backend, vectors=_vector_lookup(base))

    gate = gate if gate is not None else SecurityGate.from_env(glossary)
    if all(x is None for x in (tr, dec, ada, crag, auto, post)) and not gate.competitors:
        return base
    inner = _gated_copy(base, gate) if gate.competitors else base
    return LayeredRetriever(inner, gate=gate, transform=tr, decomposer=dec, adaptive=ada, corrective=crag,
                            auto_filters=auto, postprocessor=post)


__all__ = ["ADAPTIVE_ENV", "AUTO_FILTERS_ENV", "CORRECTIVE_ENV", "QUERY_DECOMPOSE_ENV", "QUERY_TRANSFORM_ENV",
           "AutoFilterExtractor", "CorrectiveConfig", "GatedRewriter", "Grade", "HeuristicComplexityClassifier",
           "HeuristicGrader", "HyDE", "LLMComplexityClassifier", "LLMDecomposer", "LLMFilterExtractor", "LLMGrader", "LayerFailure",
           "LayeredRetriever", "RAGFusion", "Refusal", "RetrievalResult", "Route", "SecurityConfigError",
           "SecurityGate", "StepBack", "Variant", "load_competitors", "make_query_layers",
           "make_query_transform"]
