"""The service under an attacker's requests (issue 44), in process: Host on every route,
one Authorization header, strict JSON types, the documented error JSON everywhere, nothing
out of scope in /readyz or /metrics, invalid text and costly queries refused at every door,
library-relative snippet paths, the fair engine queue, service-wide readiness with
workers, and key files written under a lock and re-read by content.

Every test here failed on the code before issue 44. Socket-level limits (timeouts, the
connection cap, event streams) are in test_service_hostile_net.py.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import threading
import time

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("mcp")

import anyio  # noqa: E402
from fastapi.testclient import TestClient  # noqa: E402
from service_fixtures import build_warehouse, refresh_library, wait_ready  # noqa: E402

from ragspine_pipeline.retrieval.limits import InvalidText, check_query  # noqa: E402
from ragspine_pipeline.service import keys as K  # noqa: E402
from ragspine_pipeline.service import operations  # noqa: E402
from ragspine_pipeline.service.app import create_app  # noqa: E402
from ragspine_pipeline.service.limits import ServiceLimits  # noqa: E402
from ragspine_pipeline.service.readiness import RUNTIME_ENV, Readiness, prepare  # noqa: E402
from ragspine_pipeline.service.runner import FairQueue, run_limited  # noqa: E402
from ragspine_pipeline.warehouse.versioned import VersionedTables  # noqa: E402

NO_RATE = ServiceLimits(rate_per_s=0)
MCP_HEADERS = {"accept": "application/json, text/event-stream"}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    return build_warehouse(tmp_path_factory.mktemp("hostile"), copy_corpus=True)


@pytest.fixture(scope="module")
def keyfile(tmp_path_factory):
    path = tmp_path_factory.mktemp("keys") / "keys.json"
    return path, K.create_key(path, ["acme_reports"])[1], K.create_key(path, ["acme_policies"])[1]


def client(app, base_url: str = "http://127.0.0.1:8080") -> TestClient:
    return TestClient(app, base_url=base_url)


@pytest.fixture(scope="module")
def local(built):
    with client(create_app(built[0], mode="bm25", limits=NO_RATE, allowed_hosts=["search.example.com"])) as c:
        wait_ready(c.get)
        yield c


@pytest.fixture(scope="module")
def keyed(built, keyfile):
    with client(create_app(built[0], mode="bm25", keys_file=keyfile[0], limits=NO_RATE, reload_s=0.05)) as c:
        wait_ready(c.get)
        yield c


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def tool_call(c: TestClient, name: str, arguments: dict, headers: dict | None = None) -> dict:
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": name, "arguments": arguments}}
    r = c.post("/mcp", headers={**MCP_HEADERS, "content-type": "application/json", **(headers or {})},
               content=json.dumps(body).encode())  # ASCII escapes: a lone surrogate travels as \ud800
    assert r.status_code == 200, r.text
    return r.json()["result"]


# ------------------------------------------------------------------ Host, headers, error bodies
def test_host_is_checked_on_every_route(local):
    for path in ("/v1/libraries", "/metrics", "/healthz", "/readyz", "/openapi.json", "/docs", "/nothing"):
        r = local.get(path, headers={"host": "evil.example"})
        assert r.status_code == 421, path
        assert r.json()["error"] == "misdirected_request", path
    r = local.post("/mcp", headers={**MCP_HEADERS, "host": "evil.example"},
                   json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
    assert r.status_code == 421 and set(r.json()) == {"error", "message"}
    for host in ("127.0.0.1:9", "localhost", "[::1]:8080", "search.example.com", "search.example.com:443"):
        assert local.get("/v1/libraries", headers={"host": host}).status_code == 200, host
    for host in ("127.0.0.1.evil.example", "localhost:x", "search.example.com.evil"):
        assert local.get("/v1/libraries", headers={"host": host}).status_code == 421, host


def test_repeated_authorization_or_host_is_400(keyed, keyfile):
    _, reports, policies = keyfile
    twice = [("authorization", f"Bearer {policies}"), ("authorization", f"Bearer {reports}")]
    r = keyed.get("/v1/libraries", headers=twice)
    assert r.status_code == 400 and r.json()["error"] == "bad_request"
    r = keyed.get("/healthz", headers=[("host", "127.0.0.1"), ("host", "evil.example")])
    assert r.status_code == 400


def test_every_error_body_is_the_documented_json(local):
    cases = [("put", "/mcp", 405), ("delete", "/mcp", 405), ("get", "/v1/search", 405), ("get", "/v2/x", 404),
             ("post", "/v1/libraries", 405)]
    for method, path, status in cases:
        r = getattr(local, method)(path)
        assert r.status_code == status, (method, path, r.text)
        assert r.headers["content-type"].startswith("application/json"), (method, path)
        assert set(r.json()) == {"error", "message"}, (method, path, r.text)
    assert local.delete("/mcp").json()["error"] == "method_not_allowed"


def test_strict_json_types(local):
    for body in ({"query": "q", "top_k": True}, {"query": "q", "top_k": "3"}, {"query": "q", "top_k": 3.0},
                 {"query": "q", "allow_partial": "yes"}, {"query": "q", "allow_partial": 1},
                 {"query": "q", "libraries": [1]}, {"query": "q", "mode": 3}):
        r = local.post("/v1/search", json=body)
        assert r.status_code == 422 and r.json()["error"] == "invalid_request", body
    assert local.post("/v1/graph/facts", json={"entity": 1, "metric": "m", "period": "p"}).status_code == 422
    for top_k in (True, "3"):
        result = tool_call(local, "search", {"query": "revenue", "top_k": top_k})
        assert result["isError"], top_k
    assert not tool_call(local, "search", {"query": "revenue", "top_k": 3})["isError"]


# ------------------------------------------------------------------ scope: readiness and metrics
def _generation(c: TestClient, key: str) -> float:
    text = c.get("/metrics", headers=bearer(key)).text
    return float(next(line for line in text.splitlines() if line.startswith("ragspine_generation "))
                 .rsplit(" ", 1)[1])


def test_readyz_and_metrics_reveal_nothing_out_of_scope(keyed, keyfile, built):
    _, reports, policies = keyfile
    assert keyed.get("/readyz").json() == {"status": "ready"}  # no generation number
    before = _generation(keyed, reports)
    served = keyed.app.state.served
    wh, corpus = VersionedTables(built[0]), built[1]
    target = corpus / "acme_policies" / "pol_travel.md"
    target.write_text(target.read_text(encoding="utf-8") + "\n\nA late travel note.\n", encoding="utf-8")
    version = refresh_library(wh, corpus, "acme_policies", graph=False)
    deadline = time.monotonic() + 30
    while served.current.libraries["acme_policies"].version != version:  # the swap landed
        assert time.monotonic() < deadline, "the republished library was never served"
        time.sleep(0.02)
    assert _generation(keyed, reports) == before  # an out-of-scope republish is invisible
    assert _generation(keyed, policies) == before + 1
    assert keyed.get("/readyz").json() == {"status": "ready"}


# ------------------------------------------------------------------ invalid text and cost
def test_invalid_text_is_400_at_every_door(local):
    bad = ['{"query": "revenue \\ud800"}', '{"query": "revenue \\u0000"}',
           '{"query": "revenue", "filters": {"entity": "\\udc80"}}',
           '{"query": "revenue", "filters": {"\\ud800": "x"}}', '{"query": "revenue", "libraries": ["\\ud800"]}']
    for raw in bad:
        r = local.post("/v1/search", content=raw.encode(), headers={"content-type": "application/json"})
        assert r.status_code == 400 and r.json()["error"] == "bad_request", raw
    r = local.post("/v1/graph/facts", content=b'{"entity": "\\ud800", "metric": "m", "period": "p"}',
                   headers={"content-type": "application/json"})
    assert r.status_code == 400
    # MCP: the SDK's JSON parser refuses a lone surrogate itself (a JSON-RPC parse error, 400);
    # a NUL parses, and the tool answers the HTTP API's bad_request
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "search",
                                                                          "arguments": {"query": "revenue \ud800"}}}
    r = local.post("/mcp", headers={**MCP_HEADERS, "content-type": "application/json"}, content=json.dumps(body).encode())
    assert r.status_code == 400
    result = tool_call(local, "search", {"query": "revenue \x00"})
    assert result["isError"] and "bad_request" in result["content"][0]["text"]
    with pytest.raises(InvalidText):  # the Python API and the CLI share the engine's check
        check_query("revenue \udcff")


def test_query_tokens_and_filters_are_capped(local):
    r = local.post("/v1/search", json={"query": "revenue " * 300})
    assert r.status_code == 400 and "RAGSPINE_SERVICE_MAX_QUERY_TOKENS" in r.json()["message"]
    r = local.post("/v1/search", json={"query": "x" * 3000})  # one run of letters counts once per 4 characters
    assert r.status_code == 400 and "RAGSPINE_SERVICE_MAX_QUERY_TOKENS" in r.json()["message"]
    triples = [["entity", "ne", f"E{i}"] for i in range(33)]
    r = local.post("/v1/search", json={"query": "revenue", "filters": triples})
    assert r.status_code == 400 and "RAGSPINE_SERVICE_MAX_FILTERS" in r.json()["message"]
    r = local.post("/v1/search", json={"query": "revenue", "filters": {"entity": {"in": [f"E{i}" for i in range(300)]}}})
    assert r.status_code == 400 and "RAGSPINE_SERVICE_MAX_FILTER_VALUES" in r.json()["message"]
    result = tool_call(local, "search", {"query": "revenue " * 300})
    assert result["isError"] and "MAX_QUERY_TOKENS" in result["content"][0]["text"]
    assert local.post("/v1/search", json={"query": "why did revenue fall " * 10}).status_code == 200


# ------------------------------------------------------------------ snippet paths
def test_snippets_carry_library_relative_paths(local, built):
    r = local.post("/v1/search", json={"query": "travel policy revenue", "top_k": 10})
    assert r.status_code == 200
    paths = {s["source_locator"]["source_path"] for s in r.json()["snippets"]}
    assert paths and all(not p.startswith("/") and "demo_corpus" not in p for p in paths), paths
    assert "pol_travel.md" in paths or any(p.endswith(".md") for p in paths)
    assert str(built[1]) not in r.text
    result = tool_call(local, "search", {"query": "travel policy revenue", "top_k": 10})
    assert str(built[1]) not in json.dumps(result) and "/demo_corpus/" not in json.dumps(result)
    assert operations.library_relative("/srv/corpus/acme/sub/a.md", "acme") == "sub/a.md"
    assert operations.library_relative("/elsewhere/a.md", "acme") == "a.md"


# ------------------------------------------------------------------ the fair queue
def test_the_fair_queue_serves_keys_in_turn():
    """One slot; key A holds it and queued five more calls, then key B asks once: B is
    served next, not after A's five (the old FIFO limiter served it sixth)."""
    async def main() -> list[str]:
        queue = FairQueue(1, per_key=None)
        await queue.acquire("A")
        done: list[str] = []

        async def call(key: str) -> None:
            await queue.acquire(key)
            done.append(key)
            queue.release(key)

        async with anyio.create_task_group() as tg:
            for _ in range(5):
                tg.start_soon(call, "A")
            await anyio.wait_all_tasks_blocked()
            tg.start_soon(call, "B")
            await anyio.wait_all_tasks_blocked()
            queue.release("A")
        return done
    assert anyio.run(main)[0] == "B"


