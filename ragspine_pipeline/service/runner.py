"""Run a blocking engine call off the event loop, within the request time limit, with the
engine threads shared fairly between API keys.

Retrieval is CPU-bound Python/numpy: it runs in a worker thread so one slow query does
not stall the other connections. At most ``usable_cpus()`` such calls run at once
(measured: with anyio's default 40 threads, 64 concurrent clients thrashed the GIL and a
worker's throughput fell to a fraction of one client's); the others wait their turn, and
the wait counts toward the time limit. Past ``timeout_s`` the caller gets a 503 at once;
a thread already running is abandoned (it cannot be killed) and finishes in the
background, its result dropped, but it keeps its engine slot until it does finish: a
timed-out heavy query is still burning a CPU, and handing its slot out would let one key
run unboundedly many of them.

``FairQueue`` is the turn order: each key runs at most ``per_key`` calls at once and,
when a slot frees, it goes to the waiting key with the fewest calls running, then the one
served least recently, so a key that queued a hundred heavy queries delays another key's
query by at most the calls already running (measured before it: three clients of one key, far under the rate limit, pushed
another key's p50 from 153 ms to 19.6 s). Without a key file (the loopback user) there is
one principal and no per-key cap.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import deque
from collections.abc import Callable
from typing import TypeVar

import anyio
import anyio.to_thread

from ..cpus import usable_cpus
from .errors import Unavailable

T = TypeVar("T")


def engine_slots() -> int:
    return max(1, usable_cpus())


def new_limiter() -> anyio.CapacityLimiter:
    """One per app, made when it starts (a limiter belongs to its event loop). It bounds
    the threads; ``FairQueue`` bounds the engine calls (abandoned ones included)."""
    return anyio.CapacityLimiter(2 * engine_slots())


class FairQueue:
    """Engine slots handed to keys in turn (one event loop; not thread-safe by design:
    ``release`` from a thread goes through ``loop.call_soon_threadsafe``)."""

    def __init__(self, slots: int, per_key: int | None) -> None:
        self.slots = max(1, slots)
        self.per_key = per_key
        self.busy = 0
        self.running: dict[str, int] = {}
        self.waiting: dict[str, deque[anyio.Event]] = {}
        self.granted: list[str] = []  # the order slots were handed out (tests read it; bounded)
        self._last: dict[str, int] = {}  # key -> number of its latest grant
        self._grants = 0

    def _may_run(self, key: str) -> bool:
        return self.per_key is None or self.running.get(key, 0) < self.per_key

    def _dispatch(self) -> None:
        while self.busy < self.slots:
            eligible = [k for k in self.waiting if self._may_run(k)]
            if not eligible:
                return
            key = min(eligible, key=lambda k: (self.running.get(k, 0), self._last.get(k, -1)))
            queue = self.waiting[key]
            event = queue.popleft()
            if not queue:
                del self.waiting[key]
            self.busy += 1
            self.running[key] = self.running.get(key, 0) + 1
            self._grants += 1
            self._last[key] = self._grants
            if len(self.granted) < 1000:
                self.granted.append(key)
            event.set()

    async def acquire(self, key: str) -> None:
        event = anyio.Event()
        self.waiting.setdefault(key, deque()).append(event)
        self._dispatch()
        if event.is_set():
            return
        try:
            await event.wait()
        except BaseException:  # cancelled (the time limit): leave the queue, or give back a grant
            queue = self.waiting.get(key)
            if queue is not None and event in queue:
                queue.remove(event)
                if not queue:
                    del self.waiting[key]
            elif event.is_set():
                self.release(key)
            raise

    def release(self, key: str) -> None:
        self.busy -= 1
        left = self.running.get(key, 1) - 1
        if left:
            self.running[key] = left
        else:
            self.running.pop(key, None)
        self._dispatch()


def new_queue(per_key: int | None) -> FairQueue:
    """The app's queue: ``per_key`` None (no key file) or 0 (half the slots, at least 1)."""
    slots = engine_slots()
    return FairQueue(slots, None if per_key is None else (per_key or max(1, slots // 2)))


async def _held(fn: Callable[[], T], limiter: anyio.CapacityLimiter | None, queue: FairQueue, key: str) -> T:
    """``fn`` in a thread holding one of ``queue``'s slots until it returns, even when its
    caller stops waiting; a call cancelled before its thread started gives the slot back."""
    loop = asyncio.get_running_loop()
    lock = threading.Lock()
    state = ["pending"]

    def release() -> None:
        with contextlib.suppress(RuntimeError):  # the loop closed (shutdown): nothing left to free
            loop.call_soon_threadsafe(queue.release, key)

    def held() -> T:
        with lock:
            if state[0] != "pending":
                raise RuntimeError("dropped before it started")
            state[0] = "running"
        try:
            return fn()
        finally:
            release()
    try:
        return await anyio.to_thread.run_sync(held, abandon_on_cancel=True, limiter=limiter)
    except BaseException:
        with lock:
            never_ran = state[0] == "pending"
            state[0] = "dropped"
        if never_ran:
            queue.release(key)
        raise


async def run_limited(fn: Callable[[], T], timeout_s: float, limiter: anyio.CapacityLimiter | None = None,
                      queue: FairQueue | None = None, key: str = "local") -> T:
    try:
        with anyio.fail_after(timeout_s):
            if queue is None:
                return await anyio.to_thread.run_sync(fn, abandon_on_cancel=True, limiter=limiter)
            await queue.acquire(key)
            return await _held(fn, limiter, queue, key)
    except TimeoutError:
        raise Unavailable(f"the request took longer than {timeout_s:g} s (RAGSPINE_SERVICE_TIMEOUT_S); "
                          "narrow it (filters, libraries, top_k) or retry") from None


__all__ = ["FairQueue", "engine_slots", "new_limiter", "new_queue", "run_limited"]
