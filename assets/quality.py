"""Golden-question quality floor for a published snapshot (eval issue, item 4)."""

import json
from pathlib import Path
from typing import Any

from ragspine_pipeline.eval.metrics import dedupe_keep_best, mean_metrics
from ragspine_pipeline.retrieval.link.narrative_link import NarrativeIndexRetriever


def golden_eval(retriever: NarrativeIndexRetriever, library: str, golden_path: Path) -> dict[str, Any]:
    """nDCG@10 / MRR@10 of the golden questions whose judged documents are in ``library``."""
    if not golden_path.exists():
        return {"queries": 0}
    golden = json.loads(golden_path.read_text(encoding="utf-8"))
    docs = {c.doc_id for c in retriever.index.retriever.chunks}
    runs, qrels = {}, {}
    for i, g in enumerate(golden):
        rel = {f"{library}/{d}": 1 for d in g["relevant"] if f"{library}/{d}" in docs}
        if not rel:
            continue
        snippets = retriever.retrieve(g["query"], filters=g.get("filters"), top_k=30)
        runs[str(i)] = dedupe_keep_best([s["doc_id"] for s in snippets])
        qrels[str(i)] = rel
    if not qrels:
        return {"queries": 0}
    return {"queries": len(qrels), **mean_metrics(runs, qrels)}


def golden_applies(golden_path: Path, library: str, doc_ids: set[str]) -> bool:
    """Whether any golden question judges a document of ``library`` (else there is nothing to score)."""
    if not golden_path.exists():
        return False
    golden = json.loads(golden_path.read_text(encoding="utf-8"))
    return any(f"{library}/{d}" in doc_ids for g in golden for d in g["relevant"])


def quality_floor(path: Path, library: str) -> float | None:
    if not path.exists():
        return None
    floors = json.loads(path.read_text(encoding="utf-8"))
    value = floors.get(library)
    return float(value) if value is not None else None
