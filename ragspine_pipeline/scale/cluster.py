"""The Ray cluster a distributed step runs on: the one at ``RAY_ADDRESS``, else a local one.

Why a context manager: a step that starts a cluster must also stop it, whatever happens,
or the raylet, the GCS and the workers outlive the Dagster step that needed them (and
hold their memory). A step that finds a cluster already connected in this process (a
test, a notebook, a caller running several steps on one cluster) uses it and leaves it
as it was; a step that connects to ``RAY_ADDRESS`` disconnects afterwards and never
stops the remote cluster.

The local cluster is small on purpose: no dashboard, a 256 MiB object store (batches of
texts and vectors are a few hundred KB each) and worker logs kept out of the driver's
output (the step logs its own progress through Dagster).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from .. import settings
from .config import ScaleUnavailable, ray_workers, require_ray

OBJECT_STORE_BYTES = 256 * 1024 * 1024
START_ATTEMPTS = 2  # Ray gives its raylet a fixed 30 s to register: a busy machine can miss it once


@dataclass(frozen=True)
class ClusterInfo:
    """Where a step's Ray work runs, as the step's metadata reports it."""

    address: str  # the GCS address (host:port)
    workers: int  # how many one-CPU workers the step uses
    started: bool  # this step started the cluster (and stops it on exit)
    startup_s: float  # seconds spent starting or connecting (0 for a cluster already connected)

    def metadata(self) -> dict[str, Any]:
        return {"ray_address": self.address, "ray_workers": self.workers, "ray_started_cluster": self.started,
                "ray_startup_s": round(self.startup_s, 3)}


def _gcs_address(ray: Any) -> str:
    ctx = ray.get_runtime_context()
    return str(getattr(ctx, "gcs_address", "") or "")


def _workers_on(ray: Any, workers: int | None) -> int:
    """The workers asked for (argument, else ``RAGSPINE_RAY_WORKERS``), else the cluster's CPUs."""
    asked = settings.get("RAGSPINE_RAY_WORKERS", workers)
    if asked is not None:
        return int(asked)
    return max(1, int(ray.cluster_resources().get("CPU", 1)))


@contextmanager
def ray_cluster(workers: int | None = None, *, address: str | None = None) -> Iterator[ClusterInfo]:
    """A connected Ray cluster for the body of the ``with``.

    ``address`` (else ``RAY_ADDRESS``) connects to a running cluster; without one a local
    cluster of ``workers`` CPUs (else ``RAGSPINE_RAY_WORKERS``, else the usable CPUs) is
    started and shut down on exit. A failure to start or connect is ``ScaleUnavailable``.
    """
    ray = require_ray()
    if ray.is_initialized():
        yield ClusterInfo(_gcs_address(ray), _workers_on(ray, workers), started=False, startup_s=0.0)
        return
    target = address or os.environ.get("RAY_ADDRESS") or None
    t0 = time.perf_counter()
    _connect(ray, target, workers)
    try:
        info = ClusterInfo(_gcs_address(ray), _workers_on(ray, workers) if target else ray_workers(workers),
                           started=not target, startup_s=time.perf_counter() - t0)
        yield info
    finally:
        ray.shutdown()  # stops a cluster this call started; only disconnects from RAY_ADDRESS


def _connect(ray: Any, target: str | None, workers: int | None) -> None:
    """``ray.init``: connect to ``target``, else start a local cluster (a second attempt
    after a failed start); every failure is ``ScaleUnavailable`` naming the cluster."""
    where = f"the Ray cluster at {target}" if target else "a local Ray cluster"
    attempts = 1 if target else START_ATTEMPTS
    for attempt in range(1, attempts + 1):
        try:
            if target:
                ray.init(address=target, log_to_driver=False)
            else:
                ray.init(num_cpus=ray_workers(workers), include_dashboard=False,
                         object_store_memory=OBJECT_STORE_BYTES, log_to_driver=False)
            return
        except Exception as exc:  # noqa: BLE001 - Ray raises many kinds; all mean "no cluster"
            ray.shutdown()  # whatever the failed start left running
            if attempt == attempts:
                raise ScaleUnavailable(f"could not start or reach {where} ({attempts} attempt(s)): "
                                       f"{type(exc).__name__}: {exc}") from exc
