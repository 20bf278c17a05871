"""``RagspineClient`` against a real ``ragspine serve`` app on 127.0.0.1: search and libraries,
and each typed error a caller must tell apart (401, 403, 413, 429 with Retry-After and the
bounded retry, 503, no answer at all); ``Retry-After`` parsing in both of its forms.
"""

from __future__ import annotations

import email.utils

import pytest

pytest.importorskip("fastapi")

import integrations_fixtures as fixtures  # noqa: E402
from integrations_fixtures import LIBRARIES, QUERY, served  # noqa: E402
from service_fixtures import free_port, running  # noqa: E402

from ragspine_pipeline.integrations.client import (  # noqa: E402
    BadRequest,
    Forbidden,
    PayloadTooLarge,
    RagspineClient,
    RateLimited,
    ServiceUnreachable,
    Unauthorized,
    Unavailable,
    error_from_response,
    parse_retry_after,
)
from ragspine_pipeline.service import keys as K  # noqa: E402

warehouse, service = fixtures.warehouse, fixtures.service  # the shared module-scoped fixtures


def test_search_libraries_and_the_errors_of_keys_and_scopes(service, tmp_path):
    url, key = service
    client = RagspineClient(url, key)
    assert client.ready()
    assert sorted(lib["id"] for lib in client.libraries()) == list(LIBRARIES)
    assert client.library("orchards")["id"] == "orchards"
    result = client.search(QUERY, top_k=2, filters={"topic": "maintenance"}, libraries=["lighthouses"])
    assert len(result.snippets) == 2 and set(result.versions) == {"lighthouses"} and result.mode == "bm25"
    assert all(s["topic"] == "maintenance" for s in result.snippets)
    assert "rsk_" not in repr(client)  # the key never shows

    with pytest.raises(Unauthorized) as bad_key:
        RagspineClient(url, "rsk_nobody_secret").search(QUERY)
    assert bad_key.value.status == 401 and bad_key.value.error == "unauthorized"
    with pytest.raises(BadRequest, match="NOPE"):
        client.search(QUERY, filters={"entity": "NOPE"})
    with pytest.raises(PayloadTooLarge):
        client.search("lamp " * 20000)
    with pytest.raises(ServiceUnreachable):
        RagspineClient(f"http://127.0.0.1:{free_port()}", timeout_s=5).search(QUERY)


def test_403_outside_the_key_scope(warehouse, tmp_path):
    with served(warehouse, tmp_path) as (url, _):
        orchards_only = K.create_key(tmp_path / "keys.json", ["orchards"])[1]  # the service re-reads its key file
        with pytest.raises(Forbidden, match="lighthouses") as outside:
            RagspineClient(url, orchards_only).search(QUERY, libraries=["lighthouses"])
        assert outside.value.status == 403 and outside.value.error == "forbidden"


def test_429_retry_after_and_the_bounded_retry(warehouse, tmp_path):
    waits: list[float] = []
    with served(warehouse, tmp_path, rate_per_s=1.0, burst=1) as (url, key):
        client = RagspineClient(url, key, max_retries=2, sleep=waits.append)  # a sleep that does not wait
        client.search(QUERY)  # the one token
        with pytest.raises(RateLimited) as limited:
            client.search(QUERY)
        assert limited.value.status == 429 and limited.value.retry_after == 1.0
        assert waits == [1.0, 1.0]  # retried max_retries times, each after Retry-After, then raised
        capped = RagspineClient(url, key, max_retries=5, max_retry_wait_s=0.5, sleep=waits.append)
        with pytest.raises(RateLimited):
            capped.search(QUERY)
        assert waits == [1.0, 1.0]  # a wait past max_retry_wait_s is raised, never slept
        assert RagspineClient(url, key, max_retries=3).search(QUERY).snippets  # real waits: then it answers


def test_503_until_the_snapshots_are_loaded(warehouse):
    from ragspine_pipeline.service.app import create_app
    from ragspine_pipeline.service.served import ServedLibraries, ServingAssembly

    class NeverLoaded(ServedLibraries):
        def start(self, interval_s: float) -> None:  # the loader never runs: the service stays unready
            pass

    app = create_app(warehouse, mode="bm25", served=NeverLoaded(ServingAssembly.resolve(warehouse, mode="bm25")))
    with running(app) as url:
        client = RagspineClient(url)
        assert client.ready() is False
        with pytest.raises(Unavailable) as unready:
            client.search(QUERY)
        assert unready.value.status == 503


def test_retry_after_in_seconds_or_as_an_http_date():
    assert parse_retry_after("7") == 7.0 and parse_retry_after(" 0 ") == 0.0
    assert parse_retry_after(None) is None and parse_retry_after("soon") is None
    assert parse_retry_after(email.utils.formatdate(1_000_030, usegmt=True), now=1_000_000) == 30.0
    assert parse_retry_after(email.utils.formatdate(999_000, usegmt=True), now=1_000_000) == 0.0
    err = error_from_response(503, b'{"error": "unavailable", "message": "loading"}', {"Retry-After": "3"})
    assert isinstance(err, Unavailable) and err.retry_after == 3.0 and err.message == "loading"
    assert error_from_response(502, b"<html>bad gateway</html>", {}).status == 502
