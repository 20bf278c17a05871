"""The ``relation_graph`` warehouse step: the graph of a library's served chunks, as Parquet.

Incremental like the other steps: the graph is a pure function of (served chunks of a
chunks version, dimensions, glossary), so when the chunks version and the input hash
are those of the published graph, the step publishes nothing and returns that version.
When they differ, only chunks the previous version has not seen are run through the
extractor: each version keeps every served chunk's facts (``fact_cache``), and the graph
is assembled from them exactly as a full build assembles it.
Only served chunks feed it (``served_chunks``): a RESTRICTED or withheld chunk can never
contribute a fact.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .. import settings
from ..llm.provider import provider_from_env
from ..retrieval.lexical.analysis.glossary import load_glossary
from ..retrieval.link.narrative_link import default_glossary_path
from ..warehouse.chunk_tables import (
    as_chunks,
    current_mask,
    current_versions,
    published_chunks,
    served_chunk_table,
)
from ..warehouse.common import CheckOutcome, StepResult
from ..warehouse.served_refresh import KEYS, chunk_rows
from ..warehouse.versioned import VersionedTables, WarehouseError, library_step
from .build import assemble_graph, graph_from_tables, graph_tables
from .communities import add_communities, detect_communities
from .dimensions import Dimensions, load_dimensions, with_glossary
from .fact_cache import FACT_COLUMNS, FACTS_TABLE, load_cache, served_facts
from .relations import RelationExtractor, add_relations, make_relation_extractor
from .store import GraphStore, make_graph_store

RELATION_GRAPH = "relation_graph"
GRAPH_CODE_VERSION = "2"  # 2: "H1 2024" periods, "is expected to" is forward-looking
COMMUNITIES_ENV = "RAGSPINE_GRAPH_COMMUNITIES"


def resolve_dimensions(dimensions: str | os.PathLike[str] | Dimensions | None = None,
                       glossary: str | os.PathLike[str] | None = None) -> Dimensions:
    """Dimensions (a path, ``RAGSPINE_GRAPH_DIMENSIONS`` or the shipped file) plus glossary aliases."""
    dims = dimensions if isinstance(dimensions, Dimensions) else load_dimensions(dimensions)
    gpath = Path(glossary) if glossary is not None else default_glossary_path()
    return with_glossary(dims, load_glossary(gpath)) if gpath is not None else dims


def _input_hash(dims: Dimensions, extras: tuple[str, ...] = ()) -> str:
    # ``extras`` (extractor, communities) only when on: the default graph's hash is unchanged.
    blob = json.dumps([GRAPH_CODE_VERSION, repr(dims), *extras], ensure_ascii=False)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:16]


@library_step
def build_relation_graph(wh: VersionedTables, library: str, chunks_version: str | None = None, *,
                         dimensions: str | os.PathLike[str] | Dimensions | None = None,
                         glossary: str | os.PathLike[str] | None = None,
                         relation_extractor: str | RelationExtractor | None = None,
                         communities: bool | None = None, provider: Any = None) -> StepResult:
    """Publish the relation graph (tables ``nodes`` and ``edges``, and ``chunk_facts``, what the
    next refresh reuses) of a chunks version.

    ``relation_extractor``: a spec or an extractor (None: ``RAGSPINE_RELATION_EXTRACTOR``,
    default none — the base graph, byte-identical). ``communities`` (None:
    ``RAGSPINE_GRAPH_COMMUNITIES``, default off) adds the GraphRAG community nodes;
    ``provider`` summarizes them (extractive without one).
    """
    t0 = time.perf_counter()
    chunks_pub = published_chunks(wh, library, chunks_version)
    dims = resolve_dimensions(dimensions, glossary)
    extractor = (relation_extractor if relation_extractor is not None and not isinstance(relation_extractor, str)
                 else make_relation_extractor(relation_extractor, provider=provider))
    if communities is None:
        communities = settings.get(COMMUNITIES_ENV)  # on-words on, anything else off (as always)
    if communities and provider is None:
        provider = provider_from_env()  # the service LLM when configured; else extractive summaries
    extras = ((f"extractor={extractor.name}",) if extractor is not None else ()) + \
        (("communities", "llm" if provider is not None else "extractive") if communities else ())
    key = _input_hash(dims, extras)
    prev = wh.latest(RELATION_GRAPH, library)
    if prev is not None and prev.manifest["metadata"].get("chunks_version") == chunks_pub.version \
            and prev.manifest["metadata"].get("input_hash") == key:
        return StepResult(prev, {**prev.manifest["metadata"], "reused": True}, {})
    whole = extractor is not None or communities  # these read every chunk's text
    served = served_chunk_table(wh, library, chunks_pub.version, columns=None if whole else FACT_COLUMNS)

    def rows(at: list[int], columns: list[str] | None = None) -> pa.Table:  # stored rows of these served chunks
        return served.take(pa.array(at, pa.int64())) if whole else \
            chunk_rows(chunks_pub, served.take(pa.array(at, pa.int64())).select(KEYS), columns=columns)
    cache = _previous_facts(wh, library, prev, key)
    found = served_facts(served, dims, cache, rows, None if cache is None else _unchanged(wh, library, prev, served))
    store = assemble_graph(found.docs, found.facts, dims)
    extra_md: dict[str, Any] = {}
    if whole:
        chunks = as_chunks(served)  # the rows read above: served_chunks(...) of this version
    if extractor is not None:
        extra_md["relation_extractor"] = extractor.name
        extra_md["relations_added"] = add_relations(store, extractor.extract(chunks, dims))
        report = getattr(extractor, "report", None)
        if report:  # counts only: a refused name is not restricted text, but keep metadata small
            extra_md["extractor_report"] = {k: (len(v) if isinstance(v, list) else v) for k, v in report.items()}
    if communities:
        detected = detect_communities(store, chunks, provider=provider)
        add_communities(store, detected)
        extra_md["communities"] = len(detected)
    nodes, edges = graph_tables(store)
    counts = {"nodes": _type_counts(nodes), "edges": _type_counts(edges)}  # counts_by_type(store), from the tables
    md: dict[str, Any] = {"chunks_version": chunks_pub.version, "input_hash": key, "served_chunks": served.num_rows,
                          "node_counts": counts["nodes"], "edge_counts": counts["edges"],
                          "n_nodes": nodes.num_rows, "n_edges": edges.num_rows, "chunks_extracted": found.extracted,
                          "chunks_reused": found.reused, **extra_md}
    pub = wh.write(RELATION_GRAPH, library, {"nodes": nodes, "edges": edges, FACTS_TABLE: found.table}, md,
                   parent=prev)
    cited = _citations_resolve(store, found.spans)
    md = {**md, "version": pub.version, "reused": False, "seconds": round(time.perf_counter() - t0, 3)}
    return StepResult(pub, md, {"facts_cite_served_chunks": cited})


def _previous_facts(wh: VersionedTables, library: str, prev: Any, key: str) -> pa.Table | None:
    """The per-chunk facts of the previous version when it was built under the same inputs
    (dimensions, glossary, code); none otherwise, or for a version from before they were kept."""
    if prev is None or prev.manifest["metadata"].get("input_hash") != key or FACTS_TABLE not in prev.manifest["tables"]:
        return None
    return load_cache(wh.read(RELATION_GRAPH, library, FACTS_TABLE, prev.version))


def _unchanged(wh: VersionedTables, library: str, prev: Any, served: pa.Table) -> np.ndarray | None:
    """Which served rows are the very stored rows the previous version was built from:
    their cached inputs digest stands without hashing their metadata again. A row is
    written once per (document, version) and never changed, and the cache holds a chunk
    id only for a row of its document's version current then; so a row whose document
    version was current at the previous version's chunks version is the row its cached
    digest was made from (a chunk not in the cache is hashed anyway). None when the
    previous chunks version can no longer be read (every row is then hashed)."""
    try:
        old = current_versions(published_chunks(wh, library, prev.manifest["metadata"]["chunks_version"]))
    except (WarehouseError, KeyError, OSError):
        return None
    return np.asarray(current_mask(served, old).to_numpy(zero_copy_only=False), np.bool_)


def _type_counts(table: pa.Table) -> dict[str, int]:
    return {str(r["values"]): int(r["counts"]) for r in sorted(pc.value_counts(table.column("type")).to_pylist(),
                                                               key=lambda r: r["values"])}


def _citations_resolve(store: GraphStore, spans: dict[str, tuple[int, str]]) -> CheckOutcome:
    """Every fact's span lies in its served chunk and reads exactly its quote
    (``spans``: chunk_id -> (document offset, text) of the cited chunks)."""
    bad = []
    for fid, a in store.nodes("fact"):
        span = spans.get(a["chunk_id"])
        lo = a["start"] - span[0] if span is not None else -1
        if span is None or lo < 0 or span[1][lo:lo + a["end"] - a["start"]] != a["quote"]:
            bad.append(fid)
    return CheckOutcome(not bad, {"facts": len(store.nodes("fact")), "unresolved": bad[:10]})


def load_relation_graph(wh: VersionedTables, library: str, version: str | None = None,
                        store: GraphStore | str | None = None) -> GraphStore:
    """The published graph of a library in a store (``RAGSPINE_GRAPH_STORE`` by default)."""
    pub = wh.get(RELATION_GRAPH, library, version) if version else wh.latest(RELATION_GRAPH, library)
    if pub is None:
        raise WarehouseError(f"no relation graph published for {library}")
    target = store if store is not None and not isinstance(store, str) else make_graph_store(store)
    return graph_from_tables(wh.read(RELATION_GRAPH, library, "nodes", pub.version),
                             wh.read(RELATION_GRAPH, library, "edges", pub.version), target)
