"""MultiIndexRetriever: several libraries, each searched on its own, fused with RRF.

A router may narrow the libraries for a query; if it fails or names none that exist,
every library is searched (routing never silently drops scope). Each snippet keeps its
``library_id``; ranks are renumbered after fusion.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..lexical.fusion import DEFAULT_RRF_K, rrf_fuse
from .narrative_link import NarrativeIndexRetriever

Router = Callable[[str], Sequence[str]]


class MultiIndexRetriever:
    def __init__(self, retrievers: Mapping[str, NarrativeIndexRetriever], *, router: Router | None = None,
                 rrf_k: int = DEFAULT_RRF_K) -> None:
        if not retrievers:
            raise ValueError("MultiIndexRetriever needs at least one library")
        self.retrievers = dict(retrievers)
        self.router = router
        self.rrf_k = rrf_k

    def route(self, query: str) -> list[str]:
        if self.router is None:
            return sorted(self.retrievers)
        try:
            picked = [lib for lib in self.router(query) if lib in self.retrievers]
        except Exception:  # noqa: BLE001 - a failed router means "search everything"
            picked = []
        return sorted(set(picked)) or sorted(self.retrievers)

    def retrieve(self, query: str, *, filters: Any = None, top_k: int = 50) -> list[dict[str, Any]]:
        per_lib: dict[str, list[dict[str, Any]]] = {}
        for lib in self.route(query):
            snippets = self.retrievers[lib].retrieve(query, filters=filters, top_k=top_k)
            for s in snippets:
                s["library_id"] = lib
            per_lib[lib] = snippets
        if len(per_lib) == 1:
            return next(iter(per_lib.values()))
        by_key = {(lib, s["chunk_id"]): s for lib, ss in per_lib.items() for s in ss}
        fused = rrf_fuse([[(lib, s["chunk_id"]) for s in ss] for lib, ss in per_lib.items()], k=self.rrf_k)
        # Each library's #1 gets the same RRF score; order such ties by lexical strength
        # (then by key) rather than by library name.
        fused.sort(key=lambda kv: (-kv[1], -by_key[kv[0]]["scores"]["bm25"], kv[0]))
        out = []
        for rank, (key, score) in enumerate(fused[:top_k], start=1):
            s = dict(by_key[key])
            s["rank"] = rank
            s["scores"] = {**s["scores"], "library_fused": score}
            out.append(s)
        return out
