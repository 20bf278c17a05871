"""GraphRAG skeleton: communities of the relation graph, summarized, retrievable as themes.

Communities are found with networkx's Louvain method (``[graph]``) over an undirected,
weighted projection of the graph onto entities and documents (a document is tied to
the entities it is about and those its facts are of; entities to their parent, peers
and co-occurring entities). The projection is built in sorted order and the method is
seeded, so the same graph always gives the same communities.

Each community becomes an ``is_synthesis`` node: a summary (extractive — the first
sentences of its members' fact-bearing chunks — without a provider; a model summary over
served text with one) plus the union of its members' lineage (doc ids, chunk ids).
Themes answer "what is this corpus about around X"; they are never citable facts:
``citable: false`` on every node and theme, and the fact queries never read them.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from ..retrieval.lexical.analysis.analyzer import tokenize
from ..retrieval.lexical.index.bm25 import bm25_scores
from ..sensitivity import is_restricted
from .extract import _SENTENCE as _FIRST_SENTENCE
from .store import GraphStore, GraphStoreError

COMMUNITY = "community"
SUMMARY_PROMPT = ("Summarize in two sentences the common theme of these passages from company reports. "
                  "Use only what they say; no figures that are not in them.")


@dataclass(frozen=True)
class Community:
    id: str
    members: tuple[str, ...]  # graph node ids (entity:…, doc:…)
    doc_ids: tuple[str, ...]
    chunk_ids: tuple[str, ...]
    summary: str
    summarizer: str  # "extractive" or "llm"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _projection(store: GraphStore) -> Any:
    try:
        import networkx as nx  # lazy: networkx, the optional [graph] extra, loaded when communities are detected
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise GraphStoreError("communities need the [graph] extra (networkx)") from exc
    weights: Counter[tuple[str, str]] = Counter()

    def tie(a: str, b: str, w: float = 1.0) -> None:
        if a != b:
            weights[(min(a, b), max(a, b))] += w

    for e in store.edges():
        if e.type in ("about", "subsidiary_of", "peer_of", "co_occurs_with", "llm_relation"):
            tie(e.src, e.dst)
    fact_doc = {e.src: e.dst for e in store.edges() if e.type == "cited_in"}
    for e in store.edges():
        if e.type == "fact_of" and e.src in fact_doc:
            tie(fact_doc[e.src], e.dst, 0.5)
    g = nx.Graph()
    g.add_nodes_from(sorted(n for n, a in store.nodes() if a["type"] in ("entity", "document")))
    for (a, b), w in sorted(weights.items()):
        if a in g and b in g:
            g.add_edge(a, b, weight=w)
    return g


def _extractive(chunks: list[Any], max_sentences: int = 3) -> str:
    out = []
    for c in chunks:
        body = "\n".join(ln for ln in c.text.splitlines() if ln.strip() and not ln.lstrip().startswith("#"))
        m = _FIRST_SENTENCE.search(body.strip())
        if m:
            out.append(" ".join(m.group(0).split()))
        if len(out) == max_sentences:
            break
    return " ".join(out)


def detect_communities(store: GraphStore, chunks: Sequence[Any] = (), *, provider: Any = None, seed: int = 0,
                       resolution: float = 1.0) -> list[Community]:
    """Seeded Louvain communities (with at least one document) and their summaries.

    ``chunks``: the served chunks the graph was built from (summary text and lineage); a
    RESTRICTED one is skipped, never summarized. ``provider``: an ``LLMProvider`` for
    model summaries; a failed call falls back to the extractive one.
    """
    import networkx as nx  # lazy: networkx, the optional [graph] extra (_projection has checked it is there)

    g = _projection(store)
    parts = nx.community.louvain_communities(g, weight="weight", resolution=resolution, seed=seed)
    served = [c for c in chunks if not is_restricted(getattr(c, "sensitivity", None))]
    by_doc: dict[str, list[Any]] = defaultdict(list)
    for c in sorted(served, key=lambda c: (c.doc_id, c.source_locator.start, c.chunk_id)):
        by_doc[c.doc_id].append(c)
    facts_in = Counter(a["chunk_id"] for _, a in store.nodes("fact"))
    out: list[Community] = []
    for members in sorted((sorted(p) for p in parts), key=lambda m: m[0]):
        docs = sorted(m.split(":", 1)[1] for m in members if m.startswith("doc:"))
        if not docs:
            continue
        cs = [c for d in docs for c in by_doc.get(d, [])]
        ranked = sorted(cs, key=lambda c: (-facts_in[c.chunk_id], c.doc_id, c.source_locator.start))
        summary, how = _extractive(ranked), "extractive"
        if provider is not None and ranked:
            try:
                text = provider.chat([{"role": "system", "content": SUMMARY_PROMPT},
                                      {"role": "user", "content": "\n\n".join(c.text for c in ranked[:6])}],
                                     temperature=0)
                if isinstance(text, str) and text.strip():
                    summary, how = " ".join(text.split()), "llm"
            except Exception:  # noqa: BLE001 - the extractive summary stands
                pass
        out.append(Community(f"community:{len(out)}", tuple(members), tuple(docs),
                             tuple(sorted(c.chunk_id for c in cs)), summary, how))
    return out


def add_communities(store: GraphStore, communities: Sequence[Community]) -> None:
    """``community`` nodes (``is_synthesis``, never citable) with ``member_of`` edges."""
    for c in communities:
        store.add_node(c.id, COMMUNITY, {**c.to_dict(), "members": list(c.members), "doc_ids": list(c.doc_ids),
                                         "chunk_ids": list(c.chunk_ids), "is_synthesis": True, "citable": False})
        for m in c.members:
            store.add_edge(m, c.id, "member_of")


def themes(store: GraphStore, query: str, top_k: int = 3) -> list[dict[str, Any]]:
    """Community summaries ranked by BM25 against ``query`` (summary + member names).

    Each theme says ``channel: graph_theme``, ``is_synthesis: true``, ``citable: false``
    and carries its lineage; it is context, never a fact to quote a number from.
    """
    nodes = store.nodes(COMMUNITY)
    if not nodes or top_k <= 0:
        return []
    names = {n: " ".join(str(a.get(k, "")) for k in ("name_en", "name_zh", "title")) for n, a in store.nodes()
             if a["type"] in ("entity", "document")}
    docs = [tokenize(a["summary"] + " " + " ".join(names.get(m, "") for m in a["members"])) for _, a in nodes]
    scores = bm25_scores(tokenize(query), docs)
    ranked = sorted(((s, nid, a) for s, (nid, a) in zip(scores, nodes, strict=True) if s > 0),
                    key=lambda x: (-x[0], x[1]))
    return [{"channel": "graph_theme", "community_id": nid, "summary": a["summary"], "summarizer": a["summarizer"],
             "members": a["members"], "doc_ids": a["doc_ids"], "chunk_ids": a["chunk_ids"], "score": round(s, 6),
             "is_synthesis": True, "citable": False} for s, nid, a in ranked[:top_k]]
