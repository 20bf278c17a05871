"""MCP an agent can use unaided (issue 45 item 3), through the official SDK's own client
against a real server over a corpus that is NOT the demo: tool descriptions carry the
caller's own values (never ``ACME_CN``/``ACME_GROUP``/``net_income``), a ``discover``
tool lists fields, values, entities and metrics of open published data only, results are
compact text within the documented budget, the schemas carry the HTTP limits, and a bad
key reads as a clear message.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

pytest.importorskip("mcp")

import anyio  # noqa: E402
import httpx2  # noqa: E402
from fastapi.testclient import TestClient  # noqa: E402
from mcp import Client  # noqa: E402
from mcp.client.streamable_http import streamable_http_client  # noqa: E402
from service_fixtures import refresh_library, running, wait_ready  # noqa: E402

from ragspine_pipeline.retrieval.limits import max_query_chars  # noqa: E402
from ragspine_pipeline.service import keys as K  # noqa: E402
from ragspine_pipeline.service.app import create_app  # noqa: E402
from ragspine_pipeline.service.limits import ServiceLimits  # noqa: E402
from ragspine_pipeline.warehouse.versioned import VersionedTables  # noqa: E402

DEMO_WORDS = ("ACME_CN", "ACME_GROUP", "net_income", "ACME")
CANARY = "Quillfrost"  # only in the RESTRICTED document: its entity, topic, title and text
OPS, HR = "harbor_ops", "harbor_hr"
LONG = " ".join(f"Crane {i} at the north quay was rebuilt after storm number {i * 7}." for i in range(80))


def meta(**kw) -> str:
    return json.dumps(kw, ensure_ascii=False)


def corpus_files(with_restricted: bool) -> dict[str, dict[str, str]]:
    ops = {
        "quay_report.md": "# Quay report\n\nNordlicht AG moved 40,000 containers through the north quay in 2019. "
                          "Dredging costs rose after the storm season.",
        "quay_report.meta.json": meta(title="Quay report 2019", entity="NORDLICHT_AG", period="2019",
                                      topic="logistics", geography="DE", language="en", sensitivity="PUBLIC"),
        "crane_log.md": "# Crane log\n\n" + LONG,
        "crane_log.meta.json": meta(title="Crane log", entity="NORDLICHT_AG", period="2020", topic="maintenance",
                                    geography="DE", language="en", sensitivity="INTERNAL"),
        "pilot_rules.md": "# Pilot rules\n\nEvery vessel over 120 metres takes a harbour pilot at the outer buoy.",
        "pilot_rules.meta.json": meta(title="Pilot rules", entity="HAFENAMT", period="2020", topic="safety",
                                      geography="DE", language="en", sensitivity="PUBLIC"),
    }
    if with_restricted:
        ops["board_minutes.md"] = f"# {CANARY} minutes\n\n{CANARY} plans to buy the north quay storm crane."
        ops["board_minutes.meta.json"] = meta(title=f"{CANARY} minutes", entity=f"{CANARY.upper()}_SE",
                                              period="1999", topic=CANARY.lower(), geography="ZZ",
                                              sensitivity="RESTRICTED")
    hr = {"shifts.md": "# Shifts\n\nQuay crews work three shifts.",
          "shifts.meta.json": meta(title="Shift plan", entity="HR_ONLY_CO", period="2021", topic="staffing",
                                   sensitivity="PUBLIC")}
    return {OPS: ops, HR: hr}


def build(root: Path, *, with_restricted: bool = True) -> Path:
    corpus = root / "corpus"
    for lib, files in corpus_files(with_restricted).items():
        for name, text in files.items():
            (corpus / lib).mkdir(parents=True, exist_ok=True)
            (corpus / lib / name).write_text(text, encoding="utf-8")
    wh = VersionedTables(root / "wh")
    for lib in (OPS, HR):
        refresh_library(wh, corpus, lib)
    return root / "wh"


@pytest.fixture(scope="module")
def warehouse(tmp_path_factory):
    return build(tmp_path_factory.mktemp("harbor"))


@pytest.fixture(scope="module")
def server(warehouse, tmp_path_factory):
    path = tmp_path_factory.mktemp("keys") / "keys.json"
    _, key = K.create_key(path, [OPS])
    limits = ServiceLimits(rate_per_s=0, max_top_k=7, mcp_result_chars=1500)
    app = create_app(warehouse, mode="bm25", keys_file=path, limits=limits)
    with running(app) as url:
        wait_ready(lambda p: httpx2.get(url + p))
        yield url, key, limits


async def _session(url: str, key: str | None, fn):
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    async with httpx2.AsyncClient(headers=headers) as http, \
            Client(streamable_http_client(url + "/mcp", http_client=http)) as client:
        return await fn(client)


def text_of(result) -> str:
    assert not result.is_error, result.content
    assert len(result.content) == 1 and not result.structured_content  # one text, not doubled as JSON
    return result.content[0].text


def test_tool_descriptions_come_from_the_callers_corpus(server):
    url, key, limits = server
    tools = anyio.run(_session, url, key, lambda c: c.list_tools()).tools
    listed = json.dumps([t.model_dump(mode="json") for t in tools], ensure_ascii=False)
    for word in (*DEMO_WORDS, CANARY, CANARY.upper(), CANARY.lower(), HR, "HR_ONLY_CO", "staffing", "1999"):
        assert word not in listed, word
    by = {t.name: t for t in tools}
    assert {"search", "discover", "list_libraries", "graph_facts"} <= set(by)
    search = by["search"]
    assert "NORDLICHT_AG" in search.description and OPS in search.description
    props = search.input_schema["properties"]
    assert '{"entity": "NORDLICHT_AG"}' in props["filters"]["description"]
    assert props["top_k"]["maximum"] == limits.max_top_k and props["top_k"]["minimum"] == 1
    assert props["query"]["maxLength"] == max_query_chars()
    assert props["detail"]["type"] == "boolean"
    assert str(limits.mcp_result_chars) in search.description  # the budget is stated to the agent


def test_discover_lists_open_published_values_only(server):
    url, key, _ = server

    async def calls(client):
        return (await client.call_tool("discover", {}), await client.call_tool("discover", {"libraries": [HR]}))

    found, outside = anyio.run(_session, url, key, calls)
    text = text_of(found)
    assert "\n" not in text and "  " not in text  # compact JSON
    body = json.loads(text)
    assert [lib["id"] for lib in body["libraries"]] == [OPS]
    entity = body["fields"]["entity"]
    assert [v["value"] for v in entity["top_values"]] == ["NORDLICHT_AG", "HAFENAMT"]
    assert entity["top_values"][0]["documents"] == 2 and entity["distinct"] == 2
    assert {v["value"] for v in body["fields"]["topic"]["top_values"]} == {"logistics", "maintenance", "safety"}
    assert body["fields"]["doc_id"]["top_values"] == [] and "sensitivity" not in body["fields"]
    assert CANARY.lower() not in text.lower() and "1999" not in text and "ZZ" not in text
    assert not any(w in text for w in DEMO_WORDS)  # the graph's dimension nodes without figures are not offered
    assert outside.is_error and "forbidden" in outside.content[0].text


def test_search_results_are_compact_and_within_the_budget(server):
    url, key, limits = server

    async def calls(client):
        return (await client.call_tool("search", {"query": "north quay storm crane", "top_k": 5}),
                await client.call_tool("search", {"query": "north quay storm crane", "top_k": 5, "detail": True}),
                await client.call_tool("search", {"query": "quay", "top_k": limits.max_top_k + 1}),
                await client.call_tool("search", {"query": "quay", "filters": {"entity": "NOPE"}}))

    compact, detailed, too_many, bad = anyio.run(_session, url, key, calls)
    http = httpx2.post(url + "/v1/search", json={"query": "north quay storm crane", "top_k": 5},
                       headers={"Authorization": f"Bearer {key}"}).json()
    text = text_of(compact)
    assert len(text) <= limits.mcp_result_chars
    assert not any(line.startswith((" ", "\t")) for line in text.splitlines())  # no indentation
    heads = [line for line in text.splitlines() if re.match(r"\[\d+\] ", line)]
    # five snippets do not all fit 1,500 characters with 200 of text each: the last are left out, said so
    assert 1 < len(heads) < len(http["snippets"]) == 5
    assert f"{5 - len(heads)} more snippet(s) left out" in text
    for i, (head, s) in enumerate(zip(heads, http["snippets"], strict=False), start=1):
        loc = s["source_locator"]
        assert head == f"[{i}] {s['title']} | {s['doc_id']} chars {loc['start']}-{loc['end']} | chunk {s['chunk_id']}"
    assert "…[+" in text  # the crane log's text is cut to fit the budget, and says so
    assert f"versions: {OPS}={http['versions'][OPS]}" in text and CANARY not in text
    full = text_of(detailed)
    assert len(full) <= limits.mcp_result_chars and "scores: " in full and "lineage: " in full
    assert f"snapshot={http['versions'][OPS]}" in full and "score" not in text
    assert too_many.is_error and str(limits.max_top_k) in too_many.content[0].text
    assert bad.is_error and "no document has entity='NOPE'" in bad.content[0].text


def test_a_bad_key_reads_as_a_clear_message(server):
    url, _, _ = server
    with pytest.raises(BaseException) as caught:
        anyio.run(_session, url, "rsk_nothere_abc", lambda c: c.list_tools())
    leaves = [caught.value]
    while any(isinstance(e, BaseExceptionGroup) for e in leaves):
        leaves = [x for e in leaves for x in (e.exceptions if isinstance(e, BaseExceptionGroup) else [e])]
    messages = " ".join(str(e) for e in leaves)
    assert "unauthorized" in messages and "Authorization: Bearer KEY" in messages, messages
    assert "Server returned an error response" not in messages
    # the plain HTTP caller (no MCP Accept) still gets the documented {error, message}
    r = httpx2.post(url + "/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
    assert r.status_code == 401 and set(r.json()) == {"error", "message"}


def _agent_view(warehouse: Path) -> str:
    """Everything an MCP caller learns about the corpus without searching: the tool list and
    discover (library versions masked: the two worlds publish at different times)."""
    app = create_app(warehouse, mode="bm25", limits=ServiceLimits(rate_per_s=0))
    headers = {"accept": "application/json, text/event-stream"}
    with TestClient(app, base_url="http://127.0.0.1:8080") as c:
        wait_ready(c.get)
        tools = c.post("/mcp", headers=headers, json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"}).json()
        found = c.post("/mcp", headers=headers, json={"jsonrpc": "2.0", "id": 2, "method": "tools/call",
                                                      "params": {"name": "discover", "arguments": {}}}).json()
        http = c.get("/v1/discover").json()
    body = json.loads(found["result"]["content"][0]["text"])
    assert body == json.loads(json.dumps(http))
    for lib in body["libraries"]:
        lib["version"] = lib["snapshot_id"] = None
    return json.dumps([tools["result"], body], sort_keys=True, ensure_ascii=False)


def test_discovery_does_not_depend_on_restricted_documents(tmp_path):
    with_secret = _agent_view(build(tmp_path / "a", with_restricted=True))
    without = _agent_view(build(tmp_path / "b", with_restricted=False))
    assert with_secret == without
    assert CANARY.lower() not in with_secret.lower()
