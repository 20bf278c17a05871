"""``/openapi.json`` describes the real service (issue 45 item 4): a bearer security scheme,
typed request and response models, and every error status declared with the real
``{error, message}`` body. The check is the client's: for every route and every status the
document declares, a real response of that status is provoked and its body validated
(jsonschema, Draft 2020-12 as OpenAPI 3.1) against the schema the document gives for it;
and every status provoked is one the document declares.
"""

from __future__ import annotations

import json
import socket

import httpx2
import pytest
from fastapi.testclient import TestClient
from jsonschema import Draft202012Validator
from service_fixtures import build_warehouse, running, wait_ready

from ragspine_pipeline.service import keys as K
from ragspine_pipeline.service.app import create_app
from ragspine_pipeline.service.limits import ServiceLimits

HOST = "http://127.0.0.1:8080"
ABSENT = "zz_unpublished"  # in the key's scope, never published: the 404
SEARCH = {"query": "revenue 2023", "top_k": 3}
FACTS = {"entity": "ACME_CN", "metric": "revenue", "period": "2023"}
# (method, template) -> (path, body); a path with {absent}: the 404 form of the route
ROUTES = {
    ("get", "/healthz"): ("/healthz", None, None),
    ("get", "/readyz"): ("/readyz", None, None),
    ("post", "/v1/search"): ("/v1/search", SEARCH, ("/v1/search", {**SEARCH, "libraries": [ABSENT]})),
    ("get", "/v1/libraries"): ("/v1/libraries", None, None),
    ("get", "/v1/libraries/{library}"): ("/v1/libraries/acme_reports", None, (f"/v1/libraries/{ABSENT}", None)),
    ("get", "/v1/discover"): ("/v1/discover", None, (f"/v1/discover?library={ABSENT}", None)),
    ("post", "/v1/graph/{kind}"): ("/v1/graph/facts", FACTS, ("/v1/graph/facts", {**FACTS, "libraries": [ABSENT]})),
    ("get", "/metrics"): ("/metrics", None, None),
}
BAD_BODY = {"/v1/search": {"query": "q", "top_k": "3"}, "/v1/graph/facts": {"entity": 1, "metric": "m", "period": "p"}}


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    warehouse = build_warehouse(tmp_path_factory.mktemp("openapi"))[0]
    keys = tmp_path_factory.mktemp("keys") / "keys.json"
    _, key = K.create_key(keys, ["acme_policies", "acme_reports", ABSENT])
    return warehouse, keys, key


def call(c, method: str, path: str, body, headers) -> httpx2.Response:
    if body is None:
        return c.request(method, path, headers=headers)
    return c.request(method, path, headers=headers, json=body)


def provoke(world) -> list[tuple[str, str, int, httpx2.Response]]:
    """(method, template, status, response) for every status each route can answer."""
    warehouse, keys, key = world
    auth = {"Authorization": f"Bearer {key}"}
    got = []
    app = create_app(warehouse, mode="bm25", keys_file=keys, limits=ServiceLimits(rate_per_s=0, max_body_bytes=4096))
    with TestClient(app, base_url=HOST) as c:
        wait_ready(c.get)
        doc = c.get("/openapi.json").json()
        for (method, template), (path, body, absent) in ROUTES.items():
            keyed = template.startswith("/v1/") or template == "/metrics"
            add = lambda status, r, m=method, t=template: got.append((m, t, status, r))  # noqa: E731
            add(200, call(c, method, path, body, auth))
            twice = [("authorization", f"Bearer {key}"), ("authorization", f"Bearer {key}")]
            add(400, c.request(method, path, headers=twice, **({"json": body} if body else {})))
            add(403, call(c, method, path, body, {**auth, "Origin": "http://evil.example"}))
            add(421, call(c, method, path, body, {**auth, "Host": "evil.example"}))
            if keyed:
                add(401, call(c, method, path, body, {}))
            if absent:
                add(404, call(c, method, absent[0], absent[1], auth))
            if body is not None:
                add(413, c.request(method, path, headers={**auth, "content-type": "application/json"},
                                   content=json.dumps({**body, "pad": "x" * 5000})))
                add(422, call(c, method, path, BAD_BODY[path], auth))
        assert c.post("/v1/search", json={**SEARCH, "top_k": 101}, headers=auth).status_code == 400
    # 429: a bucket of one token, spent by the first call
    app = create_app(warehouse, mode="bm25", keys_file=keys, limits=ServiceLimits(rate_per_s=0.001, burst=1))
    with TestClient(app, base_url=HOST) as c:
        wait_ready(c.get)
        c.get("/v1/libraries", headers=auth)
        for (method, template), (path, body, _) in ROUTES.items():
            if template.startswith("/v1/") or template == "/metrics":
                got.append((method, template, 429, call(c, method, path, body, auth)))
    # 503: an app whose snapshots are not loaded (its lifespan never ran)
    c = TestClient(create_app(warehouse, mode="bm25", keys_file=keys, limits=ServiceLimits(rate_per_s=0)), base_url=HOST)
    for (method, template), (path, body, _) in ROUTES.items():
        if template not in ("/healthz", "/metrics"):
            got.append((method, template, 503, call(c, method, path, body, auth)))
    # 408: a body that never comes, on a real listener
    app = create_app(warehouse, mode="bm25", keys_file=keys, limits=ServiceLimits(rate_per_s=0, body_timeout_s=0.2))
    with running(app) as base:
        wait_ready(lambda p: httpx2.get(base + p))
        port = int(base.rsplit(":", 1)[1])
        for (method, template), (path, body, _) in ROUTES.items():
            if body is not None:
                got.append((method, template, 408, late_body(port, path, key)))
    return doc, got


