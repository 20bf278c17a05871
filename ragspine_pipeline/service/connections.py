"""The listener's own limits: what uvicorn is started with, and the HTTP protocol class
that adds what uvicorn lacks.

uvicorn closes an idle keep-alive connection (``timeout_keep_alive``) and, with
``limit_concurrency``, answers 503 past a connection count, but only once a request's
headers have arrived: a socket that connects and sends nothing is never timed out and
never counted against the cap. Measured before this module: 20,000 such sockets held
20,000 file descriptors, the service stopped answering and a snapshot reload failed with
``Too many open files``. ``GuardedHttpToolsProtocol`` (and its h11 twin) therefore

- closes a connection whose request headers have not arrived within
  ``RAGSPINE_SERVICE_HEADER_TIMEOUT_S`` (a new connection, or a kept-alive one that began
  a request), and
- answers a connection past ``RAGSPINE_SERVICE_MAX_CONNECTIONS`` of this worker with the
  documented JSON 503 and closes it at once, before it sends a byte, so descriptors are
  freed at the rate they are taken, and
- answers a request that is not HTTP with the documented JSON 400 (uvicorn's is plain text).

The class is named by module path, so ``--workers`` processes (spawned, the config
pickled) use it too; its two numbers are read from the settings once per process.
"""

from __future__ import annotations

import asyncio
import functools
import json
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

from .. import settings

try:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
except ImportError:  # pragma: no cover - httptools is optional in uvicorn
    HttpToolsProtocol = None  # type: ignore[assignment,misc]

_BODY = json.dumps({"error": "unavailable", "message": "too many open connections to this worker "
                    "(RAGSPINE_SERVICE_MAX_CONNECTIONS); retry shortly"}).encode()
BUSY_RESPONSE = (b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
                 b"content-length: " + str(len(_BODY)).encode() + b"\r\nretry-after: 1\r\nconnection: close\r\n\r\n"
                 + _BODY)


def bad_request_response(message: str) -> bytes:
    body = json.dumps({"error": "bad_request", "message": message}).encode()
    return (b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\ncontent-length: "
            + str(len(body)).encode() + b"\r\nconnection: close\r\n\r\n" + body)


@functools.lru_cache(maxsize=1)
def listener_limits() -> tuple[int, float]:
    """(max connections per worker, header timeout in s), read once per process."""
    return settings.get("RAGSPINE_SERVICE_MAX_CONNECTIONS"), settings.get("RAGSPINE_SERVICE_HEADER_TIMEOUT_S")


class _Guarded:
    """Mixed in before a uvicorn HTTP protocol class."""

    _header_timer: asyncio.TimerHandle | None = None
    connections: set[Any]
    cycle: Any
    loop: asyncio.AbstractEventLoop
    transport: asyncio.Transport

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)  # type: ignore[misc]
        cap, _ = listener_limits()
        if len(self.connections) > cap:
            transport.write(BUSY_RESPONSE)
            transport.close()
            return
        self._arm()

    def _arm(self) -> None:
        self._header_timer = self.loop.call_later(listener_limits()[1], self._headers_late)

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _headers_late(self) -> None:
        self._header_timer = None
        if self.cycle is None or self.cycle.response_complete:  # still waiting for a request's headers
            self.transport.close()

    def data_received(self, data: bytes) -> None:
        before = self.cycle
        super().data_received(data)  # type: ignore[misc]
        if self.cycle is not before:  # a request's headers completed
            self._disarm()
        elif self._header_timer is None and (self.cycle is None or self.cycle.response_complete):
            self._arm()  # a kept-alive connection began its next request

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)  # type: ignore[misc]

    def send_400_response(self, msg: str) -> None:
        """Not HTTP (a malformed request line, oversized headers): the documented JSON."""
        self.transport.write(bad_request_response(msg))
        self.transport.close()


class GuardedH11Protocol(_Guarded, H11Protocol):
    pass


if HttpToolsProtocol is not None:
    class GuardedHttpToolsProtocol(_Guarded, HttpToolsProtocol):
        pass

    PROTOCOL: type[asyncio.Protocol] = GuardedHttpToolsProtocol
else:  # pragma: no cover
    PROTOCOL = GuardedH11Protocol


def uvicorn_options() -> dict[str, Any]:
    """What ``serve`` passes to ``uvicorn.run`` besides the app, host, port and workers
    (a bad listener setting fails here, at start, not in every connection)."""
    listener_limits.cache_clear()
    listener_limits()
    return {"http": PROTOCOL, "timeout_keep_alive": settings.get("RAGSPINE_SERVICE_KEEPALIVE_S"),
            "timeout_worker_healthcheck": settings.get("RAGSPINE_SERVICE_WORKER_TIMEOUT_S"),
            "h11_max_incomplete_event_size": 16 * 1024, "limit_concurrency": None}


__all__ = ["BUSY_RESPONSE", "GuardedH11Protocol", "PROTOCOL", "bad_request_response", "listener_limits",
           "uvicorn_options"]