def test_a_key_at_its_cap_leaves_the_other_slots_to_other_keys():
    async def main() -> tuple[list[str], int]:
        queue = FairQueue(2, per_key=1)
        await queue.acquire("heavy")
        async with anyio.create_task_group() as tg:
            tg.start_soon(queue.acquire, "heavy")  # waits: heavy is at its cap
            await anyio.wait_all_tasks_blocked()
            await queue.acquire("light")  # the free slot is light's at once
            running = queue.running.get("heavy", 0)
            queue.release("light")
            queue.release("heavy")
        return queue.granted, running
    granted, heavy_running = anyio.run(main)
    assert granted[:2] == ["heavy", "light"] and heavy_running == 1


def test_a_timed_out_call_keeps_its_slot_until_its_thread_ends():
    release = threading.Event()

    async def main() -> tuple[int, int]:
        queue = FairQueue(1, per_key=None)
        with pytest.raises(Exception, match="RAGSPINE_SERVICE_TIMEOUT_S"):
            await run_limited(release.wait, 0.05, queue=queue, key="k")
        held = queue.busy  # the abandoned thread still runs: its slot is not handed out
        release.set()
        while queue.busy:
            await anyio.sleep(0.01)
        return held, queue.busy
    assert anyio.run(main) == (1, 0)


