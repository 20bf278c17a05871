"""The relation graph: cited metric facts over controlled dimensions, and graph queries.

An independent channel beside the narrative retriever (DESIGN §3): entities with
parents and peers, metrics with units and derivations, periods and documents, plus
metric facts extracted deterministically from served chunk text, each citing
``doc_id``, ``chunk_id`` and the exact source span of its number. No Dagster here.
"""

from .build import build_graph, chunk_facts, counts_by_type, graph_from_tables, graph_tables
from .channel import GraphChannel, ask_both, query_rows, rows_of
from .communities import Community, add_communities, detect_communities, themes
from .dimensions import (
    Dimensions,
    DimensionsError,
    load_dimensions,
    parse_dimensions,
    with_glossary,
)
from .extract import Extractor, MetricFact
from .queries import (
    Citation,
    FactRow,
    GraphQueryError,
    PeerComparison,
    Rollup,
    Trace,
    compare_peers,
    rollup,
    trace,
)
from .relations import (
    CooccurrenceExtractor,
    LLMRelationExtractor,
    RelationExtractor,
    RelationExtractorError,
    make_relation_extractor,
)
from .store import (
    GraphStore,
    GraphStoreError,
    MemoryGraphStore,
    NetworkxGraphStore,
    make_graph_store,
)

__all__ = [
    "Community", "CooccurrenceExtractor", "GraphChannel", "LLMRelationExtractor", "RelationExtractor",
    "RelationExtractorError", "add_communities", "ask_both", "detect_communities", "make_relation_extractor",
    "query_rows", "rows_of", "themes",
    "Citation", "Dimensions", "DimensionsError", "Extractor", "FactRow", "GraphQueryError", "GraphStore",
    "GraphStoreError", "MemoryGraphStore", "MetricFact", "NetworkxGraphStore", "PeerComparison", "Rollup", "Trace",
    "build_graph", "chunk_facts", "compare_peers", "counts_by_type", "graph_from_tables", "graph_tables",
    "load_dimensions", "make_graph_store", "parse_dimensions", "rollup", "trace", "with_glossary",
]
