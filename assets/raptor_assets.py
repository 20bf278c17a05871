"""The ``raptor_tree`` asset: a thin call into ``ragspine_pipeline.warehouse.raptor_tables``.

Per library, after ``chunks`` and ``embeddings``: the RAPTOR tree of the library's served
chunks (RESTRICTED and withheld chunks never enter it), as Parquet levels under
``<warehouse>/raptor_tree/<library>/<version>/``; the tree's shape (nodes per level,
cluster sizes, reused summaries) goes to the UI metadata, and ``retrieval_snapshot``
names the tree so ``load_snapshot_raptor`` / ``RetrievalResource.raptor_retriever``
serve exactly it.

Opt-in: off unless ``RAGSPINE_RAPTOR=on`` or the run config says ``enabled: on``. Off,
the asset still runs (so the snapshot after it is never skipped) but builds and writes
nothing and says so in its metadata (``enabled: false``); the snapshot then names no tree
and serving is byte-identical to a pipeline without RAPTOR.
(No ``from __future__ import annotations`` here: Dagster reads the context annotation.)
"""

import dagster as dg

from ragspine_pipeline.retrieval.raptor import (
    RaptorError,
    provider_summarizer,
    raptor_enabled,
    raptor_settings,
)
from ragspine_pipeline.warehouse import pipeline as P
from ragspine_pipeline.warehouse.raptor_tables import (
    RAPTOR,
    build_raptor_step,
    embeddings_for_raptor,
)
from resources import WarehouseResource

from .partitions import library_check, library_partitions

RAPTOR_CODE_VERSION = "1"
CHECKS = ("raptor_no_restricted", "raptor_lineage_union")


class RaptorConfig(dg.Config):
    enabled: str = ""  # on / off; empty: RAGSPINE_RAPTOR (default off)
    threshold: float = 0.0  # cosine threshold of the clustering; 0: RAGSPINE_RAPTOR_THRESHOLD or 0.35
    max_depth: int = 0  # levels above the leaves; 0: RAGSPINE_RAPTOR_DEPTH or 3
    # "extractive" (default: sentences nearest each cluster's centroid) or "llm" (the
    # OpenAI-compatible provider of RAGSPINE_LLM_BASE_URL writes each summary).
    summary: str = "extractive"


def _summarizer(kind: str):
    kind = (kind or "extractive").strip().lower()
    if kind == "extractive":
        return None
    if kind != "llm":
        raise dg.Failure(f"raptor_tree summary must be 'extractive' or 'llm', not {kind!r}")
    from ragspine_pipeline.llm.provider import provider_from_env

    provider = provider_from_env()
    if provider is None:
        raise dg.Failure("raptor_tree summary 'llm' needs an LLM provider: set RAGSPINE_LLM_BASE_URL")
    return provider_summarizer(provider)


@dg.asset(
    name=RAPTOR, partitions_def=library_partitions, group_name="index", owners=["team:ragspine"],
    tags={"domain": "retrieval"}, code_version=RAPTOR_CODE_VERSION, kinds={"parquet", "python"},
    deps=[dg.AssetKey("chunks"), dg.AssetKey("embeddings")],
    description="RAPTOR tree of the library's served chunks (opt-in: RAGSPINE_RAPTOR=on or config enabled: on): "
                "deterministic threshold clustering of the chunk embeddings (TF-IDF vectors without a dense "
                "backend), one is_synthesis summary per cluster carrying the union of its members' lineage, "
                "levels until one cluster or the depth limit. Unchanged clusters keep their summaries. Off: "
                "builds nothing and says so.",
    check_specs=[
        library_check("raptor_no_restricted", asset=RAPTOR,
                      description="No node's text or lineage comes from a RESTRICTED or withheld chunk."),
        library_check("raptor_lineage_union", asset=RAPTOR,
                      description="Each synthesis node carries exactly the union of its children's lineage."),
    ],
)
def raptor_tree(context: dg.AssetExecutionContext, config: RaptorConfig,
                warehouse: WarehouseResource) -> dg.MaterializeResult:
    lib = context.partition_key
    try:
        on = raptor_enabled(config.enabled or None)
        _, depth, threshold = raptor_settings(None, config.max_depth or None, config.threshold or None)
    except RaptorError as exc:
        raise dg.Failure(str(exc)) from None
    if not on:
        return dg.MaterializeResult(
            metadata={"enabled": False,
                      "note": "RAPTOR is off (RAGSPINE_RAPTOR / run config raptor_tree.config.enabled): no tree "
                              "built or written; the snapshot names none"},
            check_results=[dg.AssetCheckResult(check_name=c, passed=True, asset_key=RAPTOR,
                                               metadata={"skipped": "RAPTOR is off"}) for c in CHECKS])
    summarizer = _summarizer(config.summary)
    wh = warehouse.tables()
    with wh.lock(lib):
        backend, leaf_vectors = embeddings_for_raptor(wh, lib)
        res = build_raptor_step(wh, lib, threshold=threshold, max_depth=depth, embedding_backend=backend,
                                summarizer=summarizer, leaf_vectors=leaf_vectors)
        keep = {res.published.version} | P.snapshot_protected(wh, lib, RAPTOR)
        wh.prune(RAPTOR, lib, keep=warehouse.keep_versions, protect=keep, retain_for=warehouse.retain_for())
    md = res.metadata
    return dg.MaterializeResult(
        metadata={"enabled": True, "version": res.published.version, "chunks_version": md["chunks_version"],
                  "reused": bool(md["reused"]), "vector_space": md.get("vector_space", ""),
                  "levels": md["levels"], "leaves": md["leaves"],
                  "nodes_per_level": dg.MetadataValue.json(md["nodes_per_level"]),
                  "synthesis_per_level": dg.MetadataValue.json(md["synthesis_per_level"]),
                  "cluster_sizes": dg.MetadataValue.json(md["cluster_sizes"]),
                  "reused_nodes": md.get("reused_nodes", 0), "resummarised_nodes": md.get("resummarised_nodes", 0),
                  "threshold": md["threshold"], "max_depth": md["max_depth"], "summary": md["summary"],
                  "note": md.get("note", ""), "incremental": md.get("incremental", ""), "seconds": md["seconds"],
                  "shape": dg.MetadataValue.md(_shape_md(md))},
        check_results=[dg.AssetCheckResult(check_name=name, passed=bool(c.passed), asset_key=RAPTOR,
                                           metadata={k: dg.MetadataValue.json(v) if isinstance(v, list | dict) else v
                                                     for k, v in c.metadata.items()})
                       for name, c in res.checks.items()],
    )


def _shape_md(md: dict) -> str:
    """The tree's shape as a small markdown table for the UI."""
    rows = ["| level | nodes | syntheses |", "|---|---|---|"]
    syn = [0, *md["synthesis_per_level"]]
    rows += [f"| {i} | {n} | {syn[i] if i < len(syn) else 0} |" for i, n in enumerate(md["nodes_per_level"])]
    return "\n".join(rows)


RAPTOR_ASSETS = [raptor_tree]
