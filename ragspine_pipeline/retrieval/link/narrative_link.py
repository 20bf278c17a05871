"""The spec's link module: cited snippets for the agent, RESTRICTED exit #2.

``NarrativeIndexRetriever.retrieve`` is the product's query path:

    pre-filter -> BM25 (+ dense) per glossary variant -> RRF -> rerank (exit #1) ->
    drop RESTRICTED (exit #2) -> snippet dicts -> optional post-processor.

The index and its retriever are defined in ``narrative_index`` and re-exported here, at
the path the spec names, beside its wiring entry ``build_narrative_retriever``.

Entry points: ``build_narrative_retriever(chunk_db, ...)`` over a chunk store (the spec's
wiring entry), ``retriever_for_index(index, ...)`` over an index already built, and
``ragspine_pipeline.serving.open_published_retriever(warehouse, ...)`` over the published
snapshots. The first and the last wrap their indices with the one layer assembly
(``assembly``), so the same ``RAGSPINE_*`` settings give the same layers.
"""

from __future__ import annotations

import os

from ... import settings
from ...llm.provider import LLMProvider
from ...sensitivity import RESTRICTED_SENSITIVITY
from ..chunking.chunk_store import ChunkStore
from ..lexical.analysis.analyzer import Analyzer
from ..postprocess.base import Postprocessor
from ..rerank.base import Reranker
from ..rerank.listwise_rerank import ListwiseJudge, ProviderListwiseJudge
from ..vector.base import EmbeddingBackend
from ..vector.embedding_backends import EMBEDDING_ENV, EMBEDDING_ENV_ALIAS, make_embedding_backend
from .assembly import (
    GLOSSARY_ENV,
    GlossarySpec,
    assemble,
    default_glossary_path,
    index_retriever,
    resolve_glossary,
    serving_reranker,
)
from .narrative_index import DEFAULT_TOP_K, NarrativeIndex, NarrativeIndexRetriever, build_snippet

# Both exits use the one constant (and ``is_restricted``) from ``ragspine_pipeline.sensitivity``.
__all__ = ["DEFAULT_TOP_K", "GLOSSARY_ENV", "RESTRICTED_SENSITIVITY", "GlossarySpec", "NarrativeIndex",
           "NarrativeIndexRetriever", "Postprocessor", "ProviderListwiseJudge", "build_narrative_retriever",
           "build_snippet", "default_glossary_path", "resolve_glossary", "retriever_for_index",
           "wiring_from_env"]


def retriever_for_index(
    index: NarrativeIndex,
    provider: LLMProvider | None = None,
    *,
    reranker: Reranker | ListwiseJudge | None = None,
    postprocessor: Postprocessor | None = None,
    retry_without_filters: bool = True,
) -> NarrativeIndexRetriever:
    """The query chain over an index that is already built (a test corpus, a notebook),
    from its arguments only (no ``RAGSPINE_*`` variable): listwise LLM rerank when a
    ``provider`` is given; a local ``reranker`` (or a ListwiseJudge) takes precedence over
    the provider's judge. A provider without ``chat`` is a TypeError, never a silent
    no-op. The served doors use ``assembly.assemble``, which also reads the settings."""
    return index_retriever(index, reranker=serving_reranker(reranker, provider, from_settings=False),
                           postprocessor=postprocessor, retry_without_filters=retry_without_filters)


_LEXICAL_MODES = ("economy", "bm25", "lexical")