def late_body(port: int, path: str, key: str) -> httpx2.Response:
    """POST headers announcing a body, then nothing: the server's answer once it gives up."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {key}\r\n"
                  "Content-Type: application/json\r\nContent-Length: 50\r\n\r\n".encode())
        data = b""
        while b"\r\n\r\n" not in data or len(data.split(b"\r\n\r\n", 1)[1]) < _length(data):
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    head, body = data.split(b"\r\n\r\n", 1)
    lines = head.decode().split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:])
    return httpx2.Response(int(lines[0].split()[1]), headers=headers, content=body)


def _length(data: bytes) -> int:
    head = data.split(b"\r\n\r\n", 1)[0].decode(errors="replace").lower()
    for line in head.split("\r\n"):
        if line.startswith("content-length:"):
            return int(line.split(":", 1)[1])
    return 0


def test_every_documented_status_of_every_route_matches_the_document(world):
    doc, got = provoke(world)
    declared = {(m, t, int(s)) for t, ops in doc["paths"].items() for m, op in ops.items() for s in op["responses"]}
    provoked = {(m, t, s) for m, t, s, _ in got}
    assert declared == provoked, (declared - provoked, provoked - declared)
    for method, template, status, r in got:
        where = (method, template, status)
        assert r.status_code == status, (where, r.text[:300])
        spec = doc["paths"][template][method]["responses"][str(status)]
        ctype = r.headers["content-type"].split(";")[0]
        assert ctype in spec["content"], (where, ctype)
        schema = spec["content"][ctype]["schema"]
        if ctype == "application/json":
            Draft202012Validator({**schema, "components": doc["components"]}).validate(r.json())
            if status >= 400:
                assert set(r.json()) == {"error", "message"}, where
        for header in spec.get("headers", {}):
            assert header in r.headers, (where, header)


def test_the_document_declares_bearer_keys_and_the_service_limits(world):
    warehouse, keys, _ = world
    app = create_app(warehouse, mode="bm25", keys_file=keys, limits=ServiceLimits(max_top_k=17))
    doc = TestClient(app, base_url=HOST).get("/openapi.json").json()
    assert doc["components"]["securitySchemes"]["bearer"] == {
        "type": "http", "scheme": "bearer", "description": doc["components"]["securitySchemes"]["bearer"]["description"]}
    for template, ops in doc["paths"].items():
        for method, op in ops.items():
            keyed = template.startswith("/v1/") or template == "/metrics"
            assert (op.get("security") == [{"bearer": []}]) == keyed, (method, template)
            ok = op["responses"]["200"]["content"]
            assert "application/json" not in ok or "$ref" in ok["application/json"]["schema"], (method, template)
    top_k = doc["components"]["schemas"]["SearchBody"]["properties"]["top_k"]
    assert (top_k["minimum"], top_k["maximum"]) == (1, 17)
    text = json.dumps(doc)
    assert "HTTPValidationError" not in text and '"detail"' not in text
    assert "ACME_CN" not in text and "ACME_GROUP" not in text  # no demo example in a served document
