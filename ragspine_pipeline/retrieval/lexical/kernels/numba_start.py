"""Start numba for the BM25 kernels without the BLAS probe they never use (#27 item 2).

Why: the first kernel a process loads from numba's cache makes numba import its whole
library of implementations (``BaseContext.refresh``), and one of them, ``numba.np.arraymath``,
probes for a BLAS at import by importing ``scipy.linalg.cython_blas``: all of scipy.linalg
and scipy's array-API layer, ~0.15-0.3 s of the ~0.6 s first open of a 1M-chunk library
(more under load). No BM25 kernel calls a BLAS. ``start`` runs that first refresh with
``scipy.linalg`` hidden from the calling thread only, so the probe finds no BLAS.

What that changes: numba reads the probe's answer in one place, the inner product of
``np.correlate`` / ``np.convolve`` compiled later in this process (and cached, with
``cache=True``), which then loops instead of calling BLAS ``dot`` (the same products summed
in another order). ``np.dot`` and
``np.linalg`` in jitted code check for BLAS again when they compile, and every import of
scipy.linalg (any thread, before or after) works as usual. When scipy.linalg or numba's
implementations are already imported there is nothing to save, and ``start`` only
refreshes. Any failure falls back to numba's own start (the next kernel load refreshes).
"""

from __future__ import annotations

import contextlib
import importlib.abc
import sys
import threading
from collections.abc import Iterator, Sequence
from types import ModuleType

_HIDDEN = "scipy.linalg"
_done = False

__all__ = ["start"]


class _HideFromThread(importlib.abc.MetaPathFinder):
    """Makes importing one module fail in one thread (first on ``sys.meta_path``)."""

    def __init__(self, name: str) -> None:
        self.name, self.thread = name, threading.get_ident()

    def find_spec(self, fullname: str, path: Sequence[str] | None = None,
                  target: ModuleType | None = None) -> None:
        if fullname == self.name and threading.get_ident() == self.thread:
            raise ModuleNotFoundError(f"{fullname} is not imported while numba starts", name=fullname)
        return None


@contextlib.contextmanager
def _hidden(name: str) -> Iterator[None]:
    finder = _HideFromThread(name)
    sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        sys.meta_path.remove(finder)


def start() -> None:
    """numba's first refresh, without the BLAS probe when that saves an import (once per
    process; raises ImportError without numba, as importing a kernel module would)."""
    global _done
    if _done:
        return
    # lazy: numba is optional, and this runs once, just before the first kernel load
    from numba.core.compiler_lock import global_compiler_lock
    from numba.core.registry import cpu_target

    with global_compiler_lock:  # what numba holds around its own refresh (a kernel load)
        if _done:
            return
        probe = _HIDDEN not in sys.modules and "numba.np.arraymath" not in sys.modules
        # A failure: numba's own refresh at the next kernel load.
        with contextlib.suppress(Exception), _hidden(_HIDDEN) if probe else contextlib.nullcontext():
            cpu_target.target_context.refresh()
        _done = True
