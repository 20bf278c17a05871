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

from ...llm.provider import LLMProvider
from ...sensitivity import RESTRICTED_SENSITIVITY
from ..chunking.chunk_store import ChunkStore
from ..lexical.analyzer import Analyzer
from ..postprocess.base import Postprocessor
from ..rerank.base import Reranker
from ..rerank.listwise_rerank import ListwiseJudge, ProviderListwiseJudge
from ..vector.base import EmbeddingBackend
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
           "build_snippet", "default_glossary_path", "resolve_glossary", "retriever_for_index"]


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

    Returns ``(retriever, store)``; the caller closes the store. The retriever is the
    ``NarrativeIndexRetriever`` itself when every layer is off (byte-identical output),
    else a ``LayeredRetriever`` around it (which answers the same attributes: ``index``,
    ``reranker`` …). An open ``ChunkStore`` may be passed instead of a path; it is
    returned as it is. The served index holds no RESTRICTED chunk; the published
    warehouse has its own entry, ``ragspine_pipeline.serving.open_published_retriever``.
    """
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
        index = NarrativeIndex.from_store(store, analyzer=analyzer, embedding_backend=embedding_backend,
                                          rewriter=rewriter)
        retriever = assemble(index, provider, reranker=reranker, postprocessor=postprocessor,
                             glossary=glossary, embedding_backend=embedding_backend,
                             retry_without_filters=retry_without_filters)
    except BaseException:
        if store is not chunk_db:
            store.close()
        raise
    return retriever, store
