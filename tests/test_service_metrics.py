"""/metrics across ``--workers`` (issue 29): with ``PROMETHEUS_MULTIPROC_DIR`` set, as
``serve --workers N`` sets it, a scrape answered by any process sums every process's
requests; the per-scrape snapshot gauges stay out of the shared files (scope)."""

from __future__ import annotations

import os
import subprocess
import sys
from types import SimpleNamespace

import pytest

pytest.importorskip("prometheus_client")

from ragspine_pipeline.service.keys import Principal  # noqa: E402
from ragspine_pipeline.service.metrics import MULTIPROC_ENV  # noqa: E402

WORKER = """
import sys
from types import SimpleNamespace
from ragspine_pipeline.service.keys import Principal
from ragspine_pipeline.service.metrics import ServiceMetrics
m = ServiceMetrics()
for _ in range(int(sys.argv[1])):
    m.observe("/v1/search", "POST", 200, 0.002)
m.observe("/v1/libraries/{library}", "GET", 403, 0.001)
if sys.argv[2] == "scrape":
    lib = SimpleNamespace(version="v000007", snapshot_id="s7")
    gen = SimpleNamespace(number=3, libraries={"acme_reports": lib, "secret_lib": lib})
    sys.stdout.write(m.render(SimpleNamespace(current=gen), Principal("k1", frozenset({"acme_reports"})))[0].decode())
"""


def _worker(n: int, action: str, env: dict[str, str]) -> str:
    return subprocess.run([sys.executable, "-c", WORKER, str(n), action], env=env, capture_output=True, text=True,
                          check=True, timeout=120).stdout


def _sample(text: str, prefix: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(prefix))


def test_a_scrape_sums_every_worker_in_multiprocess_mode(tmp_path):
    base = {k: v for k, v in os.environ.items() if k != MULTIPROC_ENV}
    search = 'ragspine_requests_total{method="POST",route="/v1/search",status="200"}'
    alone = _worker(4, "scrape", base)
    assert _sample(alone, search) == 4.0  # one process: its own counters

    shared = {**base, MULTIPROC_ENV: str(tmp_path)}
    _worker(3, "quiet", shared)  # another worker, exited
    text = _worker(4, "scrape", shared)
    assert _sample(text, search) == 7.0
    assert _sample(text, 'ragspine_request_seconds_count{route="/v1/search"}') == 7.0
    assert _sample(text, 'ragspine_requests_total{method="GET",route="/v1/libraries/{library}",status="403"}') == 2.0
    # the scope: the scraping key's library only, never written to the shared files
    assert 'ragspine_snapshot_served{library="acme_reports",snapshot_id="s7",version="v000007"} 1.0' in text
    assert "secret_lib" not in text and "ragspine_generation 1.0" in text  # in-scope loads only (issue 44)
    assert not any("gauge" in p.name for p in tmp_path.iterdir())


def test_snapshot_gauges_without_a_generation():
    from ragspine_pipeline.service.metrics import ServiceMetrics

    text = ServiceMetrics().render(SimpleNamespace(current=None), Principal("k", None))[0].decode()
    assert "# TYPE ragspine_snapshot_served gauge" in text and "\nragspine_generation " not in text  # no sample before the first load