# ------------------------------------------------------------------ readiness with workers
def test_readiness_waits_for_every_worker(tmp_path):
    prepare(tmp_path, 2)
    served = type("S", (), {"current": object()})()
    ready = Readiness(served, tmp_path)
    assert not ready.ready()  # this worker loaded, the other not yet
    (tmp_path / f"ready-{os.getppid()}").write_text("0")  # a live process: the other worker
    assert ready.ready()
    (tmp_path / f"ready-{os.getppid()}").unlink()
    (tmp_path / "ready-999999999").write_text("0")  # a dead worker's file does not count
    assert not ready.ready()
    served.current = None
    assert not Readiness(served, None).ready()


def test_a_worker_still_loading_waits_instead_of_503(built, tmp_path, monkeypatch):
    """A request reaching a worker that is still loading (a restarted one, after the
    service said ready) waits for the load: no loading 503 (12 of 407 before)."""
    prepare(tmp_path, 1)
    monkeypatch.setenv(RUNTIME_ENV, str(tmp_path))
    app = create_app(built[0], mode="bm25", limits=NO_RATE)
    served = app.state.served
    go = threading.Event()

    def late_start(interval):
        threading.Thread(target=lambda: (go.wait(30), served.refresh()), daemon=True).start()
    monkeypatch.setattr(served, "start", late_start)
    with client(app) as c:
        assert c.get("/readyz").status_code == 503
        answer: dict = {}
        asking = threading.Thread(target=lambda: answer.setdefault("r", c.post("/v1/search", json={"query": "revenue"})))
        asking.start()
        go.set()
        asking.join(60)
        assert answer["r"].status_code == 200, answer["r"].text
        wait_ready(c.get)
        assert (tmp_path / f"ready-{os.getpid()}").exists()
    assert not (tmp_path / f"ready-{os.getpid()}").exists()  # a stopped worker takes its mark back


