"""The FastAPI app: HTTP routes over ``operations``, MCP at exactly ``/mcp``, metrics,
health, and offline OpenAPI docs.

``create_app`` builds everything from explicit arguments (tests, Ray Serve); ``app_from_env``
is the factory ``uvicorn --factory`` imports in each ``--workers`` process, reading the
``RAGSPINE_*`` variables ``serve_main`` set. Each worker loads the published snapshots
itself; the memory-mapped index files are shared by the page cache.

MCP is mounted as a plain ``Route("/mcp")`` around the SDK's session manager (not a
``Mount``, which answers ``/mcp`` with a redirect to ``/mcp/``), stateless with JSON
responses, behind the same middleware (keys, scopes, Host, Origin) as ``/v1/*``.

Bodies are strict JSON: ``top_k: true`` or ``"3"`` is a 422, not a coerced 1 or 3. Every
error, a 404, 405 or 421 included, is the documented ``{error, message}`` object.
``/readyz`` answers only ready or not (no generation number: it rose with every library's
republish, in scope or not).

``/openapi.json`` is a contract (schemas.py): a bearer scheme on the keyed routes, typed
request and 200 models, every error status a route answers with the ``ErrorBody`` model,
and the running service's ``top_k`` and query bounds (``_openapi``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import sys
from collections.abc import AsyncIterator, Sequence
from importlib.metadata import version
from pathlib import Path
from typing import Annotated, Any, Literal

import anyio
import anyio.to_thread
from fastapi import FastAPI, Query, Request, Security
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, Response
from fastapi.security import HTTPBearer
from fastapi_offline import FastAPIOffline
from mcp.server.streamable_http_manager import StreamableHTTPASGIApp
from mcp.server.transport_security import TransportSecuritySettings
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Route

from .. import paths, settings
from ..retrieval.limits import max_query_chars
from . import operations
from .errors import (
    InvalidBody,
    MethodNotAllowed,
    NotFound,
    RequestTimeout,
    ServiceError,
    Unavailable,
)
from .keys import LOCAL, KeyRing, Principal
from .limits import ServiceLimits, TokenBucket
from .mcp_tools import build_mcp
from .metrics import ServiceMetrics
from .middleware import BodyTimeout, BodyTooLarge, Guard, ServiceMiddleware, too_large
from .readiness import Readiness
from .runner import new_limiter, new_queue, run_limited
from .schemas import (
    ANY_ROUTE,
    KEYED,
    WITH_BODY,
    DiscoverResponse,
    GraphBody,
    GraphResponse,
    LibrariesResponse,
    LibraryInfo,
    SearchBody,
    SearchResponse,
    Status,
    error_responses,
)
from .served import ServedLibraries, ServingAssembly

log = logging.getLogger("ragspine.service")

# The key is checked by the middleware (every protected route, MCP included); this scheme
# only declares it in /openapi.json, so /docs has an Authorize button and a generated
# client sends it. auto_error=False: the middleware's 401 is the one answer.
BEARER = HTTPBearer(auto_error=False, scheme_name="bearer",
                    description="An API key (ragspine keys create): Authorization: Bearer KEY. A service started "
                                "without a key file on loopback needs none.")
KEY = [Security(BEARER)]


class JSONText(JSONResponse):
    """JSON encoded once, ``str()`` for what JSON lacks (as ``ragspine query --json`` does)."""

    def render(self, content: Any) -> bytes:
        return json.dumps(content, ensure_ascii=False, default=str, separators=(",", ":")).encode("utf-8")


def _error_response(exc: ServiceError) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)


def _validation_message(exc: RequestValidationError) -> str:
    parts = []
    for err in exc.errors()[:5]:
        where = ".".join(str(x) for x in err.get("loc", ()) if x != "body") or "body"
        parts.append(f"{where}: {err.get('msg', 'invalid')}")
    return "; ".join(parts) or "invalid request body"


def _principal(request: Request) -> Principal:
    found = request.scope.get("state", {}).get("principal")
    return found if isinstance(found, Principal) else LOCAL


def create_app(warehouse: str | Path, *, keys_file: str | Path | None = None, mode: str | None = None,
               embedding: str | None = None, libraries: Sequence[str] | None = None,
               limits: ServiceLimits | None = None, reload_s: float | None = None,
               allowed_origins: Sequence[str] = (), allowed_hosts: Sequence[str] = (),
               served: ServedLibraries | None = None) -> FastAPI:
    """The service over the published snapshots of ``warehouse``.

    ``keys_file``: API keys (None: no keys, every library readable — loopback only, which
    ``serve_main`` enforces). ``libraries``: serve only these. ``reload_s``: how often the
    published versions are re-checked (``RAGSPINE_SERVICE_RELOAD_S``). ``allowed_origins`` /
    ``allowed_hosts``: beyond loopback, the browser origins and Host headers accepted
    (DNS-rebinding protection).
    """
    limits = limits or ServiceLimits.from_settings()
    reload_s = settings.get("RAGSPINE_SERVICE_RELOAD_S") if reload_s is None else reload_s
    served = served or ServedLibraries(ServingAssembly.resolve(Path(warehouse), mode=mode, embedding=embedding),
                                       libraries)
    keyring = KeyRing(Path(keys_file)) if keys_file else None
    metrics = ServiceMetrics()
    readiness = Readiness.from_settings(served)
    # The thread limiter and the fair queue, made by the lifespan in the app's event loop.
    pool: dict[str, Any] = {}
    mcp = build_mcp(served, limits, limiter=lambda: pool.get("limiter"), queue=lambda: pool.get("queue"),
                    loaded=readiness.wait_loaded)
    mcp_http: dict[str, Any] = {}

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        # A fresh session manager per start: the SDK's can run only once. Host and Origin
        # are the middleware's (every route, one allow-list), so the SDK's own check is off.
        mcp.streamable_http_app(stateless_http=True, json_response=True, max_request_body_size=limits.max_body_bytes,
                                transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False))
        mcp_http["app"] = StreamableHTTPASGIApp(mcp.session_manager)
        pool["limiter"] = new_limiter()
        pool["queue"] = new_queue(None if keyring is None else limits.key_concurrency)
        served.start(reload_s)
        try:
            async with mcp.session_manager.run(), anyio.create_task_group() as tg:
                tg.start_soon(readiness.mark_when_loaded)
                yield
                tg.cancel_scope.cancel()
        finally:
            readiness.unmark()
            served.stop()

    app = FastAPIOffline(title="RAGSpine", version=_version(), redoc_url=None, lifespan=lifespan, redirect_slashes=False,
                         description="Cited retrieval over published document libraries, scoped by API key. "
                                     "MCP tools at /mcp. Send `Authorization: Bearer KEY` when the service "
                                     "has a key file. Every error is the JSON object `{error, message}` "
                                     "(ErrorBody), including a 404 for an unknown route and a 405 for a method "
                                     "a route does not take; a 503 may also come from the listener's "
                                     "connection cap on any route.")
    app.state.served = served
    app.state.limits = limits

    @app.exception_handler(ServiceError)
    async def _service_error(_: Request, exc: ServiceError) -> JSONResponse:
        return _error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        return _error_response(InvalidBody(_validation_message(exc)))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if isinstance(exc.__cause__, BodyTooLarge):
            return _error_response(too_large(limits.max_body_bytes))
        if isinstance(exc.__cause__, BodyTimeout):
            return _error_response(RequestTimeout(f"the request body did not arrive within {limits.body_timeout_s:g} s "
                                                  "(RAGSPINE_SERVICE_BODY_TIMEOUT_S)", headers={"Connection": "close"}))
        if exc.status_code == 404:
            return _error_response(NotFound("no such route"))
        if exc.status_code == 405:
            return _error_response(MethodNotAllowed(f"{request.method} is not allowed on this route",
                                                    headers=dict(exc.headers or {})))
        err = ServiceError(str(exc.detail))
        err.status, err.error = exc.status_code, "http_error"
        return _error_response(err)

    async def limited(fn: Any, who: Principal) -> JSONText:
        # A Response is returned as it is: FastAPI's response validation and encoding of
        # the snippet dicts cost milliseconds per request; JSONText encodes them once.
        await readiness.wait_loaded(limits.timeout_s)
        return JSONText(await run_limited(fn, limits.timeout_s, pool.get("limiter"), pool.get("queue"), who.key_id))

    @app.get("/healthz", tags=["health"], response_model=Status, responses=error_responses(*ANY_ROUTE))
    async def healthz() -> dict[str, str]:
        """The process is up."""
        return {"status": "ok"}

    @app.get("/readyz", tags=["health"], response_model=Status, responses=error_responses(*ANY_ROUTE, 503))
    async def readyz() -> dict[str, Any]:
        """Snapshots loaded and warmed (their first query paid: assembly_warm), by every worker (503 until then)."""
        # With workers, readiness reads the runtime folder: off the event loop.
        ready = await anyio.to_thread.run_sync(readiness.ready) if readiness.shared else readiness.ready()
        if not ready:
            raise Unavailable("loading published snapshots")
        return {"status": "ready"}

    @app.post("/v1/search", tags=["retrieval"], dependencies=KEY, response_model=SearchResponse,
              responses=error_responses(*ANY_ROUTE, *KEYED, *WITH_BODY, 404, 503))
    async def search(body: SearchBody, request: Request) -> Any:
        """Cited snippets, the snapshot version of each library read, and the channels used."""
        who = _principal(request)
        return await limited(lambda: operations.search(
            served, who, body.query, filters=body.filters, top_k=body.top_k, libraries=body.libraries,
            mode=body.mode, allow_partial=body.allow_partial, limits=limits), who)

    @app.get("/v1/libraries", tags=["libraries"], dependencies=KEY, response_model=LibrariesResponse,
             responses=error_responses(*ANY_ROUTE, *KEYED, 503))
    async def libraries_list(request: Request) -> Any:
        """The published libraries this key may read: version and open document count."""
        await readiness.wait_loaded(limits.timeout_s)
        return operations.list_libraries(served, _principal(request))

    @app.get("/v1/libraries/{library}", tags=["libraries"], dependencies=KEY, response_model=LibraryInfo,
             responses=error_responses(*ANY_ROUTE, *KEYED, 404, 503))
    async def library(library: str, request: Request) -> Any:
        """One library in the key's scope (403 outside it, whether it exists or not)."""
        await readiness.wait_loaded(limits.timeout_s)
        return operations.library_info(served, _principal(request), library)

    @app.get("/v1/discover", tags=["libraries"], dependencies=KEY, response_model=DiscoverResponse,
             responses=error_responses(*ANY_ROUTE, *KEYED, 404, 503))
    async def discover(request: Request, library: Annotated[list[str] | None, Query(
            description="Library ids (repeat the parameter); absent: every library the key may read.")] = None) -> Any:
        """What you may filter on and ask the graph about, from the open published documents of
        your libraries: each filterable field with its most common values, and the entities,
        metrics and periods that have cited figures."""
        who = _principal(request)
        return await limited(lambda: operations.discover(served, who, library), who)

    @app.post("/v1/graph/{kind}", tags=["graph"], dependencies=KEY, response_model=GraphResponse,
              responses=error_responses(*ANY_ROUTE, *KEYED, *WITH_BODY, 404, 503))
    async def graph(kind: Literal["rollup", "peers", "trace", "facts"], body: GraphBody,
                    request: Request) -> Any:
        """Cited graph rows: rollup, peers, trace or facts."""
        who = _principal(request)
        return await limited(lambda: operations.graph(served, who, kind, entity=body.entity, metric=body.metric,
                                                      period=body.period, libraries=body.libraries), who)

    @app.get("/metrics", tags=["health"], response_class=Response, dependencies=KEY,
             responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}},
                              "description": "Prometheus text exposition."}, **error_responses(*ANY_ROUTE, *KEYED)})
    async def metrics_route(request: Request) -> Response:
        """Prometheus text: requests by route and status, latency, snapshot versions in scope."""
        data, ctype = metrics.render(served, _principal(request))
        return Response(data, media_type=ctype)

    app.openapi = lambda: _openapi(app, limits)  # type: ignore[method-assign]

    # No DELETE: a stateless server has no session to end (405, the documented JSON).
    app.router.routes.append(Route("/mcp", endpoint=_Late(mcp_http), methods=["GET", "POST"], include_in_schema=False))
    app.add_middleware(ServiceMiddleware, guard=Guard(keyring, limits, TokenBucket(limits.rate_per_s, limits.burst),
                                                      metrics, tuple(allowed_origins), tuple(allowed_hosts)),
                       routes=lambda: app.routes)
    return app


