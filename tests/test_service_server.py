"""``serve_main``: the real server on 127.0.0.1 (a subprocess, uvicorn ``--workers 2``), the
start-up refusals, and a refresh picked up by the running service within 5 s.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

pytest.importorskip("fastapi")

import httpx2  # noqa: E402
from service_fixtures import build_warehouse, free_port, refresh_library, wait_ready  # noqa: E402

from benchmarks.bench_service import stop_server  # noqa: E402
from ragspine_pipeline.service import keys as K  # noqa: E402
from ragspine_pipeline.service.main import is_loopback, serve_main  # noqa: E402
from ragspine_pipeline.warehouse.versioned import VersionedTables  # noqa: E402


def test_start_up_refusals(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("uvicorn.run", lambda *a, **k: pytest.fail("the server must not start"))
    assert serve_main(["--host", "0.0.0.0", "--warehouse", str(tmp_path)]) == 2
    assert "refusing to bind 0.0.0.0 without a key file" in capsys.readouterr().err
    assert serve_main(["--keys-file", str(tmp_path / "none.json"), "--warehouse", str(tmp_path)]) == 2
    assert "no such file" in capsys.readouterr().err
    assert serve_main(["--warehouse", str(tmp_path / "empty")]) == 2
    assert "no published retrieval snapshot" in capsys.readouterr().err
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("10.0.0.1") and not is_loopback("example.com")



def test_service_errors_have_the_cli_error_shape(tmp_path, capsys, monkeypatch):
    """serve, mcp and keys print ``ragspine: error: <command>: <option>: <what>``, one line,
    exit 2, like every other ``ragspine`` command: through the CLI and their own entry points."""
    from ragspine_pipeline import cli
    from ragspine_pipeline.errors_format import ERROR_PREFIX

    monkeypatch.setattr("uvicorn.run", lambda *a, **k: pytest.fail("the server must not start"))
    monkeypatch.delenv(K.KEYS_FILE_ENV, raising=False)
    cases = [
        (["serve", "--workers", "0"], "serve: --workers: must be at least 1"),
        (["serve", "--port", "70000"], "serve: --port: must be in 1..65535"),
        (["serve", "--port", "eighty"], "serve: argument --port: invalid int value"),
        (["serve", "--bogus"], "serve: unrecognized arguments: --bogus"),
        (["serve", "--host", "0.0.0.0", "--warehouse", str(tmp_path)], "serve: --host: refusing to bind 0.0.0.0"),
        (["serve", "--warehouse", str(tmp_path / "empty")], "serve: --warehouse: no published retrieval snapshot"),
        (["mcp", "--warehouse", str(tmp_path / "empty")], "mcp: --warehouse: no published retrieval snapshot"),
        (["mcp", "--bogus"], "mcp: unrecognized arguments: --bogus"),
        (["keys", "list"], "keys: --keys-file: required"),
        (["keys", "revoke", "nope", "--keys-file", str(tmp_path / "k.json")], "keys: revoke: no key with id"),
        (["keys", "frobnicate"], "keys: argument action: invalid choice"),
    ]
    for argv, expected in cases:
        assert cli.main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith(ERROR_PREFIX + expected), (argv, err)
        assert err.count("\n") == 1 and "usage:" not in err, (argv, err)
    assert serve_main(["--workers", "0"]) == 2  # the entry point itself, as the CLI hands it over
    assert capsys.readouterr().err.startswith("ragspine: error: serve: --workers:")

def test_loopback_without_keys_warns(tmp_path, capsys, monkeypatch):
    warehouse, _ = build_warehouse(tmp_path)
    started = {}
    monkeypatch.setattr("uvicorn.run", lambda app, **kw: started.update(kw, app=app))
    for var in ("RAGSPINE_WAREHOUSE", "RAGSPINE_SERVICE_LIBRARIES"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(os, "environ", dict(os.environ))  # serve_main exports its options for the workers
    assert serve_main(["--warehouse", str(warehouse), "--workers", "3", "--library", "acme_reports"]) == 0
    assert capsys.readouterr().err.startswith("ragspine: warning: serve: --keys-file: none given: every library "
                                              "is readable without a key")
    assert started["workers"] == 3 and started["host"] == "127.0.0.1" and started["factory"] is True
    assert started["app"] == "ragspine_pipeline.service.app:app_from_env"
    assert os.environ["RAGSPINE_SERVICE_LIBRARIES"] == "acme_reports"


def _rss_kib(pid: int) -> dict[str, int]:
    out = {}
    with open(f"/proc/{pid}/status", encoding="ascii") as fh:
        for line in fh:
            if line.startswith(("VmRSS", "RssAnon", "RssFile", "RssShmem")):
                name, value = line.split(":", 1)
                out[name] = int(value.split()[0])
    return out


def test_real_server_with_two_workers_and_a_hot_swap(tmp_path):
    warehouse, corpus = build_warehouse(tmp_path, copy_corpus=True)
    keys = tmp_path / "keys.json"
    _, key = K.create_key(keys, ["acme_reports", "acme_policies"])
    port = free_port()
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("RAGSPINE_")},
           "RAGSPINE_SERVICE_RELOAD_S": "0.5"}
    proc = subprocess.Popen(
        [sys.executable, "-c", "import sys; from ragspine_pipeline.service import serve_main; "
         "sys.exit(serve_main(sys.argv[1:]))", "--warehouse", str(warehouse), "--port", str(port),
         "--workers", "2", "--keys-file", str(keys), "--mode", "bm25", "--log-level", "warning"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    auth = {"Authorization": f"Bearer {key}"}
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                wait_ready(lambda p: httpx2.get(base + p), timeout_s=60)
                break
            except httpx2.TransportError:
                assert proc.poll() is None and time.monotonic() < deadline, "server did not start"
                time.sleep(0.2)
        streak = 0  # both workers ready: 8 answers in a row (connections are spread over them)
        while streak < 8:
            assert time.monotonic() < deadline, "a worker never became ready"
            streak = streak + 1 if httpx2.get(base + "/readyz").status_code == 200 else 0
        assert httpx2.post(base + "/v1/search", json={"query": "revenue"}).status_code == 401
        r = httpx2.post(base + "/v1/search", json={"query": "revenue 2023", "top_k": 3}, headers=auth)
        assert r.status_code == 200 and r.json()["snippets"], r.text  # a 503 says why: not ready, or past the time limit
        before = r.json()["versions"]["acme_reports"]
        for _ in range(6):  # fresh connections: the kernel spreads them over the workers
            assert httpx2.post(base + "/v1/search", json={"query": "policy"}, headers=auth).status_code == 200
        search = 'ragspine_requests_total{method="POST",route="/v1/search",status="200"}'
        for _ in range(6):  # whichever worker answers the scrape: the sum over both workers
            text = httpx2.get(base + "/metrics", headers=auth).text
            assert sum(float(x.rsplit(" ", 1)[1]) for x in text.splitlines() if x.startswith(search)) == 7.0, text
        with open(f"/proc/{proc.pid}/task/{proc.pid}/children", encoding="ascii") as fh:
            workers = [int(p) for p in fh.read().split()]
        rss = {pid: _rss_kib(pid) for pid in workers}
        print("worker RSS KiB:", rss)
        target = corpus / "acme_reports" / "ar2023_cn_revenue.md"
        target.write_text(target.read_text(encoding="utf-8") + "\n\nA late revenue note.\n", encoding="utf-8")
        published = refresh_library(VersionedTables(warehouse), corpus, "acme_reports", graph=False)
        assert published != before
        deadline = time.monotonic() + 5.0  # the bound: served within 5 s of the publish
        answers = set()
        while time.monotonic() < deadline and answers != {published}:
            got = [httpx2.post(base + "/v1/search", json={"query": "revenue", "libraries": ["acme_reports"]},
                               headers=auth).json()["versions"]["acme_reports"] for _ in range(4)]
            answers = set(got)
        assert answers == {published}, answers
    finally:
        stop_server(proc)
