"""Retrieval over a RAPTOR tree: leaves (detail), internal nodes (themes) or both.

``make_raptor_retriever(chunks, ...)`` builds the tree and a ``RaptorRetriever``; the
``RAGSPINE_RAPTOR_*`` variables give the defaults: ``_MODE`` (``collapsed``: every node
in one index, as RAPTOR's collapsed-tree retrieval; ``leaves``; ``internal``), ``_DEPTH``
and ``_THRESHOLD``. ``RAGSPINE_RAPTOR`` (``off`` by default) is the switch the pipeline
reads to build a tree at all (``raptor_enabled``).

A synthesis snippet is never a citable fact: it says ``is_synthesis: true``, has no
``doc_id`` / ``source_locator`` of its own, and ``cites`` the source locators of the
leaf chunks it summarises. RESTRICTED: the tree holds no restricted chunk, and hits are
filtered with ``is_restricted`` again before any snippet exists (defence in depth).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ... import settings
from ...sensitivity import is_restricted
from ..chunking.chunking import Chunk, SourceLocator
from ..hybrid.retriever import HybridRetriever
from ..lexical.analysis.analyzer import Analyzer
from ..limits import check_query
from ..link.narrative_link import build_snippet
from ..vector.embedding_backends import EmbeddingBackend
from .tree import (
    RaptorError,
    RaptorNode,
    RaptorTree,
    Summarizer,
    build_raptor_tree,
    provider_summarizer,
)

RAPTOR_ENV = "RAGSPINE_RAPTOR"
MODE_ENV = "RAGSPINE_RAPTOR_MODE"
DEPTH_ENV = "RAGSPINE_RAPTOR_DEPTH"
THRESHOLD_ENV = "RAGSPINE_RAPTOR_THRESHOLD"
MODES = ("collapsed", "leaves", "internal")
DEFAULT_MODE = "collapsed"


def raptor_enabled(value: str | None = None) -> bool:
    """``RAGSPINE_RAPTOR`` (or ``value``): on / 1 / true, or off (the default)."""
    if value is None:  # the variable, checked by the settings registry (same words)
        return settings.get(RAPTOR_ENV, error=RaptorError)
    raw = value.strip().lower()
    if raw in ("", "0", "off", "false", "no", "none"):
        return False
    if raw in ("1", "on", "true", "yes"):
        return True
    raise RaptorError(f"{RAPTOR_ENV}={raw!r}: use on or off")


def raptor_settings(mode: str | None = None, depth: int | None = None,
                    threshold: float | None = None) -> tuple[str, int, float]:
    """(mode, depth, threshold): the arguments, else ``RAGSPINE_RAPTOR_*``, else defaults."""
    m = (mode.strip().lower() or DEFAULT_MODE) if mode is not None else settings.get(MODE_ENV, error=RaptorError)
    if m not in MODES:
        raise RaptorError(f"RAPTOR mode must be one of {', '.join(MODES)}, not {m!r}")
    d = depth if depth is not None else settings.get(DEPTH_ENV, error=RaptorError)
    t = threshold if threshold is not None else settings.get(THRESHOLD_ENV, error=RaptorError)
    return m, d, t


def _node_chunk(n: RaptorNode) -> Chunk:
    md = dict(n.metadata)
    return Chunk(chunk_id=n.node_id, doc_id=n.node_id, title=md.get("title", ""), text=n.text,
                 source_locator=SourceLocator(n.node_id, 0, len(n.text)), ordinal=n.level,
                 entity=md.get("entity", ""), period=md.get("period", ""), sensitivity=n.sensitivity,
                 chunker="raptor")


class RaptorRetriever:
    """BM25 (+ dense) over the tree's nodes for one mode; snippets mark syntheses."""

    def __init__(self, tree: RaptorTree, chunks: Sequence[Chunk], *, mode: str = DEFAULT_MODE,
                 analyzer: Analyzer | str | None = None, embedding_backend: EmbeddingBackend | None = None) -> None:
        if mode not in MODES:
            raise RaptorError(f"RAPTOR mode must be one of {', '.join(MODES)}, not {mode!r}")
        self.tree = tree
        self.mode = mode
        self.leaves = {c.chunk_id: c for c in chunks if not is_restricted(c.sensitivity)}
        self.nodes = {n.node_id: n for n in tree.nodes}
        pool: list[Chunk] = []
        if mode in ("collapsed", "leaves"):
            pool += [self.leaves[n.node_id] for n in tree.levels[0] if n.node_id in self.leaves]
        if mode in ("collapsed", "internal"):
            # Fail closed: a synthesis is searchable only while every member is a served
            # leaf (a stored tree served after a member's document was hidden or withdrawn).
            pool += [_node_chunk(n) for n in tree.synthesis_nodes()
                     if n.text and all(m in self.leaves for m in n.members)]
        if not pool:
            raise RaptorError(f"the RAPTOR tree has no nodes to search in mode {mode!r} ({tree.note})")
        self.retriever = HybridRetriever(pool, analyzer=analyzer, embedding_backend=embedding_backend)

    def _synthesis_snippet(self, n: RaptorNode, rank: int, hit: Any) -> dict[str, Any]:
        cites = [self.leaves[m].source_locator.to_dict() for m in n.members if m in self.leaves]
        return {"rank": rank, "text": n.text, "chunk_id": n.node_id, "is_synthesis": True, "level": n.level,
                "members": list(n.members), "doc_ids": list(n.doc_ids), "cites": cites,
                "sensitivity": n.sensitivity,
                "scores": {"bm25": hit.bm25, "vector": hit.vector, "fused": hit.fused}}

    def retrieve(self, query: str, *, filters: Mapping[str, Any] | Sequence[Any] | None = None,
                 top_k: int = 10) -> list[dict[str, Any]]:
        check_query(query)
        if top_k <= 0:
            return []
        mask = self.retriever.candidate_mask(filters)
        hits = [h for h in self.retriever.search(query, top_k=top_k, mask=mask)
                if not is_restricted(h.chunk.sensitivity)]
        out: list[dict[str, Any]] = []
        for rank, h in enumerate(hits[:top_k], start=1):
            node = self.nodes.get(h.chunk.chunk_id)
            if node is not None and node.is_synthesis:
                out.append(self._synthesis_snippet(node, rank, h))
            else:
                out.append({**build_snippet(h, rank), "is_synthesis": False})
        return out


