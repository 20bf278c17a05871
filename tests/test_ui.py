"""The Dagster UI serves the code location: every asset key is on the page (headless Chromium),
and a re-chunk backfill launched through the UI's GraphQL API over both demo libraries
publishes the new chunking with its ``raptor_tree`` metadata visible in the UI."""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from ragspine_pipeline.paths import DEMO_ROOT

pytest.importorskip("dagster")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
ROOT = Path(__file__).resolve().parents[1]
# The library assets (what the refresh job and a re-chunk backfill run), and every asset of
# definitions.py (10): those plus the two opt-in rerank/visual ones.
LIBRARY_ASSETS = ["raw_documents", "chunks", "lexical_index", "embeddings", "raptor_tree", "relation_graph",
                  "retrieval_snapshot", "catalog"]
ASSETS = [*LIBRARY_ASSETS, "rerank_document_vectors", "page_images"]
LIBRARIES = ["acme_policies", "acme_reports"]
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--virtual-time-budget=20000", "--window-size=1400,1100"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str, timeout: float = 5.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read()


@pytest.mark.skipif(CHROMIUM is None, reason="Debian package 'chromium' not installed (.ci/run installs it)")
def test_asset_graph_in_browser(tmp_path):
    port = _free_port()
    home = tmp_path / "dagster_home"
    home.mkdir()
    env = {**os.environ, "DAGSTER_HOME": str(home), "RAGSPINE_WAREHOUSE": str(tmp_path / "wh")}
    dagster = Path(sys.executable).with_name("dagster")
    proc = subprocess.Popen([str(dagster), "dev", "-h", "127.0.0.1", "-p", str(port)], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 150
        while True:
            try:
                _get(f"{base}/server_info")
                break
            except OSError:
                if time.time() > deadline or proc.poll() is not None:
                    pytest.fail("dagster dev did not come up")
                time.sleep(1)
        req = urllib.request.Request(f"{base}/graphql", data=json.dumps({"query": "mutation { setNuxSeen }"}).encode(),
                                     headers={"Content-Type": "application/json"})
        urllib.request.urlopen(req, timeout=10).read()
        # Wait until the code location has loaded its assets.
        q = json.dumps({"query": "{ assetNodes { assetKey { path } } }"}).encode()
        while True:
            body = json.loads(urllib.request.urlopen(urllib.request.Request(
                f"{base}/graphql", data=q, headers={"Content-Type": "application/json"}), timeout=10).read())
            keys = {"/".join(n["assetKey"]["path"]) for n in (body.get("data") or {}).get("assetNodes") or []}
            if set(ASSETS) <= keys or time.time() > deadline:
                break
            time.sleep(1)
        assert set(ASSETS) <= keys
        profile = tmp_path / "chrome"
        dom = subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={profile}", "--dump-dom", f"{base}/assets"],
                             capture_output=True, text=True, timeout=120).stdout
        for key in ASSETS:
            assert key in dom, f"{key} not rendered on /assets"
        shot = tmp_path / "asset_graph.png"
        subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={profile}2", f"--screenshot={shot}",
                        f"{base}/assets"], capture_output=True, timeout=120)
        assert shot.exists() and shot.stat().st_size > 10_000
        # UPDATE_DOCS_SCREENSHOT=1 refreshes the docs figure (not a RAGSPINE_* name: conftest
        # clears those for every test, which made the old switch a no-op).
        if os.environ.get("UPDATE_DOCS_SCREENSHOT"):
            shutil.copy(shot, ROOT / "docs" / "asset_graph.png")
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


def _gql(base: str, query: str, variables: dict | None = None) -> dict:
    req = urllib.request.Request(f"{base}/graphql", data=json.dumps({"query": query, "variables": variables or {}}).encode(),
                                 headers={"Content-Type": "application/json"})
    body = json.loads(urllib.request.urlopen(req, timeout=30).read())
    assert not body.get("errors"), body["errors"]
    return body["data"]


def _wait(what: str, probe, deadline: float, proc) -> object:
    """Poll ``probe`` (a GraphQL read) until it returns something truthy: waits on the
    server's own state (run and backfill status), never on a fixed sleep."""
    while True:
        got = probe()
        if got:
            return got
        if time.time() > deadline or proc.poll() is not None:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(2)


RUNS = """{ runsOrError { ... on Runs { results { runId status tags { key value } } } } }"""
TERMINAL = {"SUCCESS", "FAILURE", "CANCELED"}


def _runs(base: str) -> list[dict]:
    return _gql(base, RUNS)["runsOrError"]["results"]


