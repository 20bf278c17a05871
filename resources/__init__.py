"""Dagster resources: the warehouse (paths, versioned tables) and read-only retrieval."""

from .retrieval import RetrievalResource
from .warehouse import WarehouseResource

__all__ = ["RetrievalResource", "WarehouseResource"]
