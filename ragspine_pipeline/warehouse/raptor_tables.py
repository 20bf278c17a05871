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
from collections.abc import Mapping, Sequence
from dataclasses import replace

import numpy as np
import pyarrow as pa

from ..retrieval.raptor.retriever import RaptorRetriever, make_raptor_retriever
from ..retrieval.raptor.tree import (
    HASH_DIM,
    RaptorError,
    RaptorNode,
    RaptorTree,
    Summarizer,
    build_raptor_tree,
)
from ..retrieval.vector.embedding_backends import (
    EmbeddingBackend,
    backend_model_id,
    make_embedding_backend,
)
from ..sensitivity import is_restricted
from .chunk_tables import published_chunks, served_chunks
from .common import (  # RAPTOR re-exported: its asset name
    EMBEDDINGS,
    RAPTOR,
    SNAPSHOT,
    CheckOutcome,
    StepResult,
)
from .snapshots import _served_now, select_snapshot
from .versioned import Published, VersionedTables, library_step, read_segments

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
    # The children's content keys (what an incremental refresh keeps a cluster by).
    keys = {n.node_id: n.key for level in levels for n in level}
    levels = [[replace(n, metadata={**n.metadata, "child_keys": ",".join(keys[c] for c in n.children if c in keys)})
               if n.is_synthesis else n for n in level] for level in levels]
    return RaptorTree(levels, float(meta["threshold"]), int(meta["max_depth"]), vectors,
                      vector_space=meta.get("vector_space", ""))


INCREMENTAL_NOTE = ("summaries (and dense vectors) are reused by content key: a cluster whose members did not "
                    "change is not re-summarised; the clustering itself is recomputed (leader clustering is "
                    "order-dependent and TF-IDF weights move with the corpus), which is cheap")


@library_step
def build_raptor_step(wh: VersionedTables, library: str, chunks_version: str | None = None, *,
                      threshold: float, max_depth: int, embedding_backend: EmbeddingBackend | None = None,
                      summarizer: Summarizer | None = None,
                      leaf_vectors: Mapping[str, Sequence[float]] | None = None) -> StepResult:
    """Build (or reuse) the RAPTOR tree of a chunks version (default: the latest).

    ``leaf_vectors``: the library's embeddings of these chunks (same model as
    ``embedding_backend``), so the leaves are not embedded a second time.
    """
    t0 = time.perf_counter()
    chunks_pub = published_chunks(wh, library, chunks_version)
    prev = wh.latest(RAPTOR, library)
    settings = {"threshold": threshold, "max_depth": max_depth, "summary": "llm" if summarizer else "extractive"}
    space = backend_model_id(embedding_backend) if embedding_backend is not None else f"tfidf-hash-{HASH_DIM}"
    pmeta = prev.manifest["metadata"] if prev is not None else {}
    chunks = served_chunks(wh, library, chunks_pub.version)
    served = {c.chunk_id for c in chunks}
    if prev is not None and pmeta.get("chunks_version") == chunks_pub.version and \
            all(pmeta.get(k) == v for k, v in settings.items()) and pmeta.get("vector_space", "") == space:
        tree = load_tree(prev, wh)
        pub, reused = prev, True
    else:
        previous = load_tree(prev, wh) if prev is not None else None
        tree = build_raptor_tree(chunks, embedding_backend=embedding_backend, threshold=threshold,
                                 max_depth=max_depth, summarizer=summarizer, previous=previous,
                                 leaf_vectors=leaf_vectors)
        syn = len(tree.synthesis_nodes())
        meta = {"chunks_version": chunks_pub.version, **settings, "vector_space": tree.vector_space,
                **{k: v for k, v in tree.shape().items() if k not in ("threshold", "max_depth")},
                "synthesis_nodes": syn, "resummarised_nodes": syn - tree.reused,
                "previous_version": prev.version if prev is not None else None, "incremental": INCREMENTAL_NOTE}
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


def embeddings_for_raptor(wh: VersionedTables, library: str, chunks_version: str | None = None
                          ) -> tuple[EmbeddingBackend | None, dict[str, Sequence[float]] | None]:
    """(backend, chunk_id -> vector) of the library's embeddings of ``chunks_version``
    (default: the latest), or (None, None) when it has none: the tree then clusters
    TF-IDF vectors. Builds the backend the embeddings were made with (the model id must
    match, or the vector spaces would mix)."""
    chunks_pub = published_chunks(wh, library, chunks_version)
    emb = wh.latest(EMBEDDINGS, library)
    if emb is None or emb.manifest["metadata"].get("chunks_version") != chunks_pub.version:
        return None, None
    backend = make_embedding_backend(emb.manifest["metadata"]["spec"])
    if backend is None or backend_model_id(backend) != emb.manifest["metadata"].get("model_id"):
        return None, None
    t = read_segments(emb, "vectors", columns=["chunk_id", "vector"])
    return backend, dict(zip(t.column("chunk_id").to_pylist(), t.column("vector").to_pylist(), strict=True))


def load_snapshot_raptor(wh: VersionedTables, library: str, *, mode: str | None = None,
                         chunker: str | None = None, embedding_backend: EmbeddingBackend | None = None
                         ) -> RaptorRetriever:
    """A ``RaptorRetriever`` over the tree the library's published snapshot names (or the
    newest snapshot of ``chunker``), served as built: nothing is clustered or summarised.

    Leaves are the snapshot's served chunks, less the documents the current snapshot
    hides; a synthesis over any member that is not served is not searchable. Raises
    RaptorError when the snapshot has no tree (RAPTOR was off when it was published).
    """
    snap = select_snapshot(wh, library, chunker)
    meta = snap.manifest["metadata"]
    if meta.get("raptor_tree") in (None, "None"):
        raise RaptorError(f"snapshot {snap.version} of {library!r} has no RAPTOR tree: materialize raptor_tree with "
                          "RAGSPINE_RAPTOR=on (or its run config enabled: on), then retrieval_snapshot")
    chunks = served_chunks(wh, library, meta["chunks"])
    cur = wh.latest(SNAPSHOT, library)
    if cur is not None and cur.version != snap.version:
        chunks = _served_now(wh, library, chunks)
    tree = load_tree(wh.get(RAPTOR, library, meta["raptor_tree"]), wh)
    return make_raptor_retriever(chunks, tree=tree, mode=mode, analyzer=meta.get("analyzer"),
                                 embedding_backend=embedding_backend)
