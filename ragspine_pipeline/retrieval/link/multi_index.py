"""MultiIndexRetriever: several libraries searched as one answer.

Ranking (``RAGSPINE_MULTI_FUSION``, read when the retriever is built; ``fusion=`` overrides):

* ``global`` (default): the selected libraries are ranked as ONE collection
  (``global_rank``): BM25 with the union's statistics, raw cosine across libraries
  embedded with the same model, one fusion over the union. A query is weighed against the
  libraries that hold its language (``language_scope``; ``language_scope=False`` sums
  every library's statistics), and ``last["bm25_scope"]`` names them. ``scores.fused`` is that one
  fusion's score, so it falls with rank. Used when the libraries share their reranker,
  post-processor and rerank depth (the served assembly resolves them once for all); else
  the retriever falls back to ``rrf`` and ``last["fusion"]`` says why.
* ``rrf``: the spec's rule: each library searched on its own, the ranked lists fused with
  RRF. ``scores.fused`` is the RRF score across libraries (``scores.library_fused`` too,
  as before; ``scores.within_library`` keeps the library's own fused score). Each
  library's best hit gets the same credit, so a library with nothing relevant still
  places its best weak match near the top (``benchmarks/results/multi_library.md``).

Routing, then fallback, then relaxation (the spec's availability fallback comes before any
relaxation). A router may narrow the libraries for a query; if it fails or names none that
exist, every library is searched. The search then goes, stopping at the first step with
an answer:

1. the routed libraries, with the filters;
2. every library, with the filters (only when the router narrowed the choice): a strict
   filter the routed libraries cannot satisfy is tried everywhere before it is relaxed;
3. only then, when relaxation is allowed and there were filters: the routed libraries
   without filters, then every library without them. Every snippet of a relaxed answer
   says ``filters_relaxed: True``; one answer never mixes relaxed and unrelaxed snippets.

Snippets of a widened answer (step 2, or step 3 on every library) carry
``route_widened: True``; ``last`` records the routed and searched libraries, whether
filters were relaxed and the ranking used.

Duplicates: passages with the same normalised text (or near-identical,
``postprocess.dedup``) appear once, across libraries too, with the others listed in
``duplicates``; the top-k is filled after collapsing.

The opt-in strength gate ``min_relative_strength`` (argument, else
``RAGSPINE_LIBRARY_MIN_STRENGTH``, else 0 = off) leaves out a library whose best BM25
score is below that fraction of the strongest library's best
(``benchmarks/bench_library_gate.py`` measures it). Each snippet keeps its ``library_id``.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ... import settings
from ..hybrid.fusion import DEFAULT_RRF_K, rrf_fuse
from ..limits import check_query
from ..postprocess.dedup import collapse
from .global_rank import takes_stats, union_hits
from .narrative_index import (
    DUPLICATE_MARGIN,
    REFILL_ROUNDS,
    LabelCheck,
    NarrativeIndexRetriever,
    cited_snippets,
    group_candidates,
    open_ranked,
)

Router = Callable[[str], Sequence[str]]
MIN_STRENGTH_ENV = "RAGSPINE_LIBRARY_MIN_STRENGTH"
DEFAULT_MIN_RELATIVE_STRENGTH = 0.0  # the spec fuses every selected library
MULTI_FUSION_ENV = "RAGSPINE_MULTI_FUSION"
MULTI_FUSIONS = ("global", "rrf")


def min_strength_from_env() -> float:
    """``RAGSPINE_LIBRARY_MIN_STRENGTH`` through the settings registry: a fraction in [0, 1],
    unset or empty is 0 (off). Read when a retriever is built, never at import; a bad
    value is one ``SettingsError`` (a ValueError) naming the variable and the range."""
    return float(settings.get(MIN_STRENGTH_ENV))


def multi_fusion_from_env() -> str:
    """``RAGSPINE_MULTI_FUSION`` through the settings registry: ``global`` (default) or ``rrf``."""
    return str(settings.get(MULTI_FUSION_ENV))


def _without_relaxation(retriever: NarrativeIndexRetriever) -> NarrativeIndexRetriever:
    """A shallow view of ``retriever`` that never retries without filters on its own.

    A copy (not a flag flipped in place) so concurrent queries on the shared retriever
    are unaffected; the index and caches are shared, nothing is rebuilt.
    """
    if not getattr(retriever, "retry_without_filters", False):
        return retriever
    view = copy.copy(retriever)
    view.retry_without_filters = False
    return view


def _ref(s: Mapping[str, Any]) -> dict[str, Any]:
    ref = {"doc_id": s["doc_id"], "chunk_id": s["chunk_id"], "source_locator": s["source_locator"]}
    if s.get("library_id"):
        ref["library_id"] = s["library_id"]
    return ref


def collapse_snippets(snippets: Sequence[dict[str, Any]], limit: int | None = None) -> list[dict[str, Any]]:
    """Snippets (best first) with duplicate passages collapsed into the first of each
    group, which lists the others (and their own duplicates) in ``duplicates``."""
    out = []
    for g in collapse(snippets, lambda s: s["text"], limit=limit):
        s = g.kept
        if g.copies:
            s = dict(s)
            s["duplicates"] = [*s.get("duplicates", ()),
                               *(r for c in g.copies for r in (_ref(c), *c.get("duplicates", ())))]
        out.append(s)
    return out


class MultiIndexRetriever:
    """Searches the routed libraries (then every library) and ranks them as one answer.

    ``fusion``: ``global`` | ``rrf`` (None reads ``RAGSPINE_MULTI_FUSION``, default global).
    ``min_relative_strength``: None reads ``RAGSPINE_LIBRARY_MIN_STRENGTH`` (unset: 0, every
    selected library is fused); a value in (0, 1] turns the strength gate on.
    ``language_scope``: ``global`` weighs BM25 against the libraries of the query's
    language (``language_scope``); False sums every searched library's statistics.
    """

    def __init__(self, retrievers: Mapping[str, NarrativeIndexRetriever], *, router: Router | None = None,
                 rrf_k: int = DEFAULT_RRF_K, min_relative_strength: float | None = None,
                 retry_without_filters: bool = True, fusion: str | None = None,
                 language_scope: bool = True) -> None:
        if min_relative_strength is None:
            min_relative_strength = min_strength_from_env()
        if not 0.0 <= min_relative_strength <= 1.0:
            raise ValueError("min_relative_strength must be in [0, 1]")
        fusion = multi_fusion_from_env() if fusion is None else fusion.strip().lower()
        if fusion not in MULTI_FUSIONS:
            raise ValueError(f"unknown multi-library fusion {fusion!r} ({MULTI_FUSION_ENV}); "
                             f"expected one of {MULTI_FUSIONS}")
        self.fusion = fusion
        self.language_scope = language_scope
        self.min_relative_strength = min_relative_strength
        if not retrievers:
            raise ValueError("MultiIndexRetriever needs at least one library")
        self.retrievers = dict(retrievers)
        self.router = router
        self.rrf_k = rrf_k
        self.retry_without_filters = retry_without_filters
        self.last: dict[str, Any] = {}  # the last query's route, fallback and ranking, for reports
        self._scope_report: dict[str, Any] = {}

    def route(self, query: str) -> list[str]:
        if self.router is None:
            return sorted(self.retrievers)
        try:
            picked = [lib for lib in self.router(query) if lib in self.retrievers]
        except Exception:  # noqa: BLE001 - a failed router means "search everything"
            picked = []
        return sorted(set(picked)) or sorted(self.retrievers)

    def retrieve(self, query: str, *, filters: Any = None, top_k: int = 50) -> list[dict[str, Any]]:
        check_query(query)
        if top_k <= 0:
            return []
        routed, everyone = self.route(query), sorted(self.retrievers)
        steps = [(routed, filters, False)]
        if routed != everyone:
            steps.append((everyone, filters, False))  # the availability fallback, before any relaxation
        if filters and self.retry_without_filters:
            steps.append((routed, None, True))
            if routed != everyone:
                steps.append((everyone, None, True))
        for step in steps:
            out, how = self._answer(step[0], query, step[1], top_k)
            if out:
                break
        libs, relaxed = step[0], step[2]
        widened = libs != routed
        for s in out:
            s["filters_relaxed"] = relaxed
            if widened:
                s["route_widened"] = True
        self.last = {"routed": routed, "searched": libs, "widened": widened, "filters_relaxed": relaxed,
                     "fusion": how}
        if how == "global":  # an injected index without outside statistics scores with its own
            exact = all(takes_stats(self.retrievers[lib].index.retriever.index) for lib in libs)
            self.last["bm25_stats"] = "union" if exact else "per_library"
            # The libraries whose statistics weighed each query text (``language_scope``);
            # a text not listed was weighed against every library searched.
            self.last["bm25_scope"] = self._scope_report.get("bm25_scope", {})
            if "dense_scope" in self._scope_report:
                # Libraries differing in dense model or fusion: those of the query's language
                # answered the dense channel with their fusion (``global_rank._language_home``).
                self.last["dense_scope"] = self._scope_report["dense_scope"]
        return out

    # ------------------------------------------------------------------ one step
    def _answer(self, libs: Sequence[str], query: str, filters: Any, top_k: int) -> tuple[list[dict[str, Any]], str]:
        if self.fusion == "global":
            why = self._global_blocker(libs)
            if why is None:
                return self._global(libs, query, filters, top_k), "global"
            return self._rrf(libs, query, filters, top_k), f"rrf ({why})"
        return self._rrf(libs, query, filters, top_k), "rrf"

    def _global_blocker(self, libs: Sequence[str]) -> str | None:
        """Why these libraries cannot be ranked as one (None: they can)."""
        rs = [self.retrievers[lib] for lib in libs]
        if not all(isinstance(r, NarrativeIndexRetriever) for r in rs):
            return "a library is not a NarrativeIndexRetriever"
        for attr in ("reranker", "postprocessor"):
            if len({id(getattr(r, attr)) for r in rs}) > 1:
                return f"libraries have different {attr}s"
        if len({(r.rerank_depth, r.collapse_duplicates) for r in rs}) > 1:
            return "libraries have different rerank depths or duplicate settings"
        return None

    def _global(self, libs: Sequence[str], query: str, filters: Any, top_k: int) -> list[dict[str, Any]]:
        first = self.retrievers[libs[0]]
        parts = {lib: self.retrievers[lib].index.retriever for lib in libs}
        budget = [int(p.restricted.sum()) for p in parts.values()]
        restricted = LabelCheck()
        self._scope_report: dict[str, Any] = {}
        depth = max(top_k, first.rerank_depth) if first.reranker is not None else top_k
        depth += DUPLICATE_MARGIN if first.collapse_duplicates else 0
        for _ in range(REFILL_ROUNDS):
            self._scope_report.clear()
            ghits, more = union_hits(parts, query, filters, depth, budget, rrf_k=self.rrf_k,
                                     language_scoped=self.language_scope, report=self._scope_report)
            lib_of = {id(g.hit): g.library_id for g in ghits}
            groups = group_candidates(open_ranked(query, [g.hit for g in ghits], first.reranker, first.rerank_depth,
                                                  restricted, limit=None if first.collapse_duplicates else top_k),
                                      first.collapse_duplicates, None if self.min_relative_strength > 0 else top_k)
            if self.min_relative_strength > 0:
                groups = self._gate_groups(groups, lib_of)
            if len(groups) >= top_k or not more:
                break
            depth *= 2
        return cited_snippets(query, groups[:top_k], relaxed=False, library_of=lambda h: lib_of[id(h)],
                              postprocessor=first.postprocessor)

    def _gate_groups(self, groups: list[Any], lib_of: Mapping[int, str]) -> list[Any]:
        def hit(g: Any) -> Any:
            return g.kept if not isinstance(g.kept, dict) else g.kept["_hit"]

        best: dict[str, float] = {}
        for g in groups:
            h = hit(g)
            best[lib_of[id(h)]] = max(best.get(lib_of[id(h)], 0.0), h.bm25)
        top = max(best.values(), default=0.0)
        if top <= 0:
            return groups
        return [g for g in groups if best[lib_of[id(hit(g))]] >= self.min_relative_strength * top]

    def _search(self, libs: Sequence[str], query: str, filters: Any, top_k: int
                ) -> dict[str, list[dict[str, Any]]]:
        per_lib: dict[str, list[dict[str, Any]]] = {}
        for lib in libs:
            snippets = _without_relaxation(self.retrievers[lib]).retrieve(query, filters=filters, top_k=top_k)
            for s in snippets:
                s["library_id"] = lib
            per_lib[lib] = snippets
        return per_lib

    def _rrf(self, libs: Sequence[str], query: str, filters: Any, top_k: int) -> list[dict[str, Any]]:
        depth = top_k + DUPLICATE_MARGIN
        for _ in range(REFILL_ROUNDS):
            per_lib = self._search(libs, query, filters, depth)
            more = any(len(ss) >= depth for ss in per_lib.values())
            out = self._rrf_fuse(per_lib, depth, top_k)
            if len(out) >= top_k or not more:
                break
            depth *= 2
        out = out[:top_k]
        for rank, s in enumerate(out, start=1):
            s["rank"] = rank
        return out

    def _rrf_fuse(self, per_lib: dict[str, list[dict[str, Any]]], depth: int, top_k: int) -> list[dict[str, Any]]:
        per_lib = {lib: ss for lib, ss in per_lib.items() if ss}
        best = {lib: max((s["scores"]["bm25"] for s in ss), default=0.0) for lib, ss in per_lib.items()}
        top = max(best.values(), default=0.0)
        if top > 0 and self.min_relative_strength > 0:
            per_lib = {lib: ss for lib, ss in per_lib.items() if best[lib] >= self.min_relative_strength * top}
        if not per_lib:
            return []
        if len(per_lib) == 1:
            return next(iter(per_lib.values()))
        by_key = {(lib, s["chunk_id"]): s for lib, ss in per_lib.items() for s in ss}
        scores = rrf_fuse([[(lib, s["chunk_id"]) for s in ss] for lib, ss in per_lib.items()], k=self.rrf_k)
        # Each library's #1 gets the same RRF score; order such ties by lexical strength
        # (then by key) rather than by library name.
        ordered = sorted(scores.items(), key=lambda kv: (-kv[1], -by_key[kv[0]]["scores"]["bm25"], kv[0]))
        out = []
        for key, score in ordered[:depth]:
            s = dict(by_key[key])
            # ``fused`` is the score the answer is ranked by; the library's own stays beside it.
            s["scores"] = {**s["scores"], "fused": score, "library_fused": score,
                           "within_library": s["scores"]["fused"]}
            out.append(s)
        on = all(getattr(self.retrievers[lib], "collapse_duplicates", True) for lib in per_lib)
        return collapse_snippets(out, top_k) if on else out
