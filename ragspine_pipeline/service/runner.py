"""Run a blocking engine call off the event loop, within the request time limit.

Retrieval is CPU-bound Python/numpy: it runs in a worker thread so one slow query does
not stall the other connections. Past ``timeout_s`` the caller gets a 503 at once; the
thread is abandoned (it cannot be killed) and finishes in the background, its result
dropped.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import anyio
import anyio.to_thread

from .errors import Unavailable

T = TypeVar("T")


async def run_limited(fn: Callable[[], T], timeout_s: float) -> T:
    try:
        with anyio.fail_after(timeout_s):
            return await anyio.to_thread.run_sync(fn, abandon_on_cancel=True)
    except TimeoutError:
        raise Unavailable(f"the request took longer than {timeout_s:g} s (RAGSPINE_SERVICE_TIMEOUT_S); "
                          "narrow it (filters, libraries, top_k) or retry") from None


__all__ = ["run_limited"]
