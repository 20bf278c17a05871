"""The ``raptor_tree`` step: a library's RAPTOR tree as a versioned Parquet table.

Input: the served chunks of a chunks version (active, not withheld, not RESTRICTED —
``served_chunks``), so no restricted chunk contributes text, a vector or lineage to any
node. Output: one ``nodes`` table (every node, level by level: text, children, member
chunk ids, documents, label, content key, vector) and metadata with the tree's shape
(nodes per level, cluster sizes) for the UI.

Incremental: the previous version's tree is read back and passed as ``previous``, so
clusters whose members did not change keep their summaries (and, with the same dense
model, their vectors); a step over an unchanged chunks version with the same settings
reuses the published version. The Dagster asset that calls this (``raptor_tree``, one per
library partition, off unless ``RAGSPINE_RAPTOR=on``) lives in ``assets/``.
"""

from __future__ import annotations

import time

import numpy as np
import pyarrow as pa

from ..retrieval.raptor.tree import RaptorNode, RaptorTree, Summarizer, build_raptor_tree
from ..retrieval.vector.embedding_backends import EmbeddingBackend
from ..sensitivity import is_restricted
from .chunk_tables import published_chunks, served_chunks
from .common import CheckOutcome, StepResult
from .versioned import Published, VersionedTables, library_step

RAPTOR = "raptor_tree"

NODE_SCHEMA = pa.schema([
    ("level", pa.int32()), ("node_id", pa.string()), ("text", pa.large_string()), ("is_synthesis", pa.bool_()),
    ("children", pa.list_(pa.string())), ("members", pa.list_(pa.string())), ("doc_ids", pa.list_(pa.string())),
    ("sensitivity", pa.string()), ("key", pa.string()), ("title", pa.string()), ("entity", pa.string()),
    ("period", pa.string()), ("summary", pa.string()), ("vector", pa.list_(pa.float32())),
])


def tree_table(tree: RaptorTree) -> pa.Table:
    rows = []
    for i, level in enumerate(tree.levels):
        for n in level:
            v = tree.vectors.get(n.node_id)
            rows.append({"level": i, "node_id": n.node_id, "text": n.text, "is_synthesis": n.is_synthesis,
                         "children": list(n.children), "members": list(n.members), "doc_ids": list(n.doc_ids),
                         "sensitivity": n.sensitivity, "key": n.key, "title": n.metadata.get("title", ""),
                         "entity": n.metadata.get("entity", ""), "period": n.metadata.get("period", ""),
                         "summary": n.metadata.get("summary", ""),
                         "vector": None if v is None else np.asarray(v, dtype=np.float32).tolist()})
    return pa.Table.from_pylist(rows, schema=NODE_SCHEMA)


def load_tree(pub: Published, wh: VersionedTables) -> RaptorTree:
    """A published tree read back (levels, nodes, vectors) — the ``previous`` of a rebuild."""
    t = wh.read(RAPTOR, pub.library, "nodes", pub.version)
    meta = pub.manifest["metadata"]
    levels: list[list[RaptorNode]] = []
    vectors: dict[str, np.ndarray] = {}
    for r in t.to_pylist():
        while len(levels) <= r["level"]:
            levels.append([])
        md = {k: r[k] for k in ("title", "entity", "period", "summary") if r[k]}
        levels[r["level"]].append(RaptorNode(r["node_id"], r["level"] if r["is_synthesis"] else 0, r["text"],
                                             r["is_synthesis"], tuple(r["children"]), tuple(r["members"]),
                                             tuple(r["doc_ids"]), r["sensitivity"], r["key"], md))
        if r["vector"] is not None:
            vectors[r["node_id"]] = np.asarray(r["vector"], dtype=np.float64)
    return RaptorTree(levels, float(meta["threshold"]), int(meta["max_depth"]), vectors,
                      vector_space=meta.get("vector_space", ""))


@library_step
def build_raptor_step(wh: VersionedTables, library: str, chunks_version: str | None = None, *,
                      threshold: float, max_depth: int, embedding_backend: EmbeddingBackend | None = None,
                      summarizer: Summarizer | None = None) -> StepResult:
    """Build (or reuse) the RAPTOR tree of a chunks version (default: the latest)."""
    t0 = time.perf_counter()
    chunks_pub = published_chunks(wh, library, chunks_version)
    prev = wh.latest(RAPTOR, library)
    settings = {"threshold": threshold, "max_depth": max_depth, "summary": "llm" if summarizer else "extractive"}
    pmeta = prev.manifest["metadata"] if prev is not None else {}
    chunks = served_chunks(wh, library, chunks_pub.version)
    served = {c.chunk_id for c in chunks}
    if prev is not None and pmeta.get("chunks_version") == chunks_pub.version and \
            all(pmeta.get(k) == v for k, v in settings.items()) and embedding_backend is None \
            and pmeta.get("vector_space", "").startswith("tfidf"):
        tree = load_tree(prev, wh)
        pub, reused = prev, True
    else:
        previous = load_tree(prev, wh) if prev is not None else None
        tree = build_raptor_tree(chunks, embedding_backend=embedding_backend, threshold=threshold,
                                 max_depth=max_depth, summarizer=summarizer, previous=previous)
        meta = {"chunks_version": chunks_pub.version, **settings, "vector_space": tree.vector_space,
                **{k: v for k, v in tree.shape().items() if k not in ("threshold", "max_depth")}}
        pub, reused = wh.write(RAPTOR, library, {"nodes": tree_table(tree)}, meta), False
    syn = tree.synthesis_nodes()
    leaked = [n.node_id for n in tree.nodes if is_restricted(n.sensitivity) or not set(n.members) <= served]
    by_id = {n.node_id: n for n in tree.nodes}
    bad_lineage = [n.node_id for n in syn
                   if set(n.members) != {m for c in n.children if c in by_id for m in by_id[c].members}]
    md = {**pub.manifest["metadata"], "version": pub.version, "reused": reused,
          "seconds": round(time.perf_counter() - t0, 3)}
    checks = {
        # Every node's lineage is served chunks only: nothing restricted or withheld in the tree.
        "raptor_no_restricted": CheckOutcome(not leaked, {"nodes": leaked[:20]}),
        # A synthesis node carries exactly the union of its children's lineage.
        "raptor_lineage_union": CheckOutcome(not bad_lineage, {"nodes": bad_lineage[:20],
                                                               "synthesis_nodes": len(syn)}),
    }
    return StepResult(pub, md, checks)

