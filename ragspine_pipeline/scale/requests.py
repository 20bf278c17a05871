"""One request's tolerance for missing shards, and the error when it has none.

Why a context variable: the shard front sits deep inside the retriever (where the
single index stood), far from the HTTP request that says ``allow_partial``; the service
opens a ``shard_request`` scope around the search and reads back which shards were
missing, without threading a flag through the retrieval code.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from dataclasses import dataclass, field


class ShardUnavailable(RuntimeError):
    """Shards that failed or missed their deadline in one phase of a query."""

    def __init__(self, phase: str, missing: dict[int, str]) -> None:
        self.phase, self.missing = phase, dict(missing)
        what = "; ".join(f"shard {i}: {why}" for i, why in sorted(missing.items()))
        super().__init__(f"sharded index: {len(missing)} shard(s) did not answer the {phase} phase ({what}); "
                         "retry, or send allow_partial=true to accept an answer without them")


class ShardUnhealthy(RuntimeError):
    """A shard whose listener cannot accept connections (Ray should replace it)."""


@dataclass
class ShardRequest:
    """One request's tolerance for missing shards, and the shards it went without."""

    allow_partial: bool = False
    missing: dict[int, str] = field(default_factory=dict)

    @property
    def partial(self) -> bool:
        return bool(self.missing)


_REQUEST: contextvars.ContextVar[ShardRequest | None] = contextvars.ContextVar("ragspine_shard_request",
                                                                               default=None)


@contextlib.contextmanager
def shard_request(allow_partial: bool = False) -> Iterator[ShardRequest]:
    """Scope of one request: inside it, a missing shard is recorded (``allow_partial``)
    or raised; outside any scope it is always raised."""
    req = ShardRequest(bool(allow_partial))
    token = _REQUEST.set(req)
    try:
        yield req
    finally:
        _REQUEST.reset(token)


__all__ = ["ShardRequest", "ShardUnavailable", "ShardUnhealthy", "shard_request"]
