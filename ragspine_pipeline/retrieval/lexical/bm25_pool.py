"""The process-wide thread pool that runs chunks of a ``search_batch`` concurrently.

Why a shared pool: starting threads per call cost ~3 ms on a loaded 2-core machine, more
than a small batch's whole search. The compiled batch kernel releases the GIL, so plain
threads run chunks in parallel.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np

_POOL: ThreadPoolExecutor | None = None
_POOL_LOCK = threading.Lock()


def batch_pool() -> ThreadPoolExecutor:
    """One process-wide pool for ``search_batch`` (created on first use)."""
    global _POOL
    if _POOL is None:
        with _POOL_LOCK:
            if _POOL is None:
                _POOL = ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 1),
                                           thread_name_prefix="bm25-batch")
    return _POOL


def batch_spans(nq: int, work: int, wanted: int, per_thread: int) -> list[tuple[int, int]]:
    """Split ``nq`` queries into at most ``wanted`` contiguous spans; an extra span (thread)
    only for every ``per_thread`` postings of work, so small batches stay on one thread."""
    n_thr = max(1, min(wanted, nq, work // per_thread + 1))
    bounds = np.linspace(0, nq, n_thr + 1).astype(int)
    return [(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:], strict=True) if b > a]
