"""The retrieval service over HTTP (in-process ASGI client): the same snippets as the Python
API, every status code, keys and scopes (including the absent-library oracle), limits,
metrics, offline docs, and hot snapshot swaps with no mixed-version response.
"""

from __future__ import annotations

import json
import threading

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("mcp")

from fastapi.testclient import TestClient  # noqa: E402
from service_fixtures import LIBS, build_warehouse, refresh_library, wait_ready  # noqa: E402

from ragspine_pipeline.cli import parse_where_arg  # noqa: E402
from ragspine_pipeline.service import keys as K  # noqa: E402
from ragspine_pipeline.service import operations  # noqa: E402
from ragspine_pipeline.service.app import create_app  # noqa: E402
from ragspine_pipeline.service.limits import ServiceLimits, TokenBucket  # noqa: E402
from ragspine_pipeline.serving import open_published_retriever  # noqa: E402
from ragspine_pipeline.warehouse.common import SNAPSHOT  # noqa: E402
from ragspine_pipeline.warehouse.versioned import VersionedTables  # noqa: E402

QUESTIONS = [("revenue 2023", None), ("travel policy", {"topic": "policy"}), ("gross margin", {"entity": "ACME_CN"})]
NO_RATE = ServiceLimits(rate_per_s=0)


@pytest.fixture(scope="module")
def warehouse(tmp_path_factory):
    return build_warehouse(tmp_path_factory.mktemp("service"))[0]


@pytest.fixture(scope="module")
def keyfile(tmp_path_factory):
    path = tmp_path_factory.mktemp("keys") / "keys.json"
    reports = K.create_key(path, ["acme_reports"])
    policies = K.create_key(path, ["acme_policies", "ghost_library"])
    return path, reports[1], policies[1]


def client(app) -> TestClient:
    return TestClient(app, base_url="http://127.0.0.1:8080")


@pytest.fixture(scope="module")
def local(warehouse):
    """No key file (loopback): every library readable without a key."""
    with client(create_app(warehouse, mode="bm25", limits=NO_RATE)) as c:
        wait_ready(c.get)
        yield c


@pytest.fixture(scope="module")
def keyed(warehouse, keyfile):
    with client(create_app(warehouse, mode="bm25", keys_file=keyfile[0], limits=NO_RATE)) as c:
        wait_ready(c.get)
        yield c


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def canonical(snippets) -> str:
    return json.dumps(snippets, ensure_ascii=False, sort_keys=True, default=str)


def versions_of(warehouse) -> dict[str, str]:
    wh = VersionedTables(warehouse)
    return {lib: wh.latest(SNAPSHOT, lib).version for lib in LIBS}


# ------------------------------------------------------------------ the one door
def test_search_gives_the_python_api_snippets(local, warehouse):
    api = open_published_retriever(warehouse, mode="bm25")
    for query, filters in QUESTIONS:
        r = local.post("/v1/search", json={"query": query, "filters": filters, "top_k": 4})
        assert r.status_code == 200, r.text
        body = r.json()
        # the Python API's snippets, each source_path relative to its library (issue 44)
        api_snippets = operations.relative_paths(api.retrieve(query, filters=filters, top_k=4))
        assert canonical(body["snippets"]) == canonical(api_snippets)
        assert body["snippets"], query
        assert str(warehouse.parent) not in r.text and "/demo_corpus/" not in r.text
        assert body["versions"] == versions_of(warehouse)
        assert body["channels"] == ["bm25"]
        assert {s["library_id"] for s in body["snippets"]} <= set(LIBS)


def test_one_library_and_triples_as_filters(local, warehouse):
    api = open_published_retriever(warehouse, "acme_reports", mode="bm25")
    triples = [["period", "gte", "2023"], ["entity", "in", ["ACME_CN", "ACME_US"]]]
    r = local.post("/v1/search", json={"query": "revenue", "filters": triples, "libraries": ["acme_reports"]})
    assert r.status_code == 200, r.text
    assert canonical(r.json()["snippets"]) == canonical(operations.relative_paths(
        api.retrieve("revenue", filters=triples, top_k=5)))
    assert r.json()["versions"] == {"acme_reports": versions_of(warehouse)["acme_reports"]}


