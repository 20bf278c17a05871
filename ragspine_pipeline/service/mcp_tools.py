"""The MCP face of the service: the same search and graph operations as tools.

One ``MCPServer`` (the official SDK) serves both doors: streamable HTTP at ``/mcp`` on the
FastAPI app (stateless, JSON responses: any worker or replica answers any request) and
stdio for desktop assistants (``mcp_main``). Over HTTP the caller's principal is the one
the service middleware authenticated (``scope["state"]["principal"]``); over stdio it is
the local user's (every library, or those named by ``--library``). Tool failures reach
the model as ``{error}: {message}`` text, the HTTP API's words; an unexpected exception's
text stays on the server (the SDK reports only that the tool failed).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Annotated, Any

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import Field, StrictInt, StrictStr

from . import operations
from .errors import ServiceError
from .keys import Principal
from .limits import ServiceLimits
from .runner import run_limited
from .served import ServedLibraries

INSTRUCTIONS = (
    "RAGSpine answers questions from an organisation's document libraries with cited snippets. Call "
    "list_libraries to see what you may read, then search. Every snippet carries its source (doc_id, "
    "title, source_locator with character offsets, chunk_id): cite them. For figures (revenue, margins, "
    "subsidiaries, peers) the graph tools return numbers with their citations.")

# Strict, as the HTTP bodies: ``top_k: true`` or ``"3"`` is refused, not coerced.
Query = Annotated[StrictStr, Field(description="The question, in natural language (any language the corpus uses).")]
Filters = Annotated[dict[str, Any] | list[Any] | None, Field(description=operations.FILTER_HELP)]
TopK = Annotated[StrictInt, Field(description="How many snippets to return (1 to the service's cap).", ge=1)]
Libraries = Annotated[list[StrictStr] | None, Field(
    description="Library ids to search (see list_libraries); leave out to search every library you may read.")]
Mode = Annotated[StrictStr | None, Field(
    description="Retrieval mode: leave out for the service default; bm25 is lexical only.")]
Entity = Annotated[StrictStr, Field(description="Entity id, e.g. ACME_GROUP (a company or a subsidiary).")]
Metric = Annotated[StrictStr, Field(description="Metric id, e.g. revenue, gross_margin, net_income.")]
Period = Annotated[StrictStr, Field(description="Reporting period, e.g. 2023 or 2024H1.")]

GRAPH_TOOLS = {
    "rollup": "Sum a metric over an entity's subsidiaries, with every subsidiary figure cited and the reported "
              "total checked against the sum.",
    "peers": "Compare an entity with its declared peers on one metric, ranked, each figure cited.",
    "trace": "Trace a derived metric (e.g. a margin) back to its cited inputs; flags reported values that "
             "disagree with the derivation.",
    "facts": "The reported figures of an entity for a metric and period, each with its citation.",
}


async def _no_wait(timeout_s: float) -> None:
    return None


def build_mcp(served: ServedLibraries, limits: ServiceLimits, local: Principal | None = None,
              limiter: Callable[[], Any] = lambda: None, queue: Callable[[], Any] = lambda: None,
              loaded: Callable[[float], Awaitable[None]] = _no_wait) -> MCPServer:
    """The MCP server over ``served``. ``local``: the principal of a transport without HTTP
    (stdio); over HTTP a request without an authenticated principal is refused.
    ``limiter``, ``queue``: the app's thread limiter and fair queue (runner.py), shared
    with the HTTP routes; ``loaded``: waits for a worker still loading (readiness.py)."""
    server = MCPServer("ragspine", instructions=INSTRUCTIONS, log_level="WARNING")

    def principal(ctx: Context) -> Principal:
        request = ctx.request_context.request
        if request is None:
            if local is None:
                raise ToolError("unauthorized: no principal for this transport")
            return local
        found = getattr(request, "scope", {}).get("state", {}).get("principal")
        if not isinstance(found, Principal):
            raise ToolError("unauthorized: a valid API key is required")
        return found

    async def call(fn: Callable[[], dict[str, Any]], who: Principal) -> dict[str, Any]:
        try:
            await loaded(limits.timeout_s)
            return operations.jsonable(await run_limited(fn, limits.timeout_s, limiter(), queue(), who.key_id))
        except ServiceError as exc:
            raise ToolError(f"{exc.error}: {exc.message}") from None

    async def search(query: Query, ctx: Context, filters: Filters = None, top_k: TopK = 5,
                     libraries: Libraries = None, mode: Mode = None) -> dict[str, Any]:
        who = principal(ctx)
        return await call(lambda: operations.search(served, who, query, filters=filters, top_k=top_k,
                                                    libraries=libraries, mode=mode, limits=limits), who)

    async def list_libraries(ctx: Context) -> dict[str, Any]:
        who = principal(ctx)
        return await call(lambda: operations.list_libraries(served, who), who)

    server.add_tool(search, name="search", description=(
        "Search the document libraries you may read; returns cited snippets (text, doc_id, title, "
        "source_locator, chunk_id, scores, library_id) and the snapshot version of each library read. "
        "Use filters to restrict by metadata. " + operations.FILTER_HELP))
    server.add_tool(list_libraries, name="list_libraries",
                    description="The libraries you may read: published snapshot version and open document count.")
    for kind, what in GRAPH_TOOLS.items():
        server.add_tool(_graph_tool(kind, served, principal, call), name=f"graph_{kind}", description=what)
    return server


def _graph_tool(kind: str, served: ServedLibraries, principal: Callable[[Context], Principal],
                call: Callable[..., Any]) -> Callable[..., Any]:
    async def tool(entity: Entity, metric: Metric, period: Period, ctx: Context,
                   libraries: Libraries = None) -> dict[str, Any]:
        who = principal(ctx)
        return await call(lambda: operations.graph(served, who, kind, entity=entity, metric=metric, period=period,
                                                   libraries=libraries), who)
    return tool


__all__ = ["GRAPH_TOOLS", "INSTRUCTIONS", "build_mcp"]
