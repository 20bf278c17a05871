"""Several libraries ranked as ONE collection (``RAGSPINE_MULTI_FUSION=global``, issue 43).

Why: ranking each library alone and fusing the lists by rank gives every library's best
hit the same credit, so a library with nothing relevant placed its best weak match at
rank 2 (a chunk with ``bm25=0.0`` did), and the answer was ordered by library, not by
relevance. Here the selected libraries are scored as the union of their chunks:

* BM25 with the union's statistics: each library reports its part (N, summed length and
  df of every query token, over its filtered survivors: ``survivor_stats``), the parts are
  summed, and each library scores its postings with the sum (``search(stats=...)``), the
  two-phase statistics of refresh stacks and shards. With the same analyzer everywhere the
  scores are those of one index over the union, so the per-library lists merge by score.
  Every index of this project takes outside statistics (the sharded front sums its shards'
  parts and scores with the caller's in one phase); an injected index that cannot (no
  ``survivor_stats`` or no ``search(stats=)``) scores with its own, and the response says
  so (``fusion.bm25_stats: "per_library"``).
* The union is the libraries that hold the query's language (``language_scope``): a
  library in another language only raises N and flattens every idf of the query (xquad-de
  with two English sets added: -0.040 nDCG@10, all of it from the statistics). The union
  of every library answers when the query's language cannot be told or no library holds
  it, when the union's best BM25 match lies outside the scope, or when the scope gives
  fewer hits than asked. The dense channel is not scoped (a multilingual model matches
  across languages).
* Dense: raw cosine (each library's cached unit vectors against one query vector per
  model), merged by score across the libraries embedded with the same model. Libraries
  with different models cannot share scores: each model's merged list is its own ranking,
  fused by rank (``fusion.dense: "rank_per_model"``; convex fusion then falls back to RRF,
  since min-max over scores of different models is not comparable either).
* One fusion (``fusion.py``'s ``fuse_runs``) over the union: the libraries' common
  fusion config (what they do; why each chose it may differ), else the spec's RRF.
* Libraries that differ in dense model or fusion (``auto`` picks both per library's
  languages): the libraries holding the query's language decide both, as they weigh BM25
  (``_language_home``; ``last["dense_scope"]``): their common fusion holds, and with
  several models only theirs answer the dense channel.

A glossary variant is run in every library whose rewriter gives it (variants are keyed by
text and weight). Ids are ``(library, position)``; ties fall by (library, position).
"""

from __future__ import annotations

import inspect
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ..hybrid.fusion import DEFAULT_RRF_K, FusionConfig, Run, fuse_runs
from ..hybrid.retriever import HybridRetriever, RetrievalHit
from ..lexical.analysis.glossary import query_variants
from ..lexical.index.corpus_stats import CorpusStats
from ..vector.base import backend_model_id
from .language_scope import library_groups, stats_scope

Key = tuple[str, int]  # (library id, position in that library's index)


@dataclass(frozen=True)
class GlobalHit:
    """One hit of the union ranking: its library and the hit (position in that library)."""

    library_id: str
    hit: RetrievalHit


def takes_stats(index: Any) -> bool:
    """Whether ``index`` scores with outside statistics (``survivor_stats`` + ``search(stats=)``)."""
    if not callable(getattr(index, "survivor_stats", None)):
        return False
    try:
        return "stats" in inspect.signature(index.search).parameters
    except (TypeError, ValueError):
        return False


def _fuses(c: FusionConfig) -> tuple[str, float, int]:
    """What a fusion config does (its ``source``, why it was chosen, apart)."""
    return c.method, float(c.dense_weight), int(c.k)


def common_fusion(parts: Mapping[str, HybridRetriever], rrf_k: int) -> FusionConfig:
    """The libraries' fusion when they all fuse alike (method, dense weight, k; each may have
    chosen it for its own reason, ``source``: ``auto:cjk`` beside ``auto:mixed``), else the
    spec's RRF."""
    configs = [p.fusion for p in parts.values() if p.embedding_backend is not None]
    if not configs or len({_fuses(c) for c in configs}) > 1:
        return FusionConfig(k=rrf_k)
    sources = sorted({c.source for c in configs})
    return configs[0] if len(sources) == 1 else replace(configs[0], source=" + ".join(sources))