@pytest.mark.skipif(CHROMIUM is None, reason="Debian package 'chromium' not installed (.ci/run installs it)")
def test_rechunk_backfill_from_the_ui_then_raptor_tree_metadata(tmp_path):
    from ragspine_pipeline.warehouse import pipeline as P
    from ragspine_pipeline.warehouse.versioned import VersionedTables

    corpus = tmp_path / "corpus"
    for lib in LIBRARIES:
        shutil.copytree(DEMO_ROOT / lib, corpus / lib)
    port = _free_port()
    home = tmp_path / "dagster_home"
    home.mkdir()
    shutil.copy(ROOT / ".dagster_home" / "dagster.yaml", home / "dagster.yaml")  # one run per library at a time
    wh_root = tmp_path / "wh"
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAGSPINE_")}
    env.update(DAGSTER_HOME=str(home), RAGSPINE_WAREHOUSE=str(wh_root), RAGSPINE_CORPUS_ROOT=str(corpus),
               RAGSPINE_EMBEDDING_BACKEND="none")
    dagster = Path(sys.executable).with_name("dagster")
    proc = subprocess.Popen([str(dagster), "dev", "-h", "127.0.0.1", "-p", str(port)], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    deadline = time.time() + 600
    try:
        def up():
            try:
                return _get(f"{base}/server_info")
            except OSError:
                return None

        _wait("dagster dev", up, deadline, proc)
        _gql(base, "mutation { setNuxSeen }")
        repo = _wait("the code location", lambda: [
            n for n in (_gql(base, "{ repositoriesOrError { ... on RepositoryConnection { nodes { name "
                                   "location { name } } } } }")["repositoriesOrError"].get("nodes") or [])],
            deadline, proc)[0]
        sel = {"repositoryLocationName": repo["location"]["name"], "repositoryName": repo["name"]}
        # The library sensor registers both folders and builds them with the default chunker.
        def first_build_done():
            runs = _runs(base)
            done = [r for r in runs if r["status"] in TERMINAL]
            return len(runs) >= len(LIBRARIES) and len(done) == len(runs) and runs
        runs = _wait("the sensor's first builds", first_build_done, deadline, proc)
        assert all(r["status"] == "SUCCESS" for r in runs), runs
        sensor = _gql(base, """query($s: SensorSelector!) { sensorOrError(sensorSelector: $s) {
            ... on Sensor { sensorState { id } } } }""", {"s": {**sel, "sensorName": "library_sensor"}})
        _gql(base, "mutation($id: String) { stopSensor(id: $id) { __typename } }",
             {"id": sensor["sensorOrError"]["sensorState"]["id"]})
        wh = VersionedTables(wh_root)
        assert all(P.snapshot_chunker(wh, wh.latest(P.SNAPSHOT, lib)) == "paragraph:480:80" for lib in LIBRARIES)

        # The backfill: every library asset, both partitions, a new chunker and RAPTOR on.
        run_config = {"ops": {"chunks": {"config": {"chunker": "layout"}},
                              "raptor_tree": {"config": {"enabled": "on", "threshold": 0.3}}}}
        launched = _gql(base, """mutation($p: LaunchBackfillParams!) { launchPartitionBackfill(backfillParams: $p) {
            __typename ... on LaunchBackfillSuccess { backfillId } ... on PythonError { message }
            ... on InvalidSubsetError { message } ... on InvalidOutputError { stepKey } } }""",
                        {"p": {"assetSelection": [{"path": [a]} for a in LIBRARY_ASSETS], "partitionNames": LIBRARIES,
                               "runConfigData": run_config, "title": "re-chunk: layout + RAPTOR"}})
        result = launched["launchPartitionBackfill"]
        assert result["__typename"] == "LaunchBackfillSuccess", result
        backfill_id = result["backfillId"]

        def backfill_done():
            b = _gql(base, """query($id: String!) { partitionBackfillOrError(backfillId: $id) {
                ... on PartitionBackfill { status runs(limit: 50) { runId status } } } }""",
                     {"id": backfill_id})["partitionBackfillOrError"]
            finished = b["status"] not in ("REQUESTED", "CANCELING") and all(r["status"] in TERMINAL for r in b["runs"])
            return b if finished else None
        b = _wait("the backfill", backfill_done, deadline, proc)
        assert b["status"] in ("COMPLETED", "COMPLETED_SUCCESS") and b["runs"], b
        assert all(r["status"] == "SUCCESS" for r in b["runs"]), b

        # The warehouse: both libraries now publish the layout chunking, the paragraph one stays.
        for lib in LIBRARIES:
            snap = wh.latest(P.SNAPSHOT, lib)
            assert P.snapshot_chunker(wh, snap) == "layout:480:80" and snap.manifest["metadata"]["raptor_tree"]
            assert set(P.published_chunkings(wh, lib)) == {"paragraph:480:80", "layout:480:80"}

        # The raptor_tree asset's metadata, as the UI reads it.
        mats = _gql(base, """{ assetOrError(assetKey: {path: ["raptor_tree"]}) { ... on Asset {
            assetMaterializations(limit: 10) { partition metadataEntries { label
              ... on BoolMetadataEntry { boolValue } ... on IntMetadataEntry { intValue }
              ... on JsonMetadataEntry { jsonString } } } } } }""")["assetOrError"]["assetMaterializations"]
        latest = {}
        for m in mats:  # newest first
            latest.setdefault(m["partition"], {e["label"]: e for e in m["metadataEntries"]})
        assert set(latest) == set(LIBRARIES)
        for md in latest.values():
            assert md["enabled"]["boolValue"] is True
            levels = json.loads(md["nodes_per_level"]["jsonString"])
            assert levels and levels[0] == md["leaves"]["intValue"] > 0 and "cluster_sizes" in md

        # And in the browser: the asset's page lists its metadata.
        profile = tmp_path / "chrome"
        dom = subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={profile}", "--dump-dom",
                              f"{base}/assets/raptor_tree?view=events&partition=acme_reports"],
                             capture_output=True, text=True, timeout=120).stdout
        assert "raptor_tree" in dom and "nodes_per_level" in dom
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