def test_libraries_count_open_documents_only(local, warehouse):
    body = local.get("/v1/libraries").json()
    assert [lib["id"] for lib in body["libraries"]] == list(LIBS)
    for lib in body["libraries"]:
        served = open_published_retriever(warehouse, lib["id"], mode="bm25").index.retriever.chunks
        assert lib["documents"] == len({c.doc_id for c in served}) and lib["chunks"] == len(served)
        assert lib["version"] == versions_of(warehouse)[lib["id"]]
    policies = local.get("/v1/libraries/acme_policies").json()
    # hr_restructuring_plan_zh is RESTRICTED in the demo corpus: never counted, never served
    served_ids = {c.doc_id for c in open_published_retriever(warehouse, "acme_policies", mode="bm25")
                  .index.retriever.chunks}
    assert "acme_policies/hr_restructuring_plan_zh" not in served_ids
    assert policies["documents"] == len(served_ids)


def test_graph_rows_are_cited(local):
    r = local.post("/v1/graph/facts", json={"entity": "ACME_CN", "metric": "revenue", "period": "2023"})
    assert r.status_code == 200, r.text
    rows = r.json()["rows"]
    assert rows and all(row["citations"] and row["library_id"] == "acme_reports" for row in rows)
    rollup = local.post("/v1/graph/rollup", json={"entity": "ACME_GROUP", "metric": "revenue", "period": "2023"})
    assert rollup.status_code == 200 and any(r["kind"] == "rollup_total" for r in rollup.json()["rows"])
    for kind in ("peers", "trace"):
        assert local.post(f"/v1/graph/{kind}", json={"entity": "ACME_CN", "metric": "gross_margin",
                                                     "period": "2023"}).status_code == 200


def test_health_docs_and_openapi_need_no_key_and_no_cdn(keyed):
    assert keyed.get("/healthz").json() == {"status": "ok"}
    assert keyed.get("/readyz").status_code == 200
    spec = keyed.get("/openapi.json").json()
    assert {"/v1/search", "/v1/libraries", "/v1/libraries/{library}", "/v1/graph/{kind}"} <= set(spec["paths"])
    page = keyed.get("/docs")
    assert page.status_code == 200 and "/static-offline-docs/swagger-ui-bundle.js" in page.text
    assert "cdn" not in page.text.lower() and "https://" not in page.text
    assert keyed.get("/static-offline-docs/swagger-ui-bundle.js").status_code == 200


# ------------------------------------------------------------------ status codes
def test_bad_filters_are_400_with_the_cli_message(local):
    cases = [{"entity": "NOPE"}, {"nofield": 1}, {"period": {"between": ["2022"]}}]
    for filters in cases:
        r = local.post("/v1/search", json={"query": "revenue", "filters": filters})
        assert r.status_code == 400, (filters, r.text)
        assert r.json()["error"] == "bad_request"
    # the parse errors are the CLI's own words (after the option name)
    try:
        parse_where_arg(json.dumps({"nofield": 1}))
    except ValueError as exc:
        cli = str(exc).split(": ", 1)[1]
    r = local.post("/v1/search", json={"query": "revenue", "filters": {"nofield": 1}})
    assert r.json()["message"] == f"filters: {cli}"
    clash = local.post("/v1/search", json={"query": "q", "filters": [["entity", "eq", "A"], ["entity", "eq", "B"]]})
    assert clash.status_code == 400 and "entity:in=a,b" in clash.json()["message"]


