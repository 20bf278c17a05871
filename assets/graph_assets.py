"""The ``relation_graph`` asset: a thin call into ``ragspine_pipeline.graph.step``.

Per library, after ``chunks``: the typed graph (entities, metrics, periods, documents,
cited metric facts) of the library's served chunks, as Parquet nodes/edges under
``<warehouse>/relation_graph/<library>/<version>/``; counts by type go to the UI metadata.
(No ``from __future__ import annotations`` here: Dagster reads the context annotation.)
"""

import dagster as dg

from ragspine_pipeline.graph.step import GRAPH_CODE_VERSION, RELATION_GRAPH, build_relation_graph
from resources import WarehouseResource

from .partitions import library_check, library_partitions


class RelationGraphConfig(dg.Config):
    # none | cooccurrence | llm; empty: RAGSPINE_RELATION_EXTRACTOR (default none: the base graph, byte-identical)
    relation_extractor: str = ""
    # on | off: GraphRAG community nodes (is_synthesis, never citable); empty: RAGSPINE_GRAPH_COMMUNITIES
    communities: str = ""


@dg.asset(
    name=RELATION_GRAPH, partitions_def=library_partitions, group_name="graph", owners=["team:ragspine"],
    tags={"domain": "retrieval"}, code_version=GRAPH_CODE_VERSION, kinds={"parquet", "python"},
    deps=[dg.AssetKey("chunks")],
    description="Relation graph of the library's served chunks: entities (aliases, parent/subsidiary, peers), "
                "metrics (units, zh/en names, derivations), periods, documents and metric facts, each fact "
                "citing doc_id, chunk_id and the exact source span of its number. RESTRICTED and withheld "
                "chunks contribute nothing. Reused when the chunks version and the dimensions are unchanged.",
    check_specs=[library_check("facts_cite_served_chunks", asset=RELATION_GRAPH,
                               description="Every fact's span lies in a served chunk and reads exactly its "
                                           "quoted figure.")],
)
def relation_graph(context: dg.AssetExecutionContext, config: RelationGraphConfig,
                   warehouse: WarehouseResource) -> dg.MaterializeResult:
    if config.communities.strip().lower() not in ("", "on", "off"):
        raise dg.Failure(f"relation_graph: communities must be on or off, got {config.communities!r}")
    res = build_relation_graph(warehouse.tables(), context.partition_key,
                               relation_extractor=config.relation_extractor or None,
                               communities={"on": True, "off": False}.get(config.communities.strip().lower()))
    md = res.metadata
    checks = [dg.AssetCheckResult(check_name=name, passed=c.passed, asset_key=RELATION_GRAPH,
                                  metadata={k: dg.MetadataValue.json(v) if isinstance(v, list | dict) else v
                                            for k, v in c.metadata.items()})
              for name, c in res.checks.items()]
    if not checks:  # reused: the published version's check already passed when it was written
        checks = [dg.AssetCheckResult(check_name="facts_cite_served_chunks", passed=True, asset_key=RELATION_GRAPH,
                                      metadata={"reused": True})]
    return dg.MaterializeResult(
        metadata={"version": res.published.version, "chunks_version": md["chunks_version"],
                  "reused": bool(md.get("reused")), "n_nodes": md["n_nodes"], "n_edges": md["n_edges"],
                  "node_counts": dg.MetadataValue.json(md["node_counts"]),
                  "edge_counts": dg.MetadataValue.json(md["edge_counts"]),
                  "relation_extractor": md.get("relation_extractor", "none"),
                  "communities": int(md.get("communities", 0))},
        check_results=checks,
    )


GRAPH_ASSETS = [relation_graph]