def make_raptor_retriever(
    chunks: Sequence[Chunk],
    *,
    mode: str | None = None,
    depth: int | None = None,
    threshold: float | None = None,
    embedding_backend: EmbeddingBackend | None = None,
    analyzer: Analyzer | str | None = None,
    provider: Any = None,
    summarizer: Summarizer | None = None,
    previous: RaptorTree | None = None,
    tree: RaptorTree | None = None,
) -> RaptorRetriever:
    """Build the RAPTOR tree of ``chunks`` and a retriever over it (see module docstring).

    Summaries are extractive unless ``summarizer`` is given, or a ``provider`` (an LLM
    with ``chat``) writes them. ``previous`` reuses the unchanged nodes of an earlier tree.
    ``tree`` serves an already built tree as it is (e.g. the ``raptor_tree`` asset's, via
    ``warehouse.raptor_tables.load_snapshot_raptor``): nothing is clustered or summarised.
    """
    m, d, t = raptor_settings(mode, depth, threshold)
    if tree is None:
        if summarizer is None and provider is not None:
            summarizer = provider_summarizer(provider)
        tree = build_raptor_tree(chunks, embedding_backend=embedding_backend, analyzer=analyzer, threshold=t,
                                 max_depth=d, summarizer=summarizer, previous=previous)
    return RaptorRetriever(tree, chunks, mode=m, analyzer=analyzer, embedding_backend=embedding_backend)
