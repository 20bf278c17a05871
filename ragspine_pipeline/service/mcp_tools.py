"""The MCP face of the service: the same search and graph operations as tools.

One ``MCPServer`` (the official SDK) serves both doors: streamable HTTP at ``/mcp`` on the
FastAPI app (stateless, JSON responses: any worker or replica answers any request) and
stdio for desktop assistants (``mcp_main``). Over HTTP the caller's principal is the one
the service middleware authenticated (``scope["state"]["principal"]``); over stdio it is
the local user's (every library, or those named by ``--library``). Tool failures reach
the model as ``{error}: {message}`` text, the HTTP API's words; an unexpected exception's
text stays on the server (the SDK reports only that the tool failed).

What an agent needs to use the tools unaided: descriptions with examples from its own
libraries (``tools/list`` is answered per caller: mcp_describe.py), a ``discover`` tool
(fields and their values, entities, metrics, periods: discovery.py), results as compact
text within ``ServiceLimits.mcp_result_chars`` (mcp_format.py; ``detail`` adds scores
and lineage), and the HTTP limits in the input schemas (``top_k`` maximum, query
length). A refused key is answered by the middleware as a JSON-RPC error the SDK client
shows (middleware.py).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Annotated, Any

import anyio.to_thread
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ListToolsResult
from pydantic import Field, StrictBool, StrictInt, StrictStr

from ..retrieval.limits import max_query_chars
from . import operations
from .discovery import scope_profile
from .errors import ServiceError
from .keys import Principal
from .limits import ServiceLimits
from .mcp_describe import describe_tools
from .mcp_format import render_lines, render_search, render_shrinking
from .runner import run_limited
from .served import ServedLibraries

log = logging.getLogger("ragspine.service")

INSTRUCTIONS = (
    "RAGSpine answers questions from an organisation's document libraries with cited snippets. Call "
    "discover to see your libraries, the values you can filter on, and the entities and metrics with "
    "figures; then search. Each snippet comes with a citation line (title, doc_id, character offsets, "
    "chunk_id): cite it. For figures (totals over subsidiaries, peers, margins) the graph tools return "
    "numbers with their citations.")

# Strict, as the HTTP bodies: ``top_k: true`` or ``"3"`` is refused, not coerced.
Filters = Annotated[dict[str, Any] | list[Any] | None, Field(description=operations.FILTER_HELP)]
Libraries = Annotated[list[StrictStr] | None, Field(
    description="Library ids to read; leave out to read every library you may read.")]
Mode = Annotated[StrictStr | None, Field(
    description="Retrieval mode: leave out for the service default; bm25 is lexical only.")]
Detail = Annotated[StrictBool, Field(
    description="Add a line of scores and lineage (library snapshot, source path, document version) per snippet.")]
Entity = Annotated[StrictStr, Field(description="Entity id (a company or a subsidiary), as discover lists them.")]
Metric = Annotated[StrictStr, Field(description="Metric id, as discover lists them.")]
Period = Annotated[StrictStr, Field(description="Reporting period, as discover lists them.")]

GRAPH_TOOLS = {
    "rollup": "Sum a metric over an entity's subsidiaries, with every subsidiary figure cited and the reported "
              "total checked against the sum.",
    "peers": "Compare an entity with its declared peers on one metric, ranked, each figure cited.",
    "trace": "Trace a derived metric (e.g. a margin) back to its cited inputs; flags reported values that "
             "disagree with the derivation.",
    "facts": "The reported figures of an entity for a metric and period, each with its citation.",
}
RESULT_NOTE = ("Rows are compact JSON, one per line; a result is at most {budget} characters (the last rows "
               "are left out past it, and a line says how many).")


async def _no_wait(timeout_s: float) -> None:
    return None


class RagspineMCP(MCPServer):
    """``MCPServer`` whose ``tools/list`` is written for the caller (``describe``)."""

    def __init__(self, describe: Callable[[Any, list[Any]], list[Any]], **kwargs: Any) -> None:
        self._describe = describe
        super().__init__(**kwargs)

    async def _handle_list_tools(self, ctx: Any, params: Any) -> ListToolsResult:
        tools = await self.list_tools()
        # A library's profile is computed on its first use (every chunk read): off the event loop.
        return ListToolsResult(tools=await anyio.to_thread.run_sync(self._describe, ctx, tools))


def build_mcp(served: ServedLibraries, limits: ServiceLimits, local: Principal | None = None,
              limiter: Callable[[], Any] = lambda: None, queue: Callable[[], Any] = lambda: None,
              loaded: Callable[[float], Awaitable[None]] = _no_wait) -> MCPServer:
    """The MCP server over ``served``. ``local``: the principal of a transport without HTTP
    (stdio); over HTTP a request without an authenticated principal is refused.
    ``limiter``, ``queue``: the app's thread limiter and fair queue (runner.py), shared
    with the HTTP routes; ``loaded``: waits for a worker still loading (readiness.py)."""
    budget = limits.mcp_result_chars

    def who_of(request: Any) -> Principal | None:
        if request is None:
            return local
        found = getattr(request, "scope", {}).get("state", {}).get("principal")
        return found if isinstance(found, Principal) else None

    def describe(ctx: Any, tools: list[Any]) -> list[Any]:
        who = who_of(getattr(ctx, "request", None))
        gen = served.current
        libs = sorted(lib for lib in gen.libraries if who.may_read(lib)) if gen is not None and who else []
        if not libs:
            return describe_tools(tools, None, [], [])
        graphs = [lib for lib in libs if gen.libraries[lib].graph_version is not None]
        try:
            return describe_tools(tools, scope_profile(gen, libs), libs, graphs)
        except Exception:  # a graph that cannot be read must not take the tool list down
            log.exception("MCP tool descriptions without examples: the corpus profile failed")
            return describe_tools(tools, None, [], [])

    server = RagspineMCP(describe, name="ragspine", instructions=INSTRUCTIONS, log_level="WARNING")

    def principal(ctx: Context) -> Principal:
        request = ctx.request_context.request
        if request is None and local is None:
            raise ToolError("unauthorized: no principal for this transport")
        found = who_of(request)
        if found is None:
            raise ToolError("unauthorized: a valid API key is required")
        return found

    async def call(fn: Callable[[], dict[str, Any]], who: Principal) -> dict[str, Any]:
        try:
            await loaded(limits.timeout_s)
            return await run_limited(fn, limits.timeout_s, limiter(), queue(), who.key_id)
        except ServiceError as exc:
            raise ToolError(f"{exc.error}: {exc.message}") from None

    # The HTTP limits, in the schema an agent reads (and the SDK validates against).
    query_t = Annotated[StrictStr, Field(description="The question, in natural language (any language the corpus "
                                                     "uses).", min_length=1, max_length=max_query_chars())]
    top_k_t = Annotated[StrictInt, Field(description=f"How many snippets to return (1 to {limits.max_top_k}).",
                                         ge=1, le=limits.max_top_k)]

    async def search(query: query_t, ctx: Context, filters: Filters = None, top_k: top_k_t = 5,
                     libraries: Libraries = None, mode: Mode = None, detail: Detail = False) -> str:
        who = principal(ctx)
        out = await call(lambda: operations.search(served, who, query, filters=filters, top_k=top_k,
                                                   libraries=libraries, mode=mode, limits=limits), who)
        return render_search(out, detail=detail, budget=budget)
    # The two bounds are this service's: objects, not names the SDK could look up in the module.
    search.__annotations__.update(query=query_t, top_k=top_k_t)

    async def list_libraries(ctx: Context) -> str:
        who = principal(ctx)
        out = await call(lambda: operations.list_libraries(served, who), who)
        return render_lines(out["libraries"], f"{len(out['libraries'])} libraries", budget=budget, what="libraries")

    async def discover(ctx: Context, libraries: Libraries = None) -> str:
        who = principal(ctx)
        out = await call(lambda: operations.discover(served, who, libraries), who)
        return render_shrinking(lambda n: _smaller(out, n), (10, 5, 3, 1, 0), budget=budget)

    server.add_tool(search, name="search", structured_output=False, description=(
        "Search the document libraries you may read. The result is compact text: per snippet one citation "
        "line ([rank] title | doc_id chars start-end | chunk chunk_id) and the snippet's text; then the "
        f"snapshot version of each library read. At most {budget} characters: longer texts are cut evenly "
        "(marked …[+N chars]) and, past that, the last snippets left out. detail=true adds scores and lineage. "
        "Use filters to restrict by metadata (discover lists the values)."))
    server.add_tool(list_libraries, name="list_libraries", structured_output=False,
                    description="The libraries you may read: published snapshot version and open document count, "
                                "one compact JSON object per line.")
    server.add_tool(discover, name="discover", structured_output=False, description=(
        "What you can ask: your libraries, each filterable field with its most common values (and how many "
        "documents have each), and the entities, metrics and periods that have cited figures for the graph "
        "tools. Compact JSON; call it before filtering or using a graph tool."))
    for kind, what in GRAPH_TOOLS.items():
        server.add_tool(_graph_tool(kind, served, principal, call, budget), name=f"graph_{kind}",
                        structured_output=False, description=what + " " + RESULT_NOTE.format(budget=budget))
    return server


def _smaller(out: dict[str, Any], n: int) -> dict[str, Any]:
    """The discovery answer with at most ``n`` values per field and ``5 * n`` terms."""
    fields = {k: {**v, "top_values": v["top_values"][:n]} for k, v in out["fields"].items()}
    return {**out, "fields": fields, "entities": out["entities"][:5 * n], "metrics": out["metrics"][:5 * n],
            "periods": out["periods"][:5 * n]}


def _graph_tool(kind: str, served: ServedLibraries, principal: Callable[[Context], Principal],
                call: Callable[..., Any], budget: int) -> Callable[..., Any]:
    async def tool(entity: Entity, metric: Metric, period: Period, ctx: Context,
                   libraries: Libraries = None) -> str:
        who = principal(ctx)
        out = await call(lambda: operations.graph(served, who, kind, entity=entity, metric=metric, period=period,
                                                  libraries=libraries), who)
        footer = "versions: " + ", ".join(f"{k}={v}" for k, v in out["versions"].items()) + f" | {len(out['rows'])} rows"
        return render_lines(out["rows"], footer, budget=budget, what="rows")
    return tool


__all__ = ["GRAPH_TOOLS", "INSTRUCTIONS", "RagspineMCP", "build_mcp"]