def _openapi(app: FastAPI, limits: ServiceLimits) -> dict[str, Any]:
    """FastAPI's document with this service's own limits on the request fields (top_k's
    maximum is RAGSPINE_SERVICE_MAX_TOP_K, the query's length RAGSPINE_MAX_QUERY_CHARS),
    built once per app."""
    if app.openapi_schema is None:
        doc = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes,
                          tags=app.openapi_tags)
        for ops in doc["paths"].values():  # FastAPI's own 422 ({detail: [...]}) where no body or value can fail
            for op in ops.values():
                if "HTTPValidationError" in json.dumps(op["responses"].get("422", {})):
                    del op["responses"]["422"]
        for unused in ("HTTPValidationError", "ValidationError"):
            doc["components"]["schemas"].pop(unused, None)
        props = doc["components"]["schemas"]["SearchBody"]["properties"]
        props["top_k"].update(minimum=1, maximum=limits.max_top_k)
        props["query"].update(minLength=1, maxLength=max_query_chars())
        app.openapi_schema = doc
    return app.openapi_schema


class _Late:
    """An ASGI app (a class instance, so Starlette passes scope/receive/send through) that
    calls the MCP app the lifespan created."""

    def __init__(self, holder: dict[str, Any]) -> None:
        self.holder = holder

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await self.holder["app"](scope, receive, send)


def _version() -> str:
    try:
        return version("ragspine-pipeline")
    except Exception:
        return "0"


def app_from_env() -> FastAPI:
    """The ``uvicorn --factory`` entry of each worker: ``RAGSPINE_WAREHOUSE``,
    ``RAGSPINE_KEYS_FILE``, ``RAGSPINE_RETRIEVAL_MODE`` and the ``RAGSPINE_SERVICE_*`` limits."""
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s %(message)s")
    raw = settings.get("RAGSPINE_WAREHOUSE")
    libs = settings.get("RAGSPINE_SERVICE_LIBRARIES")
    return create_app(Path(raw) if raw else paths.default_warehouse(), keys_file=settings.get("RAGSPINE_KEYS_FILE"),
                      libraries=libs or None, allowed_origins=settings.get("RAGSPINE_SERVICE_ALLOWED_ORIGINS") or (),
                      allowed_hosts=settings.get("RAGSPINE_SERVICE_ALLOWED_HOSTS") or ())


__all__ = ["GraphBody", "SearchBody", "app_from_env", "create_app"]
