"""NarrativeIndex and NarrativeIndexRetriever: cited snippets with RESTRICTED exit #2.

``NarrativeIndexRetriever.retrieve`` is the product's query path:

    pre-filter -> BM25 (+ dense) per glossary variant -> RRF -> rerank (exit #1) ->
    drop RESTRICTED (exit #2) -> snippet dicts -> optional post-processor.

Exit #2 filters candidate records *before* any snippet dict is built, so no code path
downstream (post-processors, prompt builders, the CLI) can ever hold restricted text.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from ...llm.provider import LLMProvider
from ...sensitivity import is_restricted
from ..chunking.chunk_store import ChunkStore
from ..chunking.chunking import METADATA_FIELDS, Chunk
from ..lexical.analyzer import Analyzer
from ..lexical.glossary import GlossaryQueryRewriter
from ..lexical.hybrid import HybridRetriever, RetrievalHit
from ..rerank.listwise_rerank import (
    ListwiseReranker,
    ProviderListwiseJudge,
    Reranker,
    guarded_rerank,
)
from ..vector.embedding_backends import EmbeddingBackend

DEFAULT_TOP_K = 50


@runtime_checkable
class Postprocessor(Protocol):
    """Reorders/trims snippets, or adds ``prompt_text``; never sees restricted text."""

    def process(self, query: str, snippets: list[dict[str, Any]]) -> list[dict[str, Any]]: ...


@dataclass
class NarrativeIndex:
    """One library's searchable chunks: the chunk set plus its HybridRetriever."""

    retriever: HybridRetriever
    library_id: str = ""
    version: str = ""
    info: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_chunks(
        cls,
        chunks: Sequence[Chunk],
        *,
        analyzer: Analyzer | str | None = None,
        embedding_backend: EmbeddingBackend | None = None,
        rewriter: GlossaryQueryRewriter | None = None,
        library_id: str = "",
        version: str = "",
        **kwargs: Any,
    ) -> NarrativeIndex:
        r = HybridRetriever(chunks, analyzer=analyzer, embedding_backend=embedding_backend,
                            rewriter=rewriter, **kwargs)
        return cls(retriever=r, library_id=library_id, version=version)

    @classmethod
    def from_store(cls, store: ChunkStore | str | os.PathLike[str], **kwargs: Any) -> NarrativeIndex:
        """Index the active chunks of a ChunkStore (opened read-only if given a path)."""
        if isinstance(store, ChunkStore):
            chunks = list(store.iter_chunks())
        else:
            with ChunkStore(store, read_only=True) as s:
                chunks = list(s.iter_chunks())
        return cls.from_chunks(chunks, **kwargs)

    def __len__(self) -> int:
        return len(self.retriever)


def _candidate(hit: RetrievalHit) -> dict[str, Any]:
    c = hit.chunk
    return {"chunk_id": c.chunk_id, "text": c.text, "sensitivity": c.sensitivity,
            "_hit": hit}


def build_snippet(hit: RetrievalHit, rank: int, *, library_id: str = "",
                  filters_relaxed: bool = False) -> dict[str, Any]:
    """The public snippet dict: text, lineage, metadata and per-channel scores."""
    c = hit.chunk
    snip: dict[str, Any] = {
        "rank": rank,
        "text": c.text,
        "doc_id": c.doc_id,
        "title": c.title,
        "chunk_id": c.chunk_id,
        "source_locator": c.source_locator.to_dict(),
        **{f: getattr(c, f) for f in METADATA_FIELDS},
        "sensitivity": c.sensitivity,
        "valid_as_of": getattr(c, "valid_as_of", ""),
        "version": getattr(c, "version", 1),
        "scores": {"bm25": hit.bm25, "vector": hit.vector, "fused": hit.fused},
        "filters_relaxed": filters_relaxed,
    }
    if library_id:
        snip["library_id"] = library_id
    return snip


class NarrativeIndexRetriever:
    """Cited retrieval over one NarrativeIndex (the read-only query path)."""

    def __init__(
        self,
        index: NarrativeIndex,
        *,
        retry_without_filters: bool = True,
        reranker: Reranker | None = None,
        postprocessor: Postprocessor | None = None,
        rerank_depth: int = 20,
    ) -> None:
        self.index = index
        self.retry_without_filters = retry_without_filters
        self.reranker = reranker
        self.postprocessor = postprocessor
        self.rerank_depth = rerank_depth

    def _ranked_candidates(self, query: str, filters: Any, top_k: int) -> list[dict[str, Any]]:
        r = self.index.retriever
        mask = r.candidate_mask(filters)
        # Fetch enough that top_k open results survive exit #2.
        in_scope = r.restricted if mask is None else (r.restricted & mask)
        hits = r.search(query, top_k=top_k + int(in_scope.sum()), mask=mask)
        return [_candidate(h) for h in hits]

    def retrieve(self, query: str, *, filters: Mapping[str, Any] | Sequence[Any] | None = None,
                 top_k: int = DEFAULT_TOP_K) -> list[dict[str, Any]]:
        if top_k <= 0:
            return []
        relaxed = False
        cands = self._ranked_candidates(query, filters, top_k)
        if filters and self.retry_without_filters and not any(
            not is_restricted(c["sensitivity"]) for c in cands
        ):
            cands = self._ranked_candidates(query, None, top_k)
            relaxed = True
        if self.reranker is not None:
            head, tail = cands[: self.rerank_depth], cands[self.rerank_depth :]
            cands = guarded_rerank(query, head, self.reranker) + tail  # exit #1
        # Exit #2: restricted records are dropped before any snippet exists.
        open_cands = [c for c in cands if not is_restricted(c["sensitivity"])
                      and not is_restricted(c["_hit"].chunk.sensitivity)]
        snippets = [
            build_snippet(c["_hit"], rank, library_id=self.index.library_id, filters_relaxed=relaxed)
            for rank, c in enumerate(open_cands[:top_k], start=1)
        ]
        if self.postprocessor is not None:
            snippets = [s for s in self.postprocessor.process(query, snippets)
                        if not is_restricted(s.get("sensitivity"))]
        return snippets


def build_narrative_retriever(
    chunk_db: ChunkStore | str | os.PathLike[str] | NarrativeIndex,
    provider: LLMProvider | None = None,
    *,
    embedding_backend: EmbeddingBackend | None = None,
    reranker: Reranker | None = None,
    postprocessor: Postprocessor | None = None,
    glossary: GlossaryQueryRewriter | str | os.PathLike[str] | None = None,
    analyzer: Analyzer | str | None = None,
    retry_without_filters: bool = True,
) -> NarrativeIndexRetriever:
    """The default chain: BM25 + RRF + glossary multi-query (+ dense when a backend is
    injected) + listwise LLM rerank when a provider is given. A local ``reranker`` takes
    precedence over the provider's judge."""
    if isinstance(glossary, (str, os.PathLike)):
        glossary = GlossaryQueryRewriter.from_file(Path(glossary))
    if isinstance(chunk_db, NarrativeIndex):
        index = chunk_db
    else:
        index = NarrativeIndex.from_store(chunk_db, analyzer=analyzer,
                                          embedding_backend=embedding_backend, rewriter=glossary)
    if reranker is None and provider is not None:
        reranker = ListwiseReranker(ProviderListwiseJudge(provider))
    return NarrativeIndexRetriever(index, retry_without_filters=retry_without_filters,
                                   reranker=reranker, postprocessor=postprocessor)
