"""The one ASGI middleware in front of every route: request id, Host and Origin checks,
API key, rate limit, body size and read time, event-stream life, metrics, access log,
and the last-resort error answer.

Pure ASGI (not ``BaseHTTPMiddleware``) so streamed MCP responses pass through untouched.
Order matters and is the attacker's view: Host first (a DNS-rebinding page names the
attacker's host: 421 on every route, not only ``/mcp``), then Origin, then the key (401
before anything else is learnt; one ``Authorization`` header only), then the key's bucket,
then the body (its size, and its arrival within ``RAGSPINE_SERVICE_BODY_TIMEOUT_S``).
An event stream (``text/event-stream``, the MCP SDK's ``GET /mcp``) gets a heartbeat
comment every ``RAGSPINE_SERVICE_STREAM_HEARTBEAT_S`` and is ended after
``RAGSPINE_SERVICE_STREAM_MAX_S``: an idle stream otherwise holds its connection forever.
Keys are never logged; the access log line carries the key id and the request id.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.to_thread
from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .errors import (
    BadRequest,
    Forbidden,
    MisdirectedRequest,
    PayloadTooLarge,
    RateLimited,
    RequestTimeout,
    ServiceError,
    Unauthorized,
)
from .keys import LOCAL, KeyRing, Principal, bearer_key
from .limits import ServiceLimits, TokenBucket
from .metrics import ServiceMetrics

access_log = logging.getLogger("ragspine.service.access")
error_log = logging.getLogger("ragspine.service")

LOOPBACK_ORIGINS = ("http://127.0.0.1", "http://localhost", "http://[::1]")
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "[::1]")
KEYS_READ_TIMEOUT_S = 2.0  # the key file read (a thread): past it every key is refused for that request
SINGLE_HEADERS = (b"authorization", b"host")  # sent twice: which one counts is ambiguous, so 400


class BodyTooLarge(Exception):
    """Raised by the body reader past the limit; answered 413 wherever it surfaces."""


class BodyTimeout(Exception):
    """Raised by the body reader when the body is late; answered 408."""


def too_large(limit: int) -> PayloadTooLarge:
    return PayloadTooLarge(f"request body over {limit} bytes (RAGSPINE_SERVICE_MAX_BODY_BYTES)")


def protected(path: str) -> bool:
    return path.startswith("/v1/") or path in ("/mcp", "/metrics") or path.startswith("/mcp/")


def origin_allowed(origin: str, allowed: Iterable[str]) -> bool:
    """Exact match, or a ``scheme://host:*`` pattern; loopback origins on any port always pass."""
    for pattern in (*allowed, *(o + ":*" for o in LOOPBACK_ORIGINS), *LOOPBACK_ORIGINS):
        if origin == pattern or (pattern.endswith(":*") and origin.startswith(pattern[:-1])
                                 and origin[len(pattern) - 1:].isdigit()):
            return True
    return False


def host_allowed(host: str | None, allowed: Iterable[str]) -> bool:
    """Loopback names on any port, an allowed name on any port (``name``, ``name:*``), or
    an allowed ``name:port`` exactly. No Host at all is refused (HTTP/1.1 requires one)."""
    if not host:
        return False
    host = host.lower()
    name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
    if host.startswith("[") and "]:" in host:
        name = host[:host.index("]") + 1]
    port_ok = name == host or host[len(name) + 1:].isdigit()
    for pattern in (*LOOPBACK_HOSTS, *(a.lower() for a in allowed)):
        if pattern.endswith(":*"):
            pattern = pattern[:-2]
        if host == pattern or (port_ok and name == pattern):
            return True
    return False


@dataclass
class Guard:
    keyring: KeyRing | None
    limits: ServiceLimits
    bucket: TokenBucket
    metrics: ServiceMetrics
    allowed_origins: tuple[str, ...] = ()
    allowed_hosts: tuple[str, ...] = ()
    keys_timeout_s: float = KEYS_READ_TIMEOUT_S
    _key_reads: Any = field(default=None, repr=False)

    async def refresh_keys(self) -> None:
        """Re-read the key file in a thread (never on the event loop), within a timeout:
        a hung read (a slow mount) refuses keys for this request instead of stalling every
        connection. At most 4 reads at once: stuck ones do not pile up threads."""
        if self.keyring is None:
            return
        if self._key_reads is None:
            self._key_reads = anyio.CapacityLimiter(4)
        with anyio.move_on_after(self.keys_timeout_s) as waited:
            await anyio.to_thread.run_sync(self.keyring.reload, abandon_on_cancel=True, limiter=self._key_reads)
        if waited.cancelled_caught:
            self.keyring.fail_closed(f"not read within {self.keys_timeout_s:g} s")

    def principal(self, headers: dict[str, str]) -> Principal:
        if self.keyring is None:
            return LOCAL
        found = self.keyring.authenticate(bearer_key(headers.get("authorization")), reload=False)
        if found is None:
            raise Unauthorized()
        return found


