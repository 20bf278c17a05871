"""Prometheus metrics of the service: requests by route and status, latency histograms,
and the snapshot versions served (only those of libraries in the scraping key's scope).

Labels use the route *template* (``/v1/libraries/{library}``), never the raw path, so a
caller cannot grow the series without bound (nor learn through them which paths exist).
With ``--workers`` N > 1, ``serve`` points ``PROMETHEUS_MULTIPROC_DIR`` at a fresh temporary
folder before the workers start (prometheus_client's multiprocess mode: each process writes
its counters to memory-mapped files there), and a scrape, whichever worker answers it, sums
every worker's requests and latencies. The snapshot gauges are built per scrape from the
answering worker's generation, never written to those files: one key's scrape must not
reveal another scope's libraries, and after a swap every worker serves the new snapshot
within ``RAGSPINE_SERVICE_RELOAD_S``. ``ragspine_generation`` counts the snapshot loads of
the libraries *in scope* only (the process's own generation number rose with every
library's republish, so it told a key that an out-of-scope library was republished).
"""

from __future__ import annotations

import os
from collections.abc import Iterator

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector

from .keys import Principal
from .served import ServedLibraries

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"  # prometheus_client's own variable, read at its import
BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class _ScopedSnapshots:
    """A collector of the snapshot versions served now, for one principal (built per scrape,
    so nothing of it lands in the shared multiprocess files)."""

    def __init__(self, served: ServedLibraries, principal: Principal) -> None:
        self.served, self.principal = served, principal

    def collect(self) -> Iterator[Metric]:
        snapshots = GaugeMetricFamily("ragspine_snapshot_served", "1 for each library snapshot version served now",
                                      labels=["library", "version", "snapshot_id"])
        generation = GaugeMetricFamily("ragspine_generation", "Snapshot loads of the libraries in this key's "
                                       "scope (by the worker that answered this scrape); rises by one per swap")
        gen = self.served.current
        if gen is not None:
            loads = 0
            for lib, snap in sorted(gen.libraries.items()):
                if self.principal.may_read(lib):
                    snapshots.add_metric([lib, snap.version, snap.snapshot_id], 1)
                    loads += getattr(snap, "loads", 1)
            generation.add_metric([], loads)
        yield snapshots
        yield generation


class ServiceMetrics:
    def __init__(self) -> None:
        self.multiprocess_dir = os.environ.get(MULTIPROC_ENV) or None
        self.registry = CollectorRegistry()
        self.requests = Counter("ragspine_requests", "HTTP requests by route, method and status",
                                ["route", "method", "status"], registry=self.registry)
        self.latency = Histogram("ragspine_request_seconds", "Request latency by route", ["route"],
                                 buckets=BUCKETS, registry=self.registry)

    def observe(self, route: str, method: str, status: int, seconds: float) -> None:
        self.requests.labels(route, method, str(status)).inc()
        self.latency.labels(route).observe(seconds)

    def render(self, served: ServedLibraries, principal: Principal) -> tuple[bytes, str]:
        """The counters, then the snapshot versions of the libraries *this key* may read
        (a scrape must not list the names of libraries outside its scope)."""
        counters = self.registry
        if self.multiprocess_dir:  # every worker's counters, summed
            counters = CollectorRegistry()
            MultiProcessCollector(counters, path=self.multiprocess_dir)
        scoped = CollectorRegistry()
        scoped.register(_ScopedSnapshots(served, principal))
        return generate_latest(counters) + generate_latest(scoped), CONTENT_TYPE_LATEST


__all__ = ["MULTIPROC_ENV", "ServiceMetrics"]