def _dense_differ(parts: Mapping[str, HybridRetriever]) -> bool:
    """Whether the libraries with a dense backend differ in model or fusion: only then may
    ``_language_home`` leave some of them out of the dense channel."""
    dense = [p for p in parts.values() if p.embedding_backend is not None]
    return (len({backend_model_id(p.embedding_backend) for p in dense}) > 1
            or len({_fuses(p.fusion) for p in dense}) > 1)


def _language_home(parts: Mapping[str, HybridRetriever], query: str, rrf_k: int,
                   bm25_best: Mapping[Key, float] | None = None) -> tuple[FusionConfig, set[str]] | None:
    """When the libraries' dense models or fusions differ (``auto`` picks them per library's
    languages), those of the libraries that hold the query's language (``stats_scope``, as
    BM25 is weighed): their common fusion and the libraries whose dense channel answers
    (every library's when the models are one). None when every library is in scope or none
    of the scope has a dense channel: then the union's rule holds. Why: a German question
    over German libraries embedded with e5 and English ones with MiniLM would otherwise fall
    back to RRF and fuse the English model's ranking, which knows no German, by rank beside
    e5's (xquad-de with two English sets as extra libraries: -0.0095 nDCG@10)."""
    if not _dense_differ(parts):
        return None
    models = {backend_model_id(p.embedding_backend) for p in parts.values() if p.embedding_backend is not None}
    scope = stats_scope(parts, query, list(parts))
    if len(scope) == len(parts) and bm25_best:
        # The query's language cannot be told from its words (a claim of terms without a
        # function word, most of SciFact's): the language of the text it matches best, the
        # library of its best BM25 match (whose statistics were the union's).
        (top, _), _ = max(bm25_best.items(), key=lambda kv: (kv[1], kv[0]))
        groups = library_groups(parts[top])
        scope = [lib for lib in parts if library_groups(parts[lib]) & groups] or scope
    home = {lib: parts[lib] for lib in scope}
    if len(home) == len(parts) or not any(p.embedding_backend is not None for p in home.values()):
        return None
    return common_fusion(home, rrf_k), (set(home) if len(models) > 1 else set(parts))


def _merge(per_lib: list[tuple[str, np.ndarray, np.ndarray]], depth: int) -> tuple[list[Key], list[float]]:
    """Per-library (positions, scores) merged by score (ties: library, position), cut at depth."""
    rows = [(-float(s), lib, int(p)) for lib, ids, sc in per_lib for p, s in zip(ids.tolist(), sc.tolist(),
                                                                                  strict=True)]
    rows.sort()
    rows = rows[:depth]
    return [(lib, p) for _, lib, p in rows], [-s for s, _, _ in rows]


def _bm25_merged(parts: Mapping[str, HybridRetriever], libs: list[str], toks: Mapping[str, list[str]],
                 own: Mapping[str, CorpusStats], union: list[str], cand: Mapping[str, Any], depth: int
                 ) -> tuple[list[Key], list[float]]:
    """``libs`` searched as one collection: the libraries in ``own`` score with their summed
    statistics, any other with its own; the lists merged by score."""
    total = sum(own.values(), CorpusStats.zero(len(union))) if own else None
    where = {t: i for i, t in enumerate(union)}
    per_lib = []
    for lib in libs:
        ix = parts[lib].index
        if lib in own and total is not None and total.n > 0 and total.total > 0:
            df = total.df[[where[t] for t in toks[lib]]] if toks[lib] else np.zeros(0, np.int64)
            got = ix.search(toks[lib], k=depth, candidates=cand[lib],
                            stats=CorpusStats(total.n, total.total, np.asarray(df, np.int64)))
        else:
            got = ix.search(toks[lib], k=depth, candidates=cand[lib])
        per_lib.append((lib, got.ids, got.scores))
    return _merge(per_lib, depth)


