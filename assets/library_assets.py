"""Library assets: raw_documents -> chunks -> lexical_index, embeddings, raptor_tree (opt-in)
-> retrieval_snapshot -> catalog.

Each asset is a thin call into ``ragspine_pipeline.warehouse.pipeline`` plus metadata and
check results. Every table is an immutable Parquet version under
``<warehouse>/<asset>/<library>/<version>/``, published by an atomic manifest swap.
(No ``from __future__ import annotations`` here: Dagster reads the context annotation.)
"""

from pathlib import Path

import dagster as dg

from ragspine_pipeline import paths, settings
from ragspine_pipeline.indexing import IndexInputError, step_line, validate_library_name
from ragspine_pipeline.retrieval.link.narrative_link import NarrativeIndexRetriever
from ragspine_pipeline.warehouse import pipeline as P
from ragspine_pipeline.warehouse.embeddings_step import progress_line
from resources import WarehouseResource

from .graph_assets import relation_graph
from .partitions import library_check, library_partitions
from .quality import golden_applies, golden_eval, quality_floor
from .raptor_assets import raptor_tree

OWNERS = ["team:ragspine"]
TAGS = {"domain": "retrieval"}
DEMO = paths.DEMO_ROOT  # the demo corpus ships inside the package

# Bump a code_version when the step's logic changes: the UI marks downstream assets stale
# and a backfill over every library partition rebuilds them.
CODE = {"raw_documents": "3", "chunks": "4", "lexical_index": "5", "embeddings": "3", "retrieval_snapshot": "4",
        "catalog": "4"}


class RawConfig(dg.Config):
    rescan: bool = False  # parse every file again (e.g. after a parser upgrade), not only changed ones


class ChunksConfig(dg.Config):
    # Empty: RAGSPINE_CHUNKER, else paragraph:480:80. Others: layout, laws, qa, book (":MAX:OVERLAP"),
    # parent_child(":PARENT:CHILD:OVERLAP"), sentence_window(":K:MAX"), semantic(":PERCENTILE:MAX").
    chunker: str = ""
    full_checks: bool = False  # re-verify every active chunk, not only the rows this run wrote (an audit)
    # What a document whose file stopped parsing serves meanwhile: "withhold" (nothing; the
    # default, fail closed) or "serve_last_good" (availability first). Empty: RAGSPINE_ON_PARSE_ERROR.
    on_parse_error: str = ""


class EmbeddingsConfig(dg.Config):
    embedding: str = ""  # empty: RAGSPINE_EMBEDDING_BACKEND / RAGSPINE_EMBEDDING (default auto: ONNX if available)
    # Contextual retrieval: embed "title · entity · period · heading" + text (on, off, or a
    # comma list of header fields). Empty: RAGSPINE_CONTEXTUAL (default off). Snippets keep the text.
    contextual: str = ""


class LexicalConfig(dg.Config):
    analyzer: str = ""  # empty: RAGSPINE_ANALYZER or "unicode" (per-script rule; e.g. "unicode:german" pins one language)
    contextual: str = ""  # as EmbeddingsConfig.contextual: the header BM25 indexes; empty: RAGSPINE_CONTEXTUAL


def _step_done(context: dg.AssetExecutionContext, step: str, md: dict) -> None:
    """The step's progress line: the run's log and ``ragspine.progress`` (``ragspine index``)."""
    progress_line(context.log.info)(step_line(context.partition_key, step, md))


def _prune(wh_res: WarehouseResource, asset: str, library: str, protect: set[str] | None = None) -> list[str]:
    # Never the versions a published snapshot names, nor those of the newest snapshot of
    # each other chunking (``ragspine query --chunker`` serves them).
    wh = wh_res.tables()
    keep = set(protect or ()) | P.snapshot_protected(wh, library, asset)
    return wh.prune(asset, library, keep=wh_res.keep_versions, protect=keep, retain_for=wh_res.retain_for())


# Run concurrency: one writer per library. The engine holds a lock file per library for
# each step (a second writer waits, then fails with WarehouseBusy); the run queue allows
# one run per partition (``.dagster_home/dagster.yaml``: tag_concurrency_limits on
# dagster/partition), so two refreshes of one library queue instead of waiting on the lock.


