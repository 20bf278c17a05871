"""NarrativeIndex and NarrativeIndexRetriever: cited snippets with RESTRICTED exit #2.

``NarrativeIndexRetriever.retrieve`` is the product's query path:

    pre-filter -> BM25 (+ dense) per glossary variant -> RRF -> rerank (exit #1) ->
    drop RESTRICTED (exit #2) -> snippet dicts -> optional post-processor.

Exit #2 filters candidate records *before* any snippet dict is built, so no code path
downstream (post-processors, prompt builders, the CLI) can ever hold restricted text.

Non-interference: ``NarrativeIndex.from_chunks`` builds the served index without the
RESTRICTED chunks, so no served output (snippets, scores, ranks) depends on restricted
text at all; both exits stay as defence in depth.

This module holds the index and its retriever only; the spec's path
``retrieval.link.narrative_link`` re-exports both beside ``build_narrative_retriever``.
They live apart so the layer assembly (``link/assembly.py``) can wrap an index while
``build_narrative_retriever`` calls that assembly, with every import pointing one way.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import islice
from typing import Any

import numpy as np

from ...sensitivity import RESTRICTED_SENSITIVITY, is_restricted
from ..chunking.chunk_columns import ChunkColumns
from ..chunking.chunk_store import ChunkStore
from ..chunking.chunking import METADATA_FIELDS, Chunk
from ..chunking.contextual import make_index_text_fn
from ..chunking.expansion import expand_prompt_text, settle_prompt_refs
from ..hybrid.retriever import HybridRetriever, RetrievalHit
from ..lexical.analysis.analyzer import Analyzer
from ..lexical.analysis.glossary import GlossaryQueryRewriter
from ..limits import check_query
from ..postprocess.base import Postprocessor
from ..postprocess.dedup import Group, collapse, duplicate_ref
from ..rerank.base import Reranker, annotate_snippet, guarded_rerank
from ..rerank.listwise_rerank import require_reranker
from ..vector.base import EmbeddingBackend

DEFAULT_TOP_K = 50
REFILL_ROUNDS = 4  # deeper fetches when collapsing duplicates left fewer than top_k
# Extra candidates fetched when collapsing: copies tie in score, so the copies of a passage
# ranked near the cut sit just past it, and the duplicates list should name them.
DUPLICATE_MARGIN = 5
Candidate = RetrievalHit | dict[str, Any]  # a hit, or its candidate dict when a reranker ran
# Both exits use the one constant (and ``is_restricted``) from ``ragspine_pipeline.sensitivity``.
__all__ = ["DEFAULT_TOP_K", "RESTRICTED_SENSITIVITY", "NarrativeIndex", "NarrativeIndexRetriever",
           "Postprocessor", "build_snippet"]


@dataclass(init=False)
class NarrativeIndex:
    """One library's searchable chunks: the chunk set plus its HybridRetriever.

    The served index holds no RESTRICTED chunk (``from_chunks`` leaves them out), so
    BM25 statistics (N, df, avgdl), dense neighbours and RRF ranks of every open chunk
    are exactly what they would be if the restricted documents did not exist. The two
    exits stay in place as defence in depth.

    ``NarrativeIndex(chunks, embedding_backend=b)`` builds the index from chunks, as the
    spec injects a backend (the same as ``from_chunks``, whose keywords it takes);
    ``NarrativeIndex(hybrid_retriever)`` wraps an index already built.
    """

    retriever: HybridRetriever
    library_id: str = ""
    version: str = ""
    info: dict[str, Any] = field(default_factory=dict)

    def __init__(self, retriever: HybridRetriever | Sequence[Chunk], library_id: str = "", version: str = "",
                 info: dict[str, Any] | None = None, *, embedding_backend: EmbeddingBackend | None = None,
                 **index_kwargs: Any) -> None:
        if isinstance(retriever, HybridRetriever):
            if embedding_backend is not None or index_kwargs:
                given = sorted({*index_kwargs, *(["embedding_backend"] if embedding_backend is not None else [])})
                raise TypeError(f"NarrativeIndex over a built HybridRetriever takes no index keywords ({given}); "
                                "pass chunks to build one with them")
            self.retriever, self.library_id, self.version = retriever, library_id, version
            self.info = dict(info) if info is not None else {}
            return
        if isinstance(retriever, str | bytes | Mapping) or not hasattr(retriever, "__iter__"):
            raise TypeError("NarrativeIndex takes a HybridRetriever or a sequence of chunks "
                            f"(got {type(retriever).__name__})")
        built = type(self).from_chunks(list(retriever), embedding_backend=embedding_backend,
                                       library_id=library_id, version=version, **index_kwargs)
        self.retriever, self.library_id, self.version = built.retriever, built.library_id, built.version
        self.info = {**built.info, **(info or {})}

    @classmethod
    def from_chunks(
        cls,
        chunks: Sequence[Chunk],
        *,
        analyzer: Analyzer | str | None = None,
        embedding_backend: EmbeddingBackend | None = None,
        rewriter: GlossaryQueryRewriter | None = None,
        library_id: str = "",
        version: str = "",
        exclude_restricted: bool = True,
        docs_tokens: Sequence[Sequence[str]] | None = None,
        **kwargs: Any,
    ) -> NarrativeIndex:
        """Index ``chunks``; with ``exclude_restricted`` (the default, and what serving
        uses) every chunk whose label ``is_restricted`` is dropped first, together with
        its row of ``docs_tokens``. ``exclude_restricted=False`` keeps them in the
        statistics (exits #1 and #2 still remove them from every output); it exists for
        tests of the exits themselves.

        ``chunks`` may be a ``ChunkColumns`` (a published snapshot's columnar records): it
        stays columnar, and the labels are checked once per distinct label."""
        if not isinstance(chunks, ChunkColumns):
            chunks = list(chunks)
        if docs_tokens is not None and len(docs_tokens) != len(chunks):
            raise ValueError("docs_tokens must align with chunks")
        excluded = 0
        if exclude_restricted and isinstance(chunks, ChunkColumns):
            drop = chunks.matching("sensitivity", is_restricted)
            excluded = int(drop.sum())
            if excluded:
                chunks = chunks.take(~drop)
                if docs_tokens is not None:
                    docs_tokens = [docs_tokens[i] for i in np.flatnonzero(~drop)]
        elif exclude_restricted:
            keep = [i for i, c in enumerate(chunks) if not is_restricted(c.sensitivity)]
            excluded = len(chunks) - len(keep)
            if excluded:
                chunks = [chunks[i] for i in keep]
                if docs_tokens is not None:
                    docs_tokens = [docs_tokens[i] for i in keep]
        if docs_tokens is None and "index_text" not in kwargs:
            kwargs["index_text"] = make_index_text_fn()  # RAGSPINE_CONTEXTUAL; off: the chunk text
        r = HybridRetriever(chunks, analyzer=analyzer, embedding_backend=embedding_backend,
                            rewriter=rewriter, docs_tokens=docs_tokens, **kwargs)
        return cls(retriever=r, library_id=library_id, version=version,
                   info={"restricted_excluded": excluded, "exclude_restricted": exclude_restricted})

    @classmethod
    def from_store(cls, store: ChunkStore | str | os.PathLike[str], **kwargs: Any) -> NarrativeIndex:
        """Index the active chunks of a ChunkStore (opened read-only if given a path)."""
        if isinstance(store, ChunkStore):
            chunks = store.iter_chunks()
        else:
            with ChunkStore(store, read_only=True) as s:
                chunks = s.iter_chunks()
        return cls.from_chunks(chunks, **kwargs)

    def __len__(self) -> int:
        return len(self.retriever)


class LabelCheck:
    """``is_restricted`` answered once per distinct label within one query.

    Every hit's label goes through ``is_restricted`` (the fail-closed rule); a query sees
    a handful of distinct labels over hundreds of hits, and each call re-reads the label
    configuration, so verdicts are kept for the length of one query. Unhashable labels
    are checked every time.
    """

    def __init__(self) -> None:
        self._seen: dict[tuple[type, Any], bool] = {}

    def __call__(self, label: object) -> bool:
        try:
            key = (type(label), label)
            hit = self._seen.get(key)
        except TypeError:  # unhashable: no memo
            return is_restricted(label)
        if hit is None:
            hit = self._seen[key] = is_restricted(label)
        return hit


def _candidate(hit: RetrievalHit) -> dict[str, Any]:
    c = hit.chunk
    return {"chunk_id": c.chunk_id, "text": c.text, "sensitivity": c.sensitivity,
            "_hit": hit}


def build_snippet(hit: RetrievalHit, rank: int, *, library_id: str = "",
                  filters_relaxed: bool = False) -> dict[str, Any]:
    """The public snippet dict: text, lineage, metadata and per-channel scores."""
    c = hit.chunk
    snip: dict[str, Any] = {
        "rank": rank,
        "text": c.text,
        "doc_id": c.doc_id,
        "title": c.title,
        "chunk_id": c.chunk_id,
        "source_locator": c.source_locator.to_dict(),
        **{f: getattr(c, f) for f in METADATA_FIELDS},
        "sensitivity": c.sensitivity,
        "valid_as_of": getattr(c, "valid_as_of", ""),
        "version": getattr(c, "version", 1),
        "scores": {"bm25": hit.bm25, "vector": hit.vector, "fused": hit.fused,
                   **({"fusion": dict(hit.fusion)} if hit.fusion else {})},
        "filters_relaxed": filters_relaxed,
    }
    if library_id:
        snip["library_id"] = library_id
    return snip


def hit_of(c: Candidate) -> RetrievalHit:
    return c if isinstance(c, RetrievalHit) else c["_hit"]


def open_ranked(query: str, hits: Sequence[RetrievalHit], reranker: Reranker | None, rerank_depth: int,
                restricted: Callable[[object], bool], *, limit: int | None = None) -> list[Candidate]:
    """Exits #1 and #2 over ranked ``hits``: reranked (the first ``rerank_depth``, when a
    reranker is set), then every RESTRICTED record dropped before any snippet exists.
    Without a reranker the open hits themselves (the first ``limit`` of them)."""
    if reranker is None:
        open_hits = []
        for h in hits:
            if not restricted(h.chunk.sensitivity):
                open_hits.append(h)
                if len(open_hits) == limit:
                    break
        return open_hits
    cands = [_candidate(h) for h in hits]
    head, tail = cands[:rerank_depth], cands[rerank_depth:]
    cands = guarded_rerank(query, head, reranker) + tail  # exit #1
    return [c for c in cands if not restricted(c["sensitivity"]) and not restricted(c["_hit"].chunk.sensitivity)]


def group_candidates(cands: Sequence[Candidate], collapse_duplicates: bool,
                     top_k: int | None = None) -> list[Group[Candidate]]:
    """Open candidates (best first) as groups of duplicates (``postprocess.dedup``; the
    first ``top_k`` groups), or one group each when collapsing is off. Only open
    candidates reach here, so a duplicates list never names a RESTRICTED chunk."""
    if not collapse_duplicates:
        return [Group(c) for c in cands[:top_k]]
    return collapse(cands, lambda c: hit_of(c).chunk.text, limit=top_k)


def cited_snippets(query: str, groups: Sequence[Group[Candidate]], *, relaxed: bool,
                   library_of: Callable[[RetrievalHit], str],
                   postprocessor: Postprocessor | None = None) -> list[dict[str, Any]]:
    """Snippet dicts of ranked groups: the kept candidate's snippet, ranks from 1, with
    ``duplicates`` (where else the same passage is) when the group has copies; prompt
    text expanded; then the optional post-processor (its output re-checked by exit #2)."""
    snippets = []
    for rank, g in enumerate(groups, start=1):
        c = g.kept if isinstance(g.kept, dict) else _candidate(g.kept)
        # annotate_snippet: scores.rerank + reranker name when a reranker ran
        s = annotate_snippet(build_snippet(c["_hit"], rank, library_id=library_of(c["_hit"]),
                                           filters_relaxed=relaxed), c)
        if g.copies:
            s["duplicates"] = [duplicate_ref(hit_of(d).chunk, library_of(hit_of(d))) for d in g.copies]
        snippets.append(s)
    chunks = [hit_of(g.kept).chunk for g in groups]
    # Parent / window chunkers: prompt_text for generation (text and citations unchanged).
    snippets = expand_prompt_text(snippets, chunks)
    if postprocessor is not None:
        snippets = [s for s in postprocessor.process(query, snippets) if not is_restricted(s.get("sensitivity"))]
        snippets = settle_prompt_refs(snippets, {c.chunk_id: c for c in chunks})
    return snippets


class NarrativeIndexRetriever:
    """Cited retrieval over one NarrativeIndex (the read-only query path)."""

    def __init__(
        self,
        index: NarrativeIndex,
        *,
        retry_without_filters: bool = True,
        reranker: Reranker | None = None,
        postprocessor: Postprocessor | None = None,
        rerank_depth: int | None = None,
        collapse_duplicates: bool = True,
    ) -> None:
        if not isinstance(index, NarrativeIndex):
            raise TypeError(f"NarrativeIndexRetriever needs a NarrativeIndex (got {type(index).__name__})")
        if postprocessor is not None and not callable(getattr(postprocessor, "process", None)):
            raise TypeError(f"{type(postprocessor).__name__} is not a Postprocessor: it needs "
                            "process(query, snippets) -> list[dict]")
        self.index = index
        self.retry_without_filters = retry_without_filters
        # Identical / near-identical passages appear once (postprocess.dedup); off: every copy.
        self.collapse_duplicates = collapse_duplicates
        # A ListwiseJudge is wrapped; anything that is neither is a TypeError here.
        self.reranker = require_reranker(reranker) if reranker is not None else None
        self.postprocessor = postprocessor
        # Default depth: the reranker's own window (the model rerankers: top_n, 100), else 20.
        self.rerank_depth = rerank_depth if rerank_depth is not None else int(getattr(self.reranker, "rerank_depth", 20))

    def _ranked_hits(self, query: str, filters: Any, top_k: int) -> tuple[list[RetrievalHit], bool]:
        """The first ``top_k`` open-to-be hits and whether the index may hold more."""
        r = self.index.retriever
        mask = r.candidate_mask(filters)
        # Fetch enough that top_k open results survive exit #2.
        in_scope = r.restricted if mask is None else (r.restricted & mask)
        want = top_k + int(in_scope.sum())
        hits = r.search(query, top_k=want, mask=mask)
        return hits, len(hits) >= want

    def _open_candidates(self, query: str, filters: Any,
                         top_k: int) -> tuple[list[Group[Candidate]], bool]:
        """The first ``top_k`` ranked open candidates (filters relaxed if needed, reranked,
        exit #2 applied, duplicates collapsed: ``postprocess.dedup``) and whether filters
        were relaxed. Each is a group: the kept candidate and its copies. Without a
        reranker the candidates are the hits themselves (no dict at all); with one,
        candidate dicts for its window. When collapsing leaves fewer than ``top_k``, a
        deeper list is fetched (doubling, at most ``REFILL_ROUNDS`` times)."""
        restricted = LabelCheck()
        relaxed = False
        # With a reranker, fetch its whole window (top-N in), so top_k out is reranked.
        depth = max(top_k, self.rerank_depth) if self.reranker is not None else top_k
        depth += DUPLICATE_MARGIN if self.collapse_duplicates else 0
        hits, more = self._ranked_hits(query, filters, depth)
        if filters and self.retry_without_filters and not any(not restricted(h.chunk.sensitivity) for h in hits):
            filters, relaxed = None, True
            hits, more = self._ranked_hits(query, None, depth)
        for _ in range(REFILL_ROUNDS):
            groups = group_candidates(open_ranked(query, hits, self.reranker, self.rerank_depth, restricted,
                                                  limit=None if self.collapse_duplicates else top_k),
                                      self.collapse_duplicates, top_k)
            if len(groups) >= top_k or not more:
                break
            depth *= 2
            hits, more = self._ranked_hits(query, filters, depth)
        return groups[:top_k], relaxed

    def ranked_hits(self, query: str, *, filters: Mapping[str, Any] | Sequence[Any] | None = None,
                    top_k: int = DEFAULT_TOP_K) -> list[RetrievalHit]:
        """The hits ``retrieve`` would turn into snippets, in the same order, without
        building any snippet dict (evaluation needs ranks and ids, not payloads).
        RESTRICTED hits are dropped exactly as in ``retrieve``; there is no post-processor
        here (it works on snippet dicts)."""
        check_query(query)
        if top_k <= 0:
            return []
        groups, _relaxed = self._open_candidates(query, filters, top_k)
        return [hit_of(g.kept) for g in groups]

    def ranked_chunks(self, query: str, *, top_k: int = DEFAULT_TOP_K) -> list[Chunk]:
        """The chunks ``retrieve(query, top_k=top_k)`` cites, in order, with no snippet
        dict and no hit record (``ragspine eval``: only ranks and ids are scored).
        Unfiltered; RESTRICTED chunks dropped as in ``retrieve``; with a reranker it goes
        through ``ranked_hits`` so the reranked order is the one returned."""
        check_query(query)
        if top_k <= 0:
            return []
        if self.reranker is not None:
            return [h.chunk for h in self.ranked_hits(query, top_k=top_k)]
        r = self.index.retriever
        restricted = LabelCheck()
        chunks = r.chunks
        out: list[Chunk] = []
        for p in r.ranked_positions(query, top_k=top_k + int(r.restricted.sum())):
            c = chunks[p]
            if not restricted(c.sensitivity):
                out.append(c)
                if len(out) == top_k:
                    break
        return out

    def ranked_doc_ids(self, query: str, *, chunk_depth: int, depth: int) -> list[str]:
        """Document ids of ``ranked_chunks(query, top_k=chunk_depth)``, each at its best
        chunk's rank, first ``depth`` (``ragspine eval``'s run), computed on arrays.

        The same rule as ``ranked_chunks``: every candidate's label is checked at query
        time (once per distinct label) and RESTRICTED ones are dropped, as are chunks
        marked restricted when the index was built. With a reranker, or unhashable
        labels, it is ``ranked_chunks`` itself.
        """
        check_query(query)
        if chunk_depth <= 0 or depth <= 0:
            return []
        r = self.index.retriever
        labels = r.label_codes
        if self.reranker is not None or labels is None:
            return list(islice(dict.fromkeys(c.doc_id for c in self.ranked_chunks(query, top_k=chunk_depth)), depth))
        codes, values = labels
        pos = r.ranked_position_array(query, top_k=chunk_depth + int(r.restricted.sum()))
        verdict = np.fromiter((is_restricted(v) for v in values), bool, count=len(values))
        pos = pos[~(verdict[codes[pos]] | r.restricted[pos])][:chunk_depth]
        doc_code, doc_ids = r.doc_codes
        best = dict.fromkeys(doc_code[pos].tolist())  # first-seen order = best rank
        return [doc_ids[d] for d in islice(best, depth)]

    def retrieve(self, query: str, *, filters: Mapping[str, Any] | Sequence[Any] | None = None,
                 top_k: int = DEFAULT_TOP_K) -> list[dict[str, Any]]:
        check_query(query)  # a clear error for a non-string or a query past the length limit
        if top_k <= 0:
            return []
        groups, relaxed = self._open_candidates(query, filters, top_k)
        lib = self.index.library_id
        return cited_snippets(query, groups, relaxed=relaxed, library_of=lambda _hit: lib,
                              postprocessor=self.postprocessor)
