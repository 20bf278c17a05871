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


def tool_text(result) -> str:
    assert not result.is_error, result.content
    return result.content[0].text


def json_lines(result) -> list[dict]:
    """The JSON objects of a compact line result (list_libraries, graph rows; last line: a footer)."""
    return [json.loads(line) for line in tool_text(result).splitlines() if line.startswith("{")]


def cited_heads(result) -> list[str]:
    return [line for line in tool_text(result).splitlines() if line.startswith("[")]


def head_of(rank: int, s: dict) -> str:
    loc = s["source_locator"]
    return f"[{rank}] {s['title']} | {s['doc_id']} chars {loc['start']}-{loc['end']} | chunk {s['chunk_id']}"


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
    # the served corpus's own values (this is the demo), in the parameter descriptions too
    assert "between" in json.dumps(described["search"].input_schema)
    assert "ACME_CN" in json.dumps(described["search"].input_schema)
    api = open_published_retriever(warehouse, "acme_reports", mode="bm25")
    # the Python API's snippets, in order, one citation line each (issue 45: compact text)
    expected = operations.relative_paths(api.retrieve("revenue 2023", filters={"entity": "ACME_CN"}, top_k=3))
    assert cited_heads(search) == [head_of(i, s) for i, s in enumerate(expected, start=1)]
    assert all(" ".join(s["text"].split())[:100] in tool_text(search) for s in expected)
    assert "versions: acme_reports=" in tool_text(search)
    assert [lib["id"] for lib in json_lines(libraries)] == ["acme_reports"]
    assert outside.is_error and absent.is_error
    assert outside.content[0].text.replace("acme_policies", "X") == absent.content[0].text.replace("zz_never_was", "X")
    assert bad.is_error and "no document has entity='NOPE'" in bad.content[0].text
    assert json_lines(graph) and all(r["library_id"] == "acme_reports" and r["citations"] for r in json_lines(graph))


def test_mcp_without_a_key_is_refused(server):
    url, _ = server
    r = httpx2.post(url + "/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
                    headers={"accept": "application/json, text/event-stream"})
    # an MCP client's request: a JSON-RPC error the SDK shows, the HTTP body in its data
    assert r.status_code == 401 and r.json()["error"]["data"]["error"] == "unauthorized"
    assert r.json()["error"]["message"].startswith("unauthorized: ") and r.json()["id"] is None
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
            libs = json_lines(await client.call_tool("list_libraries", {}))
            found = tool_text(await client.call_tool("search", {"query": "travel expenses", "top_k": 2}))
            return libs, found

    libs, found = anyio.run(run)
    assert [lib["id"] for lib in libs] == ["acme_policies"]
    assert found.startswith("[1] ") and "versions: acme_policies=" in found and "acme_reports" not in found
