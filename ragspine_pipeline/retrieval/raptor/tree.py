"""RAPTOR trees: recursive, deterministic threshold clustering of chunks with a synthesis
node per cluster (Sarthi et al., 2024, "RAPTOR: recursive abstractive processing for
tree-organized retrieval" — here with deterministic clustering and extractive summaries
by default).

Build (``build_raptor_tree``):

1. leaves = the open chunks, in chunk_id order. RESTRICTED chunks (``is_restricted``)
   are dropped before anything else: they contribute no text, vector or lineage to any
   node, nor to any prompt for a summary.
2. each level clusters the previous level's nodes by *leader clustering*: in node order,
   a node joins the most similar cluster whose centroid is at cosine >= ``threshold``
   (and that has room, ``max_cluster``), else opens a new one. Same input, same order,
   same tree: no random seeds.
3. each cluster of two or more nodes becomes an ``is_synthesis`` node: its summary is
   extractive by default (the member sentences nearest the cluster centroid, in reading
   order, up to ``summary_chars``) or written by ``summarizer`` (e.g. an LLM provider);
   it carries the union of its members' lineage (leaf chunk ids, documents). A singleton
   is carried up unchanged.
4. levels repeat until one node remains, nothing merges, or ``max_depth`` is reached.

Vectors are the dense backend's when one is given, else TF-IDF over the analyzer's
tokens, feature-hashed into ``HASH_DIM`` dimensions (deterministic: crc32, not Python's
salted ``hash``).

Incremental: a node's key is a hash of its members' keys (a leaf's key hashes its id and
text), and a rebuild given ``previous`` reuses the summary of every synthesis node whose
key is unchanged (and its vector, when both trees used the same embedding model), so a
1% refresh re-summarises — and re-asks an LLM summarizer for — only the clusters that
changed. The clustering is incremental too: each level keeps the previous clusters
whose members are all unchanged (``kept_clusters``) and clusters only the rest, so a
subtree nothing under which changed is neither re-clustered nor re-summarised (plain
leader clustering is order-dependent and TF-IDF weights move with the corpus: from
scratch, one changed chunk could move many later members). ``rebuild=True`` clusters
from scratch.
"""

from __future__ import annotations

import hashlib
import math
import zlib
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...sensitivity import is_restricted, resolve_label
from ..chunking.chunking import Chunk, sentence_spans
from ..lexical.analysis.analyzer import Analyzer, make_analyzer
from ..vector.embedding_backends import EmbeddingBackend, backend_model_id

DEFAULT_THRESHOLD = 0.35
DEFAULT_DEPTH = 3
DEFAULT_MAX_CLUSTER = 10
DEFAULT_SUMMARY_CHARS = 480
HASH_DIM = 1024
MAX_CANDIDATE_SENTENCES = 64

Summarizer = Callable[[Sequence[str]], str]


class RaptorError(ValueError):
    """A RAPTOR tree cannot be built or searched as asked."""


@dataclass(frozen=True)
class RaptorNode:
    """A tree node: a leaf (one chunk) or a synthesis of a cluster of nodes."""

    node_id: str
    level: int
    text: str
    is_synthesis: bool
    children: tuple[str, ...]      # node ids one level down (empty for a leaf)
    members: tuple[str, ...]       # leaf chunk ids under this node (lineage), sorted
    doc_ids: tuple[str, ...]       # documents of those leaves, sorted
    sensitivity: str
    key: str                       # content key: same members, same texts -> same key
    metadata: Mapping[str, str] = field(default_factory=dict)


@dataclass
class RaptorTree:
    """Nodes by id, level by level (level 0 = the leaves)."""

    levels: list[list[RaptorNode]]
    threshold: float
    max_depth: int
    vectors: dict[str, np.ndarray] = field(default_factory=dict, repr=False)
    reused: int = 0
    note: str = ""
    vector_space: str = ""  # the embedding model id, or "tfidf-hash-<dim>"

    @property
    def nodes(self) -> list[RaptorNode]:
        seen: dict[str, RaptorNode] = {}
        for level in self.levels:
            for n in level:
                seen.setdefault(n.node_id, n)
        return list(seen.values())

    def synthesis_nodes(self) -> list[RaptorNode]:
        return [n for n in self.nodes if n.is_synthesis]

    def shape(self) -> dict[str, Any]:
        """What the UI metadata shows: nodes per level and cluster sizes."""
        syn = [n for n in self.nodes if n.is_synthesis]
        per_level = Counter(n.level for n in syn)
        return {"levels": len(self.levels), "leaves": len(self.levels[0]) if self.levels else 0,
                "nodes_per_level": [len(lv) for lv in self.levels],
                "synthesis_per_level": [per_level.get(i, 0) for i in range(1, len(self.levels))],
                "cluster_sizes": sorted((len(n.children) for n in syn), reverse=True)[:50],
                "threshold": self.threshold, "max_depth": self.max_depth, "reused_nodes": self.reused,
                "note": self.note}

    def to_rows(self) -> list[dict[str, Any]]:
        """One row per node and level, for a Parquet table (lists as lists)."""
        return [{"level": i, "node_id": n.node_id, "text": n.text, "is_synthesis": n.is_synthesis,
                 "children": list(n.children), "members": list(n.members), "doc_ids": list(n.doc_ids),
                 "sensitivity": n.sensitivity, "key": n.key}
                for i, level in enumerate(self.levels) for n in level]


