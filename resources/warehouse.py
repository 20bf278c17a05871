"""WarehouseResource: where the corpus and the versioned warehouse live."""

import os
from pathlib import Path

import dagster as dg

from ragspine_pipeline.warehouse.versioned import VersionedTables

REPO_ROOT = Path(__file__).resolve().parents[1]


def default_warehouse_root() -> str:
    return os.environ.get("RAGSPINE_WAREHOUSE", str(REPO_ROOT / "data" / "warehouse"))


def default_corpus_root() -> str:
    return os.environ.get("RAGSPINE_CORPUS_ROOT", str(REPO_ROOT / "data" / "demo"))


class WarehouseResource(dg.ConfigurableResource):
    """Paths and retention. ``keep_versions`` old versions per asset and library are kept
    for point-in-time queries; older ones are pruned after each publish (never the
    published version nor one the current snapshot references)."""

    root: str = ""  # empty: RAGSPINE_WAREHOUSE or data/warehouse
    corpus_root: str = ""  # empty: RAGSPINE_CORPUS_ROOT or data/demo
    keep_versions: int = 5

    def root_path(self) -> Path:
        return Path(self.root or default_warehouse_root())

    def corpus_path(self) -> Path:
        return Path(self.corpus_root or default_corpus_root())

    def tables(self) -> VersionedTables:
        return VersionedTables(self.root_path())

    def catalog_path(self) -> Path:
        return self.root_path() / "catalog.duckdb"

    def libraries_on_disk(self) -> list[str]:
        root = self.corpus_path()
        if not root.is_dir():
            return []
        return sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
