"""WarehouseResource: where the corpus and the versioned warehouse live."""

from pathlib import Path

import dagster as dg

from ragspine_pipeline import paths, settings
from ragspine_pipeline.scale.build import step_executor
from ragspine_pipeline.scale.config import executor as executor_setting
from ragspine_pipeline.warehouse.step_executor import StepExecutor
from ragspine_pipeline.warehouse.versioned import VersionedTables

from .instance_storage import secure_instance_storage


def default_warehouse_root() -> str:
    """``paths.default_warehouse()``, the one definition the CLI shares: RAGSPINE_WAREHOUSE,
    else data/warehouse in a checkout, else ./ragspine-warehouse."""
    return str(paths.default_warehouse())


def default_corpus_root() -> str:
    """RAGSPINE_CORPUS_ROOT, else the demo corpus shipped in the package."""
    return str(paths.default_corpus_root())


def default_retain_for() -> float:
    """``RAGSPINE_RETAIN_FOR_S`` (declared default: DEFAULT_RETAIN_FOR_S)."""
    return settings.get("RAGSPINE_RETAIN_FOR_S")


class WarehouseResource(dg.ConfigurableResource):
    """Paths and retention. ``keep_versions`` old versions per asset and library are kept
    for point-in-time queries; older ones are pruned after each publish (never the
    published version nor one the current snapshot references, nor one that stopped
    being current less than ``retain_for_seconds`` ago: a reader holding the catalog open
    can finish). ``restricted_catalog`` also builds ``catalog_restricted.duckdb`` with the
    RESTRICTED text unredacted — only for readers cleared for it."""

    root: str = ""  # empty: paths.default_warehouse() (RAGSPINE_WAREHOUSE, data/warehouse, ./ragspine-warehouse)
    corpus_root: str = ""  # empty: RAGSPINE_CORPUS_ROOT or the packaged demo corpus
    keep_versions: int = 5
    retain_for_seconds: float = -1.0  # negative: RAGSPINE_RETAIN_FOR_S or 3600
    restricted_catalog: bool = False
    # Where the chunks and embeddings steps run: "local" (this process) or "ray" (Ray Data
    # pipelines on the cluster at RAY_ADDRESS, else a local one; the [scale] extra).
    # Empty: RAGSPINE_EXECUTOR (default local).
    executor: str = ""

    def setup_for_execution(self, context: dg.InitResourceContext) -> None:
        """Where every run of the library assets starts: the instance's run storage and
        compute logs become owner-only (``instance_storage``, #42 item 6)."""
        secure_instance_storage(context.instance)

    def executor_name(self) -> str:
        """``executor``, else ``RAGSPINE_EXECUTOR``; an unknown value fails here, naming it."""
        return executor_setting(self.executor or None)

    def step_executor(self) -> StepExecutor | None:
        """What the chunks and embeddings steps pass their heavy part to: Ray's executor when
        ``executor_name()`` is "ray", else None (this process, the warehouse's default)."""
        return step_executor(self.executor or None)

    def retain_for(self) -> float:
        return self.retain_for_seconds if self.retain_for_seconds >= 0 else default_retain_for()

    def restricted_catalog_path(self) -> Path:
        return self.root_path() / "catalog_restricted.duckdb"

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
