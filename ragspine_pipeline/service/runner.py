"""Run a blocking engine call off the event loop, within the request time limit.

Retrieval is CPU-bound Python/numpy: it runs in a worker thread so one slow query does
not stall the other connections. At most ``usable_cpus()`` such calls run at once
(measured: with anyio's default 40 threads, 64 concurrent clients thrashed the GIL and a
worker's throughput fell to a fraction of one client's); the others wait their turn, and
the wait counts toward the time limit. Past ``timeout_s`` the caller gets a 503 at once;
a thread already running is abandoned (it cannot be killed) and finishes in the
background, its result dropped.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import anyio
import anyio.to_thread

from ..cpus import usable_cpus
from .errors import Unavailable

T = TypeVar("T")

def new_limiter() -> anyio.CapacityLimiter:
    """One per app, made when it starts (a limiter belongs to its event loop)."""
    return anyio.CapacityLimiter(max(1, usable_cpus()))


async def run_limited(fn: Callable[[], T], timeout_s: float, limiter: anyio.CapacityLimiter | None = None) -> T:
    try:
        with anyio.fail_after(timeout_s):
            return await anyio.to_thread.run_sync(fn, abandon_on_cancel=True, limiter=limiter)
    except TimeoutError:
        raise Unavailable(f"the request took longer than {timeout_s:g} s (RAGSPINE_SERVICE_TIMEOUT_S); "
                          "narrow it (filters, libraries, top_k) or retry") from None


__all__ = ["new_limiter", "run_limited"]
