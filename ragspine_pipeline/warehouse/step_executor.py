"""Where the chunks and embeddings steps run their heavy part, passed in by the caller.

Why passed in: the warehouse sits below ``scale`` (Ray's executor is built on the
warehouse's raw tables), so it never imports it. The caller that knows the setting — the
Dagster resource (``WarehouseResource.step_executor``) or the in-process indexing door —
passes ``scale.build.step_executor()`` (Ray's when ``RAGSPINE_EXECUTOR=ray``); ``None``,
the default, is the local executor: this process reads, chunks and embeds.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

Log = Callable[[str], None] | None


class StepExecutor(Protocol):
    """A distributed executor of the two heavy steps (``scale.build.RayExecutor``)."""

    def chunk(self, raw_pub: Any, source_paths: dict[str, str], chunker_spec: str | None, chunker_key: str, *,
              log: Log, desc: str) -> tuple[dict[str, Any], dict[str, list[Any]], dict[str, Any]]:
        """(doc_id -> Document, doc_id -> its chunks, the job's metadata) of ``source_paths``
        (doc_id -> source path) from ``raw_pub``'s tables; every document or an error."""
        ...

    def embed(self, spec: str, model_id: str, texts: list[str], *, log: Log, desc: str) -> tuple[Any, dict[str, Any]]:
        """(float32 vectors of ``texts`` in order, the job's metadata): every worker builds
        ``spec`` and must get ``model_id``."""
        ...

    def no_work(self) -> dict[str, Any]:
        """The job's metadata of a step with nothing to run (no cluster is started)."""
        ...


def step_executor(executor: StepExecutor | None) -> StepExecutor | None:
    """``executor`` checked: an executor object or None (local), never a name."""
    if isinstance(executor, str):
        raise TypeError(f"executor: pass an executor object (scale.build.step_executor({executor!r})) or None "
                        f"for the local one, not the name {executor!r}")
    return executor


__all__ = ["StepExecutor", "step_executor"]
