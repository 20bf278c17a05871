"""What the service serves: one immutable generation of published snapshots, swapped whole.

A ``Generation`` maps each published library to the snapshot version it was built from
(its retrievers, one per served mode, and its relation graph). A request takes the current
generation once, at its start, and answers from it alone, so every snippet of a response
comes from the versions that response names, even while a refresh publishes: the watcher
builds the next generation beside the current one (only changed libraries are rebuilt)
and swaps a single reference. The old generation lives until its last request finishes;
the warehouse's retention window (``RAGSPINE_RETAIN_FOR_S``) keeps its files readable.

Retrievers come from the one serving assembly (``serving.library_retriever`` per library,
``serving.serve`` for the libraries a request may read), never assembled here. Each
library is warmed (``serving.warm_retriever``: its files read into the page cache, its
kernels' first calls, lazy checks and vectors done by a probe) before the generation that
holds it is swapped in, so neither the first request after start nor the first after a
reload pays for them, and ``/readyz`` says ready only after. The
snapshot loader reads the *latest* snapshot, so a build records the version before and
after loading and retries when a publish landed in between: versions only grow, so equal
versions mean the loaded index is that version's.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import serving
from ..filter_input import hybrid_retrievers
from ..graph.channel import GraphChannel
from ..graph.step import load_relation_graph, resolve_dimensions
from ..modes import LEXICAL_MODES, retrieval_mode
from ..retrieval.link.assembly import serving_reranker
from ..warehouse.common import SNAPSHOT
from ..warehouse.versioned import VersionedTables

log = logging.getLogger("ragspine.service")

BUILD_ATTEMPTS = 5


class SnapshotMoved(RuntimeError):
    """A library kept publishing while it was being loaded (every attempt saw a new version)."""


def mode_key(mode: str | None) -> str:
    """The served name of a retrieval mode: every lexical preset is ``bm25`` (same index)."""
    m = retrieval_mode(mode)
    return "bm25" if m in LEXICAL_MODES else m


@dataclass
class LibrarySnapshot:
    """One library at one published snapshot version."""

    library: str
    version: str
    snapshot_id: str
    graph_version: str | None
    retrievers: Mapping[str, Any]  # mode key -> the library's retriever (no query layers)
    documents: int  # open documents served (the index holds no RESTRICTED chunk)
    chunks: int
    channels: tuple[str, ...]
    loads: int = 1  # snapshots of this library this process has served, this one included
    _graph: Any = None
    _graph_lock: threading.Lock = field(default_factory=threading.Lock)
    _profile: Any = None  # discovery.Profile, computed on first use (an immutable snapshot has one)

    def describe(self) -> dict[str, Any]:
        return {"id": self.library, "version": self.version, "snapshot_id": self.snapshot_id,
                "documents": self.documents, "chunks": self.chunks, "channels": list(self.channels),
                "graph": self.graph_version is not None}

    def graph(self, root: Path) -> Any:
        """The GraphChannel of the graph version this snapshot names (loaded once), or None."""
        if self.graph_version is None:
            return None
        with self._graph_lock:
            if self._graph is None:
                store = load_relation_graph(VersionedTables(root), self.library, self.graph_version)
                self._graph = GraphChannel(store, resolve_dimensions())
            return self._graph


@dataclass
class Generation:
    """An immutable set of library snapshots; the served wholes are cached per library set."""

    number: int
    libraries: Mapping[str, LibrarySnapshot]
    assembly: ServingAssembly
    _wholes: dict[tuple[str, tuple[str, ...]], Any] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def versions(self, libs: Sequence[str]) -> dict[str, str]:
        return {lib: self.libraries[lib].version for lib in libs}

    def retriever(self, libs: Sequence[str], mode: str) -> Any:
        """``serving.serve`` over these libraries' retrievers (router, query layers)."""
        key = (mode, tuple(sorted(libs)))
        with self._lock:
            whole = self._wholes.get(key)
            if whole is None:
                whole = self.assembly.whole({lib: self.libraries[lib].retrievers[mode] for lib in key[1]})
                self._wholes[key] = whole
            return whole