@dg.asset(
    partitions_def=library_partitions, group_name="ingest", owners=OWNERS, tags=TAGS,
    code_version=CODE["raw_documents"], kinds={"parquet", "python"},
    description="Documents of one library folder (.md .txt .html .pdf) with metadata sidecars and "
                "content hashes. Unreadable files become rows with parse_error, never silently dropped.",
    check_specs=[
        library_check("parse_failures_zero", asset="raw_documents",
                      description="Every file of the library parsed. A file that does not is withheld from "
                                  "serving (its last good version stays stored) until it parses again; the "
                                  "check lists each such file by its path in the library."),
        library_check("sensitivity_labels_valid", asset="raw_documents",
                      description="Every document's sensitivity label (sidecar, front matter, HTML meta) is one "
                                  "of the known labels. An unknown, malformed or missing-where-required label "
                                  "is treated as RESTRICTED; the check lists the files."),
    ],
)
def raw_documents(context: dg.AssetExecutionContext, config: RawConfig, warehouse: WarehouseResource) -> dg.MaterializeResult:
    lib = context.partition_key
    try:  # the README's library-name rule holds at this door too (a sensor adds any folder)
        validate_library_name(lib, warehouse.corpus_path() / lib)
    except IndexInputError as exc:
        raise dg.Failure(description=str(exc)) from None
    wh = warehouse.tables()
    with wh.lock(lib):
        res = P.build_raw_documents(wh, warehouse.corpus_path(), lib, rescan=config.rescan)
        _step_done(context, "raw_documents", res.metadata)
        snap = wh.latest(P.SNAPSHOT, lib)
        _prune(warehouse, P.RAW, lib, {snap.manifest["metadata"]["raw_documents"]} if snap else set())
    md = res.metadata
    return dg.MaterializeResult(
        metadata={**{k: md[k] for k in ("documents", "parse_failures", "restricted_documents", "label_problems",
                                        "version", "parsed", "new_files", "changed_files", "deleted_files",
                                        "touched_unchanged", "reused", "bytes_written", "seconds")},
                  "previous_version": str(md["previous_version"]),
                  "failed_files": dg.MetadataValue.json(md["failed_files"]),
                  "invalid_labels": dg.MetadataValue.json(md["invalid_labels"])},
        check_results=_check_results(res.checks),
    )


@dg.asset(
    partitions_def=library_partitions, group_name="index", owners=OWNERS, tags=TAGS,
    code_version=CODE["chunks"], kinds={"parquet", "duckdb"}, deps=[raw_documents],
    description="Versioned chunks (seed semantics): unchanged documents keep their version, changed "
                "ones get version+1, removed ones are withdrawn. Chunker from run config / RAGSPINE_CHUNKER.",
    check_specs=[
        library_check("chunk_text_is_source_substring", asset="chunks",
                      description="Each chunk's text is exactly source[start:end] of its stored document, so "
                                  "every citation points at real characters."),
        library_check("no_orphan_chunks", asset="chunks",
                      description="No active chunk belongs to a document that no longer exists (a document "
                                  "whose file fails to parse keeps its last good version on purpose)."),
        library_check("no_duplicate_active_chunk_ids", asset="chunks",
                      description="Chunk ids are unique and namespaced by their document."),
        library_check("restricted_stays_restricted", asset="chunks",
                      description="No chunk of a RESTRICTED document carries a less restrictive label."),
    ],
)
def chunks(context: dg.AssetExecutionContext, config: ChunksConfig, warehouse: WarehouseResource) -> dg.MaterializeResult:
    lib = context.partition_key
    wh = warehouse.tables()
    with wh.lock(lib):
        res = P.build_chunks(wh, lib, config.chunker or None, full_checks=config.full_checks,
                             on_parse_error=config.on_parse_error or None, executor=warehouse.step_executor(),
                             log=context.log.info)
        snap = wh.latest(P.SNAPSHOT, lib)
        protect = {snap.manifest["metadata"]["chunks"]} if snap else set()
        _prune(warehouse, P.CHUNKS, lib, protect)
    md = res.metadata
    _step_done(context, "chunks", md)
    return dg.MaterializeResult(
        metadata={k: md[k] for k in ("new", "changed", "unchanged", "withdrawn", "rows_written", "segments",
                                      "bytes_written", "active_chunks", "rows_total", "version", "chunker", "reused",
                                      "seconds")}
        | _ray_metadata(md)
        | {"preview": dg.MetadataValue.md(md["preview_md"]),
           "changed_docs": dg.MetadataValue.json({"new": md["new_docs"], "changed": md["changed_docs"],
                                                  "withdrawn": md["withdrawn_docs"]})},
        check_results=_check_results(res.checks),
    )