def _bm25_runs(parts: Mapping[str, HybridRetriever], variants: Mapping[tuple[str, float], list[str]],
               cand: Mapping[str, Any], depth: int, best: dict[Key, float], need: int,
               language_scoped: bool = True, report: dict[str, Any] | None = None) -> tuple[list[Run], bool]:
    """One merged BM25 run per variant; whether every library scored with the union's statistics.

    With ``language_scoped``, a query is weighed against the libraries that hold its
    language (``language_scope``), unless the union's best match lies outside them or
    they give fewer than ``need`` hits: then against every library. ``report["bm25_scope"]``
    gets, per variant, the libraries whose statistics weighed it (None: every library)."""
    runs: list[Run] = []
    exact = True
    for (text, weight), libs in variants.items():
        libs = [lib for lib in libs if "bm25" in parts[lib].channels]
        if not libs:
            continue
        toks = {lib: list(parts[lib].analyzer.analyze_query(text, parts[lib]._languages)) for lib in libs}
        shared = [lib for lib in libs if takes_stats(parts[lib].index)]
        exact = exact and len(shared) == len(libs)
        union = list(dict.fromkeys(t for lib in libs for t in toks[lib]))
        own = {lib: parts[lib].index.survivor_stats(union, cand[lib]) for lib in shared}
        scope = set(stats_scope(parts, text, shared) if language_scoped else shared)
        ids: list[Key] = []
        scores: list[float] = []
        # The scope answers unless another library holds the union's best match.
        if scope != set(shared) and all(lib in scope for lib, _ in
                                        _bm25_merged(parts, shared, toks, own, union, cand, 1)[0]):
            inside = [lib for lib in libs if lib in scope or lib not in own]
            ids, scores = _bm25_merged(parts, inside, toks, {lib: own[lib] for lib in scope}, union, cand, depth)
        if len(ids) < need:  # no scope, or it cannot fill the answer: the union
            ids, scores = _bm25_merged(parts, libs, toks, own, union, cand, depth)
        elif report is not None:
            report.setdefault("bm25_scope", {})[text] = sorted(scope)
        runs.append(Run(ids, scores, weight))
        for key, s in zip(ids, scores, strict=True):
            if s > best.get(key, 0.0):
                best[key] = s
    return runs, exact


def _dense_runs(parts: Mapping[str, HybridRetriever], variants: Mapping[tuple[str, float], list[str]],
                positions: Mapping[str, np.ndarray | None], depth: int,
                best: dict[Key, float]) -> tuple[list[Run], int]:
    """Per variant and per model, one run merged by raw cosine; how many models there were."""
    groups: dict[str, list[str]] = {}
    for lib, p in parts.items():
        if positions.get(lib) is not None:
            groups.setdefault(backend_model_id(p.embedding_backend), []).append(lib)
    runs: list[Run] = []
    for model_libs in groups.values():
        be = parts[model_libs[0]].embedding_backend
        embed_q = getattr(be, "embed_queries", None) or be.embed_texts
        wanted = [(v, [lib for lib in libs if lib in model_libs]) for v, libs in variants.items()]
        wanted = [(v, libs) for v, libs in wanted if libs]
        qv = np.asarray(embed_q([v[0] for v, _ in wanted]), dtype=np.float32)
        qv = qv / np.where((n := np.linalg.norm(qv, axis=1, keepdims=True)) == 0, 1, n)
        for row, ((_, weight), libs) in zip(qv, wanted, strict=True):
            per_lib = []
            for lib in libs:
                pos = positions[lib]
                if pos is None or not len(pos):
                    continue
                # The library's own dense step (exact cosines; a sharded library's shards answer it).
                top = parts[lib].dense_top_vectors(row[None, :], pos, depth)[0]
                per_lib.append((lib, top.ids, top.scores))
            ids, scores = _merge(per_lib, depth)
            runs.append(Run(ids, scores, weight))
            for key, s in zip(ids, scores, strict=True):
                if key not in best or s > best[key]:
                    best[key] = s
    return runs, len(groups)