@dataclass
class ServingAssembly:
    """The settings every generation is built with (resolved once, at start)."""

    root: Path
    modes: tuple[str, ...]
    embedding: str | None = None
    router: str | None = None
    glossary: Path | None = None
    reranker: Any = None

    @classmethod
    def resolve(cls, root: Path, *, mode: str | None = None, embedding: str | None = None,
                router: str | None = None) -> ServingAssembly:
        """The default mode first, then ``bm25`` (cheap: no model) when the default is not it.
        The glossary is the warehouse's own when ``ragspine index`` recorded one, as for
        ``open_published_retriever``: the service answers a synonym query as the CLI does."""
        default = mode_key(mode)
        modes = (default,) if default == "bm25" else (default, "bm25")
        return cls(Path(root), modes, embedding, router, serving.served_glossary(root),
                   serving_reranker(None, None))

    def whole(self, retrievers: Mapping[str, Any]) -> Any:
        return serving.serve(retrievers, router=self.router, glossary=self.glossary)

    def prepare(self, wh: VersionedTables, library: str, version: str, retrievers: Mapping[str, Any]) -> None:
        """What a subclass does to a library's retrievers before they are warmed and served
        (``scale.serve.ShardedAssembly`` points them at the library's shards, so the warm-up
        probes the shards the queries will go to); nothing here."""

    def build_library(self, wh: VersionedTables, library: str) -> LibrarySnapshot:
        for _ in range(BUILD_ATTEMPTS):
            before = wh.latest(SNAPSHOT, library)
            if before is None:
                raise serving.NoPublishedSnapshot(f"no retrieval snapshot published for {library}")
            # One open per library: every mode's retriever shares its BM25 mapping.
            retrievers = serving.library_retrievers(wh, library, self.modes, reranker=self.reranker,
                                                    glossary=self.glossary, embedding=self.embedding)
            after = wh.latest(SNAPSHOT, library)
            if after is not None and after.version == before.version:
                self.prepare(wh, library, before.version, retrievers)
                # Before the generation holding it is swapped in (and before /readyz says
                # ready): the first query's costs paid here, not by a caller (its one log line).
                serving.warm_retriever(*retrievers.values(), name=f"library {library}@{before.version}")
                meta = before.manifest["metadata"]
                hs = hybrid_retrievers(retrievers[self.modes[0]])
                graph = meta.get("relation_graph")
                return LibrarySnapshot(
                    library, before.version, str(meta.get("snapshot_id", "")),
                    None if graph in (None, "None") else str(graph), retrievers,
                    # The distinct doc ids of each retriever's document codes (built by the warm-up,
                    # one pass over the doc_id column): a chunk built per row cost ~14 s at 1M chunks.
                    documents=len({d for h in hs for d in h.doc_codes[1]}), chunks=sum(len(h) for h in hs),
                    channels=tuple(sorted({ch for h in hs for ch in h.channels})))
        raise SnapshotMoved(f"library {library!r} published {BUILD_ATTEMPTS} times while it was being loaded")


class ServedLibraries:
    """The current generation and the watcher that replaces it when a snapshot is published."""

    def __init__(self, assembly: ServingAssembly, libraries: Sequence[str] | None = None) -> None:
        self.assembly = assembly
        self.only = tuple(libraries) if libraries else None  # ``--library``: serve just these
        self._current: Generation | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.last_error: str | None = None

    @property
    def current(self) -> Generation | None:
        return self._current

    def published(self) -> dict[str, str]:
        """library -> latest published snapshot version (manifests only: cheap)."""
        wh = VersionedTables(self.assembly.root)
        libs = serving.published_library_ids(self.assembly.root, list(self.only) if self.only else None)
        out = {}
        for lib in libs:
            snap = wh.latest(SNAPSHOT, lib)
            if snap is not None:
                out[lib] = snap.version
        return out

    def refresh(self) -> bool:
        """Build and swap in a new generation when any published version changed; True if swapped."""
        with self._lock:
            latest = self.published()
            cur = self._current
            if cur is not None and {k: v.version for k, v in cur.libraries.items()} == latest:
                return False
            wh = VersionedTables(self.assembly.root)
            libs: dict[str, LibrarySnapshot] = {}
            for lib, version in latest.items():
                old = cur.libraries.get(lib) if cur is not None else None
                if old is not None and old.version == version:
                    libs[lib] = old
                else:
                    libs[lib] = self.assembly.build_library(wh, lib)
                    libs[lib].loads = old.loads + 1 if old is not None else 1
            self._current = Generation((cur.number + 1) if cur else 1, libs, self.assembly)
            log.info("serving generation %d: %s", self._current.number,
                     ", ".join(f"{k}@{v.version}" for k, v in sorted(libs.items())) or "no library")
            return True

    def _watch(self, interval_s: float) -> None:
        while not self._stop.is_set():
            try:
                self.refresh()
                self.last_error = None
            except Exception as exc:  # keep serving the current generation; say why on /readyz and in the log
                self.last_error = f"{type(exc).__name__}: {exc}"
                log.warning("snapshot reload failed (still serving the previous generation): %s", self.last_error)
            self._stop.wait(interval_s)

    def start(self, interval_s: float) -> None:
        """Load now (in the background) and re-check the published versions every ``interval_s``."""
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._watch, args=(interval_s,), name="ragspine-snapshots",
                                            daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None


__all__ = ["Generation", "LibrarySnapshot", "ServedLibraries", "ServingAssembly", "SnapshotMoved", "mode_key"]
