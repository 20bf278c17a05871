"""Request limits of the service: body size and read time, top_k cap, query and filter
cost, event-stream life, time per request, per-key engine concurrency, and a per-key token
bucket.

The bucket lives in the worker process. With ``--workers N`` each worker keeps its own
buckets and the kernel spreads connections over the workers, so one key gets at most
N × the rate (and N × the burst) across the service; set the rate per worker with that in
mind (docs/service.md). A shared store (Redis) would make it exact; this service keeps no
state outside the warehouse on purpose.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from .. import settings


@dataclass(frozen=True)
class ServiceLimits:
    max_body_bytes: int = 65536
    max_top_k: int = 100
    timeout_s: float = 30.0
    rate_per_s: float = 20.0  # tokens per second per key; 0 turns the limit off
    burst: int = 40
    body_timeout_s: float = 10.0  # headers arrived: the body within this (408)
    stream_max_s: float = 300.0  # an event stream (GET /mcp) is ended past this
    stream_heartbeat_s: float = 15.0  # a comment line this often on an open event stream
    max_query_tokens: int = 256  # words (a CJK character is one): bounds the embedded text
    max_filters: int = 32  # filter conditions per request
    max_filter_values: int = 256  # operand values over all conditions (in/nin/between items)
    key_concurrency: int = 0  # engine calls per key at once; 0: half the engine threads, at least 1
    mcp_result_chars: int = 8000  # characters of one MCP tool result (mcp_format.py): ~2,000 tokens

    @classmethod
    def from_settings(cls) -> ServiceLimits:
        """The ``RAGSPINE_SERVICE_*`` variables (read when the app is built, never at import)."""
        return cls(max_body_bytes=settings.get("RAGSPINE_SERVICE_MAX_BODY_BYTES"),
                   max_top_k=settings.get("RAGSPINE_SERVICE_MAX_TOP_K"),
                   timeout_s=settings.get("RAGSPINE_SERVICE_TIMEOUT_S"),
                   rate_per_s=settings.get("RAGSPINE_SERVICE_RATE"),
                   burst=settings.get("RAGSPINE_SERVICE_BURST"),
                   body_timeout_s=settings.get("RAGSPINE_SERVICE_BODY_TIMEOUT_S"),
                   stream_max_s=settings.get("RAGSPINE_SERVICE_STREAM_MAX_S"),
                   stream_heartbeat_s=settings.get("RAGSPINE_SERVICE_STREAM_HEARTBEAT_S"),
                   max_query_tokens=settings.get("RAGSPINE_SERVICE_MAX_QUERY_TOKENS"),
                   max_filters=settings.get("RAGSPINE_SERVICE_MAX_FILTERS"),
                   max_filter_values=settings.get("RAGSPINE_SERVICE_MAX_FILTER_VALUES"),
                   key_concurrency=settings.get("RAGSPINE_SERVICE_KEY_CONCURRENCY"))


class TokenBucket:
    """Buckets by key id: ``take(key)`` -> 0 when allowed, else seconds until a token.

    ``clock`` is injectable so tests step time instead of sleeping.
    """

    def __init__(self, rate_per_s: float, burst: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate = float(rate_per_s)
        self.burst = max(1, int(burst))
        self.clock = clock
        self._lock = threading.Lock()
        self._state: dict[str, tuple[float, float]] = {}  # key -> (tokens, at)

    def take(self, key: str) -> float:
        if self.rate <= 0:
            return 0.0
        with self._lock:
            now = self.clock()
            tokens, at = self._state.get(key, (float(self.burst), now))
            tokens = min(float(self.burst), tokens + (now - at) * self.rate)
            if tokens >= 1.0:
                self._state[key] = (tokens - 1.0, now)
                return 0.0
            self._state[key] = (tokens, now)
            return (1.0 - tokens) / self.rate


__all__ = ["ServiceLimits", "TokenBucket"]
