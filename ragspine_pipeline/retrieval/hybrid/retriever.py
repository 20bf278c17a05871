"""HybridRetriever: metadata pre-filter -> BM25 (+ dense) per query variant -> RRF.

Order of work per query, as the contract requires:

1. compile and apply the metadata filter to get the candidate set (nothing is scored or
   embedded outside it);
2. rewrite the query into glossary variants (original first);
3. BM25 ranking of every variant over the candidates, with statistics over the
   candidates (the index equals the reference scorer there);
4. when an embedding backend is injected: embed the candidates not yet cached (by
   chunk_id) and rank them by cosine — with no backend this step does not exist, and the
   output is pure BM25 + RRF;
5. fuse all rankings with RRF (or the opt-in weighted RRF / convex fusion: ``hybrid.fusion.py``);
   ties by (-fused_score, chunk_id). An ``auto`` backend (``vector/auto_policy.py``) picks
   the model and the fusion for the chunk set here, from the evaluation table; a dense
   weight of 0 (the guard) skips the dense channel in hybrid search altogether.

Chunks are held sorted by chunk_id, so index position order *is* chunk_id order and
every tie in every channel falls in chunk_id order.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...sensitivity import is_restricted
from ..chunking.chunk_columns import ChunkColumns
from ..chunking.chunking import Chunk
from ..filters import compile_filters
from ..lexical.analysis.analyzer import Analyzer, make_analyzer
from ..lexical.analysis.glossary import GlossaryQueryRewriter, query_variants
from ..lexical.index.bm25 import DEFAULT_B, DEFAULT_K1, BM25Index
from ..lexical.index.topk import ScoredDocs, empty_scored
from ..vector.batching import embed_in_batches
from ..vector.embedding_backends import EmbeddingBackend, backend_model_id
from .bm25_handover import bm25_candidates, check_prebuilt
from .dense_topk import dense_top
from .filter_codes import CachedFilter, FieldCodes, FilterCache, code_values, coded_mask, filter_key
from .fusion import DEFAULT_RRF_K, FusionConfig, Run, fuse_runs, fusion_configured, fusion_from_env

# Filterable fields and their value types (everything a Chunk/StoredChunk carries).
FILTER_FIELDS: dict[str, type] = {
    "doc_id": str, "chunk_id": str, "title": str, "topic": str, "entity": str,
    "geography": str, "period": str, "language": str, "sensitivity": str,
    "valid_as_of": str, "chunker": str, "parent_id": str, "version": int,
}

# Values for fields a plain Chunk lacks (StoredChunk carries them).
_FIELD_DEFAULTS: dict[str, object] = {"version": 1, "valid_as_of": ""}

DEFAULT_CANDIDATE_K = 100


def default_index_text(chunk: Chunk) -> str:
    """What BM25 indexes for a chunk: its text (headers are an opt-in layer)."""
    return chunk.text


def _check_channels(channels: Sequence[str]) -> None:
    if not channels or set(channels) - {"bm25", "dense"}:
        raise ValueError(f"channels must be a non-empty subset of ('bm25', 'dense'), got {channels!r}")


@dataclass
class _VectorCache:
    """Position-aligned unit vectors, filled lazily; shared by ``with_channels`` views."""

    have: np.ndarray
    mat: np.ndarray | None = None
    source: Any = None  # a published vector file (``vector.published``), mapped: no ``mat``


@dataclass(frozen=True)
class RetrievalHit:
    """One fused result: the chunk, its position, and per-channel scores."""

    position: int
    chunk: Chunk
    bm25: float
    vector: float | None
    fused: float
    fusion: Mapping[str, Any] | None = None  # the fusion choice, when a dense backend is set


class HybridRetriever:
    """BM25 (+ optional dense) retrieval over a fixed chunk set."""

    def __init__(
        self,
        chunks: Sequence[Chunk],
        *,
        analyzer: Analyzer | str | None = None,
        k1: float = DEFAULT_K1,
        b: float = DEFAULT_B,
        embedding_backend: EmbeddingBackend | None = None,
        rewriter: GlossaryQueryRewriter | None = None,
        rrf_k: int = DEFAULT_RRF_K,
        candidate_k: int = DEFAULT_CANDIDATE_K,
        index_text: Callable[[Chunk], str] = default_index_text,
        docs_tokens: Sequence[Sequence[str]] | None = None,
        channels: Sequence[str] = ("bm25", "dense"),
        fusion: FusionConfig | None = None,
        embed_progress: Callable[[int, int], None] | None = None,
        bm25_index: BM25Index | None = None,
    ) -> None:
        _check_channels(channels)
        if "bm25" not in channels and embedding_backend is None:
            raise ValueError("a dense-only retriever needs an embedding backend")
        if embedding_backend is not None and not callable(getattr(embedding_backend, "embed_texts", None)):
            raise TypeError(f"{type(embedding_backend).__name__} is not an EmbeddingBackend: "
                            "it needs embed_texts(texts) -> list[list[float]]")
        self.channels = tuple(channels)
        if isinstance(chunks, ChunkColumns):
            # Columnar (a published snapshot): unique and in chunk_id order already (checked
            # there); a Chunk is built only for a position a query returns.
            self.chunks: Sequence[Chunk] = chunks
        else:
            ids = [c.chunk_id for c in chunks]
            if len(set(ids)) != len(ids):
                raise ValueError("HybridRetriever needs unique chunk ids")
            self.chunks = sorted(chunks, key=lambda c: c.chunk_id)
        self.analyzer = make_analyzer(analyzer)
        self.rewriter = rewriter
        self.embed_progress = embed_progress
        self.auto_choice = None
        if embedding_backend is not None and callable(getattr(embedding_backend, "resolve", None)):
            # ``auto``: the model and fusion for this chunk set, from the evaluation table.
            # Non-interference: RESTRICTED chunks never vote (a restricted majority in another
            # language must not move the model, the fusion or any served score).
            choice = embedding_backend.resolve((index_text(c), c.language or None) for c in self.chunks
                                               if not is_restricted(c.sensitivity))
            self.auto_choice = choice
            embedding_backend = embedding_backend.backend_for(choice.model)
            if fusion is None and not fusion_configured():
                fusion = choice.fusion
        self.embedding_backend = embedding_backend
        if fusion is None:
            fusion = fusion_from_env(rrf_k) if embedding_backend is not None else FusionConfig(k=rrf_k)
        self.fusion = fusion
        self.rrf_k = rrf_k
        self.candidate_k = candidate_k
        self.index_text = index_text
        if bm25_index is not None:
            # A published index (e.g. memory-mapped): nothing is tokenized or rebuilt. Its own
            # k1 and b hold; it must index exactly these chunks, in chunk_id order.
            check_prebuilt(bm25_index, self.chunks)
            self.index = bm25_index
        elif docs_tokens is not None:
            if len(docs_tokens) != len(chunks):
                raise ValueError("docs_tokens must align with chunks")
            order = sorted(range(len(chunks)), key=lambda i: chunks[i].chunk_id)
            toks = [docs_tokens[i] for i in order]
        else:
            # Each chunk by its document's language metadata (the analyzer records its rule).
            toks = [self.analyzer.analyze(index_text(c), c.language or None) for c in self.chunks]
        if bm25_index is None:
            self.index = BM25Index(toks, k1=k1, b=b)
        # Queries are analyzed for every document language of the index (see analyze_query).
        self._languages = (self.chunks.languages() if isinstance(self.chunks, ChunkColumns)
                           else sorted({c.language for c in self.chunks if c.language}))
        self._columns: dict[str, np.ndarray] = {}
        self._codes: dict[str, FieldCodes] = {}
        self._filter_cache = FilterCache()
        self.restricted = self._restricted_mask()
        self._vectors = _VectorCache(have=np.zeros(len(self.chunks), dtype=bool))
        self._model_id: tuple[EmbeddingBackend, str] | None = None  # (backend, its id), see fusion_info

    def __len__(self) -> int:
        return len(self.chunks)

    def _chunk_ids(self) -> list[str]:
        if isinstance(self.chunks, ChunkColumns):
            return self.chunks.chunk_ids()
        return [c.chunk_id for c in self.chunks]

    def _restricted_mask(self) -> np.ndarray:
        """Which positions hold a RESTRICTED label: ``is_restricted`` once per distinct
        label (``label_codes``), per chunk only where a label is unhashable."""
        if isinstance(self.chunks, ChunkColumns):
            return self.chunks.matching("sensitivity", is_restricted)
        labels = self.label_codes
        if labels is None:
            return np.fromiter((is_restricted(c.sensitivity) for c in self.chunks), dtype=bool,
                               count=len(self.chunks))
        codes, values = labels
        verdict = np.fromiter((is_restricted(v) for v in values), dtype=bool, count=len(values))
        return verdict[codes] if len(codes) else np.zeros(0, dtype=bool)

    def with_channels(self, channels: Sequence[str]) -> HybridRetriever:
        """A view running other channels over the same index and embedded vectors."""
        _check_channels(channels)
        if "dense" in channels and self.embedding_backend is None:
            raise ValueError("the dense channel needs an embedding backend")
        view = copy.copy(self)
        view.channels = tuple(channels)
        return view

    # ----------------------------------------------------------------- filters
    def _column(self, name: str) -> np.ndarray:
        col = self._columns.get(name)
        if col is None:
            default = _FIELD_DEFAULTS.get(name)
            if isinstance(self.chunks, ChunkColumns):
                col = self.chunks.values(name, default)
            else:
                col = np.array([getattr(c, name, default) for c in self.chunks], dtype=object)
            self._columns[name] = col
        return col

    def _field_codes(self, name: str) -> FieldCodes:
        """The field's value codes (``hybrid.filter_codes``), built on its first filter."""
        fc = self._codes.get(name)
        if fc is None:
            fc = self._codes[name] = code_values(self._column(name))
        return fc

    def candidate_mask(self, filters: Mapping[str, Any] | Sequence[Any] | None) -> np.ndarray | None:
        """Boolean mask of chunks passing ``filters`` (None = no filter = everything): each
        predicate decided once per distinct value of its field (``hybrid.filter_codes``), the
        same mask as ``predicate_mask``."""
        preds = compile_filters(filters, FILTER_FIELDS)
        if not preds:
            return None
        return coded_mask(preds, self._column, self._field_codes, len(self.chunks))

    # ------------------------------------------------------------------ dense
    def ensure_vectors(self, positions: np.ndarray) -> np.ndarray:
        """Unit vectors of ``positions``; embeds only the ones not embedded before.

        Vectors live in a position-aligned matrix (a chunk id maps to one position), so
        the per-query work is a mask lookup and a gather, never a Python loop over the
        candidates.
        """
        assert self.embedding_backend is not None
        cache = self._vectors
        if cache.source is not None:
            return cache.source.unit_rows(positions)
        missing = positions[~cache.have[positions]] if len(positions) else positions
        if len(missing):
            # The dense channel embeds what BM25 indexes (a contextual header when on).
            vecs = embed_in_batches(self.embedding_backend,
                                    [self.index_text(self.chunks[int(p)]) for p in missing],
                                    progress=self.embed_progress)
            if len(vecs) != len(missing):
                raise RuntimeError("embedding backend returned a wrong number of vectors")
            arr = np.asarray(vecs, dtype=np.float32)
            norms = np.linalg.norm(arr, axis=1, keepdims=True)
            arr = arr / np.where(norms == 0, 1, norms)
            if cache.mat is None:
                cache.mat = np.zeros((len(self.chunks), arr.shape[1]), dtype=np.float32)
            if arr.shape[1] != cache.mat.shape[1]:
                raise RuntimeError("embedding backend changed its dimension")
            cache.mat[missing] = arr
            cache.have[missing] = True
        assert cache.mat is not None
        return cache.mat if len(positions) == len(self.chunks) else cache.mat[positions]

    def preload_vectors(self, vectors: np.ndarray, chunk_ids: Sequence[str] | None = None) -> None:
        """Install precomputed vectors (the warehouse's embeddings table), so serving
        embeds only queries.

        Without ``chunk_ids``: one row per indexed chunk, in chunk_id order. With
        ``chunk_ids`` (one per row): rows are matched by id, and rows of chunks this index
        does not hold (RESTRICTED chunks the served index left out) are ignored; every
        indexed chunk must have a row.
        """
        if vectors.ndim != 2:
            raise ValueError("preload_vectors needs a 2-D array of vectors")
        if chunk_ids is not None:
            if len(chunk_ids) != len(vectors):
                raise ValueError("preload_vectors: chunk_ids must align with the vector rows")
            row = {cid: i for i, cid in enumerate(chunk_ids)}
            mine = self._chunk_ids()
            missing = [c for c in mine if c not in row]
            if missing:
                raise ValueError(f"preload_vectors: no vector for {len(missing)} indexed chunks "
                                 f"(first: {missing[0]!r})")
            vectors = vectors[np.fromiter((row[c] for c in mine), dtype=np.int64, count=len(mine))]
        if len(vectors) != len(self.chunks):
            raise ValueError("preload_vectors needs one vector per chunk, in chunk_id order")
        norms = np.linalg.norm(vectors, axis=1, keepdims=True)
        self._vectors.mat = (vectors / np.where(norms == 0, 1, norms)).astype(np.float32)
        self._vectors.source = None
        self._vectors.have[:] = True

    def install_vectors(self, source: Any) -> None:
        """Serve the dense channel from a published vector file (``vector.published``:
        mapped and shared by every serving process, the same exact answers as a float32
        matrix) instead of holding one. Its rows must be these chunks in chunk_id order
        (the warehouse compares the ids' digests before it installs one)."""
        if len(source) != len(self.chunks):
            raise ValueError(f"install_vectors: {len(source)} vectors for {len(self.chunks)} chunks")
        self._vectors.source, self._vectors.mat = source, None
        self._vectors.have[:] = True

    @property
    def embedded_count(self) -> int:
        return int(self._vectors.have.sum())

    def _dense_rankings(
        self, queries: Sequence[str], positions: np.ndarray, depth: int
    ) -> list[tuple[list[int], dict[int, float]]]:
        if len(positions) == 0:
            return [([], {}) for _ in queries]
        # Backends with asymmetric encoders (e5 prefixes) expose embed_queries.
        backend = self.embedding_backend
        embed_q = getattr(backend, "embed_queries", None) or backend.embed_texts  # type: ignore[union-attr]
        qv = np.asarray(embed_q(list(queries)), dtype=np.float32)
        qn = np.linalg.norm(qv, axis=1, keepdims=True)
        qv = qv / np.where(qn == 0, 1, qn)
        out = []
        for top in self.dense_top_vectors(qv, positions, depth):
            ranked = top.ids.tolist()
            out.append((ranked, dict(zip(ranked, top.scores.tolist(), strict=True))))
        return out

    def dense_top_vectors(self, qv: np.ndarray, positions: np.ndarray, depth: int) -> list[ScoredDocs]:
        """Per unit query vector (a row of ``qv``): the top ``depth`` of ``positions`` by
        (cosine desc, position asc), exact float64 cosines (``hybrid.dense_topk``: the same bits in
        any shard). The one dense step: a ranking across libraries calls it with vectors it
        embedded once, and a sharded retriever's is its shards' (``scale.front.attach``)."""
        if len(positions) == 0:
            return [empty_scored() for _ in qv]
        if self._vectors.source is not None:  # int8 pre-selection, exact rescoring: dense_top's answers
            return self._vectors.source.top(qv, positions, depth)
        mat = self.ensure_vectors(positions)
        return [dense_top(mat, positions, row, depth) for row in qv]

    # ----------------------------------------------------------------- search
    def search(
        self,
        query: str,
        *,
        filters: Mapping[str, Any] | Sequence[Any] | None = None,
        top_k: int = 10,
        depth: int | None = None,
        mask: np.ndarray | None = None,
    ) -> list[RetrievalHit]:
        """Fused top-``top_k`` hits (restricted chunks included; exits remove them)."""
        if top_k <= 0:
            return []
        fused, bm25_best, vec_best, has_dense = self._fused(query, filters, top_k, depth, mask)
        info = self.fusion_info() if self.embedding_backend is not None else None
        return [
            RetrievalHit(
                position=int(p),
                chunk=self.chunks[int(p)],
                bm25=bm25_best.get(int(p), 0.0),
                vector=vec_best.get(int(p)) if has_dense else None,
                fused=score,
                fusion=info,
            )
            for p, score in fused
        ]

    def ranked_positions(self, query: str, *, filters: Mapping[str, Any] | Sequence[Any] | None = None,
                         top_k: int = 10, depth: int | None = None, mask: np.ndarray | None = None) -> list[int]:
        """The positions ``search`` ranks, in its order, without building hit records
        (evaluation needs the order only; 300 frozen records cost several times the index)."""
        if top_k <= 0:
            return []
        return [int(p) for p, _ in self._fused(query, filters, top_k, depth, mask)[0]]

    def ranked_position_array(self, query: str, *, top_k: int = 10) -> np.ndarray:
        """``ranked_positions(query, top_k=top_k)`` (unfiltered) as an int64 array.

        A BM25-only search with no query rewriter is one ranking, which RRF keeps in
        order, so its positions are the index's own top-k array with no per-hit Python
        work; every other configuration goes through ``_fused``.
        """
        if top_k <= 0:
            return np.zeros(0, np.int64)
        if self.rewriter is None and tuple(self.channels) == ("bm25",):
            depth = max(top_k, self.candidate_k)
            hits = self.index.search(self.analyzer.analyze_query(query, self._languages), k=depth)
            return hits.ids[:top_k]
        return np.fromiter((p for p, _ in self._fused(query, None, top_k, None, None)[0]), np.int64)

    @functools.cached_property
    def label_codes(self) -> tuple[np.ndarray, list[Any]] | None:
        """(code per chunk, distinct sensitivity labels), so a query can check each
        distinct label once and mask every candidate in one gather; None when a label is
        unhashable (callers then check per chunk)."""
        if isinstance(self.chunks, ChunkColumns):
            code, labels = self.chunks.codes("sensitivity")
            return code.astype(np.int32), labels
        codes: dict[tuple[type, Any], int] = {}
        labels: list[Any] = []
        out = np.empty(len(self.chunks), np.int32)
        try:
            for i, c in enumerate(self.chunks):
                key = (type(c.sensitivity), c.sensitivity)
                code = codes.get(key)
                if code is None:
                    code = codes[key] = len(labels)
                    labels.append(c.sensitivity)
                out[i] = code
        except TypeError:
            return None
        return out, labels

    @functools.cached_property
    def doc_codes(self) -> tuple[np.ndarray, list[str]]:
        """(document code per chunk, document ids): dedupe by document in numpy."""
        if isinstance(self.chunks, ChunkColumns):
            return self.chunks.codes("doc_id")
        codes: dict[str, int] = {}
        out = np.fromiter((codes.setdefault(c.doc_id, len(codes)) for c in self.chunks), np.int64,
                          count=len(self.chunks))
        return out, list(codes)

    @functools.cached_property
    def every_position(self) -> np.ndarray:
        """``0 .. n-1`` (int64, read-only), built once: the dense channel's positions when
        nothing is filtered. Built per unfiltered query it cost ~10% of a hybrid query at 1M
        chunks (``bench_hybrid_1m``); the ANN path reads only its length, the exact paths
        index with it, and read-only it cannot be changed under a later query."""
        every = np.arange(len(self.chunks), dtype=np.int64)
        every.flags.writeable = False
        return every

    def prefilter(self, filters: Any, mask: np.ndarray | None = None, dense: bool = False) -> tuple[Any, Any]:
        """(positions, BM25 candidates) of ``filters`` AND ``mask``: positions for the dense
        channel only (every position without a filter), candidates None without a filter.
        A filter expression alone is kept in the ``FilterCache`` (the snapshot is immutable);
        a caller's mask is computed per call."""
        preds = compile_filters(filters, FILTER_FIELDS)
        key = filter_key(preds) if preds and mask is None else None
        entry = self._filter_cache.get(key) if key is not None else None
        filled = entry is None
        if entry is None:
            fmask = coded_mask(preds, self._column, self._field_codes, len(self.chunks)) if preds else None
            if mask is not None:
                fmask = mask if fmask is None else (fmask & mask)
            if fmask is None:
                return (self.every_position if dense else None), None
            entry = CachedFilter(fmask)
        if dense and entry.positions is None:
            entry.positions, filled = np.flatnonzero(entry.mask), True
        if "bm25" in self.channels and entry.bm25 is None:
            entry.bm25, filled = bm25_candidates(self.index, entry.mask, entry.positions), True
        if key is not None and filled:  # a hit with every form it needs is left as it is
            self._filter_cache.put(key, entry)
        return (entry.positions if dense else None), entry.bm25

    def _fused(self, query: str, filters: Any, top_k: int, depth: int | None, mask: np.ndarray | None):
        depth = max(depth or 0, top_k, self.candidate_k)
        variants = query_variants(self.rewriter, query)  # weighted: glossary.py
        queries = [v.text for v in variants]
        rankings: list[Run] = []
        bm25_best: dict[int, float] = {}
        # The guard's "not at all": a dense weight of 0 in hybrid search runs no dense channel.
        fusion = self.fusion
        run_dense = (self.embedding_backend is not None and "dense" in self.channels
                     and ("bm25" not in self.channels or fusion.dense_weight > 0))
        # The dense channel ranks the survivors' positions; BM25 may take them too (once for all variants).
        positions, cand = self.prefilter(filters, mask, run_dense)
        for v in variants if "bm25" in self.channels else ():
            hits = self.index.search(self.analyzer.analyze_query(v.text, self._languages), k=depth, candidates=cand)
            ranked, scores = hits.ids.tolist(), hits.scores.tolist()
            rankings.append(Run(ranked, scores, v.weight))
            for p, s in zip(ranked, scores, strict=True):
                if s > bm25_best.get(p, 0.0):
                    bm25_best[p] = s
        vec_best: dict[int, float] = {}
        dense_rankings: list[Run] = []
        if positions is not None:
            for v, (ranked, sims) in zip(variants, self._dense_rankings(queries, positions, depth), strict=True):
                dense_rankings.append(Run(ranked, [sims[p] for p in ranked], v.weight))
                for p, s in sims.items():
                    if p not in vec_best or s > vec_best[p]:
                        vec_best[p] = s
        fused = fuse_runs(rankings, dense_rankings, fusion, top_k=top_k, rrf_k=self.rrf_k)
        has_dense = self.embedding_backend is not None and "dense" in self.channels
        return fused, bm25_best, vec_best, has_dense

    def fusion_info(self) -> dict[str, Any]:
        """The fusion and model choice, as snippets and metadata report it."""
        info: dict[str, Any] = {**self.fusion.to_dict(), "channels": list(self.channels)}
        backend = self.embedding_backend
        if backend is not None:
            # A backend without ``model_id`` is identified by embedding a probe text: once per
            # backend object, not on every search (that doubled the embedding calls).
            known = getattr(self, "_model_id", None)
            if known is None or known[0] is not backend:
                known = self._model_id = (backend, backend_model_id(backend))
            info["model"] = known[1]
        if self.auto_choice is not None:
            info["auto_group"] = self.auto_choice.group
        return info