# Refusals an MCP client's user must act on (a key, a scope, a wait, a header): to a
# request from an MCP client they are JSON-RPC errors (see ``mcp_client``).
MCP_READABLE = (400, 401, 403, 429)
MCP_ERROR_CODE = -32001  # JSON-RPC's server-defined range; data.error is the stable code


def mcp_client(scope: Scope, headers: dict[str, str]) -> bool:
    """A POST to ``/mcp`` that accepts an event stream: what every MCP client sends
    (streamable HTTP requires both media types in Accept)."""
    return (scope.get("path") == "/mcp" and scope.get("method") == "POST"
            and "text/event-stream" in headers.get("accept", "") and "application/json" in headers.get("accept", ""))


def mcp_error_bytes(exc: ServiceError) -> bytes:
    """``exc`` as a JSON-RPC error response (id null: the request was refused before its
    body was read). The SDK client reads a JSON-RPC error from any non-2xx JSON body and
    shows its message, where ``{error, message}`` gave only "Server returned an error
    response"; ``data`` carries the HTTP API's body."""
    return json.dumps({"jsonrpc": "2.0", "id": None,
                       "error": {"code": MCP_ERROR_CODE, "message": f"{exc.error}: {exc.message}",
                                 "data": {**exc.body(), "status": exc.status}}}, ensure_ascii=False).encode("utf-8")


