"""RetrievalResource: read-only cited retrieval over the latest published snapshots.

Opens nothing for writing: it reads snapshot manifests and immutable Parquet versions.
Each call checks the libraries' published snapshot ids and rebuilds an index only when
one changed, so a refresh is picked up without a restart, and a query sees one whole
snapshot (the one it resolved), never a mix of versions.

The service variables mean here what they mean in the CLI: ``RAGSPINE_RETRIEVAL_MODE``
(``economy`` / ``bm25`` / ``lexical`` build no embedding backend and load no vectors;
``auto`` serves what the snapshot has), ``RAGSPINE_EMBEDDING_BACKEND`` (for ``hybrid`` /
``vector`` over a snapshot without vectors) and ``RAGSPINE_RERANKER``. The query layers
(``ragspine_pipeline.retrieval.query.make_query_layers``) read ``RAGSPINE_QUERY_TRANSFORM``,
``RAGSPINE_QUERY_DECOMPOSE``, ``RAGSPINE_ADAPTIVE``, ``RAGSPINE_CORRECTIVE``,
``RAGSPINE_AUTO_FILTERS``, ``RAGSPINE_POSTPROCESSOR`` and the gate's competitor config;
they wrap the served retriever once, over all libraries (post-processors run after the
multi-index fusion). The resource's own fields, when set, take precedence over the
variables. With every layer off ``ask`` returns exactly the base retriever's snippets;
with any on it returns a ``RetrievalResult`` (a list of snippet dicts with ``.report``:
refusals, status, route, filters).
"""

import os
import threading
from pathlib import Path
from typing import Any

import dagster as dg
from pydantic import Field, PrivateAttr

from ragspine_pipeline.modes import RetrievalModeError
from ragspine_pipeline.retrieval.link.multi_index import MultiIndexRetriever
from ragspine_pipeline.retrieval.link.narrative_link import (
    NarrativeIndexRetriever,
    default_glossary_path,
)
from ragspine_pipeline.retrieval.link.published import load_published_index, retrieval_mode
from ragspine_pipeline.retrieval.query import (
    LayeredRetriever,
    SecurityConfigError,
    make_query_layers,
)
from ragspine_pipeline.retrieval.rerank.cross_encoder import (
    RERANKER_ENV,
    make_reranker,
    reranker_from_env,
)
from ragspine_pipeline.warehouse.pipeline import (
    SNAPSHOT,
    published_libraries,
    serving_retriever,
)
from ragspine_pipeline.warehouse.rerank_vectors import attach_library_vectors
from ragspine_pipeline.warehouse.versioned import VersionedTables

from .warehouse import default_warehouse_root

LAYER_FIELDS = ("transform", "decompose", "adaptive", "corrective", "auto_filters", "postprocessor")


