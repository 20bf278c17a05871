"""Where an adapter's snippets come from: a warehouse in this process, or a service over HTTP.

Every adapter takes either ``warehouse=`` (a folder with published snapshots: the
retriever comes from the one serving assembly, ``serving.open_published_retriever``, as
for the CLI, the Dagster resource and the service) or ``base_url=`` + ``api_key=`` (a
``ragspine serve``, through ``RagspineClient``), or a ready ``client=``. Both give the
same snippet dicts for the same question and settings, and both check filters the same
way the service does: conflicting conditions and values no served document has are a
``ValueError`` naming the field and the values there are, never an empty answer.

Why a small protocol here and not in each adapter: the three adapters then differ only in
how they spell their framework's object and filters, never in how they search.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from .. import serving
from ..filter_input import FilterValueError, check_filter_values, conflicting
from .client import RagspineClient
from .snippets import open_snippets

Triple = tuple[str, str, Any]


@runtime_checkable
class SnippetSource(Protocol):
    """Cited snippets for a question: ``filters`` as engine triples (AND), ``libraries``
    None for every library the source may read. Only open snippets are returned, each
    with its ``library_id`` when the answer came from one library."""

    def search(self, query: str, *, top_k: int, filters: Sequence[Triple] | None = None,
               libraries: Sequence[str] | None = None) -> list[dict[str, Any]]: ...


def check_request(query: Any, top_k: Any) -> None:
    """The request checks both sources share (the service makes the same ones)."""
    if not isinstance(query, str) or not query.strip():
        raise ValueError(f"query: a non-empty string is required, got {query!r}")
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
        raise ValueError(f"top_k: must be a whole number >= 1, got {top_k!r}")


def _with_library(snippets: list[Any], libs: Sequence[str]) -> list[dict[str, Any]]:
    only = libs[0] if len(libs) == 1 else ""
    out = []
    for s in open_snippets(snippets):
        d = dict(s)
        if only and not d.get("library_id"):
            d["library_id"] = only
        out.append(d)
    return out


class LocalSource:
    """A warehouse's published snapshots in this process: one served retriever per library
    set, assembled on first use by ``serving.open_published_retriever`` and kept."""

    def __init__(self, warehouse: str | os.PathLike[str], *, mode: str | None = None) -> None:
        self.warehouse = Path(warehouse)
        self.mode = mode
        self._retrievers: dict[tuple[str, ...] | None, tuple[Any, list[str]]] = {}
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"LocalSource({str(self.warehouse)!r}, mode={self.mode!r})"

    def retriever(self, libraries: Sequence[str] | None = None) -> tuple[Any, list[str]]:
        """(the served retriever, the library ids it reads) for ``libraries`` (None: all)."""
        if isinstance(libraries, str):
            raise ValueError("libraries must be a list of library ids, not a string")
        key = tuple(sorted(set(libraries))) if libraries is not None else None
        if key == ():
            raise ValueError("libraries is empty; leave it out (None) to read every published library")
        with self._lock:
            got = self._retrievers.get(key)
            if got is None:
                retriever = serving.open_published_retriever(self.warehouse, list(key) if key else None,
                                                             mode=self.mode)
                got = (retriever, serving.published_library_ids(self.warehouse, list(key) if key else None))
                self._retrievers[key] = got
            return got

    def search(self, query: str, *, top_k: int, filters: Sequence[Triple] | None = None,
               libraries: Sequence[str] | None = None) -> list[dict[str, Any]]:
        check_request(query, top_k)
        triples = [tuple(t) for t in (filters or [])]
        clash = conflicting(triples)
        if clash:
            raise FilterValueError(f"filters: {clash}")
        retriever, libs = self.retriever(libraries)
        for t in triples:
            check_filter_values(retriever, [t])
        return _with_library(retriever.retrieve(query, filters=triples or None, top_k=top_k), libs)


class HttpSource:
    """A ``ragspine serve`` over HTTP: ``RagspineClient.search`` (typed errors, Retry-After)."""

    def __init__(self, client: RagspineClient, *, mode: str | None = None) -> None:
        self.client = client
        self.mode = mode

    def __repr__(self) -> str:
        return f"HttpSource({self.client!r}, mode={self.mode!r})"

    def search(self, query: str, *, top_k: int, filters: Sequence[Triple] | None = None,
               libraries: Sequence[str] | None = None) -> list[dict[str, Any]]:
        check_request(query, top_k)
        result = self.client.search(query, filters=[list(t) for t in filters] if filters else None, top_k=top_k,
                                    libraries=libraries, mode=self.mode)
        return _with_library(result.snippets, sorted(result.versions))


def make_source(*, warehouse: str | os.PathLike[str] | None = None, base_url: str | None = None,
                api_key: str | None = None, client: RagspineClient | None = None,
                mode: str | None = None) -> SnippetSource:
    """Exactly one of ``warehouse`` (in process), ``base_url`` (+ ``api_key``) or ``client``."""
    given = [name for name, v in (("warehouse", warehouse), ("base_url", base_url), ("client", client))
             if v is not None]
    if len(given) != 1:
        raise ValueError("give exactly one of warehouse= (a folder with published snapshots, searched in this "
                         "process), base_url= (+ api_key=, a `ragspine serve`) or client= (a RagspineClient); "
                         f"got {', '.join(given) or 'none'}")
    if api_key is not None and base_url is None:
        raise ValueError("api_key= goes with base_url= (a key of `ragspine serve`); a warehouse needs none")
    if warehouse is not None:
        return LocalSource(warehouse, mode=mode)
    if client is None:
        client = RagspineClient(str(base_url), api_key)
    return HttpSource(client, mode=mode)


__all__ = ["HttpSource", "LocalSource", "SnippetSource", "Triple", "check_request", "make_source"]
