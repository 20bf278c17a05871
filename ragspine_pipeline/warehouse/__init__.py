"""Versioned Parquet warehouse: immutable versions, atomic manifest publish, catalog."""

from .versioned import PublishInterrupted, VersionedTables, WarehouseError

__all__ = ["PublishInterrupted", "VersionedTables", "WarehouseError"]
