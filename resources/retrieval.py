"""RetrievalResource: read-only cited retrieval over the latest published snapshots.

Opens nothing for writing: it reads snapshot manifests and immutable Parquet versions.
Each call checks the libraries' published snapshot ids and rebuilds an index only when
one changed, so a refresh is picked up without a restart, and a query sees one whole
snapshot (the one it resolved), never a mix of versions.

A library's retriever is warmed when it is opened (``warm``, on by default:
``serving.warm_retriever``, what the service does before it says ready), so the process
holding the resource answers its first question as fast as the next; the CLI's one-shot
query stays unwarmed.

A thin adapter over ``ragspine_pipeline.serving``, the one assembly the CLI and the
Python API serve too (same settings, byte-identical snippets; ``tests/test_one_door.py``):
``serving.library_retriever`` per library (cached here by snapshot id), ``serving.serve``
for the router (``RAGSPINE_ROUTER``, default rules) and the layers around the whole.

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

import threading
from pathlib import Path
from typing import Any

import dagster as dg
from pydantic import Field, PrivateAttr

from ragspine_pipeline import serving, settings
from ragspine_pipeline.modes import RetrievalModeError, retrieval_mode
from ragspine_pipeline.retrieval.lexical.analysis.glossary import GlossaryError
from ragspine_pipeline.retrieval.link.assembly import LAYER_KEYS, serving_reranker
from ragspine_pipeline.retrieval.link.multi_index import MultiIndexRetriever
from ragspine_pipeline.retrieval.link.narrative_index import NarrativeIndexRetriever
from ragspine_pipeline.retrieval.query import LayeredRetriever, SecurityConfigError
from ragspine_pipeline.retrieval.rerank.cross_encoder import RERANKER_ENV
from ragspine_pipeline.warehouse.pipeline import SNAPSHOT, published_libraries, select_snapshot
from ragspine_pipeline.warehouse.versioned import VersionedTables, WarehouseError

from .instance_storage import secure_instance_storage
from .warehouse import default_warehouse_root

LAYER_FIELDS = LAYER_KEYS  # the make_query_layers keywords, as fields of the same names


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
    router: str = Field(default="", description="Library router over several libraries: rules (glossary/metadata, "
                                                "the default), llm (RAGSPINE_LLM_BASE_URL, rules as fallback) or "
                                                "none; empty: RAGSPINE_ROUTER. A failed or empty route searches all.")
    chunker: str = Field(default="", description="Serve a published chunking (e.g. 'layout', or a full key "
                                                 "'layout:480:80'): each library's newest snapshot built by it; "
                                                 "empty: the published snapshot.")

    warm: bool = Field(default=True, description="Warm each library's index when it is opened, before its "
                                                 "first answer (its files read into the page cache, lazy checks "
                                                 "and kernels paid by a probe: serving.warm_retriever), as the "
                                                 "service does; false for a run that asks one question.")

    _cache: dict = PrivateAttr(default_factory=dict)
    _lock: Any = PrivateAttr(default_factory=threading.Lock)

    def setup_for_execution(self, context: dg.InitResourceContext) -> None:
        """The ``ask`` job's runs keep the instance's run storage owner-only too (#42 item 6)."""
        secure_instance_storage(context.instance)

    def _tables(self) -> VersionedTables:
        return VersionedTables(self.warehouse_root or default_warehouse_root())

    def published_libraries(self) -> list[str]:
        return published_libraries(self._tables(), self.libraries or None)

    def _mode(self) -> str:
        try:
            return retrieval_mode(self.mode or None)
        except RetrievalModeError as exc:
            raise dg.Failure(str(exc)) from None

    def _glossary(self) -> Path | None:
        """The one glossary file: the field, else as every door decides (RAGSPINE_GLOSSARY,
        else the warehouse's own corpora's, else the corpus root's)."""
        root = self.warehouse_root or default_warehouse_root()
        try:
            return serving.served_glossary(root, self.glossary_path or None)
        except GlossaryError as exc:
            raise dg.Failure(str(exc)) from None

    def _reranker(self):
        """One reranker per resource and spec (building one may load a model), resolved by
        the assembly: the field, else RAGSPINE_RERANKER."""
        spec = self.reranker or settings.get(RERANKER_ENV)
        hit = self._cache.get(("reranker",))
        if hit is None or hit[0] != spec:
            self._cache[("reranker",)] = (spec, serving_reranker(self.reranker or None))
        return self._cache[("reranker",)][1]

    def retriever_for(self, library: str) -> NarrativeIndexRetriever:
        """One library's retriever (``serving.library_retriever``), cached until its
        published snapshot (or the mode, or the reranker) changes."""
        wh = self._tables()
        snap = wh.latest(SNAPSHOT, library)
        if snap is None:
            raise dg.Failure(f"library {library!r} has no published retrieval snapshot yet")
        if self.chunker:  # a published chunking: its newest snapshot (the error names those there are)
            try:
                snap = select_snapshot(wh, library, self.chunker)
            except WarehouseError as exc:
                raise dg.Failure(str(exc)) from None
        mode = self._mode()
        glossary = self._glossary()
        with self._lock:
            reranker = self._reranker()
            # The current snapshot id too: an older chunking is served less what it now hides.
            current = wh.latest(SNAPSHOT, library).manifest["metadata"]["snapshot_id"]
            key = (snap.manifest["metadata"]["snapshot_id"], current, mode, id(reranker), glossary)
            hit = self._cache.get(library)
            if hit is None or hit[0] != key:
                try:
                    r = serving.library_retriever(wh, library, reranker=reranker, mode=mode, glossary=glossary,
                                                  chunker=self.chunker or None)
                except RetrievalModeError as exc:
                    raise dg.Failure(str(exc)) from None
                if self.warm:  # under the lock, before it is cached: no caller gets it cold
                    serving.warm_retriever(r, name=f"library {library}@{snap.version}")
                self._cache[library] = (key, r)
            return self._cache[library][1]

    def retriever(self, **layers: str) -> NarrativeIndexRetriever | MultiIndexRetriever | LayeredRetriever:
        """The served retriever (one library, or a MultiIndexRetriever with the router) with
        the configured query layers around it; the base itself when every layer is off.
        ``layers`` (transform, decompose, adaptive, corrective, auto_filters, postprocessor)
        override the resource's fields for one call, e.g. from the ``ask`` job's run config."""
        unknown = set(layers) - set(LAYER_FIELDS)
        if unknown:
            raise TypeError(f"unknown query layer option(s): {sorted(unknown)}; use {', '.join(LAYER_FIELDS)}")
        pick = {f: (layers.get(f) or getattr(self, f)) or None for f in LAYER_FIELDS}
        libs = self.published_libraries()
        if not libs:
            raise dg.Failure(f"no published snapshots under {Path(self.warehouse_root or default_warehouse_root())}")
        retrievers = {lib: self.retriever_for(lib) for lib in libs}
        try:
            return serving.serve(retrievers, router=self.router or None, glossary=self._glossary(), layers=pick)
        except (ValueError, TypeError, SecurityConfigError) as exc:
            raise dg.Failure(f"query layers: {exc}") from None

    def raptor_retriever(self, library: str, mode: str = ""):
        """A RaptorRetriever over the RAPTOR tree the library's snapshot (of ``chunker``,
        when set) names: leaves, internal syntheses or the collapsed tree (``mode``, empty:
        RAGSPINE_RAPTOR_MODE). Synthesis snippets say ``is_synthesis: true`` and cite their
        members; the snapshot must have been published with the ``raptor_tree`` asset on."""
        from ragspine_pipeline.retrieval.raptor import RaptorError
        from ragspine_pipeline.warehouse.raptor_tables import load_snapshot_raptor

        try:
            return load_snapshot_raptor(self._tables(), library, mode=mode or None, chunker=self.chunker or None)
        except (RaptorError, WarehouseError) as exc:
            raise dg.Failure(str(exc)) from None

    def ask(self, query: str, *, filters: Any = None, top_k: int = 5, **layers: str) -> list[dict[str, Any]]:
        return self.retriever(**layers).retrieve(query, filters=filters, top_k=top_k)

    # ------------------------------------------------------------ the graph channel
    def graph_channel(self, library: str):
        """The ``GraphChannel`` over the relation graph the library's snapshot names (cached per version)."""
        from ragspine_pipeline.graph.channel import GraphChannel
        from ragspine_pipeline.graph.step import load_relation_graph, resolve_dimensions

        wh = self._tables()
        snap = wh.latest(SNAPSHOT, library)
        version = snap.manifest["metadata"].get("relation_graph") if snap is not None else None
        if not version:
            raise dg.Failure(f"library {library!r} has no relation graph in its published snapshot")
        with self._lock:
            hit = self._cache.get(("graph", library))
            if hit is None or hit[0] != version:
                glossary = self._glossary()
                self._cache[("graph", library)] = (version, GraphChannel(
                    load_relation_graph(wh, library, version), resolve_dimensions(glossary=glossary)))
            return self._cache[("graph", library)][1]

    def graph_libraries(self) -> list[str]:
        wh = self._tables()
        return [lib for lib in self.published_libraries()
                if (snap := wh.latest(SNAPSHOT, lib)) is not None and snap.manifest["metadata"].get("relation_graph")]

    def graph_query(self, kind: str, entity: str, metric: str, period: str, library: str | None = None
                    ) -> list[dict[str, Any]]:
        """A roll-up / peer comparison / derivation trace / figures as cited rows (each with library_id)."""
        from ragspine_pipeline.graph.channel import query_rows

        libs = [library] if library else self.graph_libraries()
        return [{**row, "library_id": lib} for lib in libs
                for row in query_rows(self.graph_channel(lib).store, kind, entity, metric, period)]

    def ask_channels(self, query: str, *, filters: Any = None, top_k: int = 5, **layers: str
                     ) -> dict[str, list[dict[str, Any]]]:
        """The narrative snippets and, beside them, the graph rows the question asks for
        (a metric and entities named): ``{"graph": [...], "narrative": [...], "themes": [...]}``,
        each item labelled with its ``channel``; themes only when the graph has communities."""
        from ragspine_pipeline.graph.channel import ask_both

        out = ask_both(query, self.retriever(**layers), None, filters=filters, top_k=top_k)
        from ragspine_pipeline.graph.communities import themes

        libs = self.graph_libraries()
        out["graph"] = [{**row, "library_id": lib} for lib in libs for row in self.graph_channel(lib).ask(query)]
        # GraphRAG themes (when the graph was built with communities): context, never citable facts.
        out["themes"] = [{**t, "library_id": lib} for lib in libs
                         for t in themes(self.graph_channel(lib).store, query, top_k=2)]
        return out
