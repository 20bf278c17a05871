"""LlamaIndex adapter, tested the way LlamaIndex tests its own BM25 retriever package (class
hierarchy, retrieve, async retrieve, metadata filters), in this process and over a real service
on 127.0.0.1: ``NodeWithScore`` with the citation in metadata and the locator's offsets, and
the RESTRICTED canary in no node.
"""

from __future__ import annotations

import pytest

pytest.importorskip("llama_index.core")
pytest.importorskip("fastapi")

import integrations_fixtures as fixtures  # noqa: E402
from integrations_fixtures import (  # noqa: E402
    CANARY,
    DOCS,
    DOORS,
    QUERY,
    assert_no_canary,
    door,
)
from llama_index.core.base.base_retriever import BaseRetriever  # noqa: E402
from llama_index.core.schema import MetadataMode, NodeWithScore, TextNode  # noqa: E402
from llama_index.core.vector_stores.types import (  # noqa: E402
    FilterCondition,
    FilterOperator,
    MetadataFilter,
    MetadataFilters,
)

from ragspine_pipeline.integrations.filters import UnsupportedFilter  # noqa: E402
from ragspine_pipeline.integrations.llamaindex import RagspineRetriever, filters_to_triples  # noqa: E402

warehouse, service = fixtures.warehouse, fixtures.service  # the shared module-scoped fixtures


@pytest.fixture(params=DOORS)
def make(request, warehouse, service):
    return door(RagspineRetriever, request.param, warehouse, service)


def test_class():
    names_of_base_classes = [b.__name__ for b in RagspineRetriever.__mro__]
    assert BaseRetriever.__name__ in names_of_base_classes


def _source_text(node: TextNode) -> str:
    lib, name = node.metadata["doc_id"].split("/")
    return DOCS[lib][name]["text"]


async def test_retrieve_and_aretrieve(make):
    retriever = make(similarity_top_k=3)
    nodes = retriever.retrieve(QUERY)
    assert len(nodes) == 3 and all(isinstance(n, NodeWithScore) and n.score > 0 for n in nodes)
    for n in nodes:
        node = n.node
        assert node.node_id == node.metadata["chunk_id"] and node.ref_doc_id == node.metadata["doc_id"]
        assert node.metadata["citation"] == f"{node.metadata['doc_id']} chars {node.start_char_idx}-{node.end_char_idx}"
        assert _source_text(node)[node.start_char_idx:node.end_char_idx] == node.text  # offsets from the locator
        llm_view = node.get_content(MetadataMode.LLM)
        assert node.metadata["citation"] in llm_view and "score_bm25" not in llm_view
    again = await retriever.aretrieve(QUERY)
    assert [n.node.node_id for n in again] == [n.node.node_id for n in nodes]
    assert make(similarity_top_k=0).retrieve(QUERY) == []


def test_metadata_filters(make):
    def docs(filters):
        return sorted(n.node.metadata["doc_id"] for n in make(similarity_top_k=10, filters=filters).retrieve(QUERY))

    assert len(docs(None)) == 5
    eq = MetadataFilters(filters=[MetadataFilter(key="entity", operator=FilterOperator.EQ, value="NORTH")])
    assert docs(eq) == ["lighthouses/north"]
    within = MetadataFilters(filters=[MetadataFilter(key="entity", operator=FilterOperator.IN, value=["SOUTH", "WEST"]),
                                      MetadataFilter(key="topic", operator=FilterOperator.EQ, value="history")],
                             condition=FilterCondition.AND)
    assert docs(within) == ["lighthouses/west"]
    either = MetadataFilters(filters=[MetadataFilter(key="entity", value="NORTH"),
                                      MetadataFilter(key="entity", value="EAST")], condition=FilterCondition.OR)
    assert docs(either) == ["lighthouses/east", "lighthouses/north"]


def test_unsupported_filters_are_a_clear_error():
    cross_field_or = MetadataFilters(filters=[MetadataFilter(key="entity", value="NORTH"),
                                              MetadataFilter(key="topic", value="history")],
                                     condition=FilterCondition.OR)
    with pytest.raises(UnsupportedFilter, match="OR is supported only"):
        filters_to_triples(cross_field_or)
    with pytest.raises(UnsupportedFilter, match="text_match"):
        filters_to_triples(MetadataFilters(filters=[MetadataFilter(key="title", value="x",
                                                                   operator=FilterOperator.TEXT_MATCH)]))
    with pytest.raises(UnsupportedFilter, match="unknown filter field 'author'"):
        filters_to_triples(MetadataFilters(filters=[MetadataFilter(key="author", value="x")]))
    negated = MetadataFilters(filters=[MetadataFilter(key="entity", value="NORTH")], condition=FilterCondition.NOT)
    assert filters_to_triples(negated) == [("entity", "ne", "NORTH")]


def test_restricted_canary_never_reaches_a_node(make):
    retriever = make(similarity_top_k=10)
    nodes = [*retriever.retrieve(CANARY), *retriever.retrieve(QUERY)]
    assert nodes and all(n.node.metadata["sensitivity"] in ("PUBLIC", "INTERNAL") for n in nodes)
    assert_no_canary(nodes)