class RetrievalResource(dg.ConfigurableResource):
    warehouse_root: str = Field(default="", description="Warehouse folder; empty: RAGSPINE_WAREHOUSE or data/warehouse.")
    libraries: list[str] = Field(default=[], description="Libraries to serve; empty: every library with a published snapshot.")
    glossary_path: str = Field(default="", description="Glossary JSON for multi-query rewriting; empty: "
                                                       "RAGSPINE_GLOSSARY, else the demo corpus glossary.")
    mode: str = Field(default="", description="Retrieval mode; empty: RAGSPINE_RETRIEVAL_MODE (default auto). "
                                              "economy/bm25/lexical build no embedding backend and load no vectors.")
    reranker: str = Field(default="", description="Reranker spec; empty: RAGSPINE_RERANKER (default none).")
    transform: str = Field(default="", description="Query transform (none, rag_fusion, hyde, step_back); "
                                                   "empty: RAGSPINE_QUERY_TRANSFORM.")
    decompose: str = Field(default="", description="none or llm[:N]; empty: RAGSPINE_QUERY_DECOMPOSE.")
    adaptive: str = Field(default="", description="off, on or llm; empty: RAGSPINE_ADAPTIVE.")
    corrective: str = Field(default="", description="off, on or llm (CRAG); empty: RAGSPINE_CORRECTIVE.")
    auto_filters: str = Field(default="", description="off or on; empty: RAGSPINE_AUTO_FILTERS.")
    postprocessor: str = Field(default="", description="Post-processor chain, e.g. 'mmr,lost_in_middle'; "
                                                       "empty: RAGSPINE_POSTPROCESSOR.")

    _cache: dict = PrivateAttr(default_factory=dict)
    _lock: Any = PrivateAttr(default_factory=threading.Lock)

    def _tables(self) -> VersionedTables:
        return VersionedTables(self.warehouse_root or default_warehouse_root())

    def published_libraries(self) -> list[str]:
        return published_libraries(self._tables(), self.libraries or None)

    def _mode(self) -> str:
        try:
            return retrieval_mode(self.mode or None)
        except RetrievalModeError as exc:
            raise dg.Failure(str(exc)) from None

    def _reranker(self):
        """One reranker per resource and spec (building one may load a model)."""
        spec = self.reranker or os.environ.get(RERANKER_ENV, "none")
        hit = self._cache.get(("reranker",))
        if hit is None or hit[0] != spec:
            self._cache[("reranker",)] = (spec, make_reranker(self.reranker) if self.reranker else reranker_from_env())
        return self._cache[("reranker",)][1]

    def retriever_for(self, library: str) -> NarrativeIndexRetriever:
        wh = self._tables()
        snap = wh.latest(SNAPSHOT, library)
        if snap is None:
            raise dg.Failure(f"library {library!r} has no published retrieval snapshot yet")
        mode = self._mode()
        with self._lock:
            reranker = self._reranker()
            attach_library_vectors(reranker, wh.root, [library])  # precomputed passage vectors, if any
            key = (snap.manifest["metadata"]["snapshot_id"], mode, id(reranker))
            hit = self._cache.get(library)
            if hit is None or hit[0] != key:
                glossary = Path(self.glossary_path) if self.glossary_path else default_glossary_path()
                try:
                    index = load_published_index(wh, library, mode=mode, glossary=glossary)
                except RetrievalModeError as exc:
                    raise dg.Failure(str(exc)) from None
                self._cache[library] = (key, NarrativeIndexRetriever(index, reranker=reranker))
            return self._cache[library][1]

    def retriever(self, **layers: str) -> NarrativeIndexRetriever | MultiIndexRetriever | LayeredRetriever:
        """The served retriever (one library or a MultiIndexRetriever) with the configured
        query layers around it; the base itself when every layer is off. ``layers``
        (transform, decompose, adaptive, corrective, auto_filters, postprocessor) override
        the resource's fields for one call, e.g. from the ``ask`` job's run config."""
        unknown = set(layers) - set(LAYER_FIELDS)
        if unknown:
            raise TypeError(f"unknown query layer option(s): {sorted(unknown)}; use {', '.join(LAYER_FIELDS)}")
        pick = {f: (layers.get(f) or getattr(self, f)) or None for f in LAYER_FIELDS}
        libs = self.published_libraries()
        if not libs:
            raise dg.Failure(f"no published snapshots under {Path(self.warehouse_root or default_warehouse_root())}")
        base = serving_retriever({lib: self.retriever_for(lib) for lib in libs})
        glossary = Path(self.glossary_path) if self.glossary_path else default_glossary_path()
        try:
            return make_query_layers(base, **pick, glossary=glossary)
        except (ValueError, TypeError, SecurityConfigError) as exc:
            raise dg.Failure(f"query layers: {exc}") from None

    def ask(self, query: str, *, filters: Any = None, top_k: int = 5, **layers: str) -> list[dict[str, Any]]:
        return self.retriever(**layers).retrieve(query, filters=filters, top_k=top_k)
