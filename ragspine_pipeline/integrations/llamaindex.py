"""LlamaIndex: ``RagspineRetriever``, a ``BaseRetriever`` returning ``NodeWithScore``.

``RagspineRetriever(warehouse="data/warehouse")`` searches in this process through the
one serving assembly; ``RagspineRetriever(base_url=..., api_key=...)`` a ``ragspine serve``.
Each node is a ``TextNode`` whose id is the chunk id (``ref_doc_id`` the document id),
text the chunk text, ``start_char_idx``/``end_char_idx`` the snippet's offsets in its source document (its
locator), and metadata the flat snippet metadata with the ``citation`` (``doc_id chars
start-end``); only ``citation`` and ``title`` are shown to an LLM or an embedder (the rest
is lineage and scores). The score is the fused score.

Filters: LlamaIndex ``MetadataFilters`` (EQ, NE, GT, GTE, LT, LTE, IN, NIN; AND, OR of
equalities on one field, NOT of one equality or ``in``) over the engine's fields, or the
engine's own form (a mapping or triples). Other operators and conditions raise
``UnsupportedFilter`` (a ``ValueError``) rather than being ignored. Needs ``[llamaindex]``.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping, Sequence
from typing import Any

from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.callbacks import CallbackManager
from llama_index.core.schema import (
    NodeRelationship,
    NodeWithScore,
    QueryBundle,
    RelatedNodeInfo,
    TextNode,
)
from llama_index.core.vector_stores.types import (
    FilterCondition,
    FilterOperator,
    MetadataFilter,
    MetadataFilters,
)

from ..filter_input import as_triples
from .client import RagspineClient
from .filters import Cmp, Logic, Node, Triple, UnsupportedFilter, engine_field, to_triples
from .snippets import PROMPT_FIELDS, char_span, score_of, snippet_metadata
from .source import make_source

DEFAULT_TOP_K = 10

_OPS = {FilterOperator.EQ: "eq", FilterOperator.NE: "ne", FilterOperator.GT: "gt", FilterOperator.GTE: "gte",
        FilterOperator.LT: "lt", FilterOperator.LTE: "lte", FilterOperator.IN: "in", FilterOperator.NIN: "nin"}
_CONDITIONS = {FilterCondition.AND: "and", FilterCondition.OR: "or", FilterCondition.NOT: "not"}


def _node(f: MetadataFilter | MetadataFilters) -> Node:
    if isinstance(f, MetadataFilters):
        cond = f.condition or FilterCondition.AND
        if cond not in _CONDITIONS:
            raise UnsupportedFilter(f"filter condition {cond!r} is not supported; use and, or, not")
        return Logic(_CONDITIONS[cond], tuple(_node(x) for x in f.filters))
    if isinstance(f, MetadataFilter):
        op = _OPS.get(f.operator)
        if op is None:
            raise UnsupportedFilter(f"filter operator {f.operator.value!r} on {f.key!r} is not supported; use "
                                    f"{', '.join(o.value for o in _OPS)}")
        return Cmp(engine_field(f.key), op, f.value)
    raise UnsupportedFilter(f"expected MetadataFilter or MetadataFilters, got {type(f).__name__}")


def filters_to_triples(filters: MetadataFilters | Mapping[str, Any] | Sequence[Any] | None) -> list[Triple]:
    """``MetadataFilters`` (or the engine's own form) as engine triples; see the module docstring."""
    if filters is None:
        return []
    if isinstance(filters, MetadataFilters):
        return to_triples(_node(filters))
    if isinstance(filters, MetadataFilter):
        return to_triples(_node(MetadataFilters(filters=[filters])))
    return as_triples(filters)


def to_node(snippet: Mapping[str, Any]) -> NodeWithScore:
    """One snippet as a scored ``TextNode`` (offsets from the locator, citation in metadata)."""
    meta = snippet_metadata(snippet)
    start, end = char_span(snippet)
    hidden = [k for k in meta if k not in PROMPT_FIELDS]
    # The source document as LlamaIndex's SOURCE relationship, so ``node.ref_doc_id`` is the doc id.
    source = {NodeRelationship.SOURCE: RelatedNodeInfo(node_id=str(snippet["doc_id"]))} if snippet.get("doc_id") else {}
    node = TextNode(id_=str(snippet.get("chunk_id") or ""), text=str(snippet.get("text", "")), metadata=meta,
                    start_char_idx=start, end_char_idx=end, excluded_llm_metadata_keys=hidden,
                    excluded_embed_metadata_keys=hidden, relationships=source)
    return NodeWithScore(node=node, score=score_of(snippet))


class RagspineRetriever(BaseRetriever):
    """Cited RAGSpine snippets as LlamaIndex nodes (see the module docstring)."""

    def __init__(self, warehouse: str | os.PathLike[str] | None = None, *, base_url: str | None = None,
                 api_key: str | None = None, client: RagspineClient | None = None,
                 similarity_top_k: int = DEFAULT_TOP_K,
                 filters: MetadataFilters | Mapping[str, Any] | Sequence[Any] | None = None,
                 libraries: Sequence[str] | None = None, mode: str | None = None,
                 callback_manager: CallbackManager | None = None, verbose: bool = False) -> None:
        if isinstance(similarity_top_k, bool) or not isinstance(similarity_top_k, int) or similarity_top_k < 0:
            raise ValueError(f"similarity_top_k must be a whole number >= 0, got {similarity_top_k!r}")
        self._source = make_source(warehouse=warehouse, base_url=base_url, api_key=api_key, client=client, mode=mode)
        self.similarity_top_k = similarity_top_k
        self.filters = filters
        self._triples = filters_to_triples(filters)  # a bad filter fails here, not at the first question
        self.libraries = list(libraries) if libraries is not None else None
        super().__init__(callback_manager=callback_manager, verbose=verbose)

    def _search(self, query: str) -> list[NodeWithScore]:
        if self.similarity_top_k == 0:  # as LlamaIndex's own retrievers: nothing asked, nothing returned
            return []
        snippets = self._source.search(query, top_k=self.similarity_top_k, filters=self._triples or None,
                                       libraries=self.libraries)
        return [to_node(s) for s in snippets]

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        return self._search(query_bundle.query_str)

    async def _aretrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        return await asyncio.to_thread(self._search, query_bundle.query_str)


__all__ = ["RagspineRetriever", "filters_to_triples", "to_node"]
