"""The scale-out settings, read at call time (declared in ``ragspine_pipeline.settings``)."""

from __future__ import annotations

from .. import settings
from ..cpus import usable_cpus


class ScaleUnavailable(RuntimeError):
    """Ray was asked for (``RAGSPINE_EXECUTOR=ray``, ``serve --ray``) but cannot run here;
    the message says why and how to install the ``[scale]`` extra."""


def executor(value: str | None = None) -> str:
    """``local`` or ``ray``: where the chunks and embeddings steps run."""
    return str(settings.get("RAGSPINE_EXECUTOR", value))


def ray_workers(value: int | None = None) -> int:
    """Workers of a distributed step (default: the CPUs this process may use)."""
    got = settings.get("RAGSPINE_RAY_WORKERS", value)
    return int(got) if got is not None else usable_cpus()


def shards(value: int | None = None) -> int:
    """Hash shards a served library is split into."""
    return int(settings.get("RAGSPINE_SHARDS", value))


def shard_timeout_s(value: float | None = None) -> float:
    """Deadline of one shard for one phase of a query."""
    return float(settings.get("RAGSPINE_SHARD_TIMEOUT_S", value))


def require_ray() -> object:
    """The ``ray`` module, or a ScaleUnavailable naming the extra to install."""
    try:
        import ray  # lazy: Ray, the heavy optional [scale] extra, only where Ray is asked for
    except ImportError as exc:
        raise ScaleUnavailable(
            "Ray is not installed: install the [scale] extra (pip install 'ragspine-pipeline[scale]')") from exc
    return ray