def _ray_metadata(md: dict) -> dict:
    """The executor and, for a Ray run, its job's figures (cluster address, workers,
    batches, seconds, rows/s) as the engine reports them."""
    return {k: v for k, v in md.items() if (k == "executor" or k.startswith("ray_")) and v is not None}


def _contextual(value: str) -> str | None:
    """The run config's contextual spec (None: RAGSPINE_CONTEXTUAL); a bad one fails the step clearly."""
    from ragspine_pipeline.retrieval.chunking.contextual import contextual_fields

    try:
        contextual_fields(value or None)
    except ValueError as exc:
        raise dg.Failure(str(exc)) from None
    return value or None


def _check_results(checks: dict) -> list[dg.AssetCheckResult]:
    return [dg.AssetCheckResult(check_name=name, passed=bool(c.passed),
                                metadata={k: dg.MetadataValue.json(v) if isinstance(v, list | dict) else v
                                          for k, v in c.metadata.items()})
            for name, c in checks.items()]


@dg.asset(
    partitions_def=library_partitions, group_name="index", owners=OWNERS, tags=TAGS,
    code_version=CODE["lexical_index"], kinds={"parquet", "python"}, deps=[chunks],
    description="Analyzed BM25 tokens of the served chunks, and the published BM25 index and served "
                "chunk records built from them (serving maps both: nothing is rebuilt per process).",
)
def lexical_index(context: dg.AssetExecutionContext, config: LexicalConfig, warehouse: WarehouseResource) -> dg.MaterializeResult:
    lib = context.partition_key
    wh = warehouse.tables()
    with wh.lock(lib):
        res = P.build_lexical_index(wh, lib, config.analyzer or None, contextual=_contextual(config.contextual))
        snap = wh.latest(P.SNAPSHOT, lib)
        _prune(warehouse, P.LEXICAL, lib, {snap.manifest["metadata"]["lexical_index"]} if snap else set())
    _step_done(context, "lexical_index", res.metadata)
    return dg.MaterializeResult(metadata=res.metadata)


@dg.asset(
    partitions_def=library_partitions, group_name="index", owners=OWNERS, tags=TAGS,
    code_version=CODE["embeddings"], kinds={"parquet", "python"}, deps=[chunks],
    description="Dense vectors of the active chunks (incremental: only chunk texts not yet embedded with the "
                "same model id + hash are embedded). With no embedding backend configured this writes "
                "nothing and the library serves pure BM25. RESTRICTED chunks are never embedded.",
    check_specs=[library_check("restricted_never_embedded", asset="embeddings",
                               description="No active RESTRICTED chunk has a vector: its text never reached the "
                                           "embedding model (remote backends included).")],
)
def embeddings(context: dg.AssetExecutionContext, config: EmbeddingsConfig, warehouse: WarehouseResource) -> dg.MaterializeResult:
    from ragspine_pipeline.retrieval.vector.embedding_backends import (
        embedding_spec_from_env,
        make_embedding_backend,
    )

    lib = context.partition_key
    spec = config.embedding or embedding_spec_from_env("auto")
    wh = warehouse.tables()
    with wh.lock(lib):
        res = P.build_embeddings(wh, lib, make_embedding_backend(spec), spec,
                                 contextual=_contextual(config.contextual), log=context.log.info,
                                 executor=warehouse.step_executor())
        if res is None:
            return dg.MaterializeResult(metadata={"backend": "none", "spec": spec, "embedded": 0},
                                        check_results=[dg.AssetCheckResult(
                                            check_name="restricted_never_embedded", passed=True,
                                            metadata={"embedded_restricted": 0, "backend": "none"})])
        snap = wh.latest(P.SNAPSHOT, lib)
        keep = snap.manifest["metadata"].get("embeddings") if snap else None
        _prune(warehouse, P.EMBEDDINGS, lib, {keep} if keep else set())
    _step_done(context, "embeddings", res.metadata)
    return dg.MaterializeResult(metadata={k: v for k, v in res.metadata.items() if v is not None},
                                check_results=_check_results(res.checks))