def rank_union(parts: Mapping[str, HybridRetriever], query: str, filters: Any, top_k: int, *,
               rrf_k: int = DEFAULT_RRF_K, language_scoped: bool = True,
               report: dict[str, Any] | None = None) -> list[GlobalHit]:
    """The first ``top_k`` hits of the libraries ``parts`` ranked as one collection under
    ``filters`` (RESTRICTED chunks included, as ``HybridRetriever.search``; the exits
    remove them)."""
    if top_k <= 0 or not parts:
        return []
    depth = max(top_k, *(p.candidate_k for p in parts.values()))
    fusion = common_fusion(parts, rrf_k)
    variants: dict[tuple[str, float], list[str]] = {}
    for lib, p in parts.items():
        for v in query_variants(p.rewriter, query):
            variants.setdefault((v.text, float(v.weight)), []).append(lib)
    dense_capable = {lib for lib, p in parts.items() if p.embedding_backend is not None and "dense" in p.channels}
    # Which libraries answer the dense channel may hang on BM25's best match (``_language_home``):
    # then their dense positions (an arange(n) without a filter) are built after it, for those
    # kept only; otherwise in the one pre-filter call, as always.
    later = language_scoped and _dense_differ(parts)
    positions, cand = {}, {}
    for lib, p in parts.items():
        positions[lib], cand[lib] = p.prefilter(filters, None, lib in dense_capable and not later)
    bm25_best: dict[Key, float] = {}
    vec_best: dict[Key, float] = {}
    bm25, exact = _bm25_runs(parts, variants, cand, depth, bm25_best, top_k, language_scoped, report)
    dense_libs = set(parts)
    home = _language_home(parts, query, rrf_k, bm25_best) if language_scoped else None
    if home is not None:
        fusion, dense_libs = home
        if report is not None:
            report["dense_scope"] = sorted(dense_libs)
    for lib, p in parts.items():
        if lib not in dense_libs or ("bm25" in p.channels and fusion.dense_weight <= 0):
            positions[lib] = None  # no dense channel here (a dense weight of 0 runs none)
        elif later and lib in dense_capable:  # positions only: its BM25 candidates are built
            positions[lib] = p.prefilter(filters, None, True)[0]
    dense, models = _dense_runs(parts, variants, positions, depth, vec_best)
    if models > 1 and fusion.method == "convex":
        fusion = FusionConfig(k=fusion.k, source=fusion.source)  # scores of different models: ranks only
    fused: list[tuple[Hashable, float]] = fuse_runs(bm25, dense, fusion, top_k=top_k, rrf_k=rrf_k)
    info = None
    if any(p.embedding_backend is not None for p in parts.values()):
        info = {**fusion.to_dict(), "channels": sorted({c for p in parts.values() for c in p.channels}),
                "scope": "global", "bm25_stats": "union" if exact else "per_library",
                "dense": "raw_cosine" if models <= 1 else "rank_per_model"}
    out = []
    for key, score in fused:
        lib, pos = key  # type: ignore[misc]
        p = parts[lib]
        has_dense = p.embedding_backend is not None and "dense" in p.channels
        out.append(GlobalHit(lib, RetrievalHit(position=pos, chunk=p.chunks[pos], bm25=bm25_best.get(key, 0.0),
                                               vector=vec_best.get(key) if has_dense else None, fused=score,
                                               fusion=info)))
    return out


def union_hits(parts: Mapping[str, HybridRetriever], query: str, filters: Any, top_k: int,
               restricted_budget: Sequence[int] = (), *, rrf_k: int = DEFAULT_RRF_K,
               language_scoped: bool = True, report: dict[str, Any] | None = None) -> tuple[list[GlobalHit], bool]:
    """``rank_union`` asked for ``top_k`` plus the restricted chunks the libraries hold (so
    ``top_k`` open hits survive exit #2), and whether more may exist past them."""
    want = top_k + int(sum(restricted_budget))
    hits = rank_union(parts, query, filters, want, rrf_k=rrf_k, language_scoped=language_scoped, report=report)
    return hits, len(hits) >= want


__all__ = ["GlobalHit", "common_fusion", "rank_union", "takes_stats", "union_hits"]
