"""Build the typed relation graph from dimensions, document metadata and chunk facts.

Node ids are typed strings (``entity:ACME_CN``, ``metric:revenue``, ``period:2023``,
``doc:<doc_id>``, ``fact:<doc_id>:<start>:<end>:<metric>:<kind>``), so a graph built twice
from the same chunks is identical, row for row. Chunks must already be the *served*
ones (no RESTRICTED, no withheld: ``served_chunks``); the builder checks again and
refuses a RESTRICTED chunk rather than trusting its caller.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable
from typing import Any

import pyarrow as pa

from ..sensitivity import is_restricted
from .dimensions import Dimensions
from .extract import Extractor, MetricFact
from .store import GraphStore, MemoryGraphStore, make_graph_store

NODE_SCHEMA = pa.schema([("id", pa.string()), ("type", pa.string()), ("attrs", pa.string())])
EDGE_SCHEMA = pa.schema([("src", pa.string()), ("dst", pa.string()), ("type", pa.string()), ("attrs", pa.string())])


class GraphBuildError(ValueError):
    """A chunk that must not contribute (RESTRICTED) reached the builder."""


def _add_dimensions(store: GraphStore, dims: Dimensions) -> None:
    for e in dims.entities:
        store.add_node(f"entity:{e.id}", "entity", {"id": e.id, "name_en": e.name_en, "name_zh": e.name_zh,
                                                    "aliases": sorted(set(e.aliases))})
    for e in dims.entities:
        if e.parent:
            store.add_edge(f"entity:{e.id}", f"entity:{e.parent}", "subsidiary_of")
    for gid, members in dims.peer_groups:
        for a in members:
            for b in members:
                if a != b:
                    store.add_edge(f"entity:{a}", f"entity:{b}", "peer_of", {"group": gid})
    for m in dims.metrics:
        store.add_node(f"metric:{m.id}", "metric", {"id": m.id, "kind": m.kind, "unit": m.unit,
                                                    "name_en": m.name_en, "name_zh": m.name_zh,
                                                    "aliases": sorted(set(m.aliases))})
    for d in dims.derivations:
        store.add_edge(f"metric:{d.metric}", f"metric:{d.numerator}", "derived_from",
                       {"role": "numerator", "op": d.op})
        store.add_edge(f"metric:{d.metric}", f"metric:{d.denominator}", "derived_from",
                       {"role": "denominator", "op": d.op})


def _ensure(store: GraphStore, node_id: str, type: str, attrs: dict[str, Any]) -> None:
    if store.node(node_id) is None:
        store.add_node(node_id, type, attrs)


def known_facts(ex: Extractor, known: set[str], chunk: Any) -> list[MetricFact]:
    """The facts of one chunk that can enter the graph: about a known entity, in a period."""
    return [f for f in ex.chunk_facts(chunk) if f.entity in known and f.period]


def dedupe_facts(per_chunk: Iterable[tuple[tuple[str, int, str], list[MetricFact]]]) -> list[MetricFact]:
    """One fact per figure span from ``(doc_id, start, chunk_id)``-keyed chunk facts: where
    chunks overlap, the first chunk in that order is the one cited."""
    seen: dict[str, MetricFact] = {}
    for _, facts in sorted(per_chunk, key=lambda p: p[0]):
        for f in facts:
            seen.setdefault(f.key(), f)
    return sorted(seen.values(), key=lambda f: (f.doc_id, f.start, f.metric, f.kind))


def chunk_facts(chunks: Iterable[Any], dims: Dimensions) -> list[MetricFact]:
    """Facts of served chunks, one per figure span (overlapping chunks cite the first chunk)."""
    ex = Extractor(dims)
    known = {e.id for e in dims.entities}
    pairs = []
    for c in chunks:
        if is_restricted(c.sensitivity):
            raise GraphBuildError(f"chunk {c.chunk_id} is RESTRICTED; build the graph from served_chunks()")
        pairs.append(((c.doc_id, c.source_locator.start, c.chunk_id), known_facts(ex, known, c)))
    return dedupe_facts(pairs)


def build_graph(chunks: Iterable[Any], dims: Dimensions, store: GraphStore | None = None) -> GraphStore:
    """The relation graph of ``chunks`` (served chunks) under ``dims``, in ``store``."""
    chunks = list(chunks)
    docs: dict[str, dict[str, str]] = {}
    for c in chunks:  # a document's metadata from its first chunk, in the given order
        if c.doc_id not in docs:
            docs[c.doc_id] = {"title": c.title, "entity": c.entity, "period": c.period, "language": c.language}
    return assemble_graph(docs, chunk_facts(chunks, dims), dims, store)


def assemble_graph(docs: dict[str, dict[str, str]], facts: Iterable[MetricFact], dims: Dimensions,
                   store: GraphStore | None = None) -> GraphStore:
    """The graph from its parts: the dimensions, each document's metadata (``title``,
    ``entity``, ``period``, ``language``) and the deduplicated facts (``dedupe_facts``).

    Why apart from ``build_graph``: a refresh gets the facts of unchanged chunks from the
    previous version (``fact_cache``) and must assemble exactly the graph a full build would.
    """
    store = store if store is not None else make_graph_store()
    _add_dimensions(store, dims)
    for doc_id in sorted(docs):
        d = docs[doc_id]
        store.add_node(f"doc:{doc_id}", "document", {"doc_id": doc_id, "title": d["title"], "entity": d["entity"],
                                                     "period": d["period"], "language": d["language"]})
        if d["entity"] and store.node(f"entity:{d['entity']}") is not None:
            store.add_edge(f"doc:{doc_id}", f"entity:{d['entity']}", "about")
        if d["period"]:
            _ensure(store, f"period:{d['period']}", "period", {"id": d["period"]})
            store.add_edge(f"doc:{doc_id}", f"period:{d['period']}", "covers")
    for f in facts:
        fid = f"fact:{f.key()}"
        store.add_node(fid, "fact", f.to_dict())
        _ensure(store, f"period:{f.period}", "period", {"id": f.period})
        store.add_edge(fid, f"entity:{f.entity}", "fact_of")
        store.add_edge(fid, f"metric:{f.metric}", "measures")
        store.add_edge(fid, f"period:{f.period}", "for_period")
        store.add_edge(fid, f"doc:{f.doc_id}", "cited_in", {"chunk_id": f.chunk_id, "start": f.start, "end": f.end})
    return store


# One encoder for every row: ``json.dumps`` with options builds a new encoder per call
# (most of writing a 50k-document graph's tables). Same output as json.dumps(attrs, ...).
_ENCODER = json.JSONEncoder(ensure_ascii=False, sort_keys=True)


def _dumps(attrs: dict[str, Any]) -> str:
    return _ENCODER.encode(attrs)


def graph_tables(store: GraphStore) -> tuple[pa.Table, pa.Table]:
    """(nodes, edges) as Arrow tables, sorted: the Parquet form of the graph."""
    # The memory store's own attribute dicts, read only (``nodes()`` copies each one first).
    nodes = sorted(store._nodes.items()) if isinstance(store, MemoryGraphStore) else store.nodes()
    edges = store.edges()
    nt = pa.table({"id": [n for n, _ in nodes], "type": [a["type"] for _, a in nodes],
                   "attrs": [_dumps({k: v for k, v in a.items() if k != "type"}) for _, a in nodes]},
                  schema=NODE_SCHEMA)
    et = pa.table({"src": [e.src for e in edges], "dst": [e.dst for e in edges], "type": [e.type for e in edges],
                   "attrs": [_dumps(e.attrs) for e in edges]}, schema=EDGE_SCHEMA)
    return nt, et


def graph_from_tables(nodes: pa.Table, edges: pa.Table, store: GraphStore | None = None) -> GraphStore:
    """Load the Parquet form back into a store (memory or networkx)."""
    store = store if store is not None else make_graph_store()
    for nid, typ, attrs in zip(*(nodes.column(c).to_pylist() for c in ("id", "type", "attrs")), strict=True):
        store.add_node(nid, typ, json.loads(attrs))
    for src, dst, typ, attrs in zip(*(edges.column(c).to_pylist() for c in ("src", "dst", "type", "attrs")),
                                    strict=True):
        store.add_edge(src, dst, typ, json.loads(attrs))
    return store


def counts_by_type(store: GraphStore) -> dict[str, dict[str, int]]:
    return {"nodes": dict(sorted(Counter(a["type"] for _, a in store.nodes()).items())),
            "edges": dict(sorted(Counter(e.type for e in store.edges()).items()))}
