"""Service errors: one typed exception per status, always answered as ``{error, message}``.

Why typed errors and not ``HTTPException``: the same failures reach two doors (HTTP routes
and MCP tools), and each door renders them its own way; the message is written once here.
A message never names a library outside the caller's scope and never carries a traceback:
anything unexpected becomes a 500 ``internal`` with a request id the operator can grep.
"""

from __future__ import annotations

import json
from typing import Any


class ServiceError(Exception):
    """A failure the caller may see: ``status`` (HTTP), ``error`` (a stable code), ``message``."""

    status, error = 500, "internal"

    def __init__(self, message: str, *, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.headers = dict(headers or {})

    def body(self) -> dict[str, Any]:
        return {"error": self.error, "message": self.message}

    def json_bytes(self) -> bytes:
        return json.dumps(self.body(), ensure_ascii=False).encode("utf-8")


class BadRequest(ServiceError):
    """Input that cannot be used (a filter, a query too long): the CLI's own message."""

    status, error = 400, "bad_request"


class InvalidBody(ServiceError):
    """A JSON body of the wrong shape (missing or mistyped fields)."""

    status, error = 422, "invalid_request"


class Unauthorized(ServiceError):
    status, error = 401, "unauthorized"

    def __init__(self, message: str = "a valid API key is required: send Authorization: Bearer KEY") -> None:
        super().__init__(message, headers={"WWW-Authenticate": "Bearer"})


class Forbidden(ServiceError):
    status, error = 403, "forbidden"


class NotFound(ServiceError):
    status, error = 404, "not_found"


class MethodNotAllowed(ServiceError):
    status, error = 405, "method_not_allowed"


class RequestTimeout(ServiceError):
    """The body did not arrive within ``RAGSPINE_SERVICE_BODY_TIMEOUT_S``."""

    status, error = 408, "request_timeout"


class MisdirectedRequest(ServiceError):
    """A ``Host`` header outside the allow-list (DNS rebinding)."""

    status, error = 421, "misdirected_request"


class PayloadTooLarge(ServiceError):
    status, error = 413, "payload_too_large"


class RateLimited(ServiceError):
    status, error = 429, "rate_limited"

    def __init__(self, retry_after_s: float) -> None:
        wait = max(1, int(retry_after_s + 0.999))
        super().__init__(f"too many requests for this key; retry in {wait} s", headers={"Retry-After": str(wait)})


class Unavailable(ServiceError):
    """Not ready (no snapshot loaded yet) or a request past its time limit."""

    status, error = 503, "unavailable"


def out_of_scope(library: str) -> Forbidden:
    """The one answer for a library the key may not read, whether it exists or not.

    The message repeats only what the caller sent, so an absent library and an existing
    one outside the scope give the same status and the same body (no existence oracle).
    """
    return Forbidden(f"library {library!r} is not readable with this key")


__all__ = ["BadRequest", "Forbidden", "InvalidBody", "MethodNotAllowed", "MisdirectedRequest", "NotFound",
           "PayloadTooLarge", "RateLimited", "RequestTimeout", "ServiceError", "Unauthorized", "Unavailable",
           "out_of_scope"]
