"""Non-interference through the service: HTTP responses and MCP tool results are identical
whether or not RESTRICTED documents (in every spelling that must fail closed) exist in the
library, and ``/v1/libraries`` counts open documents only. Extends the property test of
tests/test_security.py to the service's two doors.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("fastapi")
pytest.importorskip("mcp")

from fastapi.testclient import TestClient  # noqa: E402
from service_fixtures import wait_ready  # noqa: E402
from test_security import VOCAB, _form_files, corpora, write_lib  # noqa: E402  (the engine's worlds)

from ragspine_pipeline.service.app import create_app  # noqa: E402
from ragspine_pipeline.service.limits import ServiceLimits  # noqa: E402
from ragspine_pipeline.warehouse import pipeline as P  # noqa: E402
from ragspine_pipeline.warehouse.versioned import VersionedTables  # noqa: E402

LIB = "lib"
MCP_HEADERS = {"accept": "application/json, text/event-stream"}


def publish(root: Path, docs: dict) -> Path:
    """The library of ``docs`` published under ``root``; a hidden document is written in its
    ingest form (test_security's ``_form_files``: sidecar, look-alike keys, hard links...)."""
    shutil.rmtree(root, ignore_errors=True)
    files: dict[str, str | tuple[str, str]] = {}
    for d, (text, label, entity, *form) in docs.items():
        files.update(_form_files(d, text, label, entity, form[0] if form else "sidecar"))
    folder = write_lib(root / "corpus", {n: b for n, b in files.items() if not isinstance(b, tuple)}, LIB)
    for name, body in files.items():
        if isinstance(body, tuple):
            os.link(folder / body[1], folder / name)
    wh = VersionedTables(root / "wh")
    P.build_raw_documents(wh, root / "corpus", LIB)
    P.build_chunks(wh, LIB)
    P.build_lexical_index(wh, LIB)
    P.publish_snapshot(wh, LIB)
    return root / "wh"


def service_outputs(root: Path, docs: dict, queries: list[str]) -> str:
    """Everything a caller sees through HTTP and MCP for ``queries`` (same path both worlds)."""
    app = create_app(publish(root, docs), mode="bm25", limits=ServiceLimits(rate_per_s=0))
    out: list = []
    with TestClient(app, base_url="http://127.0.0.1:8080") as c:
        wait_ready(c.get)
        out.append(c.get("/v1/libraries").json()["libraries"][0] | {"snapshot_id": None})
        for q in queries:
            for f in (None, {"entity": "A"}):
                r = c.post("/v1/search", json={"query": q, "filters": f, "top_k": 10})
                out.append([r.status_code, r.json()])
                call = {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                        "params": {"name": "search", "arguments": {"query": q, "filters": f, "top_k": 10}}}
                out.append(c.post("/mcp", json=call, headers=MCP_HEADERS).json())
    return json.dumps(out, ensure_ascii=False, sort_keys=True)


@settings(max_examples=6)
@given(corpora(), st.lists(st.lists(st.sampled_from(VOCAB), min_size=1, max_size=3).map(" ".join),
                           min_size=1, max_size=2))
def test_service_output_is_identical_with_or_without_restricted_documents(tmp_path_factory, corpus, queries):
    docs, secret = corpus
    root = tmp_path_factory.mktemp("worlds")
    assert service_outputs(root, {**docs, **secret}, queries) == service_outputs(root, docs, queries)


def test_restricted_text_never_reaches_a_caller(tmp_path):
    docs = {"p": ("revenue margin lyon", "PUBLIC", "A"), "s": ("zebra tariff 深圳 工会", "RESTRICTED", "A")}
    out = service_outputs(tmp_path, docs, ["zebra tariff", "revenue"])
    body = json.loads(out)
    assert body[0]["documents"] == 1 and body[1][0] == 200
    assert "zebra" not in out and "工会" not in out and "lib/s" not in out