async def send_error(send: Send, exc: ServiceError, request_id: str, *, mcp: bool = False) -> None:
    body = mcp_error_bytes(exc) if mcp and exc.status in MCP_READABLE else exc.json_bytes()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
               (b"x-request-id", request_id.encode())]
    headers += [(k.lower().encode(), v.encode()) for k, v in exc.headers.items()]
    await send({"type": "http.response.start", "status": exc.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _single_headers(raw: Iterable[tuple[bytes, bytes]]) -> None:
    seen: set[bytes] = set()
    for k, _ in raw:
        k = k.lower()
        if k in SINGLE_HEADERS:
            if k in seen:
                raise BadRequest(f"the {k.decode().title()} header was sent more than once")
            seen.add(k)


class ServiceMiddleware:
    def __init__(self, app: ASGIApp, guard: Guard, routes: Callable[[], list[Any]]) -> None:
        self.app = app
        self.guard = guard
        self.routes = routes

    def route_of(self, scope: Scope) -> str:
        """The route template (bounded label set), ``unmatched`` for anything else."""
        for route in self.routes():
            match, _ = route.matches(scope)
            if match == Match.FULL:
                return getattr(route, "path", "unmatched")
        return "unmatched"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        request_id = uuid.uuid4().hex[:16]
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        path = scope.get("path", "")
        route = self.route_of(scope)
        state = {"status": 500, "started": False, "key_id": "-"}

        async def send_wrapped(message: Message) -> None:
            if message["type"] == "http.response.start":
                state["status"] = message["status"]
                state["started"] = True
                message = {**message, "headers": [*message.get("headers", []), (b"x-request-id", request_id.encode())]}
            await send(message)

        try:
            _single_headers(scope.get("headers", []))
            if not host_allowed(headers.get("host"), self.guard.allowed_hosts):
                raise MisdirectedRequest("this Host may not call the service (RAGSPINE_SERVICE_ALLOWED_HOSTS)")
            origin = headers.get("origin")
            if origin and not origin_allowed(origin, self.guard.allowed_origins):
                raise Forbidden("this Origin may not call the service (RAGSPINE_SERVICE_ALLOWED_ORIGINS)")
            if protected(path):
                await self.guard.refresh_keys()
                who = self.guard.principal(headers)
                state["key_id"] = who.key_id
                # Keys are rate limited; the loopback user without a key file is not (its own machine).
                wait = self.guard.bucket.take(who.key_id) if self.guard.keyring is not None else 0.0
                if wait > 0:
                    raise RateLimited(wait)
                scope.setdefault("state", {})["principal"] = who
            scope.setdefault("state", {})["request_id"] = request_id
            size = headers.get("content-length")
            limits = self.guard.limits
            if size is not None and size.isdigit() and int(size) > limits.max_body_bytes:
                raise too_large(limits.max_body_bytes)
            body = _limited(receive, limits.max_body_bytes, time.monotonic() + limits.body_timeout_s)
            if "text/event-stream" in headers.get("accept", ""):
                await _streamed(self.app, scope, body, send_wrapped, limits)
            else:
                await self.app(scope, body, send_wrapped)
        except ServiceError as exc:
            state["status"] = exc.status
            if not state["started"]:
                await send_error(send, exc, request_id, mcp=mcp_client(scope, headers))
        except BodyTooLarge:
            state["status"] = 413
            if not state["started"]:
                await send_error(send, too_large(self.guard.limits.max_body_bytes), request_id)
        except BodyTimeout:
            state["status"] = 408
            if not state["started"]:
                await send_error(send, RequestTimeout(
                    f"the request body did not arrive within {self.guard.limits.body_timeout_s:g} s "
                    "(RAGSPINE_SERVICE_BODY_TIMEOUT_S)", headers={"Connection": "close"}), request_id)
        except Exception:
            error_log.exception("request %s failed", request_id)
            state["status"] = 500
            if not state["started"]:
                await send_error(send, ServiceError(f"internal error (request id {request_id})"), request_id)
        finally:
            elapsed = time.perf_counter() - started
            self.guard.metrics.observe(route, scope.get("method", ""), int(state["status"]), elapsed)
            access_log.info("%s %s %s %d %.1fms key=%s", request_id, scope.get("method", ""), route,
                            state["status"], elapsed * 1000, state["key_id"])


async def _streamed(app: ASGIApp, scope: Scope, receive: Receive, send: Send, limits: ServiceLimits) -> None:
    """``app`` answering a request that accepts an event stream. If it opens one (the MCP
    SDK's ``GET /mcp``), a heartbeat comment goes out every ``stream_heartbeat_s`` and the
    stream is ended after ``stream_max_s`` (the app is cancelled, the body closed)."""
    lock = anyio.Lock()
    stream = {"open": False, "ended": False}
    failed: Exception | None = None

    async def heartbeat() -> None:
        while True:
            await anyio.sleep(limits.stream_heartbeat_s)
            async with lock:
                if stream["ended"]:
                    return
                await send({"type": "http.response.body", "body": b": heartbeat\n\n", "more_body": True})

    async with anyio.create_task_group() as tg:
        life = anyio.CancelScope()

        async def sending(message: Message) -> None:
            async with lock:
                if message["type"] == "http.response.start":
                    ctype = dict(message.get("headers", [])).get(b"content-type", b"")
                    if ctype.startswith(b"text/event-stream"):
                        stream["open"] = True
                        life.deadline = anyio.current_time() + limits.stream_max_s
                        tg.start_soon(heartbeat)
                elif message["type"] == "http.response.body" and not message.get("more_body", False):
                    stream["ended"] = True
                await send(message)

        try:
            with life:
                await app(scope, receive, sending)
        except Exception as exc:  # raised as itself below, not wrapped in the task group's ExceptionGroup
            failed = exc
        finally:
            tg.cancel_scope.cancel()
    if failed is not None:
        raise failed
    if stream["open"] and not stream["ended"]:  # ended by its life: close the body
        stream["ended"] = True
        await send({"type": "http.response.body", "body": b"", "more_body": False})


def _limited(receive: Receive, limit: int, deadline: float) -> Receive:
    """``receive`` that fails once the body passes ``limit`` (a chunked upload has no
    length), or when the body is not complete by ``deadline`` (``time.monotonic``); once
    the body is complete, later calls (waiting for a disconnect) wait as long as needed."""
    seen = 0
    complete = False

    async def wrapped() -> Message:
        nonlocal seen, complete
        if complete:
            return await receive()
        with anyio.move_on_after(max(0.0, deadline - time.monotonic())) as waited:
            message = await receive()
        if waited.cancelled_caught:
            raise BodyTimeout()
        if message["type"] == "http.request":
            seen += len(message.get("body", b""))
            if seen > limit:
                raise BodyTooLarge()
            complete = not message.get("more_body", False)
        else:
            complete = True
        return message
    return wrapped


__all__ = ["MCP_READABLE", "BodyTimeout", "BodyTooLarge", "Guard", "ServiceMiddleware", "host_allowed", "mcp_client",
           "mcp_error_bytes", "origin_allowed", "protected", "too_large"]
