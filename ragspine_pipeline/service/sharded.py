"""The service's hook for a sharded backend (``serve --ray``), which ``scale`` fills.

Why a hook: ``scale`` is built on the service (its Ray app is the service's own
``create_app`` over a ``ServingAssembly`` subclass), so the arrow runs scale -> service
and the service never imports scale. The service needs two things from a sharded
backend: the ``serve --ray`` runner, and a per-request scope in which shards that did
not answer are tolerated (``allow_partial``) or raised. ``scale.serve.register()`` puts
Ray's backend here: the CLI's ``serve`` command calls it, and so does every Ray Serve
replica before it builds its app. Without a backend every index is whole (one process,
no shards): a request is never partial, and ``--ray`` says how to get one.
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol


class RequestScope(Protocol):
    """What one request learns about the shards it went without."""

    @property
    def partial(self) -> bool: ...

    @property
    def missing(self) -> Mapping[int, str]: ...


class ShardedBackend(Protocol):
    """A backend that serves libraries as shards (``scale.serve.RayBackend``)."""

    #: What a shard that failed or missed its deadline raises: the service answers 503 with its message.
    unavailable: tuple[type[Exception], ...]

    def request(self, allow_partial: bool) -> AbstractContextManager[RequestScope]:
        """The scope of one search: missing shards recorded (``allow_partial``) or raised."""
        ...

    def serve(self, prog: str, args: argparse.Namespace, root: Path, keys_file: str | None) -> int:
        """``serve --ray`` after the service's own checks of ``args``: an exit code."""
        ...


@dataclass(frozen=True)
class WholeRequest:
    """The scope of a request over whole (unsharded) indexes: never partial."""

    missing: Mapping[int, str] = field(default_factory=dict)

    @property
    def partial(self) -> bool:
        return False


_BACKEND: list[ShardedBackend] = []  # at most one: the last registered


def register_sharded_backend(backend: ShardedBackend) -> None:
    """Make ``backend`` the process's sharded backend (registering again replaces it)."""
    _BACKEND[:] = [backend]


def sharded_backend() -> ShardedBackend | None:
    return _BACKEND[0] if _BACKEND else None


def request_scope(allow_partial: bool) -> AbstractContextManager[RequestScope]:
    """The registered backend's request scope, else a whole one."""
    backend = sharded_backend()
    return backend.request(allow_partial) if backend else contextlib.nullcontext(WholeRequest())


def unavailable_errors() -> tuple[type[Exception], ...]:
    """The errors that mean "shards did not answer" (none without a backend)."""
    backend = sharded_backend()
    return backend.unavailable if backend else ()


__all__ = ["RequestScope", "ShardedBackend", "WholeRequest", "register_sharded_backend", "request_scope",
           "sharded_backend", "unavailable_errors"]