def test_bad_bodies_are_422_and_limits_400(local, monkeypatch):
    for body in ({}, {"query": 3}, {"query": "q", "top_k": "many"}, {"query": "q", "unknown": 1}):
        r = local.post("/v1/search", json=body)
        assert r.status_code == 422 and r.json()["error"] == "invalid_request", body
        assert "Traceback" not in r.text and "detail" not in r.json()
    assert local.post("/v1/search", content=b"{not json", headers={"content-type": "application/json"}
                      ).status_code == 422
    assert local.post("/v1/search", json={"query": "q", "top_k": 101}).status_code == 400
    assert local.post("/v1/search", json={"query": "q", "top_k": 0}).status_code == 400
    monkeypatch.setenv("RAGSPINE_MAX_QUERY_CHARS", "10")
    r = local.post("/v1/search", json={"query": "x" * 11})
    assert r.status_code == 400 and "RAGSPINE_MAX_QUERY_CHARS" in r.json()["message"]
    assert local.post("/v1/search", json={"query": "q", "mode": "warp"}).status_code == 400


def test_not_found_and_method_errors_are_json(local):
    r = local.get("/v2/nothing")
    assert r.status_code == 404 and r.json() == {"error": "not_found", "message": "no such route"}
    assert local.get("/v1/libraries/no_such_library").status_code == 404
    r = local.post("/v1/search", json={"query": "q", "libraries": ["no_such_library"]})
    assert r.status_code == 404 and r.json()["error"] == "not_found"
    assert local.post("/v1/graph/everything", json={"entity": "A", "metric": "m", "period": "p"}).status_code == 422
    r = local.get("/v1/search")
    assert r.status_code == 405 and set(r.json()) == {"error", "message"}


def test_oversized_body_is_413(local):
    r = local.post("/v1/search", content=json.dumps({"query": "x" * 70000}).encode(),
                   headers={"content-type": "application/json"})
    assert r.status_code == 413 and r.json()["error"] == "payload_too_large"

    def chunks():  # no Content-Length: counted as it arrives
        for _ in range(40):
            yield b" " * 4096
    r = local.post("/v1/search", content=chunks(), headers={"content-type": "application/json"})
    assert r.status_code == 413


def test_rate_limit_is_429_with_retry_after(warehouse, keyfile):
    path, reports, _ = keyfile
    limits = ServiceLimits(rate_per_s=0.01, burst=2)
    with client(create_app(warehouse, mode="bm25", keys_file=path, limits=limits)) as c:
        wait_ready(c.get)
        got = [c.get("/v1/libraries", headers=bearer(reports)).status_code for _ in range(3)]
        assert got == [200, 200, 429]
        r = c.get("/v1/libraries", headers=bearer(reports))
        assert r.json()["error"] == "rate_limited" and int(r.headers["Retry-After"]) >= 1
        assert c.get("/healthz").status_code == 200  # health is not rate limited


def test_token_bucket_refills_with_time():
    now = [0.0]
    bucket = TokenBucket(2.0, 2, clock=lambda: now[0])
    assert [bucket.take("k") for _ in range(2)] == [0.0, 0.0]
    assert bucket.take("k") == pytest.approx(0.5)
    assert bucket.take("other") == 0.0
    now[0] = 0.5
    assert bucket.take("k") == 0.0


def test_timeout_is_503_and_not_ready_is_503(warehouse, monkeypatch):
    import time as _time

    slow = operations.search

    def sleepy(*args, **kwargs):
        _time.sleep(0.5)
        return slow(*args, **kwargs)

    with client(create_app(warehouse, mode="bm25", limits=ServiceLimits(rate_per_s=0, timeout_s=0.05))) as c:
        wait_ready(c.get)
        monkeypatch.setattr(operations, "search", sleepy)
        r = c.post("/v1/search", json={"query": "revenue"})
        assert r.status_code == 503 and "RAGSPINE_SERVICE_TIMEOUT_S" in r.json()["message"]
    app = create_app(warehouse, mode="bm25", limits=NO_RATE)
    monkeypatch.setattr(app.state.served, "start", lambda interval: None)  # never loads
    with client(app) as c:
        assert c.get("/healthz").status_code == 200
        assert c.get("/readyz").status_code == 503
        assert c.post("/v1/search", json={"query": "q"}).status_code == 503


