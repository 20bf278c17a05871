"""Optional reranker assets (thin: the engine is ragspine_pipeline.warehouse.rerank_vectors
and .page_images). Both are opt-in and do nothing unless configured.

- ``rerank_document_vectors``: SPLADE vectors / late-interaction token matrices of every
  served chunk, for the rerankers named in the config or ``RAGSPINE_RERANK_VECTORS``
  (``splade,colbert``), for the libraries named in ``libraries`` /
  ``RAGSPINE_RERANK_VECTOR_LIBRARIES`` (empty: every library). A refresh encodes only new
  or changed chunk texts. The ``RetrievalResource`` serves from them when present.
- ``page_images``: PDF pages rendered (pypdfium2) and embedded into patch vectors, only
  when ``RAGSPINE_VISUAL_EMBEDDER`` is set; ``colpali`` without weights or a GPU fails
  with the message that names what is missing.

(No ``from __future__ import annotations`` here: Dagster reads the context annotation.)
"""


import dagster as dg

from ragspine_pipeline import settings
from resources import WarehouseResource

from .library_assets import OWNERS, TAGS, retrieval_snapshot
from .partitions import library_check, library_partitions

VECTORS_ENV = "RAGSPINE_RERANK_VECTORS"
VECTOR_LIBRARIES_ENV = "RAGSPINE_RERANK_VECTOR_LIBRARIES"
PRECOMPUTABLE = ("splade", "colbert")


class RerankVectorsConfig(dg.Config):
    rerankers: str = ""  # comma list of splade, colbert; empty: RAGSPINE_RERANK_VECTORS (default: none)
    libraries: str = ""  # comma list of library ids that opt in; empty: RAGSPINE_RERANK_VECTOR_LIBRARIES, else all


def _names(raw: str) -> list[str]:
    return [n.strip().lower() for n in raw.split(",") if n.strip()]


@dg.asset(
    partitions_def=library_partitions, group_name="serve", owners=OWNERS, tags=TAGS,
    code_version="1", kinds={"duckdb", "python"}, deps=[retrieval_snapshot],
    description="Precomputed passage encodings for the SPLADE / late-interaction rerankers (opt-in: "
                "RAGSPINE_RERANK_VECTORS). Only new or changed chunk texts are encoded; RESTRICTED chunks never.",
    check_specs=[library_check("restricted_never_encoded", asset="rerank_document_vectors",
                               description="No stored vector is of a RESTRICTED chunk's text, and no row "
                                           "carries a restricted label.")],
)
def rerank_document_vectors(context: dg.AssetExecutionContext, config: RerankVectorsConfig,
                            warehouse: WarehouseResource) -> dg.MaterializeResult:
    from ragspine_pipeline.retrieval.rerank import make_reranker
    from ragspine_pipeline.warehouse.rerank_vectors import (
        build_rerank_vectors,
        restricted_never_encoded_check,
    )

    lib = context.partition_key
    names = _names(config.rerankers or settings.get(VECTORS_ENV, error=dg.Failure) or "")
    bad = [n for n in names if n not in PRECOMPUTABLE]
    if bad:
        raise dg.Failure(f"{VECTORS_ENV}: {bad} have no document vectors; use {', '.join(PRECOMPUTABLE)}")
    libs = _names(config.libraries or ",".join(settings.get(VECTOR_LIBRARIES_ENV) or ()))
    wh = warehouse.tables()
    if not names or (libs and lib.lower() not in libs):
        check = restricted_never_encoded_check(wh, lib)
        return dg.MaterializeResult(metadata={"rerankers": "none (not opted in)", "encoded": 0},
                                    check_results=[dg.AssetCheckResult(check_name="restricted_never_encoded",
                                                                       passed=check.passed, metadata=check.metadata)])
    out = build_rerank_vectors(wh, lib, {n: make_reranker(n) for n in names})
    check = restricted_never_encoded_check(wh, lib)
    md = {"path": out["path"], "chunks": out["chunks"]}
    for name, r in out["reports"].items():
        md.update({f"{name}_model": r.model_id, f"{name}_encoded": r.encoded, f"{name}_reused": r.reused,
                   f"{name}_removed": r.removed})
    return dg.MaterializeResult(metadata=md, check_results=[dg.AssetCheckResult(
        check_name="restricted_never_encoded", passed=check.passed,
        metadata={k: dg.MetadataValue.json(v) if isinstance(v, list | dict) else v for k, v in check.metadata.items()})])


class PageImagesConfig(dg.Config):
    scale: float = 1.0  # pypdfium2 render scale (1.0 = 72 dpi)


@dg.asset(
    partitions_def=library_partitions, group_name="index", owners=OWNERS, tags=TAGS,
    code_version="2", kinds={"parquet", "python"}, deps=[retrieval_snapshot],
    description="PDF pages rendered and embedded into patch vectors for the visual slot, only when "
                "RAGSPINE_VISUAL_EMBEDDER is set. Only documents the published snapshot serves whole are "
                "rendered (RESTRICTED, partly restricted, withheld and redacted ones never); hits are page "
                "references (is_visual), never citable facts.",
    check_specs=[library_check("restricted_pages_excluded", asset="page_images",
                               description="No published page belongs to a RESTRICTED document.")],
)
def page_images(context: dg.AssetExecutionContext, config: PageImagesConfig,
                warehouse: WarehouseResource) -> dg.MaterializeResult:
    from ragspine_pipeline.retrieval.rerank.visual import (
        VisualEmbedderUnavailable,
        make_visual_embedder,
    )
    from ragspine_pipeline.warehouse.page_images import build_page_images, restricted_pages_check

    lib = context.partition_key
    wh = warehouse.tables()
    try:
        embedder = make_visual_embedder()
    except VisualEmbedderUnavailable as exc:
        raise dg.Failure(str(exc)) from None
    if embedder is None:
        check = restricted_pages_check(wh, lib)
        return dg.MaterializeResult(metadata={"visual_embedder": "none (RAGSPINE_VISUAL_EMBEDDER unset)", "pages": 0},
                                    check_results=[dg.AssetCheckResult(check_name="restricted_pages_excluded",
                                                                       passed=check.passed,
                                                                       metadata={"restricted_pages": 0})])
    try:
        res = build_page_images(wh, warehouse.corpus_path(), lib, embedder, scale=config.scale)
    except VisualEmbedderUnavailable as exc:
        raise dg.Failure(str(exc)) from None
    check = res.checks["restricted_pages_excluded"]
    return dg.MaterializeResult(
        metadata={k: dg.MetadataValue.json(v) if isinstance(v, list | dict) else v for k, v in res.metadata.items()},
        check_results=[dg.AssetCheckResult(check_name="restricted_pages_excluded", passed=check.passed,
                                           metadata={k: dg.MetadataValue.json(v) if isinstance(v, list) else v
                                                     for k, v in check.metadata.items()})])


RERANK_ASSETS = [rerank_document_vectors, page_images]