@dg.asset(
    partitions_def=library_partitions, group_name="serve", owners=OWNERS, tags=TAGS,
    code_version=CODE["retrieval_snapshot"], kinds={"parquet", "python"},
    deps=[lexical_index, embeddings, raptor_tree, relation_graph],
    description="Publishes one consistent version id across the library's index tables; the read-only "
                "RetrievalResource serves exactly what the latest snapshot names.",
    check_specs=[
        library_check("golden_ndcg_above_floor", asset="retrieval_snapshot",
                      description="nDCG@10 of the golden questions is not below the recorded floor."),
        library_check("restricted_never_served", asset="retrieval_snapshot",
                      description="Each RESTRICTED chunk (up to 25) is asked for by its own words; neither it nor "
                                  "any restricted snippet may come back (the served index holds none)."),
    ],
)
def retrieval_snapshot(context: dg.AssetExecutionContext, warehouse: WarehouseResource) -> dg.MaterializeResult:
    lib = context.partition_key
    wh = warehouse.tables()
    with wh.lock(lib):
        res = P.publish_snapshot(wh, lib)
        _prune(warehouse, P.SNAPSHOT, lib)
    _step_done(context, "retrieval_snapshot", res.metadata)
    # The checks query the served index; it is built only when there is something to ask
    # (golden questions about this library, or RESTRICTED chunks to probe for leaks).
    golden_path = DEMO / "golden_queries.json"
    served = P.snapshot_summary(wh, lib)
    needs_golden = golden_applies(golden_path, lib, served["doc_ids"])
    retriever = None
    if needs_golden or served["restricted_chunks"]:
        retriever = NarrativeIndexRetriever(P.load_snapshot_index(wh, lib, glossary=DEMO / "glossary.json"))
    quality = golden_eval(retriever, lib, golden_path) if needs_golden else {"queries": 0}
    floor = quality_floor(Path(settings.get("RAGSPINE_QUALITY_FLOOR_FILE") or DEMO / "quality_floor.json"), lib)
    ndcg = quality.get("ndcg@10")
    passed = floor is None or ndcg is None or ndcg >= floor
    leak = P.restricted_leak_check(wh, lib, retriever) if retriever is not None else None
    return dg.MaterializeResult(
        metadata={**{k: str(v) for k, v in res.metadata.items()}, "golden": dg.MetadataValue.json(quality)},
        check_results=[
            dg.AssetCheckResult(check_name="golden_ndcg_above_floor", passed=passed,
                                metadata={"ndcg@10": ndcg if ndcg is not None else -1.0,
                                          "floor": floor if floor is not None else -1.0,
                                          "queries": quality.get("queries", 0)}),
            dg.AssetCheckResult(check_name="restricted_never_served", passed=leak is None or leak.passed,
                                metadata={"leaks": leak.metadata["leaks"] if leak else 0,
                                          "restricted_probed": leak.metadata["restricted_probed"] if leak else 0,
                                          "restricted_chunks": served["restricted_chunks"]}),
        ],
    )


@dg.asset(
    partitions_def=library_partitions, group_name="serve", owners=OWNERS, tags=TAGS,
    code_version=CODE["catalog"], kinds={"duckdb"}, deps=[retrieval_snapshot],
    description="DuckDB catalog (data/warehouse/catalog.duckdb): a view per published table of every "
                "library, swapped in atomically, for notebooks: duckdb.connect(path, read_only=True). "
                "RESTRICTED and withheld documents have no row in any view (withheld_documents counts them "
                "per library; docs/security.md); catalog_restricted.duckdb (unredacted) is "
                "built only when the warehouse resource's restricted_catalog is set.",
)
def catalog(context: dg.AssetExecutionContext, warehouse: WarehouseResource) -> dg.MaterializeResult:
    wh = warehouse.tables()
    libs = P.published_libraries(wh)
    out = P.build_catalog(wh, libs, warehouse.catalog_path())
    md = {"path": out["path"], "views": dg.MetadataValue.json(out["views"]), "libraries": len(libs),
          "rebuilt": out["rebuilt"], "redacted": out["redacted"], "errors": dg.MetadataValue.json(out["errors"])}
    if warehouse.restricted_catalog:
        md["restricted_catalog"] = P.build_catalog(wh, libs, warehouse.restricted_catalog_path(),
                                                   include_restricted=True)["path"]
    for lib, err in out["errors"].items():
        context.log.warning(f"catalog: library {lib!r} left out: {err}")
    return dg.MaterializeResult(metadata=md)


LIBRARY_ASSETS = [raw_documents, chunks, lexical_index, embeddings, raptor_tree, relation_graph, retrieval_snapshot,
                  catalog]
