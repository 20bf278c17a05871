"""The one ASGI middleware in front of every route: request id, Origin check, API key,
rate limit, body size, metrics, access log, and the last-resort error answer.

Pure ASGI (not ``BaseHTTPMiddleware``) so streamed MCP responses pass through untouched.
Order matters and is the attacker's view: Origin first (a DNS-rebinding page gets nothing),
then the key (401 before anything else is learnt), then the key's bucket, then the body.
Keys are never logged; the access log line carries the key id and the request id.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .errors import Forbidden, PayloadTooLarge, RateLimited, ServiceError, Unauthorized
from .keys import LOCAL, KeyRing, Principal, bearer_key
from .limits import ServiceLimits, TokenBucket
from .metrics import ServiceMetrics

access_log = logging.getLogger("ragspine.service.access")
error_log = logging.getLogger("ragspine.service")

LOOPBACK_ORIGINS = ("http://127.0.0.1", "http://localhost", "http://[::1]")


class BodyTooLarge(Exception):
    """Raised by the body reader past the limit; answered 413 wherever it surfaces."""


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


@dataclass
class Guard:
    keyring: KeyRing | None
    limits: ServiceLimits
    bucket: TokenBucket
    metrics: ServiceMetrics
    allowed_origins: tuple[str, ...] = ()

    def principal(self, headers: dict[str, str]) -> Principal:
        if self.keyring is None:
            return LOCAL
        found = self.keyring.authenticate(bearer_key(headers.get("authorization")))
        if found is None:
            raise Unauthorized()
        return found


async def send_error(send: Send, exc: ServiceError, request_id: str) -> None:
    body = exc.json_bytes()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
               (b"x-request-id", request_id.encode())]
    headers += [(k.lower().encode(), v.encode()) for k, v in exc.headers.items()]
    await send({"type": "http.response.start", "status": exc.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


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
            origin = headers.get("origin")
            if origin and not origin_allowed(origin, self.guard.allowed_origins):
                raise Forbidden("this Origin may not call the service (RAGSPINE_SERVICE_ALLOWED_ORIGINS)")
            if protected(path):
                who = self.guard.principal(headers)
                state["key_id"] = who.key_id
                # Keys are rate limited; the loopback user without a key file is not (its own machine).
                wait = self.guard.bucket.take(who.key_id) if self.guard.keyring is not None else 0.0
                if wait > 0:
                    raise RateLimited(wait)
                scope.setdefault("state", {})["principal"] = who
            scope.setdefault("state", {})["request_id"] = request_id
            size = headers.get("content-length")
            limit = self.guard.limits.max_body_bytes
            if size is not None and size.isdigit() and int(size) > limit:
                raise too_large(limit)
            await self.app(scope, _limited(receive, limit), send_wrapped)
        except ServiceError as exc:
            state["status"] = exc.status
            if not state["started"]:
                await send_error(send, exc, request_id)
        except BodyTooLarge:
            state["status"] = 413
            if not state["started"]:
                await send_error(send, too_large(self.guard.limits.max_body_bytes), request_id)
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


def _limited(receive: Receive, limit: int) -> Receive:
    """``receive`` that fails once the body passes ``limit`` (a chunked upload has no length)."""
    seen = 0

    async def wrapped() -> Message:
        nonlocal seen
        message = await receive()
        if message["type"] == "http.request":
            seen += len(message.get("body", b""))
            if seen > limit:
                raise BodyTooLarge()
        return message
    return wrapped


__all__ = ["BodyTooLarge", "Guard", "ServiceMiddleware", "origin_allowed", "protected", "too_large"]