def wiring_from_env(embedding_backend: EmbeddingBackend | None = None
                    ) -> tuple[EmbeddingBackend | None, tuple[str, ...]]:
    """(backend, channels) the wiring entry builds, from ``RAGSPINE_RETRIEVAL_MODE`` and
    ``RAGSPINE_EMBEDDING_BACKEND`` (alias ``RAGSPINE_EMBEDDING``), all validated first:
    a bad value, or the two embedding names set to different specs, is one SettingsError
    and nothing is built.

    * ``economy`` / ``bm25`` / ``lexical``: BM25 only; no backend is built and an injected
      one is left unused (the spec's zero-embedding presets).
    * ``auto`` (the default): the injected backend, else the one the embedding variable
      names; neither set keeps the spec's library default, no vector backend (pure BM25),
      so an unconfigured call is byte-identical to before.
    * ``hybrid`` / ``vector`` (dense only): the injected backend, else the variable's
      spec (default ``auto``); none at all is a SettingsError naming the mode, never a
      silent BM25 fallback."""
    mode = settings.get("RAGSPINE_RETRIEVAL_MODE")
    specs = {name: settings.get(name) for name in (EMBEDDING_ENV, EMBEDDING_ENV_ALIAS)
             if settings.raw(name) is not None and settings.raw(name).strip()}
    if len({v.lower() for v in specs.values()}) > 1:
        raise settings.SettingsError(EMBEDDING_ENV_ALIAS, specs[EMBEDDING_ENV_ALIAS], f"{specs[EMBEDDING_ENV]!r} "
                                     f"(the value of {EMBEDDING_ENV}, whose alias it is) or leave it unset")
    if mode in _LEXICAL_MODES:
        return None, ("bm25",)
    channels = ("dense",) if mode == "vector" else ("bm25", "dense")
    if embedding_backend is None:
        spec = next(iter(specs.values()), "none" if mode == "auto" else "auto")
        embedding_backend = make_embedding_backend(spec)
    if embedding_backend is None:
        if mode == "auto":
            return None, ("bm25",)
        raise settings.SettingsError("RAGSPINE_RETRIEVAL_MODE", mode, "auto, economy, bm25 or lexical",
                                     detail=f"{mode} needs an embedding backend and none could be built: set "
                                            f"{EMBEDDING_ENV} or pass embedding_backend=")
    return embedding_backend, channels


def build_narrative_retriever(
    chunk_db: ChunkStore | str | os.PathLike[str],
    provider: LLMProvider | None = None,
    *,
    embedding_backend: EmbeddingBackend | None = None,
    reranker: Reranker | ListwiseJudge | None = None,
    postprocessor: Postprocessor | None = None,
    glossary: GlossarySpec = None,
    analyzer: Analyzer | str | None = None,
    retry_without_filters: bool = True,
) -> tuple[NarrativeIndexRetriever, ChunkStore]:
    """The spec's wiring entry: open the chunk store at ``chunk_db``, ``init_schema()`` it
    (a missing file is created, empty), and build the default chain over its active
    chunks with the one layer assembly (``assembly.assemble``): pure BM25 + RRF (dense too
    when an ``embedding_backend`` is injected; ``RAGSPINE_CONTEXTUAL`` shapes the index
    text) + glossary multi-query (``RAGSPINE_GLOSSARY`` or the demo glossary;
    ``glossary=False`` turns it off) + rerank: a local ``reranker``, else
    ``RAGSPINE_RERANKER``, else the listwise LLM judge when a ``provider`` is given + the
    query layers and post-processors the settings name (``RAGSPINE_QUERY_TRANSFORM``,
    ``_QUERY_DECOMPOSE``, ``_ADAPTIVE``, ``_CORRECTIVE``, ``_AUTO_FILTERS``,
    ``_POSTPROCESSOR``; the LLM layers use ``provider``). An explicit ``postprocessor``
    runs on the index's snippets and replaces ``RAGSPINE_POSTPROCESSOR``.
    ``RAGSPINE_RETRIEVAL_MODE`` and ``RAGSPINE_EMBEDDING_BACKEND`` / ``RAGSPINE_EMBEDDING``
    choose the channels and the backend (``wiring_from_env``); a bad value is one
    SettingsError raised before the store is opened.

    Returns ``(retriever, store)``; the caller closes the store. The retriever is the
    ``NarrativeIndexRetriever`` itself when every layer is off (byte-identical output),
    else a ``LayeredRetriever`` around it (which answers the same attributes: ``index``,
    ``reranker`` …). An open ``ChunkStore`` may be passed instead of a path; it is
    returned as it is. The served index holds no RESTRICTED chunk; the published
    warehouse has its own entry, ``ragspine_pipeline.serving.open_published_retriever``.
    """
    backend, channels = wiring_from_env(embedding_backend)
    rewriter = resolve_glossary(glossary)
    if isinstance(chunk_db, ChunkStore):
        store = chunk_db
    elif isinstance(chunk_db, str | os.PathLike):
        store = ChunkStore(chunk_db)  # read-write: the file and its folder are created if missing
    else:
        raise TypeError(f"chunk_db must be a path or a ChunkStore (got {type(chunk_db).__name__})")
    try:
        if not store.read_only:
            store.init_schema()  # idempotent; migrates an older schema additively
        index = NarrativeIndex.from_store(store, analyzer=analyzer, embedding_backend=backend,
                                          rewriter=rewriter, channels=channels)
        retriever = assemble(index, provider, reranker=reranker, postprocessor=postprocessor,
                             glossary=glossary, embedding_backend=backend,
                             retry_without_filters=retry_without_filters)
    except BaseException:
        if store is not chunk_db:
            store.close()
        raise
    return retriever, store
