"""LangChain: ``RagspineRetriever``, a ``BaseRetriever`` over a warehouse or a service.

``RagspineRetriever(warehouse="data/warehouse")`` searches in this process through the
one serving assembly; ``RagspineRetriever(base_url="http://127.0.0.1:8080",
api_key="rsk_…")`` searches a ``ragspine serve``. ``k``, ``filters`` and ``libraries`` are
fields and may be overridden per call (``retriever.invoke(q, k=3, filters={...})``).
LangChain has no filter language of its own, so ``filters`` is the engine's: ``{field:
value | {op: operand}}`` or ``[field, op, operand]`` triples (``ragspine query --where``).

Each ``Document`` is one cited snippet: ``page_content`` the chunk text, ``id`` the chunk
id, ``metadata`` flat (``snippets.snippet_metadata``: ``citation``, ``doc_id``, offsets,
scores, ``library_id`` …). Passes ``langchain-tests``' ``RetrieversIntegrationTests``
(tests/test_integrations_langchain.py). Needs the ``[langchain]`` extra.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping, Sequence
from typing import Any

from langchain_core.callbacks import (
    AsyncCallbackManagerForRetrieverRun,
    CallbackManagerForRetrieverRun,
)
from langchain_core.documents import Document
from langchain_core.retrievers import BaseRetriever
from pydantic import ConfigDict, Field, PrivateAttr, SecretStr, model_validator

from ..filter_input import as_triples
from .client import RagspineClient
from .snippets import snippet_metadata
from .source import SnippetSource, make_source

_CALL_ARGS = ("k", "filters", "libraries")


def _documents(snippets: list[dict[str, Any]]) -> list[Document]:
    return [Document(page_content=s.get("text", ""), id=s.get("chunk_id") or None, metadata=snippet_metadata(s))
            for s in snippets]


class RagspineRetriever(BaseRetriever):
    """Cited RAGSpine snippets as LangChain ``Document`` objects (see the module docstring)."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    warehouse: str | os.PathLike[str] | None = None
    """A folder with published snapshots, searched in this process."""
    base_url: str | None = None
    """A ``ragspine serve`` base URL (``http://host:port``), searched over HTTP."""
    api_key: SecretStr | None = Field(default=None, repr=False)
    """The service key (``Authorization: Bearer``); None: no key. A ``SecretStr``
    (a plain string is accepted), so no repr, log or validation error shows it."""
    client: RagspineClient | None = None
    """A ready client (timeouts, retries) instead of ``base_url``/``api_key``."""
    k: int = Field(default=4, ge=1)
    """Snippets to return."""
    filters: Mapping[str, Any] | Sequence[Any] | None = None
    """Engine filters: ``{field: value | {op: operand}}`` or ``[field, op, operand]`` triples."""
    libraries: list[str] | None = None
    """Library ids to search; None: every published library (the key's scope over HTTP)."""
    mode: str | None = None
    """Retrieval mode (bm25, hybrid, …); None: ``RAGSPINE_RETRIEVAL_MODE`` / the service's."""

    _source: SnippetSource = PrivateAttr()

    @model_validator(mode="after")
    def _open(self) -> RagspineRetriever:
        key = self.api_key.get_secret_value() if self.api_key is not None else None
        self._source = make_source(warehouse=self.warehouse, base_url=self.base_url, api_key=key,
                                   client=self.client, mode=self.mode)
        as_triples(self.filters)  # a bad filter fails at construction, not at the first question
        return self

    def _call(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        unknown = sorted(set(kwargs) - set(_CALL_ARGS))
        if unknown:
            raise TypeError(f"unexpected argument(s) {', '.join(unknown)}; RagspineRetriever takes "
                            f"{', '.join(_CALL_ARGS)} per call")
        k = kwargs.get("k", self.k)
        filters = kwargs.get("filters", self.filters)
        libraries = kwargs.get("libraries", self.libraries)
        return {"top_k": k, "filters": as_triples(filters) or None, "libraries": libraries}

    def _get_relevant_documents(self, query: str, *, run_manager: CallbackManagerForRetrieverRun,
                                **kwargs: Any) -> list[Document]:
        return _documents(self._source.search(query, **self._call(kwargs)))

    async def _aget_relevant_documents(self, query: str, *, run_manager: AsyncCallbackManagerForRetrieverRun,
                                       **kwargs: Any) -> list[Document]:
        call = self._call(kwargs)
        return _documents(await asyncio.to_thread(self._source.search, query, **call))


__all__ = ["RagspineRetriever"]
