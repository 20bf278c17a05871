"""The service's operations, shared by the HTTP routes and the MCP tools.

Each takes the caller's ``Principal`` and plain values, answers with plain JSON-ready
dicts, and fails with a ``ServiceError`` (errors.py). Scope comes first, before anything
touches the warehouse: a library outside the key's scope is refused with the same answer
whether it exists or not; only a library in scope can be "not found".

Filters use the ``--where`` language (filter_input): an object ``{field: value | {op:
operand}}`` or a list of ``[field, op, operand]`` triples; the messages are the CLI's.
What a request may cost (query tokens, filter size, valid text) is checked first
(costs.py). A snippet's ``source_locator.source_path`` leaves the service relative to
its library's folder: the server's absolute paths are not the caller's business.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import PurePath
from typing import Any

from ..filter_input import (
    FilterValueError,
    as_triples,
    check_filter_values,
    conflicting,
    hybrid_retrievers,
)
from ..graph.channel import query_rows
from ..graph.dimensions import DimensionsError
from ..graph.queries import GraphQueryError
from ..graph.store import GraphStoreError
from ..modes import RetrievalModeError
from ..retrieval.filters import FilterError
from ..retrieval.limits import InvalidText, QueryTooLong, check_query
from .costs import check_filter_cost, check_filter_size, check_query_tokens, check_texts
from .discovery import describe
from .errors import BadRequest, NotFound, Unavailable, out_of_scope
from .keys import Principal
from .limits import ServiceLimits
from .served import Generation, ServedLibraries, mode_key
from .sharded import request_scope, unavailable_errors

GRAPH_KINDS = ("rollup", "peers", "trace", "facts")

FILTER_HELP = (
    "Metadata filters, all of which must hold (AND), in the same language as the CLI's --where: an object "
    "{field: value} (equality) or {field: {op: operand}}, or a list of [field, op, operand] triples. "
    "Fields: entity, period (text, compared as text), topic, geography, language, doc_id, title, valid_as_of, "
    "chunker, parent_id, chunk_id, version (a whole number); GET /v1/discover (the MCP discover tool) lists "
    "each field's values in your libraries. Operators: eq, ne, gt, gte, lt, lte, in, nin, between ([lo, hi]). "
    "A value no served document has is an error that lists the values there are; a valid filter that leaves "
    "nothing is retried without filters.")


def generation(served: ServedLibraries) -> Generation:
    gen = served.current
    if gen is None:
        raise Unavailable("the service is still loading its snapshots; retry shortly (GET /readyz says when)")
    return gen


def readable(gen: Generation, principal: Principal, wanted: Sequence[str] | None) -> list[str]:
    """The libraries a request reads: ``wanted`` (each in scope, then published), else every
    published library in scope."""
    if wanted is not None:
        if isinstance(wanted, str) or not all(isinstance(x, str) for x in wanted):
            raise BadRequest("libraries must be a list of library ids")
        for lib in wanted:
            if not principal.may_read(lib):
                raise out_of_scope(lib)
        for lib in wanted:
            if lib not in gen.libraries:
                raise NotFound(f"library {lib!r} has no published snapshot")
        if not wanted:
            raise BadRequest("libraries is empty; leave it out to read every library the key may read")
        return sorted(set(wanted))
    libs = sorted(lib for lib in gen.libraries if principal.may_read(lib))
    if not libs:
        raise NotFound("no published library is readable with this key")
    return libs


def _triples(filters: Any, limits: ServiceLimits) -> list[tuple[str, str, Any]]:
    if filters is None:
        return []
    check_texts(filters, "filters")
    if isinstance(filters, str):  # the --where text itself
        try:
            filters = json.loads(filters)
        except json.JSONDecodeError as exc:
            raise BadRequest(f"filters: not valid JSON ({exc.msg} at char {exc.pos}); "
                             "e.g. '{\"field\": \"value\"}'") from None
    if not isinstance(filters, (dict, list)):
        raise BadRequest("filters: expected a JSON object {field: value | {op: operand}} or a list of "
                         f"[field, op, operand] triples, got {json.dumps(filters)[:200]}")
    check_filter_size(filters, limits.max_filters)
    try:
        triples = as_triples(filters)
    except FilterError as exc:
        raise BadRequest(f"filters: {exc}") from None
    check_filter_cost(triples, limits.max_filters, limits.max_filter_values)
    clash = conflicting(triples)
    if clash:
        raise BadRequest(f"filters: {clash}")
    return triples


def library_relative(source_path: Any, library: str) -> Any:
    """``source_path`` after its last folder named ``library`` (the library's own layout,
    e.g. ``sub/report.md``); the file name alone when no such folder is in the path."""
    if not isinstance(source_path, str) or not source_path:
        return source_path
    parts = PurePath(source_path).parts
    folders = [i for i, part in enumerate(parts[:-1]) if part == library]
    return "/".join(parts[folders[-1] + 1:]) if folders else parts[-1]


def relative_paths(snippets: Sequence[Any]) -> list[Any]:
    """The snippets with each ``source_locator.source_path`` relative to its library (new
    dicts: the engine's cached ones are not touched)."""
    out = []
    for s in snippets:
        loc = s.get("source_locator") if isinstance(s, dict) else None
        if isinstance(loc, dict) and "source_path" in loc:
            lib = str(s.get("library_id") or str(s.get("doc_id", "")).split("/", 1)[0])
            s = {**s, "source_locator": {**loc, "source_path": library_relative(loc["source_path"], lib)}}
        out.append(s)
    return out


def jsonable(value: Any) -> Any:
    """Snippet dicts as JSON values (what ``ragspine query --json`` prints: str() for the
    rest). The HTTP routes skip it and encode once with the same rule (app.JSONText)."""
    return json.loads(json.dumps(value, ensure_ascii=False, default=str))


def search(served: ServedLibraries, principal: Principal, query: Any, *, filters: Any = None, top_k: int = 5,
           libraries: Sequence[str] | None = None, mode: str | None = None, allow_partial: bool = False,
           max_top_k: int | None = None, limits: ServiceLimits | None = None) -> dict[str, Any]:
    """Cited snippets of ``query`` over the libraries the caller may read, with the snapshot
    version of each library read. A sharded library (``serve --ray``) whose shard fails
    or misses its deadline is a 503 naming the shards, or, with ``allow_partial``, an
    answer from the shards that did answer, marked ``"partial": true`` with
    ``missing_shards`` (a single-process index is never partial). ``limits``: the caps
    on top_k, query tokens and filters (default: ``ServiceLimits()``)."""
    limits = limits or ServiceLimits()
    max_top_k = limits.max_top_k if max_top_k is None else max_top_k
    try:
        query = check_query(query)
    except (TypeError, QueryTooLong, InvalidText) as exc:
        raise BadRequest(f"query: {exc}") from None
    if not query.strip():
        raise BadRequest("query: empty query")
    check_query_tokens(query, limits.max_query_tokens)
    if isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= max_top_k:
        raise BadRequest(f"top_k: must be a whole number from 1 to {max_top_k}, got {top_k!r}")
    if not isinstance(allow_partial, bool):
        raise BadRequest(f"allow_partial: must be true or false, got {allow_partial!r}")
    check_texts([libraries, mode], "libraries/mode")
    triples = _triples(filters, limits)
    gen = generation(served)
    libs = readable(gen, principal, libraries)
    try:
        key = mode_key(mode) if mode else gen.assembly.modes[0]
    except RetrievalModeError as exc:
        raise BadRequest(f"mode: {exc}") from None
    if key not in gen.assembly.modes:
        raise BadRequest(f"mode: this service serves {', '.join(gen.assembly.modes)} (start it with --mode {key} "
                         "to serve that mode)")
    retriever = gen.retriever(libs, key)
    for t in triples:
        try:
            check_filter_values(retriever, [t])
        except FilterValueError as exc:
            raise BadRequest(f"filters: {exc}") from None
    try:
        with request_scope(allow_partial) as shards:  # sharded.py: whole without a sharded backend
            snippets = retriever.retrieve(query, filters=triples or None, top_k=top_k)
    except (FilterError, QueryTooLong, InvalidText) as exc:
        raise BadRequest(str(exc)) from None
    except unavailable_errors() as exc:
        raise Unavailable(str(exc)) from None
    channels = sorted({ch for h in hybrid_retrievers(retriever) for ch in h.channels})
    out = {"snippets": relative_paths(snippets), "versions": gen.versions(libs), "channels": channels, "mode": key}
    if shards.partial:  # only ever with allow_partial: never a silently partial answer
        out["partial"] = True
        out["missing_shards"] = {str(i): why for i, why in sorted(shards.missing.items())}
    return out


def list_libraries(served: ServedLibraries, principal: Principal) -> dict[str, Any]:
    gen = generation(served)
    return {"libraries": [gen.libraries[lib].describe() for lib in sorted(gen.libraries) if principal.may_read(lib)]}


def library_info(served: ServedLibraries, principal: Principal, library: str) -> dict[str, Any]:
    if not principal.may_read(library):
        raise out_of_scope(library)
    gen = generation(served)
    snap = gen.libraries.get(library)
    if snap is None:
        raise NotFound(f"library {library!r} has no published snapshot")
    return snap.describe()


def discover(served: ServedLibraries, principal: Principal, libraries: Sequence[str] | None = None) -> dict[str, Any]:
    """What the caller may filter on and ask the graph about, over the libraries it may read
    (discovery.py: open, published data only)."""
    check_texts(libraries, "libraries")
    gen = generation(served)
    return describe(gen, readable(gen, principal, libraries))


def graph(served: ServedLibraries, principal: Principal, kind: str, *, entity: Any, metric: Any, period: Any,
          libraries: Sequence[str] | None = None) -> dict[str, Any]:
    """Cited graph rows (rollup, peers, trace, facts) from every readable library with a graph."""
    if kind not in GRAPH_KINDS:
        raise NotFound(f"no graph query {kind!r}; use one of {', '.join(GRAPH_KINDS)}")
    for name, value in (("entity", entity), ("metric", metric), ("period", period)):
        if not isinstance(value, str) or not value.strip():
            raise BadRequest(f"{name}: a non-empty string is required")
        check_texts(value, name)
    check_texts(libraries, "libraries")
    gen = generation(served)
    libs = readable(gen, principal, libraries)
    rows: list[dict[str, Any]] = []
    with_graph = []
    for lib in libs:
        channel = gen.libraries[lib].graph(gen.assembly.root)
        if channel is None:
            continue
        with_graph.append(lib)
        try:
            got = query_rows(channel.store, kind, entity, metric, period)
        except (GraphQueryError, GraphStoreError, DimensionsError) as exc:
            raise BadRequest(f"graph {kind}: {exc}") from None
        rows += [{**r, "library_id": lib} for r in got]
    return {"rows": rows, "versions": gen.versions(with_graph)}


__all__ = ["FILTER_HELP", "GRAPH_KINDS", "discover", "generation", "graph", "jsonable", "library_info", "library_relative", "relative_paths",
           "list_libraries", "readable", "search"]