def _unit(m: np.ndarray) -> np.ndarray:
    m = np.asarray(m, dtype=np.float64)
    if m.ndim == 1:
        n = np.linalg.norm(m)
        return m / n if n > 0 else m
    n = np.linalg.norm(m, axis=1, keepdims=True)
    return m / np.where(n == 0, 1, n)


class TfidfHasher:
    """TF-IDF vectors in a fixed hashed space; idf from the leaves it was fitted on."""

    def __init__(self, analyzer: Analyzer, texts: Sequence[str], dim: int = HASH_DIM) -> None:
        self.analyzer = analyzer
        self.dim = dim
        df: Counter[int] = Counter()
        for t in texts:
            df.update({self._slot(tok) for tok in analyzer(t)})
        n = max(len(texts), 1)
        self.idf = np.ones(dim)
        for slot, d in df.items():
            self.idf[slot] = math.log((1 + n) / (1 + d)) + 1.0

    def _slot(self, tok: str) -> int:
        return zlib.crc32(tok.encode()) % self.dim

    def __call__(self, texts: Sequence[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.dim))
        for i, t in enumerate(texts):
            for tok, c in Counter(self._slot(tok) for tok in self.analyzer(t)).items():
                out[i, tok] = (1 + math.log(c)) * self.idf[tok]
        return _unit(out)


def leader_clusters(vecs: np.ndarray, threshold: float, max_cluster: int,
                    seeds: Sequence[Sequence[int]] = ()) -> list[list[int]]:
    """Deterministic threshold clustering of unit vectors (see module docstring): ties go
    to the earliest cluster.

    ``seeds``: clusters formed before (disjoint index lists); the other nodes, in order,
    may join them or open new ones. The result is sorted by each cluster's first member,
    so it reads in node order either way.
    """
    n = len(vecs)
    sums = np.zeros_like(vecs, dtype=np.float64)
    units = np.zeros_like(vecs, dtype=np.float64)
    members: list[list[int]] = []
    seeded: set[int] = set()
    for group in seeds:
        k = len(members)
        members.append(list(group))
        seeded.update(group)
        sums[k] = np.sum(vecs[list(group)], axis=0)
        units[k] = _unit(sums[k])
    for i in range(n):
        if i in seeded:
            continue
        v = vecs[i]
        k = len(members)
        if k:
            sims = units[:k] @ v
            sims[[len(m) >= max_cluster for m in members]] = -np.inf
            best = int(np.argmax(sims))
            if sims[best] >= threshold:
                members[best].append(i)
                sums[best] += v
                units[best] = _unit(sums[best])
                continue
        members.append([i])
        sums[k] = v
        units[k] = _unit(v)
    return sorted((sorted(m) for m in members), key=lambda m: m[0])


def kept_clusters(nodes: Sequence[RaptorNode], previous_level: Sequence[RaptorNode]) -> list[list[int]]:
    """Index lists of the previous tree's clusters at this level (singletons included),
    each reduced to the members still here unchanged (same content keys): the incremental refresh starts
    from them, so a cluster nothing under which changed is kept as it is (same key, same
    summary, not rebuilt), and a changed chunk touches only the cluster it left and the
    one it joins, on each level up its path."""
    at = {n.key: i for i, n in enumerate(nodes)}
    out: list[list[int]] = []
    used: set[int] = set()
    for p in previous_level:
        # A synthesis: its children; a node carried up alone: itself (it stays alone
        # unless a changed or new node joins it).
        keys = p.metadata.get("child_keys", "").split(",") if p.is_synthesis else [p.key]
        idx = sorted({i for k in keys if k and (i := at.get(k)) is not None and i not in used})
        if idx:
            out.append(idx)
            used.update(idx)
    return out


