"""The Dagster UI serves the code location: every asset key is on the page (headless Chromium)."""

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

pytest.importorskip("dagster")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
ROOT = Path(__file__).resolve().parents[1]
ASSETS = ["raw_documents", "chunks", "lexical_index", "embeddings", "retrieval_snapshot", "catalog"]
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--virtual-time-budget=20000", "--window-size=1400,900"]


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
        if os.environ.get("RAGSPINE_UPDATE_SCREENSHOT"):
            shutil.copy(shot, ROOT / "docs" / "asset_graph.png")
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