# ------------------------------------------------------------------ key files
def _writer(path: str, barrier, n_creates: int, revoke: str | None, out) -> None:
    from pathlib import Path as P

    from ragspine_pipeline.service import keys as keys

    slow = keys.write_entries

    def write_slowly(p, entries):  # widen the read-modify-write window: without a lock it loses
        time.sleep(0.02)
        slow(p, entries)
    keys.write_entries = write_slowly
    barrier.wait()
    made = [keys.create_key(P(path), ["lib"])[0] for _ in range(n_creates)]
    if revoke:
        keys.revoke_key(P(path), revoke)
    out.put(made)


def key_race(path, writers: int = 6, creates: int = 2) -> tuple[set[str], set[str], list[K.KeyEntry]]:
    """``writers`` processes at once, each creating keys and revoking one: (made, revoked, file)."""
    ctx = multiprocessing.get_context("fork")
    victims = [K.create_key(path, ["lib"])[0] for _ in range(writers)]
    barrier, out = ctx.Barrier(writers), ctx.Queue()
    procs = [ctx.Process(target=_writer, args=(str(path), barrier, creates, victims[i], out)) for i in range(writers)]
    for p in procs:
        p.start()
    made = {kid for _ in procs for kid in out.get(timeout=120)}
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    return made, set(victims), K.read_entries(path)


def test_concurrent_key_writes_lose_nothing(tmp_path):
    made, revoked, entries = key_race(tmp_path / "keys.json")
    by_id = {e.id: e for e in entries}
    assert made <= set(by_id), f"lost creates: {made - set(by_id)}"
    assert all(by_id[k].revoked for k in revoked), "a revoke was lost"
    assert not any(p.name.endswith(".tmp") for p in tmp_path.iterdir())


@pytest.mark.slow
def test_concurrent_key_writes_lose_nothing_in_100_trials(tmp_path):
    for trial in range(100):
        made, revoked, entries = key_race(tmp_path / f"keys{trial}.json", writers=4, creates=1)
        by_id = {e.id: e for e in entries}
        assert made <= set(by_id) and all(by_id[k].revoked for k in revoked), trial


def test_a_same_size_same_mtime_replacement_is_reloaded(tmp_path):
    path = tmp_path / "keys.json"
    _, key = K.create_key(path, ["acme_reports"])
    ring = K.KeyRing(path)
    assert ring.authenticate(key) is not None
    st = path.stat()
    text = path.read_text(encoding="utf-8")
    path.write_text(text.replace('"revoked": false', '"revoked": true '), encoding="utf-8")  # same size
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert path.stat().st_size == st.st_size and path.stat().st_mtime_ns == st.st_mtime_ns
    assert ring.authenticate(key) is None


def test_an_unreadable_key_file_rejects_every_key(tmp_path):
    path = tmp_path / "keys.json"
    _, key = K.create_key(path, ["acme_reports"])
    ring = K.KeyRing(path)
    assert ring.authenticate(key) is not None
    path.unlink()
    path.mkdir()  # a directory in its place (root ignores chmod 000)
    assert ring.authenticate(key) is None
    path.rmdir()
    os.mkfifo(path)  # a FIFO: refused at once, never waited on
    started = time.monotonic()
    assert ring.authenticate(key) is None and time.monotonic() - started < 1.0
