"""Prometheus metrics of the service: requests by route and status, latency histograms,
and the snapshot versions served (only those of libraries in the scraping key's scope).

Labels use the route *template* (``/v1/libraries/{library}``), never the raw path, so a
caller cannot grow the series without bound (nor learn through them which paths exist).
Each ``--workers`` process keeps its own registry: a scrape sees the worker that
answered, so scrape per worker or sum over them (docs/service.md).
"""

from __future__ import annotations

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

from .keys import Principal
from .served import ServedLibraries

BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class ServiceMetrics:
    def __init__(self) -> None:
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
        scoped = CollectorRegistry()
        snapshots = Gauge("ragspine_snapshot_served", "1 for each library snapshot version served now",
                          ["library", "version", "snapshot_id"], registry=scoped)
        generation = Gauge("ragspine_generation", "Number of the snapshot generation served now", registry=scoped)
        gen = served.current
        if gen is not None:
            generation.set(gen.number)
            for lib, snap in sorted(gen.libraries.items()):
                if principal.may_read(lib):
                    snapshots.labels(lib, snap.version, snap.snapshot_id).set(1)
        return generate_latest(self.registry) + generate_latest(scoped), CONTENT_TYPE_LATEST


__all__ = ["ServiceMetrics"]
