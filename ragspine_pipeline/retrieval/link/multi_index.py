"""MultiIndexRetriever: several libraries, each searched on its own, fused with RRF.

A router may narrow the libraries for a query; if it fails or names none that exist,
every library is searched (routing never silently drops scope). Each snippet keeps its
``library_id``; ranks are renumbered after fusion.

Filter relaxation is decided once, over all the selected libraries: each library is
searched *with* the filters and with its own relaxation off; only when the filtered
search is empty everywhere is the query run again without filters, and then every
snippet says ``filters_relaxed: True``. One answer never mixes relaxed and unrelaxed
snippets — a library that merely has no match must not contribute unfiltered hits that
outrank another library's real matches.

Every selected library is fused, as the spec says. RRF gives each library's best hit the
same credit, so a library with nothing relevant still places its best weak match near
the top; the opt-in strength gate ``min_relative_strength`` (argument, else
``RAGSPINE_LIBRARY_MIN_STRENGTH``, else 0 = off) leaves out a library whose best BM25
score is below that fraction of the strongest library's best. BM25 scales differ between
libraries (idf is per library), so the gate is a heuristic: it is off unless asked for
(``benchmarks/bench_library_gate.py`` measures what it does).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ... import settings
from ..lexical.fusion import DEFAULT_RRF_K, rrf_fuse
from ..limits import check_query
from .narrative_link import NarrativeIndexRetriever

Router = Callable[[str], Sequence[str]]
MIN_STRENGTH_ENV = "RAGSPINE_LIBRARY_MIN_STRENGTH"
DEFAULT_MIN_RELATIVE_STRENGTH = 0.0  # the spec fuses every selected library


def min_strength_from_env() -> float:
    """``RAGSPINE_LIBRARY_MIN_STRENGTH`` through the settings registry: a fraction in [0, 1],
    unset or empty is 0 (off). Read when a retriever is built, never at import; a bad
    value is one ``SettingsError`` (a ValueError) naming the variable and the range."""
    return float(settings.get(MIN_STRENGTH_ENV))


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


class MultiIndexRetriever:
    """Searches the routed libraries one by one and fuses them with RRF.

    ``min_relative_strength``: None reads ``RAGSPINE_LIBRARY_MIN_STRENGTH`` (unset: 0, every
    selected library is fused); a value in (0, 1] turns the strength gate on.
    """

    def __init__(self, retrievers: Mapping[str, NarrativeIndexRetriever], *, router: Router | None = None,
                 rrf_k: int = DEFAULT_RRF_K, min_relative_strength: float | None = None,
                 retry_without_filters: bool = True) -> None:
        if min_relative_strength is None:
            min_relative_strength = min_strength_from_env()
        if not 0.0 <= min_relative_strength <= 1.0:
            raise ValueError("min_relative_strength must be in [0, 1]")
        self.min_relative_strength = min_relative_strength
        if not retrievers:
            raise ValueError("MultiIndexRetriever needs at least one library")
        self.retrievers = dict(retrievers)
        self.router = router
        self.rrf_k = rrf_k
        self.retry_without_filters = retry_without_filters

    def route(self, query: str) -> list[str]:
        if self.router is None:
            return sorted(self.retrievers)
        try:
            picked = [lib for lib in self.router(query) if lib in self.retrievers]
        except Exception:  # noqa: BLE001 - a failed router means "search everything"
            picked = []
        return sorted(set(picked)) or sorted(self.retrievers)

    def _search(self, libs: Sequence[str], query: str, filters: Any, top_k: int
                ) -> dict[str, list[dict[str, Any]]]:
        per_lib: dict[str, list[dict[str, Any]]] = {}
        for lib in libs:
            snippets = _without_relaxation(self.retrievers[lib]).retrieve(query, filters=filters, top_k=top_k)
            for s in snippets:
                s["library_id"] = lib
            per_lib[lib] = snippets
        return per_lib

    def retrieve(self, query: str, *, filters: Any = None, top_k: int = 50) -> list[dict[str, Any]]:
        check_query(query)
        if top_k <= 0:
            return []
        libs = self.route(query)
        per_lib = self._search(libs, query, filters, top_k)
        relaxed = False
        if filters and self.retry_without_filters and not any(per_lib.values()):
            per_lib = self._search(libs, query, None, top_k)
            relaxed = True
        for ss in per_lib.values():
            for s in ss:
                s["filters_relaxed"] = relaxed
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
        for rank, (key, score) in enumerate(ordered[:top_k], start=1):
            s = dict(by_key[key])
            s["rank"] = rank
            s["scores"] = {**s["scores"], "library_fused": score}
            out.append(s)
        return out
