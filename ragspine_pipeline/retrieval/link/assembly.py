"""The one assembly of the retrieval layers around a given index.

Every door wraps its indices here, so the same settings give the same layers:
``build_narrative_retriever`` (over a chunk store) and ``ragspine_pipeline.serving``
(over the published warehouse or the engine-only store — and through it the CLI, the
Python API, the ``RetrievalResource`` and the ``ask`` job)::

    index ─▶ NarrativeIndexRetriever(reranker: the argument, else RAGSPINE_RERANKER,
                                     else the provider's listwise judge)
          ─▶ (serving: several libraries fused, RAGSPINE_ROUTER picks them)
          ─▶ query layers + post-processors (make_query_layers: RAGSPINE_QUERY_TRANSFORM,
             _QUERY_DECOMPOSE, _ADAPTIVE, _CORRECTIVE, _AUTO_FILTERS, _POSTPROCESSOR)

The glossary (the argument, else ``RAGSPINE_GLOSSARY``, else the corpus root's glossary.json —
the demo glossary for the demo corpus) is the one
file the index's multi-query rewriter, the rules router and the query layers all read.

This module reads settings (the ``RAGSPINE_*`` variables, at call time), never the
warehouse; library fusion and the router live one floor up, in ``serving``, because
``MultiIndexRetriever`` sits above ``narrative_link``, which calls this module.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ... import paths, settings
from ...llm.provider import LLMProvider
from ..hybrid.retriever import HybridRetriever
from ..lexical.analysis.glossary import GlossaryError, GlossaryQueryRewriter
from ..postprocess.base import Postprocessor
from ..query import make_query_layers
from ..rerank.base import Reranker
from ..rerank.cross_encoder import make_reranker, reranker_from_env
from ..rerank.listwise_rerank import (
    ListwiseJudge,
    ListwiseReranker,
    ProviderListwiseJudge,
)
from ..vector.base import EmbeddingBackend
from .narrative_index import NarrativeIndex, NarrativeIndexRetriever

GLOSSARY_ENV = "RAGSPINE_GLOSSARY"
# make_query_layers keywords a door may set; a missing or None one reads its variable.
LAYER_KEYS = ("transform", "decompose", "adaptive", "corrective", "auto_filters", "postprocessor")
_OFF = ("", "none", "off")

GlossarySpec = GlossaryQueryRewriter | str | os.PathLike[str] | bool | None
RerankerSpec = Reranker | ListwiseJudge | str | None


def default_glossary_path() -> Path | None:
    """The glossary the default chain uses: ``RAGSPINE_GLOSSARY`` (a path, or none/off to
    disable), else the corpus root's own ``glossary.json`` (``RAGSPINE_CORPUS_ROOT``; the
    demo corpus by default, whose file is the demo glossary), else none: the demo's ACME
    synonyms never rewrite the queries of another corpus."""
    env = settings.raw(GLOSSARY_ENV)  # exact text: set-but-empty disables, as none/off do
    if env is not None:
        if env.strip().lower() in _OFF:
            return None
        path = Path(env)
        if not path.is_file():
            raise GlossaryError(f"{GLOSSARY_ENV}={env!r}: no such glossary file")
        return path
    return paths.corpus_glossary(paths.default_corpus_root())


def glossary_file(glossary: GlossarySpec = None) -> Path | None:
    """The glossary file every layer reads: None/True -> ``default_glossary_path()``;
    False -> none; a path -> that file (it must exist); a rewriter object -> none (it
    carries its own groups; the router and the gate then use no file)."""
    if glossary is False or isinstance(glossary, GlossaryQueryRewriter):
        return None
    if glossary is None or glossary is True:
        return default_glossary_path()
    if isinstance(glossary, str | os.PathLike):
        path = Path(glossary)
        if not path.is_file():
            raise GlossaryError(f"glossary {str(glossary)!r}: no such glossary file")
        return path
    raise TypeError(f"glossary must be a path, a GlossaryQueryRewriter, False or None "
                    f"(got {type(glossary).__name__})")


def resolve_glossary(glossary: GlossarySpec) -> GlossaryQueryRewriter | None:
    """The index's multi-query rewriter: None -> the default glossary (see
    ``default_glossary_path``); False -> no rewriter; a path -> that file; a rewriter as it is."""
    if isinstance(glossary, GlossaryQueryRewriter):
        return glossary
    path = glossary_file(glossary)
    return GlossaryQueryRewriter.from_file(path) if path is not None else None


def serving_reranker(reranker: RerankerSpec = None, provider: LLMProvider | None = None, *,
                     from_settings: bool = True) -> Reranker | ListwiseJudge | None:
    """The reranker of every index: ``reranker`` (an object, or a ``make_reranker`` spec),
    else ``RAGSPINE_RERANKER`` (with ``from_settings``), else the listwise judge over
    ``provider``. A local reranker takes precedence over the LLM judge, as the spec says.
    A provider without ``chat`` is a TypeError, never a silent no-op."""
    judge = ProviderListwiseJudge(provider) if provider is not None else None  # TypeError for a non-provider
    if isinstance(reranker, str):
        reranker = make_reranker(reranker)
    elif reranker is None and from_settings:
        reranker = reranker_from_env()
    if reranker is None and judge is not None:
        reranker = ListwiseReranker(judge)
    return reranker


def index_retriever(index: NarrativeIndex, *, reranker: Reranker | ListwiseJudge | None = None,
                    postprocessor: Postprocessor | None = None,
                    retry_without_filters: bool = True) -> NarrativeIndexRetriever:
    """One index's cited retriever with an already resolved reranker (``serving_reranker``:
    resolved once, shared by every library, so a model loads once)."""
    return NarrativeIndexRetriever(index, retry_without_filters=retry_without_filters,
                                   reranker=reranker, postprocessor=postprocessor)


def lexical_view(index: NarrativeIndex) -> NarrativeIndex:
    """The BM25-only index a lexical mode serves, over ``index``'s own chunks and BM25 index
    object (nothing opened, mapped or tokenized again): a service that serves a library in a
    dense mode and in ``bm25`` opens its published files once, and pays their lazy checks
    and its warm-up once. Built as a lexical load builds it (no backend, no vectors, the
    fusion of a retriever without one), from the same analyzer, glossary rewriter, index
    text and candidate depth, so its answers are those of a second load."""
    h = index.retriever
    view = HybridRetriever(h.chunks, analyzer=h.analyzer, rewriter=h.rewriter, index_text=h.index_text,
                           rrf_k=h.rrf_k, candidate_k=h.candidate_k, channels=("bm25",), bm25_index=h.index)
    return NarrativeIndex(view, index.library_id, index.version, info=index.info)


def check_layers(layers: Mapping[str, Any] | None) -> dict[str, Any]:
    """``layers`` as make_query_layers keywords; an unknown key is a TypeError naming them."""
    layers = dict(layers or {})
    unknown = sorted(set(layers) - set(LAYER_KEYS))
    if unknown:
        raise TypeError(f"unknown query layer option(s): {unknown}; use {', '.join(LAYER_KEYS)}")
    return layers


def with_layers(base: Any, *, layers: Mapping[str, Any] | None = None, provider: LLMProvider | None = None,
                glossary: Path | None = None, embedding_backend: EmbeddingBackend | None = None) -> Any:
    """``base`` (one index's retriever or several fused) with the query layers and the
    post-processors around it, once over all libraries; ``base`` itself when every layer
    is off (byte-identical output). ``layers`` values override the variables; ``glossary``
    is the file from ``glossary_file``."""
    return make_query_layers(base, **check_layers(layers), provider=provider, glossary=glossary,
                             embedding_backend=embedding_backend)


def assemble(index: NarrativeIndex, provider: LLMProvider | None = None, *, reranker: RerankerSpec = None,
             postprocessor: Postprocessor | None = None, glossary: GlossarySpec = None,
             layers: Mapping[str, Any] | None = None, embedding_backend: EmbeddingBackend | None = None,
             retry_without_filters: bool = True) -> Any:
    """One index wrapped with every layer: reranker, per-index ``postprocessor`` (an
    explicit object: it replaces ``RAGSPINE_POSTPROCESSOR``), query layers and
    post-processors from the settings. Several libraries go through ``serving``."""
    layers = check_layers(layers)
    if postprocessor is not None:
        layers.setdefault("postprocessor", "none")  # the argument wins over the variable
    base = index_retriever(index, reranker=serving_reranker(reranker, provider), postprocessor=postprocessor,
                           retry_without_filters=retry_without_filters)
    return with_layers(base, layers=layers, provider=provider, glossary=glossary_file(glossary),
                       embedding_backend=embedding_backend)


__all__ = ["GLOSSARY_ENV", "LAYER_KEYS", "GlossarySpec", "RerankerSpec", "assemble", "check_layers",
           "default_glossary_path", "glossary_file", "index_retriever", "lexical_view", "resolve_glossary",
           "serving_reranker", "with_layers"]
