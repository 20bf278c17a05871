"""MCP through the official SDK's own client: streamable HTTP against the real server on
127.0.0.1 (keys and scopes as over HTTP), and stdio against ``mcp_main``.
"""

from __future__ import annotations

import json
import sys

import pytest

pytest.importorskip("mcp")

import anyio  # noqa: E402
import httpx2  # noqa: E402
from mcp import Client  # noqa: E402
from mcp.client.stdio import StdioServerParameters  # noqa: E402
from mcp.client.streamable_http import streamable_http_client  # noqa: E402
from service_fixtures import build_warehouse, running, wait_ready  # noqa: E402

from ragspine_pipeline.service import keys as K  # noqa: E402
from ragspine_pipeline.service import operations  # noqa: E402
from ragspine_pipeline.service.app import create_app  # noqa: E402
from ragspine_pipeline.service.limits import ServiceLimits  # noqa: E402
from ragspine_pipeline.serving import open_published_retriever  # noqa: E402


@pytest.fixture(scope="module")
def warehouse(tmp_path_factory):
    return build_warehouse(tmp_path_factory.mktemp("mcp"))[0]


@pytest.fixture(scope="module")
def server(warehouse, tmp_path_factory):
    path = tmp_path_factory.mktemp("keys") / "keys.json"
    _, key = K.create_key(path, ["acme_reports"])
    app = create_app(warehouse, mode="bm25", keys_file=path, limits=ServiceLimits(rate_per_s=0))
    with running(app) as url:
        wait_ready(lambda p: httpx2.get(url + p))
        yield url, key


def tool_json(result) -> dict:
    assert not result.is_error, result.content
    return json.loads(result.content[0].text)


async def _session(url: str, key: str | None, fn):
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    async with httpx2.AsyncClient(headers=headers) as http, \
            Client(streamable_http_client(url + "/mcp", http_client=http)) as client:
        return await fn(client)


def test_the_sdk_client_searches_within_its_scope(server, warehouse):
    url, key = server

    async def calls(client):
        tools = await client.list_tools()
        search = await client.call_tool("search", {"query": "revenue 2023", "top_k": 3,
                                                   "filters": {"entity": "ACME_CN"}})
        libraries = await client.call_tool("list_libraries", {})
        outside = await client.call_tool("search", {"query": "travel", "libraries": ["acme_policies"]})
        absent = await client.call_tool("search", {"query": "travel", "libraries": ["zz_never_was"]})
        bad = await client.call_tool("search", {"query": "revenue", "filters": {"entity": "NOPE"}})
        graph = await client.call_tool("graph_facts", {"entity": "ACME_CN", "metric": "revenue", "period": "2023"})
        return tools, search, libraries, outside, absent, bad, graph

    tools, search, libraries, outside, absent, bad, graph = anyio.run(_session, url, key, calls)
    described = {t.name: t for t in tools.tools}
    assert {"search", "list_libraries", "graph_rollup", "graph_peers", "graph_trace", "graph_facts"} <= set(described)
    assert "between" in described["search"].description and "ACME_CN" in json.dumps(described["search"].input_schema)
    body = tool_json(search)
    api = open_published_retriever(warehouse, "acme_reports", mode="bm25")
    # the Python API's snippets, source_path relative to the library (issue 44)
    expected = operations.relative_paths(api.retrieve("revenue 2023", filters={"entity": "ACME_CN"}, top_k=3))
    assert json.dumps(body["snippets"], sort_keys=True, default=str) == json.dumps(expected, sort_keys=True, default=str)
    assert list(body["versions"]) == ["acme_reports"]
    assert [lib["id"] for lib in tool_json(libraries)["libraries"]] == ["acme_reports"]
    assert outside.is_error and absent.is_error
    assert outside.content[0].text.replace("acme_policies", "X") == absent.content[0].text.replace("zz_never_was", "X")
    assert bad.is_error and "no document has entity='NOPE'" in bad.content[0].text
    assert all(r["library_id"] == "acme_reports" and r["citations"] for r in tool_json(graph)["rows"])


def test_mcp_without_a_key_is_refused(server):
    url, _ = server
    r = httpx2.post(url + "/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
                    headers={"accept": "application/json, text/event-stream"})
    assert r.status_code == 401 and r.json()["error"] == "unauthorized"
    r = httpx2.post(url + "/mcp", json={}, headers={"Host": "evil.example"})
    assert r.status_code in (401, 421)


def test_stdio_reads_the_libraries_named(warehouse):
    params = StdioServerParameters(
        command=sys.executable,
        args=["-c", "import sys; from ragspine_pipeline.service import mcp_main; "
                    "sys.exit(mcp_main(sys.argv[1:]))", "--warehouse", str(warehouse), "--library", "acme_policies",
              "--mode", "bm25"])

    async def run():
        async with Client(params) as client:
            libs = tool_json(await client.call_tool("list_libraries", {}))
            found = tool_json(await client.call_tool("search", {"query": "travel expenses", "top_k": 2}))
            return libs, found

    libs, found = anyio.run(run)
    assert [lib["id"] for lib in libs["libraries"]] == ["acme_policies"]
    assert found["snippets"] and list(found["versions"]) == ["acme_policies"]