def extractive_summary(texts: Sequence[str], centroid: np.ndarray, embed: Callable[[Sequence[str]], np.ndarray],
                       max_chars: int) -> str:
    """Member sentences nearest the centroid, kept in reading order, up to ``max_chars``."""
    cands: list[str] = []
    per_member = max(1, MAX_CANDIDATE_SENTENCES // max(len(texts), 1))
    for t in texts:
        cands.extend(t[s:e] for s, e in sentence_spans(t, 0, len(t))[:per_member])
    cands = cands[:MAX_CANDIDATE_SENTENCES]
    if not cands:
        return ""
    scores = embed(cands) @ _unit(centroid)
    chosen: list[int] = []
    used = 0
    for i in sorted(range(len(cands)), key=lambda i: (-float(scores[i]), i)):
        if used + len(cands[i]) > max_chars and chosen:
            continue
        chosen.append(i)
        used += len(cands[i]) + 1
        if used >= max_chars:
            break
    return " ".join(cands[i][:max_chars] for i in sorted(chosen))


def _key(parts: Sequence[str]) -> str:
    return hashlib.sha1("\x1f".join(parts).encode()).hexdigest()[:16]


def _shared(values: Sequence[str]) -> str:
    return values[0] if values and all(v == values[0] for v in values) else ""


def build_raptor_tree(
    chunks: Sequence[Chunk],
    *,
    embedding_backend: EmbeddingBackend | None = None,
    analyzer: Analyzer | str | None = None,
    threshold: float = DEFAULT_THRESHOLD,
    max_depth: int = DEFAULT_DEPTH,
    max_cluster: int = DEFAULT_MAX_CLUSTER,
    summary_chars: int = DEFAULT_SUMMARY_CHARS,
    summarizer: Summarizer | None = None,
    previous: RaptorTree | None = None,
    leaf_vectors: Mapping[str, Sequence[float]] | None = None,
    rebuild: bool = False,
) -> RaptorTree:
    """The RAPTOR tree of ``chunks`` (RESTRICTED chunks are left out first).

    ``leaf_vectors`` (chunk_id -> vector of ``embedding_backend``'s model, e.g. the
    library's ``embeddings`` table) spares re-embedding the leaves the pipeline has
    already embedded; a leaf without one is embedded here.

    With ``previous`` (incremental), each level first keeps the previous clusters whose
    members are all unchanged, then clusters the rest (changed, new, or freed nodes may
    join a kept cluster, which is then re-summarised). The result therefore depends on the
    previous tree as well as on the chunks; ``rebuild=True`` clusters from scratch (and
    still reuses unchanged summaries by key).
    """
    if leaf_vectors is not None and embedding_backend is None:
        raise RaptorError("leaf_vectors need the embedding_backend whose model made them (for the summaries)")
    if not 0.0 < threshold <= 1.0:
        raise RaptorError(f"threshold must be in (0, 1] (got {threshold})")
    if max_depth < 1 or max_cluster < 2 or summary_chars <= 0:
        raise RaptorError("max_depth must be >= 1, max_cluster >= 2 and summary_chars > 0")
    open_chunks = sorted((c for c in chunks if not is_restricted(c.sensitivity)), key=lambda c: c.chunk_id)
    if previous is not None and previous.levels and not rebuild:
        # A document that left the open set (withdrawn, withheld, or now RESTRICTED — whole or
        # in part) shaped the previous clusters (leader clustering is order- and content-
        # dependent): keeping them as seeds would carry its influence into the served tree.
        # Cluster from scratch then (summaries are still reused by key where a cluster comes
        # out the same). An edit keeps its document, so a refresh of edits stays incremental.
        prev_leaves = previous.levels[0]
        gone_docs = {d for n in prev_leaves for d in n.doc_ids} - {c.doc_id for c in open_chunks}
        closed = {c.chunk_id for c in chunks if is_restricted(c.sensitivity)} & {n.node_id for n in prev_leaves}
        rebuild = bool(gone_docs or closed)
    if embedding_backend is not None:
        def embed(texts: Sequence[str]) -> np.ndarray:
            return _unit(np.asarray(embedding_backend.embed_texts(list(texts)), dtype=np.float64))
        space = backend_model_id(embedding_backend)
    else:
        embed = TfidfHasher(make_analyzer(analyzer), [c.text for c in open_chunks])
        space = f"tfidf-hash-{HASH_DIM}"
    old = {n.key: n for n in previous.nodes} if previous is not None else {}
    # Vectors are reused only from the same model: TF-IDF weights move with the corpus
    # (idf), so those are recomputed (cheap); summaries are reused by key either way.
    old_vecs = previous.vectors if previous is not None and previous.vector_space == space and \
        embedding_backend is not None else {}
    tree = RaptorTree(levels=[], threshold=threshold, max_depth=max_depth, vector_space=space)
    leaves = [RaptorNode(c.chunk_id, 0, c.text, False, (), (c.chunk_id,), (c.doc_id,), c.sensitivity,
                         _key([c.chunk_id, c.text]), {"title": c.title, "entity": c.entity, "period": c.period})
              for c in open_chunks]
    tree.levels.append(leaves)
    if not leaves:
        tree.note = "no open chunks"
        return tree
    vec: dict[str, np.ndarray] = {}
    todo = []
    for n in leaves:
        prev = old.get(n.key)
        if leaf_vectors is not None and n.node_id in leaf_vectors:
            vec[n.node_id] = _unit(np.asarray(leaf_vectors[n.node_id], dtype=np.float64))
        elif prev is not None and prev.node_id in old_vecs:
            vec[n.node_id] = old_vecs[prev.node_id]
        else:
            todo.append(n)
    if todo:
        for n, v in zip(todo, embed([n.text for n in todo]), strict=True):
            vec[n.node_id] = v
    current = leaves
    for level in range(1, max_depth + 1):
        if len(current) <= 1:
            tree.note = "one root"
            break
        mat = np.stack([vec[n.node_id] for n in current])
        seeds = kept_clusters(current, previous.levels[level]) if previous is not None and \
            level < len(previous.levels) and not rebuild else []
        clusters = leader_clusters(mat, threshold, max_cluster, seeds)
        if all(len(c) == 1 for c in clusters):
            tree.note = f"nothing merges at level {level} (threshold {threshold})"
            break
        nxt: list[RaptorNode] = []
        for members in clusters:
            if len(members) == 1:
                nxt.append(current[members[0]])
                continue
            kids = [current[i] for i in members]
            key = _key([k.key for k in kids])
            leaf_ids = tuple(sorted({m for k in kids for m in k.members}))
            docs = tuple(sorted({d for k in kids for d in k.doc_ids}))
            label = resolve_label([k.sensitivity for k in kids], default="INTERNAL").label
            node_id = f"raptor:L{level}:{key}"  # content-addressed: a kept cluster keeps its id
            prev = old.get(key)
            if prev is not None and prev.is_synthesis and (summarizer is None) == (prev.metadata.get("summary") != "llm"):
                text = prev.text
                v = old_vecs[prev.node_id] if prev.node_id in old_vecs else (embed([text])[0] if text else None)
                if v is None:
                    v = _unit(np.sum(np.stack([vec[k.node_id] for k in kids]), axis=0))
                tree.reused += 1
            else:
                centroid = np.sum(np.stack([vec[k.node_id] for k in kids]), axis=0)
                texts = [k.text for k in kids]
                text = summarizer(texts) if summarizer is not None else extractive_summary(
                    texts, centroid, embed, summary_chars)
                v = embed([text])[0] if text else _unit(centroid)
            md = {f: _shared([k.metadata.get(f, "") for k in kids]) for f in ("title", "entity", "period")}
            md["summary"] = "llm" if summarizer is not None else "extractive"
            md["child_keys"] = ",".join(k.key for k in kids)  # what the next refresh keeps the cluster by
            node = RaptorNode(node_id, level, text, True, tuple(k.node_id for k in kids), leaf_ids, docs, label,
                              key, md)
            vec[node_id] = v
            nxt.append(node)
        tree.levels.append(nxt)
        current = nxt
    else:
        tree.note = f"depth limit {max_depth}"
    tree.vectors = vec
    return tree


def provider_summarizer(provider: Any, *, max_words: int = 80) -> Summarizer:
    """A summarizer that asks an LLM provider (``chat(messages) -> str``) for one
    paragraph over the member texts (which never include RESTRICTED text: the tree
    drops those chunks before clustering)."""
    if not callable(getattr(provider, "chat", None)):
        raise TypeError(f"{type(provider).__name__} is not an LLM provider: it needs chat(messages)")

    def summarize(texts: Sequence[str]) -> str:
        body = "\n\n".join(f"[{i + 1}] {t}" for i, t in enumerate(texts))
        return provider.chat([
            {"role": "system", "content": f"Summarize the passages in at most {max_words} words. Use only facts "
                                          "stated in them; add nothing."},
            {"role": "user", "content": body}]).strip()

    return summarize
