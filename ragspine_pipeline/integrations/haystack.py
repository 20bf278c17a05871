"""Haystack: ``RagspineRetriever``, a ``@component`` retriever (the ``TextRetriever`` protocol).

``run(query, filters=None, top_k=None) -> {"documents": [...]}`` and ``run_async`` with the
same signature, so it stands wherever Haystack takes a ``TextRetriever`` (a ``Pipeline``,
``MultiQueryTextRetriever``). ``RagspineRetriever(warehouse="data/warehouse")`` searches in
this process through the one serving assembly; ``RagspineRetriever(base_url=...,
api_key=...)`` a ``ragspine serve`` (``api_key`` may be a Haystack ``Secret``).

Each ``Document`` is one cited snippet: ``id`` the chunk id, ``content`` the chunk text,
``score`` the fused score, ``meta`` the flat snippet metadata (``citation``, ``doc_id``,
``start_char``/``end_char``, scores, ``library_id`` …).

Filters are Haystack filter dicts over ``meta.<field>`` (the engine's fields; ``id`` is
the chunk id): comparisons ``== != > >= < <= in "not in"``, ``AND`` of anything, ``OR`` of
equalities on one field (an ``in``), ``NOT`` of one equality or ``in``. Anything else
raises ``UnsupportedFilter`` (a ``ValueError``), never ignored. ``filter_policy`` as in
Haystack's own retrievers: ``REPLACE`` (run-time filters replace the constructor's) or
``MERGE`` (both hold). Needs the ``[haystack]`` extra.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping, Sequence
from typing import Any

# Haystack posts anonymous usage telemetry (a network call) when it is imported unless
# this is "False"; RAGSpine makes no network call at run time, so it is off before the
# import below. A value the user set (even "True") is kept: their choice, not ours.
os.environ.setdefault("HAYSTACK_TELEMETRY_ENABLED", "False")

from haystack import Document, component, default_from_dict, default_to_dict
from haystack.document_stores.types import FilterPolicy
from haystack.utils import Secret, deserialize_secrets_inplace

from .client import RagspineClient
from .filters import Cmp, Logic, Node, Triple, UnsupportedFilter, engine_field, to_triples
from .snippets import score_of, snippet_metadata
from .source import make_source

DEFAULT_TOP_K = 10

_OPS = {"==": "eq", "!=": "ne", ">": "gt", ">=": "gte", "<": "lt", "<=": "lte", "in": "in", "not in": "nin"}
_LOGIC = {"AND": "and", "OR": "or", "NOT": "not"}


def _node(f: Any) -> Node:
    if not isinstance(f, Mapping):
        raise UnsupportedFilter(f"a Haystack filter is a dict, got {type(f).__name__}")
    op = f.get("operator")
    if "conditions" in f:
        if op not in _LOGIC or not isinstance(f["conditions"], list):
            raise UnsupportedFilter(f"logical filter needs operator AND, OR or NOT and a list of conditions, "
                                    f"got operator {op!r}")
        return Logic(_LOGIC[op], tuple(_node(c) for c in f["conditions"]))
    if "field" not in f or "value" not in f:
        raise UnsupportedFilter("a comparison filter is {'field': 'meta.<field>', 'operator': '==', 'value': ...}; "
                                f"got keys {sorted(map(str, f))}")
    if op not in _OPS:
        raise UnsupportedFilter(f"filter operator {op!r} is not supported; use {', '.join(map(repr, _OPS))}")
    field = "chunk_id" if f["field"] == "id" else engine_field(f["field"], prefix="meta.")
    return Cmp(field, _OPS[op], f["value"])


def filters_to_triples(filters: Mapping[str, Any] | None) -> list[Triple]:
    """A Haystack filter dict as engine triples (AND); see the module docstring."""
    if not filters:
        return []
    return to_triples(_node(filters))


def to_document(snippet: Mapping[str, Any]) -> Document:
    """One snippet as a Haystack ``Document`` (id: the chunk id; meta: citation, lineage, scores)."""
    return Document(id=str(snippet.get("chunk_id") or ""), content=str(snippet.get("text", "")),
                    meta=snippet_metadata(snippet), score=score_of(snippet))


@component
class RagspineRetriever:
    """Cited RAGSpine snippets as Haystack ``Document`` objects (see the module docstring)."""

    def __init__(self, warehouse: str | os.PathLike[str] | None = None, *, base_url: str | None = None,
                 api_key: Secret | str | None = None, client: RagspineClient | None = None,
                 top_k: int = DEFAULT_TOP_K, filters: dict[str, Any] | None = None,
                 libraries: Sequence[str] | None = None, mode: str | None = None,
                 filter_policy: FilterPolicy | str = FilterPolicy.REPLACE) -> None:
        if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
            raise ValueError(f"top_k must be a whole number > 0, got {top_k!r}")
        key = api_key.resolve_value() if isinstance(api_key, Secret) else api_key
        self._source = make_source(warehouse=warehouse, base_url=base_url, api_key=key, client=client, mode=mode)
        self._init = {"warehouse": None if warehouse is None else os.fspath(warehouse), "base_url": base_url,
                      "api_key": api_key, "client": client, "mode": mode}
        self.top_k = top_k
        self.filters = filters
        self._triples = filters_to_triples(filters)  # a bad filter fails here, not in the pipeline
        self.libraries = list(libraries) if libraries is not None else None
        self.filter_policy = FilterPolicy.from_str(filter_policy) if isinstance(filter_policy, str) else filter_policy

    def to_dict(self) -> dict[str, Any]:
        """Haystack serialization (``Pipeline.dumps``). The key is written only as a
        ``Secret`` read from an environment variable (``Secret.from_env_var("SEARCH_API_KEY")``):
        a plain-string key or a ready ``client`` would put a credential, or an object YAML
        cannot hold, into the pipeline file, so either is refused."""
        init = self._init
        if init["client"] is not None:
            raise ValueError("a RagspineRetriever built with client= cannot be serialized; build it with base_url= "
                             "and api_key=Secret.from_env_var(<the variable holding the key>)")
        if isinstance(init["api_key"], str):
            raise ValueError("a plain-string api_key is never written into a pipeline file; pass "
                             "api_key=Secret.from_env_var(<the variable holding the key>) to serialize this retriever")
        api_key = init["api_key"].to_dict() if isinstance(init["api_key"], Secret) else None
        return default_to_dict(self, warehouse=init["warehouse"], base_url=init["base_url"], api_key=api_key,
                               top_k=self.top_k, filters=self.filters, libraries=self.libraries, mode=init["mode"],
                               filter_policy=self.filter_policy.value)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RagspineRetriever:
        """The retriever ``to_dict`` wrote (the key read again from its environment variable)."""
        deserialize_secrets_inplace(data["init_parameters"], keys=["api_key"])
        return default_from_dict(cls, data)

    def _call(self, filters: dict[str, Any] | None, top_k: int | None) -> dict[str, Any]:
        triples = self._triples
        if filters:
            given = filters_to_triples(filters)
            triples = [*self._triples, *given] if self.filter_policy == FilterPolicy.MERGE else given
        return {"top_k": self.top_k if top_k is None else top_k, "filters": triples or None,
                "libraries": self.libraries}

    @component.output_types(documents=list[Document])
    def run(self, query: str, filters: dict[str, Any] | None = None, top_k: int | None = None) -> dict[str, Any]:
        """Cited snippets for ``query``: ``{"documents": [Document, ...]}``, best first."""
        snippets = self._source.search(query, **self._call(filters, top_k))
        return {"documents": [to_document(s) for s in snippets]}

    @component.output_types(documents=list[Document])
    async def run_async(self, query: str, filters: dict[str, Any] | None = None,
                        top_k: int | None = None) -> dict[str, Any]:
        """``run`` in a worker thread (the event loop is never blocked)."""
        call = self._call(filters, top_k)
        snippets = await asyncio.to_thread(self._source.search, query, **call)
        return {"documents": [to_document(s) for s in snippets]}


__all__ = ["RagspineRetriever", "filters_to_triples", "to_document"]
