"""The HTTP API's request and response models: what ``/openapi.json`` declares.

Why models for responses the routes never validate: the routes answer with JSON encoded
once (``app.JSONText``: FastAPI's per-response validation cost milliseconds), so these
models exist for the document a client is generated from. They must describe the real
bodies, which ``tests/test_service_openapi.py`` checks by validating real responses of
every documented status of every route against ``/openapi.json``. Snippets and graph
rows keep ``additionalProperties``: the engine adds fields (lineage, duplicates, layer
reports) without a service release, and a generated client must not reject them.

``ERRORS`` and ``error_responses`` declare the failures: every one is the same
``{error, message}`` object (``ErrorBody``), whatever the status.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr

from .operations import FILTER_HELP


class SearchBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    query: StrictStr = Field(description="The question.")
    filters: dict[str, Any] | list[Any] | StrictStr | None = Field(None, description=FILTER_HELP)
    # The bounds (1, RAGSPINE_SERVICE_MAX_TOP_K) are in /openapi.json (app._openapi) and checked
    # by the operation (a 400 naming the cap), not here: the cap is the running service's.
    top_k: StrictInt = Field(5, description="Snippets to return (1 to RAGSPINE_SERVICE_MAX_TOP_K).")
    libraries: list[StrictStr] | None = Field(None, description="Library ids; absent: every library the key may read.")
    mode: StrictStr | None = Field(None, description="Retrieval mode (default: the service's); bm25 is always served.")
    allow_partial: StrictBool = Field(False, description="Accept an answer missing unreachable shards (sharded index).")


class GraphBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    entity: StrictStr = Field(description="Entity id (GET /v1/discover lists those with figures).")
    metric: StrictStr = Field(description="Metric id (GET /v1/discover lists those with figures).")
    period: StrictStr = Field(description="Reporting period, as the documents write it (e.g. 2023).")
    libraries: list[StrictStr] | None = Field(None, description="Library ids; absent: every library the key may read.")


class ErrorBody(BaseModel):
    """Every error of the HTTP API, whatever its status."""

    error: str = Field(description="A stable code: bad_request, unauthorized, forbidden, not_found, "
                                   "method_not_allowed, request_timeout, payload_too_large, misdirected_request, "
                                   "invalid_request, rate_limited, unavailable, internal.")
    message: str = Field(description="What went wrong and what to do, in words.")


class SourceLocator(BaseModel):
    model_config = ConfigDict(extra="allow")
    source_path: str | None = Field(None, description="The file, relative to its library's folder.")
    start: int = Field(description="First character of the snippet in the source text.")
    end: int = Field(description="One past its last character.")


class Scores(BaseModel):
    model_config = ConfigDict(extra="allow")
    fused: float | None = None
    bm25: float | None = None
    vector: float | None = None


class Snippet(BaseModel):
    """One cited snippet (the fields ``ragspine query --json`` prints; more may appear)."""

    model_config = ConfigDict(extra="allow")
    text: str
    doc_id: str
    chunk_id: str
    title: str | None = None
    source_locator: SourceLocator
    scores: Scores | None = None
    rank: int | None = None
    library_id: str | None = None
    version: int | str | None = None
    entity: str | None = None
    period: str | None = None
    topic: str | None = None
    language: str | None = None


class SearchResponse(BaseModel):
    snippets: list[Snippet]
    versions: dict[str, str] = Field(description="library id -> the snapshot version every snippet came from.")
    channels: list[str] = Field(description="Retrieval channels used (bm25, dense, ...).")
    mode: str
    partial: bool | None = Field(None, description="Only with allow_partial: true when some shards did not answer.")
    missing_shards: dict[str, str] | None = Field(None, description="Shard -> why it is missing (partial only).")


class LibraryInfo(BaseModel):
    id: str
    version: str
    snapshot_id: str
    documents: int = Field(description="Open documents served.")
    chunks: int
    channels: list[str]
    graph: bool = Field(description="Whether the library has a relation graph (the graph routes).")


class LibrariesResponse(BaseModel):
    libraries: list[LibraryInfo]


class Citation(BaseModel):
    model_config = ConfigDict(extra="allow")
    doc_id: str | None = None
    chunk_id: str | None = None


class GraphRow(BaseModel):
    model_config = ConfigDict(extra="allow")
    kind: str
    library_id: str
    entity: str | None = None
    metric: str | None = None
    period: str | None = None
    value: float | None = None
    citations: list[Citation] = Field(default_factory=list)


class GraphResponse(BaseModel):
    rows: list[GraphRow]
    versions: dict[str, str]


class ValueCount(BaseModel):
    value: str | int | float
    documents: int = Field(description="Open documents with this value.")


class FieldInfo(BaseModel):
    type: Literal["string", "integer", "number"]
    distinct: int = Field(description="Distinct values over the open documents in scope.")
    top_values: list[ValueCount] = Field(description="The most common values, most documents first (none for "
                                                     "per-document or per-chunk ids).")


class GraphTerm(BaseModel):
    id: str
    name: str | None = None
    facts: int = Field(description="Cited figures in the graph.")


class DiscoverResponse(BaseModel):
    libraries: list[LibraryInfo]
    fields: dict[str, FieldInfo] = Field(description="Filterable fields of the open documents in scope.")
    entities: list[GraphTerm] = Field(description="Entities with cited figures (the graph tools' entity).")
    metrics: list[GraphTerm] = Field(description="Metrics with cited figures (the graph tools' metric).")
    periods: list[str] = Field(description="Periods with cited figures.")


class Status(BaseModel):
    status: Literal["ok", "ready"]


ERRORS: dict[int, str] = {
    400: "Unusable input (a filter, a query too long or not text), or the Authorization/Host header sent twice.",
    401: "No valid API key: send Authorization: Bearer KEY.",
    403: "A library outside the key's scope (the same answer whether it exists or not), or a browser Origin "
         "not allowed.",
    404: "A library in scope with no published snapshot.",
    408: "The request body did not arrive within RAGSPINE_SERVICE_BODY_TIMEOUT_S.",
    413: "The body is over RAGSPINE_SERVICE_MAX_BODY_BYTES.",
    421: "A Host header outside RAGSPINE_SERVICE_ALLOWED_HOSTS (DNS rebinding).",
    422: "A body of the wrong shape: missing, unknown or mistyped fields (types are strict: \"3\" is not 3).",
    429: "Too many requests for this key; retry after Retry-After seconds.",
    503: "Still loading the snapshots, past RAGSPINE_SERVICE_TIMEOUT_S, at the connection cap, or a shard "
         "did not answer.",
}
_HEADERS = {
    401: {"WWW-Authenticate": {"description": "Bearer", "schema": {"type": "string"}}},
    429: {"Retry-After": {"description": "Seconds until the key may call again.", "schema": {"type": "integer"}}},
}
ANY_ROUTE = (400, 403, 421)  # a header twice, Origin, Host: every route (the connection cap: the description)
KEYED = (401, 429)  # routes behind the key
WITH_BODY = (408, 413, 422)  # routes that read a JSON body


def error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """FastAPI ``responses=`` declaring ``statuses`` with the ``ErrorBody`` model."""
    out: dict[int | str, dict[str, Any]] = {}
    for status in sorted(set(statuses)):
        out[status] = {"model": ErrorBody, "description": ERRORS[status]}
        if status in _HEADERS:
            out[status]["headers"] = _HEADERS[status]
    return out


__all__ = ["ANY_ROUTE", "ERRORS", "KEYED", "WITH_BODY", "Citation", "DiscoverResponse", "ErrorBody", "FieldInfo",
           "GraphBody", "GraphResponse", "GraphRow", "GraphTerm", "LibrariesResponse", "LibraryInfo", "Scores",
           "SearchBody", "SearchResponse", "Snippet", "SourceLocator", "Status", "ValueCount", "error_responses"]
