"""Haystack adapter: a ``@component`` with the ``TextRetriever`` protocol's ``run`` signature,
run alone, async, and inside a real ``haystack.Pipeline``, in this process and over a real
service on 127.0.0.1; Haystack filter dicts translated (unknown forms a clear error); the
RESTRICTED canary in no ``Document``.
"""

from __future__ import annotations

import inspect
import os

import pytest

os.environ.setdefault("HAYSTACK_TELEMETRY_ENABLED", "False")  # no network: Haystack's telemetry is on by default
pytest.importorskip("haystack")
pytest.importorskip("fastapi")

import integrations_fixtures as fixtures  # noqa: E402
from haystack import Document, Pipeline  # noqa: E402
from haystack.components.retrievers.types import TextRetriever  # noqa: E402
from haystack.utils import Secret  # noqa: E402
from integrations_fixtures import CANARY, DOORS, QUERY, assert_no_canary, door  # noqa: E402

from ragspine_pipeline.integrations.filters import UnsupportedFilter  # noqa: E402
from ragspine_pipeline.integrations.haystack import RagspineRetriever, filters_to_triples  # noqa: E402

warehouse, service = fixtures.warehouse, fixtures.service  # the shared module-scoped fixtures


@pytest.fixture(params=DOORS)
def make(request, warehouse, service):
    return door(RagspineRetriever, request.param, warehouse, service)


def test_signature_matches_the_text_retriever_protocol():
    for method in (RagspineRetriever.run, RagspineRetriever.run_async):
        assert list(inspect.signature(method).parameters) == list(inspect.signature(TextRetriever.run).parameters)
        for name, p in inspect.signature(TextRetriever.run).parameters.items():
            assert inspect.signature(method).parameters[name].default == p.default


async def test_run_run_async_and_a_pipeline(make):
    retriever = make(top_k=3)
    docs = retriever.run(QUERY)["documents"]
    assert len(docs) == 3 and all(isinstance(d, Document) and d.score > 0 for d in docs)
    assert docs[0].id == docs[0].meta["chunk_id"]
    assert docs[0].meta["citation"] == f"{docs[0].meta['doc_id']} chars {docs[0].meta['start_char']}-{docs[0].meta['end_char']}"
    assert [d.id for d in (await retriever.run_async(QUERY))["documents"]] == [d.id for d in docs]
    assert len(retriever.run(QUERY, top_k=1)["documents"]) == 1

    pipe = Pipeline()
    pipe.add_component("retriever", make(top_k=5))
    out = pipe.run({"retriever": {"query": QUERY, "filters": {
        "operator": "AND", "conditions": [
            {"field": "meta.topic", "operator": "==", "value": "maintenance"},
            {"operator": "OR", "conditions": [{"field": "meta.entity", "operator": "==", "value": "SOUTH"},
                                              {"field": "meta.entity", "operator": "==", "value": "NORTH"}]}]}}})
    assert sorted(d.meta["doc_id"] for d in out["retriever"]["documents"]) == ["lighthouses/north", "lighthouses/south"]


def test_filters_translate_or_fail_clearly():
    f = {"operator": "AND", "conditions": [
        {"field": "meta.period", "operator": ">=", "value": "2022"},
        {"operator": "NOT", "conditions": [{"field": "meta.entity", "operator": "in", "value": ["EAST"]}]},
        {"field": "id", "operator": "!=", "value": "x"}]}
    assert filters_to_triples(f) == [("period", "gte", "2022"), ("entity", "nin", ["EAST"]), ("chunk_id", "ne", "x")]
    for bad, why in [({"field": "meta.author", "operator": "==", "value": "x"}, "unknown filter field 'meta.author'"),
                     ({"field": "meta.entity", "operator": "~", "value": "x"}, "operator '~'"),
                     ({"operator": "OR", "conditions": [{"field": "meta.entity", "operator": "==", "value": "A"},
                                                         {"field": "meta.topic", "operator": "==", "value": "b"}]},
                      "OR is supported only"),
                     ({"entity": "NORTH"}, "comparison filter is")]:
        with pytest.raises(UnsupportedFilter, match=why):
            filters_to_triples(bad)


def test_restricted_canary_never_reaches_a_document(make):
    retriever = make(top_k=10)
    docs = [*retriever.run(CANARY)["documents"], *retriever.run(QUERY)["documents"]]
    assert docs and all(d.meta["sensitivity"] in ("PUBLIC", "INTERNAL") for d in docs)
    assert_no_canary(docs)


def test_a_pipeline_round_trips_through_yaml_with_the_key_as_an_env_secret(service, monkeypatch):
    url, key = service
    monkeypatch.setenv("SEARCH_API_KEY", key)
    pipe = Pipeline()
    pipe.add_component("retriever", RagspineRetriever(base_url=url, api_key=Secret.from_env_var("SEARCH_API_KEY"),
                                                      top_k=2, filters={"field": "meta.topic", "operator": "==",
                                                                        "value": "maintenance"}))
    text = pipe.dumps()
    assert key not in text and "SEARCH_API_KEY" in text
    again = Pipeline.loads(text, allowed_modules=["ragspine_pipeline.integrations.haystack"])
    docs = again.run({"retriever": {"query": QUERY}})["retriever"]["documents"]
    assert len(docs) == 2 and {d.meta["topic"] for d in docs} == {"maintenance"}
    with pytest.raises(ValueError, match="plain-string api_key"):
        RagspineRetriever(base_url=url, api_key=key).to_dict()
