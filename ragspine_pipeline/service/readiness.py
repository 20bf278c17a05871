"""Readiness of the service, not of whichever worker answers.

With ``--workers N`` the kernel spreads connections over N processes that each load the
snapshots themselves, so a per-process ``/readyz`` flapped (ready from a loaded worker,
503 from one still loading) and a client that waited for ready still got loading 503s:
12 of 407 searches in the issue's run. ``serve`` makes a runtime folder
(``RAGSPINE_SERVICE_RUNTIME_DIR``) holding ``workers`` (N); each worker, once its first
generation is loaded, writes ``ready-<pid>``. ``/readyz`` says ready when its own worker is
loaded and N live workers have said so. A request that reaches a worker still loading (a
restarted one) waits for the load, within the request time limit, instead of a 503.

One process (no runtime folder): ready when its generation is loaded, as before.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from pathlib import Path

import anyio
import anyio.to_thread

from .. import settings
from .served import ServedLibraries

log = logging.getLogger("ragspine.service")
RUNTIME_ENV = "RAGSPINE_SERVICE_RUNTIME_DIR"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def prepare(folder: Path, workers: int) -> None:
    """``serve``: the runtime folder of ``workers`` processes (before they start)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "workers").write_text(str(workers), encoding="ascii")


class Readiness:
    def __init__(self, served: ServedLibraries, folder: Path | None = None) -> None:
        self.served = served
        self.folder = folder
        self._marked = False

    @classmethod
    def from_settings(cls, served: ServedLibraries) -> Readiness:
        raw = settings.get(RUNTIME_ENV)
        return cls(served, Path(raw) if raw else None)

    @property
    def shared(self) -> bool:
        return self.folder is not None

    def _mark(self) -> None:
        if self._marked or self.folder is None:
            return
        with contextlib.suppress(OSError):
            tmp = self.folder / f".ready-{os.getpid()}.tmp"
            tmp.write_text(str(time.time()), encoding="ascii")
            os.replace(tmp, self.folder / f"ready-{os.getpid()}")
            self._marked = True

    def ready(self) -> bool:
        """This worker loaded, and (with a runtime folder) every worker has said so."""
        if self.served.current is None:
            return False
        if self.folder is None:
            return True
        self._mark()
        try:
            expected = int((self.folder / "workers").read_text(encoding="ascii"))
            pids = [int(p.name.split("-", 1)[1]) for p in self.folder.glob("ready-*")]
        except (OSError, ValueError):
            return False
        return sum(1 for pid in pids if _alive(pid)) >= expected

    async def mark_when_loaded(self) -> None:
        """The app's lifespan runs it: record this worker's first load as soon as it lands."""
        if self.folder is None:
            return
        while self.served.current is None:
            await anyio.sleep(0.05)
        await anyio.to_thread.run_sync(self._mark)

    def unmark(self) -> None:
        if self.folder is not None and self._marked:
            with contextlib.suppress(OSError):
                (self.folder / f"ready-{os.getpid()}").unlink()
            self._marked = False

    async def wait_loaded(self, timeout_s: float) -> None:
        """With workers, a request on a worker still loading waits for it (up to ``timeout_s``)."""
        if self.folder is None or self.served.current is not None:
            return
        with anyio.move_on_after(timeout_s):
            while self.served.current is None:
                await anyio.sleep(0.02)


__all__ = ["RUNTIME_ENV", "Readiness", "prepare"]
