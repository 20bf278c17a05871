"""LangChain adapter: ``langchain-tests``' own ``RetrieversIntegrationTests``, unmodified, over a
warehouse in this process and over a real service on 127.0.0.1; per-call ``k`` / ``filters`` /
``libraries``; the RESTRICTED canary never reaches a ``Document``.
"""

from __future__ import annotations

import pytest

pytest.importorskip("langchain_core")
pytest.importorskip("langchain_tests")
pytest.importorskip("fastapi")

import integrations_fixtures as fixtures  # noqa: E402
from integrations_fixtures import CANARY, QUERY, assert_no_canary  # noqa: E402
from langchain_core.documents import Document  # noqa: E402
from langchain_tests.integration_tests import RetrieversIntegrationTests  # noqa: E402

from ragspine_pipeline.integrations.client import Unauthorized  # noqa: E402
from ragspine_pipeline.integrations.langchain import RagspineRetriever  # noqa: E402

warehouse, service = fixtures.warehouse, fixtures.service  # the shared module-scoped fixtures


class TestInProcess(RetrieversIntegrationTests):
    """The standard suite over a warehouse searched in this process (no test overridden)."""

    @pytest.fixture(autouse=True)
    def _warehouse(self, warehouse):
        self.params = {"warehouse": warehouse, "mode": "bm25"}

    @property
    def retriever_constructor(self) -> type[RagspineRetriever]:
        return RagspineRetriever

    @property
    def retriever_constructor_params(self) -> dict:
        return self.params

    @property
    def retriever_query_example(self) -> str:
        return QUERY


class TestOverHttp(TestInProcess):
    """The same standard suite against ``ragspine serve`` (base URL + key)."""

    @pytest.fixture(autouse=True)
    def _warehouse(self, service):
        url, key = service
        self.params = {"base_url": url, "api_key": key}


def test_fields_and_call_arguments_in_process_and_over_http(warehouse, service):
    url, key = service
    for retriever in (RagspineRetriever(warehouse=warehouse, mode="bm25", k=2),
                      RagspineRetriever(base_url=url, api_key=key, k=2)):
        docs = retriever.invoke(QUERY)
        assert len(docs) == 2 and all(isinstance(d, Document) for d in docs)
        first = docs[0]
        assert first.id == first.metadata["chunk_id"]
        loc = (first.metadata["start_char"], first.metadata["end_char"])
        assert first.metadata["citation"] == f"{first.metadata['doc_id']} chars {loc[0]}-{loc[1]}"
        north = retriever.invoke(QUERY, k=5, filters={"entity": "NORTH"})
        assert [d.metadata["doc_id"] for d in north] == ["lighthouses/north"]
        orchard = retriever.invoke(QUERY, libraries=["orchards"])
        assert {d.metadata["library_id"] for d in orchard} == {"orchards"}
        with pytest.raises(ValueError, match="NOPE"):  # a value no document has: an error, not []
            retriever.invoke(QUERY, filters=[["entity", "eq", "NOPE"]])
    with pytest.raises(Unauthorized):
        RagspineRetriever(base_url=url, api_key="rsk_nobody_secret").invoke(QUERY)
    with pytest.raises(ValueError, match="exactly one of"):
        RagspineRetriever(warehouse=warehouse, base_url=url)
    with pytest.raises(ValueError, match="unknown filter field 'author'") as bad:  # at construction
        RagspineRetriever(base_url=url, api_key=key, filters={"author": "x"})
    assert key not in str(bad.value) and key not in repr(RagspineRetriever(base_url=url, api_key=key))


async def test_restricted_canary_never_reaches_a_document(warehouse, service):
    url, key = service
    for retriever in (RagspineRetriever(warehouse=warehouse, mode="bm25", k=10),
                      RagspineRetriever(base_url=url, api_key=key, k=10)):
        docs = [*retriever.invoke(CANARY), *retriever.invoke(QUERY), *await retriever.ainvoke(QUERY)]
        assert docs and all(d.metadata["sensitivity"] in ("PUBLIC", "INTERNAL") for d in docs)
        assert_no_canary(docs)
