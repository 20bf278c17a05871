"""Dagster assets, checks, jobs, sensors and schedules (thin: they call the engine)."""

from .ask import ask
from .automation import build_refresh_schedule, library_sensor, refresh_job
from .graph_assets import GRAPH_ASSETS
from .library_assets import LIBRARY_ASSETS
from .partitions import library_partitions
from .raptor_assets import RAPTOR_ASSETS
from .rerank_assets import RERANK_ASSETS

__all__ = ["GRAPH_ASSETS", "LIBRARY_ASSETS", "RAPTOR_ASSETS", "RERANK_ASSETS", "ask", "build_refresh_schedule",
           "library_partitions", "library_sensor", "refresh_job"]
