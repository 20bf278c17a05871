"""``RagspineClient``: a small Python client of the retrieval service's HTTP API.

Why the standard library (``urllib``) and not httpx: the client is what the three framework
adapters use over HTTP, and a caller of a remote service should not need the ``[service]``
extra (FastAPI, uvicorn, the MCP SDK) to install one. It speaks the routes of
``ragspine serve`` (``POST /v1/search``, ``GET /v1/libraries``, ``GET /v1/libraries/{id}``,
``GET /readyz``), sends ``Authorization: Bearer KEY``, and turns every ``{error, message}``
answer into a typed exception: 401 ``Unauthorized``, 403 ``Forbidden``, 413
``PayloadTooLarge``, 429 ``RateLimited``, 503 ``Unavailable`` (and 400/404/422), each
carrying the status, the service's error code and message, and, for 429/503, the
``Retry-After`` seconds the service sent.

Retries are off by default (``max_retries=0``): a 429 or 503 is raised at once with
``retry_after`` set, so the caller decides. With ``max_retries=N`` the client waits what
``Retry-After`` says (never more than ``max_retry_wait_s``; longer waits are raised, not
slept) and tries again, at most N times.
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

DEFAULT_TIMEOUT_S = 30.0
DEFAULT_MAX_RETRY_WAIT_S = 30.0


class RagspineError(Exception):
    """The service answered with an error: ``status`` (HTTP), ``error`` (its stable code),
    ``message`` (its text), ``retry_after`` (seconds, from ``Retry-After``; None if absent)."""

    status: int = 0

    def __init__(self, message: str, *, status: int | None = None, error: str = "",
                 retry_after: float | None = None) -> None:
        super().__init__(message)
        self.message = message
        if status is not None:
            self.status = status
        self.error = error
        self.retry_after = retry_after

    def __str__(self) -> str:
        return f"{self.status} {self.error or 'error'}: {self.message}"


class BadRequest(RagspineError, ValueError):
    """400/422: a query, filter or body the service cannot use (its message says why)."""

    status = 400


class Unauthorized(RagspineError):
    """401: no key, or a key the service does not know (revoked, mistyped)."""

    status = 401


class Forbidden(RagspineError):
    """403: a library outside the key's scope (the same answer whether it exists or not)."""

    status = 403


class NotFound(RagspineError, LookupError):
    """404: a library in scope with no published snapshot, or an unknown route."""

    status = 404


class PayloadTooLarge(RagspineError):
    """413: the request body is over the service's limit (RAGSPINE_SERVICE_MAX_BODY_BYTES)."""

    status = 413


class RateLimited(RagspineError):
    """429: too many requests for this key; ``retry_after`` says when to try again."""

    status = 429


class Unavailable(RagspineError):
    """503: snapshots still loading, a request past its time limit, or a shard down."""

    status = 503


class ServiceUnreachable(RagspineError, ConnectionError):
    """No HTTP answer at all (refused, DNS, timeout): ``status`` is 0."""


_BY_STATUS: dict[int, type[RagspineError]] = {400: BadRequest, 422: BadRequest, 401: Unauthorized, 403: Forbidden,
                                              404: NotFound, 413: PayloadTooLarge, 429: RateLimited,
                                              503: Unavailable}


