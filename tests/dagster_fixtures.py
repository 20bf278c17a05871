"""Shared set-up of the Dagster asset tests: a private copy of demo libraries and a
warehouse under ``tmp_path``, wired through the environment the resources read.

A plain helper module (not conftest): a test imports what it needs, e.g.
``from dagster_fixtures import demo_warehouse``.
"""

from __future__ import annotations

import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # the code location (assets/, resources/, definitions.py)
    sys.path.insert(0, str(ROOT))

from ragspine_pipeline.paths import DEMO_ROOT  # noqa: E402

DEMO = DEMO_ROOT
DEMO_LIBRARIES = ("acme_policies", "acme_reports")


@dataclass
class DemoWarehouse:
    corpus: Path
    root: Path

    def resource(self, **kwargs):
        from resources import WarehouseResource

        return WarehouseResource(root=str(self.root), corpus_root=str(self.corpus), **kwargs)

    def tables(self):
        from ragspine_pipeline.warehouse.versioned import VersionedTables

        return VersionedTables(self.root)


def copy_demo_vocabulary(corpus: Path) -> None:
    """Give a corpus copied from the demo the demo's glossary and graph dimensions as its
    own files: a corpus root other than the demo's gets its own vocabulary or none."""
    from ragspine_pipeline.paths import (
        CORPUS_DIMENSIONS,
        CORPUS_GLOSSARY,
        DEMO_GLOSSARY,
        SHIPPED_DIMENSIONS,
    )

    corpus.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(DEMO_GLOSSARY, corpus / CORPUS_GLOSSARY)
    shutil.copyfile(SHIPPED_DIMENSIONS, corpus / CORPUS_DIMENSIONS)


def demo_warehouse(tmp_path: Path, monkeypatch, libraries: tuple[str, ...] = ("acme_reports",), *,
                   embedding: str = "none") -> DemoWarehouse:
    """Copy ``libraries`` of the demo corpus under ``tmp_path`` and point RAGSPINE_WAREHOUSE,
    RAGSPINE_CORPUS_ROOT and the embedding backend variable at them (no model, no network)."""
    corpus = tmp_path / "corpus"
    for lib in libraries:
        shutil.copytree(DEMO / lib, corpus / lib)
    copy_demo_vocabulary(corpus)
    root = tmp_path / "warehouse"
    monkeypatch.setenv("RAGSPINE_WAREHOUSE", str(root))
    monkeypatch.setenv("RAGSPINE_CORPUS_ROOT", str(corpus))
    monkeypatch.setenv("RAGSPINE_EMBEDDING_BACKEND", embedding)
    return DemoWarehouse(corpus, root)


def materialized_metadata(result, asset: str) -> dict:
    """The metadata values of ``asset``'s one materialization in an in-process result."""
    (ev,) = [e for e in result.get_asset_materialization_events() if e.asset_key.to_user_string() == asset]
    return {k: v.value for k, v in ev.step_materialization_data.materialization.metadata.items()}
