"""RetrievalResource: read-only cited retrieval over the latest published snapshots.

Opens nothing for writing: it reads snapshot manifests and immutable Parquet versions.
Each call checks the libraries' published snapshot ids and rebuilds an index only when
one changed, so a refresh is picked up without a restart, and a query sees one whole
snapshot (the one it resolved), never a mix of versions.
"""

import os
import threading
from pathlib import Path
from typing import Any

import dagster as dg
from pydantic import PrivateAttr

from ragspine_pipeline.retrieval.link.multi_index import MultiIndexRetriever
from ragspine_pipeline.retrieval.link.narrative_link import NarrativeIndexRetriever
from ragspine_pipeline.warehouse.pipeline import (
    SNAPSHOT,
    load_snapshot_index,
    published_libraries,
    serving_retriever,
)
from ragspine_pipeline.warehouse.versioned import VersionedTables

from .warehouse import REPO_ROOT, default_warehouse_root


class RetrievalResource(dg.ConfigurableResource):
    warehouse_root: str = ""  # empty: RAGSPINE_WAREHOUSE or data/warehouse
    libraries: list[str] = []  # empty: every library with a published snapshot
    glossary_path: str = str(REPO_ROOT / "data" / "demo" / "glossary.json")

    _cache: dict = PrivateAttr(default_factory=dict)
    _lock: Any = PrivateAttr(default_factory=threading.Lock)

    def _tables(self) -> VersionedTables:
        return VersionedTables(self.warehouse_root or default_warehouse_root())

    def published_libraries(self) -> list[str]:
        return published_libraries(self._tables(), self.libraries or None)

    def retriever_for(self, library: str) -> NarrativeIndexRetriever:
        wh = self._tables()
        snap = wh.latest(SNAPSHOT, library)
        if snap is None:
            raise dg.Failure(f"library {library!r} has no published retrieval snapshot yet")
        key = (library, snap.manifest["metadata"]["snapshot_id"])
        with self._lock:
            hit = self._cache.get(library)
            if hit is None or hit[0] != key:
                glossary = self.glossary_path if os.path.exists(self.glossary_path) else None
                index = load_snapshot_index(wh, library, glossary=glossary)
                self._cache[library] = (key, NarrativeIndexRetriever(index))
            return self._cache[library][1]

    def retriever(self) -> NarrativeIndexRetriever | MultiIndexRetriever:
        libs = self.published_libraries()
        if not libs:
            raise dg.Failure(f"no published snapshots under {Path(self.warehouse_root or default_warehouse_root())}")
        return serving_retriever({lib: self.retriever_for(lib) for lib in libs})

    def ask(self, query: str, *, filters: Any = None, top_k: int = 5) -> list[dict[str, Any]]:
        return self.retriever().retrieve(query, filters=filters, top_k=top_k)
