import pytest

from ragspine_pipeline.retrieval.chunking.chunking import chunk_document
from ragspine_pipeline.retrieval.filters import FilterError
from ragspine_pipeline.retrieval.hybrid.retriever import HybridRetriever


@pytest.fixture(scope="module")
def retriever():
    chunks = []
    for i, (ent, period) in enumerate([("A", "2022"), ("A", "2023"), ("B", "2023"), ("C", "2024"), ("", "")]):
        chunks += chunk_document(f"revenue report number {i}", doc_id=f"d{i}",
                                 metadata={"entity": ent, "period": period})
    return HybridRetriever(chunks)


def docs(r, filters):
    return sorted(h.chunk.doc_id for h in r.search("revenue", filters=filters, top_k=10))


@pytest.mark.parametrize("filters,expect", [
    ({"entity": "A"}, ["d0", "d1"]),
    ({"entity": {"eq": "B"}}, ["d2"]),
    ({"entity": {"ne": "A"}}, ["d2", "d3", "d4"]),
    ({"entity": {"in": ["B", "C"]}}, ["d2", "d3"]),
    ({"entity": {"nin": ["A", ""]}}, ["d2", "d3"]),
    ({"period": {"gt": "2022"}}, ["d1", "d2", "d3"]),
    ({"period": {"gte": "2023", "lt": "2024"}}, ["d1", "d2"]),
    ({"period": {"lte": "2022"}}, ["d0"]),
    ({"period": {"between": ["2023", "2024"]}}, ["d1", "d2", "d3"]),
    ({"entity": "A", "period": "2023"}, ["d1"]),
    ([("entity", "eq", "A"), ("period", "gte", "2023")], ["d1"]),
    ({"entity": "nobody"}, []),
    ({"version": {"gte": 1}}, ["d0", "d1", "d2", "d3", "d4"]),
])
def test_operators(retriever, filters, expect):
    assert docs(retriever, filters) == expect


@pytest.mark.parametrize("filters,needle", [
    ({"colour": "red"}, "colour"),
    ({"entity": {"like": "A"}}, "entity"),
    ({"entity": {"in": "A"}}, "entity"),
    ({"period": {"between": ["2023"]}}, "period"),
    ({"period": {"between": ["2023", 2024]}}, "period"),
    ({"entity": 3}, "entity"),
    ({"version": {"gt": "1"}}, "version"),
    ({"entity": {}}, "entity"),
    ({"entity": ["A"]}, "entity"),
    ([("entity", "eq")], "entity"),
])
def test_bad_filters_raise_naming_the_field(retriever, filters, needle):
    with pytest.raises(FilterError, match=needle):
        retriever.search("revenue", filters=filters)
