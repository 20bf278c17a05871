"""The process-wide thread pool that runs chunks of a ``search_batch`` concurrently.

Why a shared pool: starting threads per call cost ~3 ms on a loaded 2-core machine, more
than a small batch's whole search. The compiled batch kernel releases the GIL, so plain
threads run chunks in parallel.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from itertools import chain, repeat
from typing import Any

import numpy as np

from .topk import ScoredDocs

POSTINGS_PER_THREAD = 50_000  # batch work (postings of its terms) per extra thread
BatchArrays = tuple[np.ndarray, np.ndarray, np.ndarray]  # ids[nq, k] (-1 pad), scores[nq, k], counts[nq]

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


def empty_batch(nq: int, kk: int) -> BatchArrays:
    """No result for any of ``nq`` queries, as batch arrays."""
    return np.full((nq, kk), -1, np.int64), np.zeros((nq, kk)), np.zeros(nq, np.int64)


def batch_one_by_one(search: Callable[[Sequence[str], int], ScoredDocs], queries: Sequence[Sequence[str]],
                     kk: int) -> BatchArrays:
    """The batch arrays of ``search`` called per query (the path without compiled kernels)."""
    ids, sc, cnt = empty_batch(len(queries), kk)
    for i, q in enumerate(queries if kk else []):
        r = search(q, kk)
        cnt[i] = n = len(r.ids)
        ids[i, :n], sc[i, :n] = r.ids, r.scores
    return ids, sc, cnt


def batch_rows(arrays: BatchArrays) -> list[ScoredDocs]:
    """Batch arrays back as one ScoredDocs per query."""
    ids, sc, cnt = arrays
    return [ScoredDocs(ids[i, :c], sc[i, :c]) for i, c in enumerate(cnt.tolist())]


def run_batch(queries: Sequence[Sequence[str]], term_id: Callable[..., Any], work_of: Callable[[np.ndarray], int],
              threads: int, per_thread: int, run: Callable[[np.ndarray, np.ndarray], BatchArrays]) -> BatchArrays:
    """Run a compiled batch kernel over ``queries`` in spans on the shared pool.

    Token -> term id for the whole batch runs in C-level loops (``term_id(token, -1)``;
    tokens outside the vocabulary become -1 and the kernels skip them). ``work_of(known
    term ids)`` is the batch's postings, which decide how many spans (threads) pay off;
    ``run(flat term ids, their per-query pointers)`` answers one span. The first span
    runs on the calling thread, the rest on the pool.
    """
    nq = len(queries)
    flat = np.fromiter(map(term_id, chain.from_iterable(queries), repeat(-1)), np.int64)
    ptr = np.zeros(nq + 1, np.int64)
    np.cumsum(np.fromiter(map(len, queries), np.int64, nq), out=ptr[1:])
    work = int(work_of(flat[flat >= 0])) if len(flat) else 0
    spans = batch_spans(nq, work, threads, per_thread)

    def one(span: tuple[int, int]) -> BatchArrays:
        a, b = span
        return run(flat[ptr[a]:ptr[b]], ptr[a:b + 1] - ptr[a])

    if len(spans) == 1:
        return one(spans[0])
    rest = [batch_pool().submit(one, c) for c in spans[1:]]
    parts = [one(spans[0])] + [f.result() for f in rest]
    return tuple(np.concatenate([p[x] for p in parts]) for x in range(3))  # type: ignore[return-value]