def parse_retry_after(value: str | None, *, now: float | None = None) -> float | None:
    """``Retry-After`` as seconds: a number of seconds or an HTTP date; None when absent or
    unreadable (never negative)."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when is None:
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def error_from_response(status: int, body: bytes, headers: Mapping[str, str]) -> RagspineError:
    """The typed error of one HTTP error answer (``{error, message}``, else the raw text)."""
    error, message = "", ""
    try:
        data = json.loads(body.decode("utf-8"))
        if isinstance(data, dict):
            error, message = str(data.get("error", "")), str(data.get("message", ""))
    except (UnicodeDecodeError, json.JSONDecodeError):
        pass
    if not message:
        message = body.decode("utf-8", "replace")[:300] or f"HTTP {status}"
    retry_after = parse_retry_after(headers.get("Retry-After"))
    cls = _BY_STATUS.get(status, RagspineError)
    return cls(message, status=status, error=error, retry_after=retry_after)


@dataclass(frozen=True)
class SearchResult:
    """One ``POST /v1/search`` answer: cited snippet dicts (the same dicts the Python API
    returns), the snapshot version of each library read, the channels used and the mode."""

    snippets: list[dict[str, Any]]
    versions: dict[str, str] = field(default_factory=dict)
    channels: list[str] = field(default_factory=list)
    mode: str = ""
    partial: bool = False
    missing_shards: dict[str, str] = field(default_factory=dict)


class RagspineClient:
    """The HTTP API of one ``ragspine serve``: ``base_url`` (e.g. ``http://127.0.0.1:8080``)
    and ``api_key`` (None: no key, which a service without a key file accepts on loopback).
    The client never reads the environment: the caller passes the key it holds."""

    def __init__(self, base_url: str, api_key: str | None = None, *, timeout_s: float = DEFAULT_TIMEOUT_S,
                 max_retries: int = 0, max_retry_wait_s: float = DEFAULT_MAX_RETRY_WAIT_S,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        parts = urllib.parse.urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"base_url must be an http(s) URL such as http://127.0.0.1:8080, got {base_url!r}")
        if max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {max_retries}")
        self.base_url = base_url.rstrip("/")
        self._api_key = api_key
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.max_retry_wait_s = max_retry_wait_s
        self._sleep = sleep

    def __repr__(self) -> str:  # never the key
        return f"RagspineClient({self.base_url!r}, api_key={'***' if self._api_key else None})"

    # ------------------------------------------------------------------ transport
    def _once(self, method: str, path: str, body: Any | None) -> Any:
        data = None if body is None else json.dumps(body, ensure_ascii=False).encode("utf-8")
        req = urllib.request.Request(self.base_url + path, data=data, method=method)
        req.add_header("Accept", "application/json")
        if data is not None:
            req.add_header("Content-Type", "application/json")
        if self._api_key:
            req.add_header("Authorization", f"Bearer {self._api_key}")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as exc:
            with exc:
                raise error_from_response(exc.code, exc.read(), exc.headers) from None
        except (urllib.error.URLError, TimeoutError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise ServiceUnreachable(f"cannot reach {self.base_url}: {reason}") from None
        try:
            return json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError):
            raise RagspineError(f"{method} {path}: the answer is not JSON", status=200, error="bad_response") from None

    def request(self, method: str, path: str, body: Any | None = None) -> Any:
        """One call of the API, with the bounded retry of 429/503 (see the module docstring)."""
        attempt = 0
        while True:
            try:
                return self._once(method, path, body)
            except (RateLimited, Unavailable) as exc:
                wait = exc.retry_after if exc.retry_after is not None else 1.0
                if attempt >= self.max_retries or wait > self.max_retry_wait_s:
                    raise
                attempt += 1
                self._sleep(wait)

    # ------------------------------------------------------------------ routes
    def search(self, query: str, *, filters: Mapping[str, Any] | Sequence[Any] | None = None, top_k: int = 5,
               libraries: Sequence[str] | None = None, mode: str | None = None,
               allow_partial: bool = False) -> SearchResult:
        """``POST /v1/search``: filters in the engine's form (``{field: value | {op: operand}}``
        or ``[field, op, operand]`` triples)."""
        body: dict[str, Any] = {"query": query, "top_k": top_k}
        if filters is not None:
            body["filters"] = [list(t) for t in filters] if not isinstance(filters, Mapping) else dict(filters)
        if libraries is not None:
            body["libraries"] = list(libraries)
        if mode is not None:
            body["mode"] = mode
        if allow_partial:
            body["allow_partial"] = True
        data = self.request("POST", "/v1/search", body)
        return SearchResult(snippets=list(data.get("snippets", [])), versions=dict(data.get("versions", {})),
                            channels=list(data.get("channels", [])), mode=str(data.get("mode", "")),
                            partial=bool(data.get("partial", False)),
                            missing_shards=dict(data.get("missing_shards", {})))

    async def asearch(self, query: str, **kwargs: Any) -> SearchResult:
        """``search`` in a worker thread (the event loop is never blocked)."""
        return await asyncio.to_thread(self.search, query, **kwargs)

    def libraries(self) -> list[dict[str, Any]]:
        """``GET /v1/libraries``: the published libraries this key may read."""
        return list(self.request("GET", "/v1/libraries").get("libraries", []))

    def library(self, library: str) -> dict[str, Any]:
        """``GET /v1/libraries/{id}``: one library in the key's scope."""
        return dict(self.request("GET", "/v1/libraries/" + urllib.parse.quote(library, safe="")))

    def ready(self) -> bool:
        """``GET /readyz``: True once the service has loaded its snapshots."""
        try:
            return self.request("GET", "/readyz").get("status") == "ready"
        except Unavailable:
            return False


__all__ = ["BadRequest", "Forbidden", "NotFound", "PayloadTooLarge", "RagspineClient",
           "RagspineError", "RateLimited", "SearchResult", "ServiceUnreachable", "Unauthorized", "Unavailable",
           "error_from_response", "parse_retry_after"]