def test_an_unexpected_error_is_a_json_500_without_its_text(local, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("secret detail /srv/keys")
    monkeypatch.setattr(operations, "list_libraries", broken)
    r = local.get("/v1/libraries")
    assert r.status_code == 500 and r.json()["error"] == "internal"
    assert "secret" not in r.text and "Traceback" not in r.text and r.headers["x-request-id"] in r.text


# ------------------------------------------------------------------ keys and scopes
def test_no_key_is_401(keyed):
    for headers in ({}, bearer("rsk_nothere_abc"), bearer("garbage"), {"Authorization": "Basic x"}):
        for method, path in (("get", "/v1/libraries"), ("get", "/metrics"), ("post", "/mcp")):
            r = getattr(keyed, method)(path, headers=headers)
            assert r.status_code == 401, (path, headers)
            assert r.json()["error"] == "unauthorized" and r.headers["WWW-Authenticate"] == "Bearer"


def test_a_key_reads_only_its_scope(keyed, keyfile, warehouse):
    _, reports, policies = keyfile
    body = keyed.get("/v1/libraries", headers=bearer(reports)).json()
    assert [lib["id"] for lib in body["libraries"]] == ["acme_reports"]
    r = keyed.post("/v1/search", json={"query": "travel policy revenue", "top_k": 10}, headers=bearer(reports))
    assert r.status_code == 200 and r.json()["versions"] == {"acme_reports": versions_of(warehouse)["acme_reports"]}
    assert all(s["doc_id"].startswith("acme_reports/") for s in r.json()["snippets"])
    rows = keyed.post("/v1/graph/facts", json={"entity": "ACME_CN", "metric": "revenue", "period": "2023"},
                      headers=bearer(policies)).json()["rows"]
    assert all(row["library_id"] == "acme_policies" for row in rows)
    metrics = keyed.get("/metrics", headers=bearer(reports)).text
    assert 'library="acme_reports"' in metrics and "acme_policies" not in metrics


def test_out_of_scope_and_absent_libraries_answer_alike(keyed, keyfile):
    """The attacker's oracle: an existing library outside the scope and one that does not
    exist get the same status and the same body (the message repeats only the input)."""
    _, reports, policies = keyfile

    def answers(name):
        h = bearer(reports)
        return [(r.status_code, r.json()["message"].replace(name, "X")) for r in (
            keyed.get(f"/v1/libraries/{name}", headers=h),
            keyed.post("/v1/search", json={"query": "q", "libraries": [name]}, headers=h),
            keyed.post("/v1/graph/facts", json={"entity": "A", "metric": "m", "period": "p",
                                                "libraries": [name]}, headers=h))]
    exists, absent = answers("acme_policies"), answers("zz_never_was")
    assert exists == absent and {s for s, _ in exists} == {403}
    # in scope but never published: that key may learn it (404)
    assert keyed.get("/v1/libraries/ghost_library", headers=bearer(policies)).status_code == 404


def test_key_file_holds_hashes_and_reloads_without_restart(keyed, keyfile):
    path, reports, policies = keyfile
    text = path.read_text()
    assert reports not in text and policies not in text
    assert K.digest(reports) in text and oct(path.stat().st_mode & 0o777) == "0o600"
    kid, key = K.create_key(path, ["acme_policies"])
    assert keyed.get("/v1/libraries", headers=bearer(key)).status_code == 200
    new_id, new_key = K.rotate_key(path, kid)
    assert keyed.get("/v1/libraries", headers=bearer(key)).status_code == 401
    assert [x["id"] for x in keyed.get("/v1/libraries", headers=bearer(new_key)).json()["libraries"]] == \
        ["acme_policies"]
    K.revoke_key(path, new_id)
    assert keyed.get("/v1/libraries", headers=bearer(new_key)).status_code == 401


def test_a_corrupt_key_file_fails_closed(tmp_path):
    path = tmp_path / "keys.json"
    _, key = K.create_key(path, ["acme_reports"])
    ring = K.KeyRing(path)
    assert ring.authenticate(key) is not None
    path.write_text("{ not json", encoding="utf-8")
    assert ring.authenticate(key) is None


def test_keys_command(tmp_path, capsys):
    path = tmp_path / "k.json"
    assert K.keys_main(["create", "--keys-file", str(path), "--library", "acme_reports",
                        "--library", "not_checked"]) == 0
    key = capsys.readouterr().out.strip().splitlines()[-1]
    assert key.startswith("rsk_") and key not in path.read_text()
    assert K.keys_main(["list", "--keys-file", str(path)]) == 0
    listed = capsys.readouterr().out
    kid = K.key_id_of(key)
    assert f"{kid}\tactive\tacme_reports,not_checked" in listed and key not in listed
    assert K.keys_main(["rotate", kid, "--keys-file", str(path)]) == 0
    rotated = capsys.readouterr().out.strip().splitlines()[-1]
    assert rotated.startswith("rsk_") and rotated != key
    assert K.keys_main(["revoke", "nope", "--keys-file", str(path)]) == 2
    assert "no key with id" in capsys.readouterr().err
    ring = K.KeyRing(path)
    assert ring.authenticate(key) is None and ring.authenticate(rotated).libraries == {"acme_reports", "not_checked"}


def test_origin_is_checked_everywhere(keyed, keyfile):
    _, reports, _ = keyfile
    h = bearer(reports)
    assert keyed.get("/v1/libraries", headers={**h, "Origin": "http://evil.example"}).status_code == 403
    assert keyed.get("/v1/libraries", headers={**h, "Origin": "http://127.0.0.1.evil.example:80"}).status_code == 403
    assert keyed.get("/v1/libraries", headers={**h, "Origin": "http://localhost:3000"}).status_code == 200
    r = keyed.post("/mcp", headers={**h, "Origin": "http://evil.example", "accept": "application/json"},
                   json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
    assert r.status_code == 403


def test_mcp_answers_at_exactly_mcp(keyed, keyfile):
    _, reports, _ = keyfile
    h = {**bearer(reports), "accept": "application/json, text/event-stream"}
    r = keyed.post("/mcp", headers=h, json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
                   follow_redirects=False)
    assert r.status_code == 200, r.text
    assert {t["name"] for t in r.json()["result"]["tools"]} >= {"search", "list_libraries", "graph_rollup"}
    for path in ("/mcp/", "/mcp/mcp"):
        assert keyed.post(path, headers=h, json={}, follow_redirects=False).status_code == 404


def test_metrics_count_requests_by_route_and_status(local):
    local.get("/v1/libraries/no_such_library")
    text = local.get("/metrics").text
    assert 'ragspine_requests_total{method="GET",route="/v1/libraries/{library}",status="404"}' in text
    assert "ragspine_request_seconds_bucket" in text and "ragspine_snapshot_served{" in text
    assert "no_such_library" not in text


# ------------------------------------------------------------------ hot swaps
def test_a_refresh_is_served_without_restart_and_never_mixed(tmp_path):
    """Readers hammer the service while a library is republished with changed text: every
    response's snippets come from the snapshot versions that response names."""
    warehouse, corpus = build_warehouse(tmp_path, copy_corpus=True)
    wh = VersionedTables(warehouse)
    app = create_app(warehouse, mode="bm25", limits=NO_RATE, reload_s=0.05)
    seen: list[dict] = []
    stop = threading.Event()
    with client(app) as c:
        wait_ready(c.get)

        def reader():
            while not stop.is_set():
                r = c.post("/v1/search", json={"query": "revenue travel policy 2023", "top_k": 10})
                assert r.status_code == 200, r.text
                seen.append(r.json())
        threads = [threading.Thread(target=reader) for _ in range(3)]
        for t in threads:
            t.start()
        published = []
        target = corpus / "acme_reports" / "ar2023_cn_revenue.md"
        for i in range(3):
            target.write_text(target.read_text(encoding="utf-8") + f"\n\nRevenue travel policy note {i}.\n",
                              encoding="utf-8")
            published.append(refresh_library(wh, corpus, "acme_reports", graph=False))
        stop.set()
        for t in threads:
            t.join()
        app.state.served.refresh()
        final = c.post("/v1/search", json={"query": "revenue", "libraries": ["acme_reports"]}).json()
    assert final["versions"] == {"acme_reports": published[-1]}
    chunk_ids = {}
    for body in seen:
        for lib, version in body["versions"].items():
            if (lib, version) not in chunk_ids:
                snap = wh.get(SNAPSHOT, lib, version)
                chunk_ids[(lib, version)] = set(wh.read("chunks", lib, "chunks", snap.manifest["metadata"]["chunks"])
                                                .column("chunk_id").to_pylist())
        for s in body["snippets"]:
            assert s["chunk_id"] in chunk_ids[(s["library_id"], body["versions"][s["library_id"]])]
    assert len({b["versions"]["acme_reports"] for b in seen}) >= 2, "no swap was observed during the run"


def test_access_log_has_key_id_and_request_id_never_the_key(keyed, keyfile, caplog):
    _, reports, _ = keyfile
    with caplog.at_level("INFO", logger="ragspine.service.access"):
        r = keyed.get("/v1/libraries", headers=bearer(reports))
    lines = [rec.getMessage() for rec in caplog.records if rec.name == "ragspine.service.access"]
    assert any(r.headers["x-request-id"] in line and f"key={K.key_id_of(reports)}" in line for line in lines)
    assert all(reports not in line and reports.split("_", 2)[2] not in line for line in lines)


def test_an_indexed_warehouse_is_served_with_its_own_glossary(tmp_path, monkeypatch, capsys):
    """The service answers a synonym query of a ``ragspine index``-ed warehouse through the
    corpus's own glossary, exactly as the Python API (and so the CLI) does."""
    from ragspine_pipeline import cli
    from ragspine_pipeline.service.served import ServedLibraries, ServingAssembly

    monkeypatch.setenv("RAGSPINE_EMBEDDING_BACKEND", "none")
    monkeypatch.setenv("RAGSPINE_RETRIEVAL_MODE", "bm25")
    for name in ("RAGSPINE_GLOSSARY", "RAGSPINE_CORPUS_ROOT", "RAGSPINE_EMBEDDING", "RAGSPINE_WAREHOUSE"):
        monkeypatch.delenv(name, raising=False)
    corpus, wh = tmp_path / "corpus", tmp_path / "wh"
    (corpus / "birds").mkdir(parents=True)
    (corpus / "birds" / "survey.md").write_text("# Survey\n\nThe seabird colony grew this year.\n")
    (corpus / "glossary.json").write_text(json.dumps({"groups": [{"kind": "term", "terms": ["pelican", "seabird"]}]}))
    assert cli.main(["index", str(corpus), "--warehouse", str(wh), "--in-process"]) == 0, \
        capsys.readouterr()
    served = ServedLibraries(ServingAssembly.resolve(wh, mode="bm25"), None)
    served.refresh()
    got = operations.search(served, K.LOCAL, "pelican", top_k=1)
    api = open_published_retriever(wh, mode="bm25").retrieve("pelican", top_k=1)
    assert [s["doc_id"] for s in got["snippets"]] == [s["doc_id"] for s in api] == ["birds/survey"]
