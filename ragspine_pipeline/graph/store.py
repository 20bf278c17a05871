"""GraphStore: the seam between the relation graph and where it lives.

Why a protocol: queries are written once against these few calls, so the in-process
store (the default, no dependency) and the networkx adapter (``[graph]``) give the same
answers by construction; every listing is returned sorted, never in insertion or hash
order. ``RAGSPINE_GRAPH_STORE=memory|networkx`` picks one.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from .. import settings

STORE_ENV = "RAGSPINE_GRAPH_STORE"
STORES = ("memory", "networkx")


class GraphStoreError(ValueError):
    """An unknown store name, or a missing dependency of the chosen store."""


@dataclass(frozen=True)
class Edge:
    src: str
    dst: str
    type: str
    attrs: dict[str, Any]


@runtime_checkable
class GraphStore(Protocol):
    def add_node(self, node_id: str, type: str, attrs: dict[str, Any]) -> None: ...
    def add_edge(self, src: str, dst: str, type: str, attrs: dict[str, Any] | None = None) -> None: ...
    def node(self, node_id: str) -> dict[str, Any] | None: ...
    def nodes(self, type: str | None = None) -> list[tuple[str, dict[str, Any]]]: ...
    def out_edges(self, node_id: str, type: str | None = None) -> list[Edge]: ...
    def in_edges(self, node_id: str, type: str | None = None) -> list[Edge]: ...
    def edges(self) -> list[Edge]: ...


def _key(e: Edge) -> tuple[str, str, str]:
    return (e.type, e.src, e.dst)


class MemoryGraphStore:
    """Dicts of adjacency lists: the default store."""

    def __init__(self) -> None:
        self._nodes: dict[str, dict[str, Any]] = {}
        self._out: dict[str, list[Edge]] = defaultdict(list)
        self._in: dict[str, list[Edge]] = defaultdict(list)

    def add_node(self, node_id: str, type: str, attrs: dict[str, Any]) -> None:
        self._nodes[node_id] = {**attrs, "type": type}

    def add_edge(self, src: str, dst: str, type: str, attrs: dict[str, Any] | None = None) -> None:
        if src not in self._nodes or dst not in self._nodes:
            raise GraphStoreError(f"edge {type} {src}->{dst} names a missing node")
        e = Edge(src, dst, type, dict(attrs or {}))
        self._out[src].append(e)
        self._in[dst].append(e)

    def node(self, node_id: str) -> dict[str, Any] | None:
        n = self._nodes.get(node_id)
        return dict(n) if n is not None else None

    def nodes(self, type: str | None = None) -> list[tuple[str, dict[str, Any]]]:
        return sorted((k, dict(v)) for k, v in self._nodes.items() if type is None or v["type"] == type)

    def out_edges(self, node_id: str, type: str | None = None) -> list[Edge]:
        return sorted((e for e in self._out.get(node_id, []) if type is None or e.type == type), key=_key)

    def in_edges(self, node_id: str, type: str | None = None) -> list[Edge]:
        return sorted((e for e in self._in.get(node_id, []) if type is None or e.type == type), key=_key)

    def edges(self) -> list[Edge]:
        return sorted((e for es in self._out.values() for e in es), key=_key)


class NetworkxGraphStore:
    """The same graph in a ``networkx.MultiDiGraph`` (for its algorithms: communities, paths)."""

    def __init__(self) -> None:
        try:
            import networkx as nx  # lazy: networkx, the optional [graph] extra, loaded when this store is chosen
        except ImportError as exc:  # pragma: no cover - depends on the environment
            raise GraphStoreError("RAGSPINE_GRAPH_STORE=networkx needs the [graph] extra (networkx)") from exc
        self.graph = nx.MultiDiGraph()

    def add_node(self, node_id: str, type: str, attrs: dict[str, Any]) -> None:
        self.graph.add_node(node_id, **{**attrs, "type": type})

    def add_edge(self, src: str, dst: str, type: str, attrs: dict[str, Any] | None = None) -> None:
        if src not in self.graph or dst not in self.graph:
            raise GraphStoreError(f"edge {type} {src}->{dst} names a missing node")
        self.graph.add_edge(src, dst, key=None, etype=type, attrs=dict(attrs or {}))

    def node(self, node_id: str) -> dict[str, Any] | None:
        return dict(self.graph.nodes[node_id]) if node_id in self.graph else None

    def nodes(self, type: str | None = None) -> list[tuple[str, dict[str, Any]]]:
        return sorted((k, dict(v)) for k, v in self.graph.nodes(data=True) if type is None or v["type"] == type)

    def _edges(self, it: Any, type: str | None) -> list[Edge]:
        return sorted((Edge(u, v, d["etype"], dict(d["attrs"])) for u, v, d in it
                       if type is None or d["etype"] == type), key=_key)

    def out_edges(self, node_id: str, type: str | None = None) -> list[Edge]:
        return self._edges(self.graph.out_edges(node_id, data=True), type) if node_id in self.graph else []

    def in_edges(self, node_id: str, type: str | None = None) -> list[Edge]:
        return self._edges(self.graph.in_edges(node_id, data=True), type) if node_id in self.graph else []

    def edges(self) -> list[Edge]:
        return self._edges(self.graph.edges(data=True), None)


def make_graph_store(name: str | None = None) -> GraphStore:
    """A new empty store: ``name``, else ``RAGSPINE_GRAPH_STORE``, else ``memory``."""
    choice = (name.strip().lower() or "memory") if name is not None else settings.get(STORE_ENV, error=GraphStoreError)
    if choice == "memory":
        return MemoryGraphStore()
    if choice == "networkx":
        return NetworkxGraphStore()
    raise GraphStoreError(f"unknown graph store {choice!r} ({STORE_ENV}); expected one of {STORES}")
