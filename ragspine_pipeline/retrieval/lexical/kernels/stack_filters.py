"""Compiled translation of a row filter into a stack's per-segment packed filters.

Why: a filter over a stacked version's rows (a caller's mask, or packed words) must become
one filter per segment, over that segment's positions, before any segment can score. Done
with numpy (unpack N bools, gather N of them through the segment's rows, pack again) that
cost 2.7-7.5 ms at 1M documents on a 2-segment stack: ten times a whole filtered query on
one file, paid by every query under a filter the retriever cannot reuse (a caller's own
mask is new on every call).

Here each segment's packed words are built from the filter's packed words directly, with
no pass over N bools. A segment's live rows ascend (chunk_id order), so they fall into
*runs*: stretches of positions p0..p0+len-1 holding rows r0..r0+len-1. A base segment after
a 1% refresh has about one run per dead document (~10k at 1M), so copying bit ranges run by
run, up to 64 bits a step, reads and writes each word about once: O(N/64 + runs) instead of
O(N). A segment whose rows are scattered (a refresh's delta: its documents land all over the
row space) has nearly one run per document; its rows are then read position by position,
sequentially (``RUNS_DIV``), which is O(its documents) and needs no run arrays.

Not imported when an index opens (the open time of a large library is a tracked figure):
``refresh.stack`` loads it on a stack's first filter translation, and keeps its numpy
translation for ``kernel="numpy"`` stacks and when this module cannot load (it is the oracle
the tests compare this one with).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import njit

from . import numba_start
from .filter_stats import popcount64

RUNS_DIV = 8  # a segment copies by runs when it has at most live / RUNS_DIV of them (else per position)

_ONE = np.uint64(1)
_ALL = np.uint64(0xFFFFFFFFFFFFFFFF)


@njit(cache=True, nogil=True)
def live_runs(rows):
    """(positions, rows, lengths) of the maximal runs of consecutive live positions holding
    consecutive rows, as int64 arrays."""
    n = rows.shape[0]
    count = 0
    prev_p, prev_r = -2, -2
    for p in range(n):
        r = rows[p]
        if r >= 0:
            if not (p == prev_p + 1 and r == prev_r + 1):
                count += 1
            prev_p, prev_r = p, r
    run_p = np.empty(count, np.int64)
    run_r = np.empty(count, np.int64)
    run_len = np.empty(count, np.int64)
    i = -1
    prev_p, prev_r = -2, -2
    for p in range(n):
        r = rows[p]
        if r >= 0:
            if p == prev_p + 1 and r == prev_r + 1:
                run_len[i] += 1
            else:
                i += 1
                run_p[i] = p
                run_r[i] = r
                run_len[i] = 1
            prev_p, prev_r = p, r
    return run_p, run_r, run_len


@njit(cache=True, nogil=True)
def copy_runs(words, run_p, run_r, run_len, out):
    """Set bit p of ``out`` (zeroed, little bit order) for every run position p whose row's
    bit is set in ``words``; returns how many were set. Up to 64 bits move per step, without
    a branch: the source bits at any offset (two words joined; the second shifted in two
    steps so that offset 0 shifts it out whole), cut to the step's length, into one output
    word. Counted by one popcount pass over ``out`` at the end (measured ~20% faster than
    counting per step, which kept a branch per step)."""
    last = words.shape[0] - 1
    for i in range(run_p.shape[0]):
        p = run_p[i]
        r = run_r[i]
        left = run_len[i]
        while left > 0:
            po = p & 63
            ro = r & 63
            k = min(64 - po, left)
            w = r >> 6
            # words[w + 1] exists whenever its bits are kept: a run's rows lie below N.
            x = (words[w] >> np.uint64(ro)) | ((words[min(w + 1, last)] << np.uint64(63 - ro)) << _ONE)
            out[p >> 6] |= (x & (_ALL >> np.uint64(64 - k))) << np.uint64(po)
            p += k
            r += k
            left -= k
    n = 0
    for w in range(out.shape[0]):
        n += popcount64(out[w])
    return n


@njit(cache=True, nogil=True)
def copy_rows(words, rows, out):
    """``copy_runs`` position by position (rows read sequentially, dead rows skipped): for
    a segment whose live rows are scattered."""
    n = 0
    for p in range(rows.shape[0]):
        r = rows[p]
        if r >= 0 and (words[r >> 6] >> np.uint64(r & 63)) & _ONE:
            out[p >> 6] |= _ONE << np.uint64(p & 63)
            n += 1
    return n


def plan(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """How a segment with these rows translates filters: its runs when they are few enough
    to pay (at most live / ``RUNS_DIV``), else None (position by position)."""
    rows = np.ascontiguousarray(rows, np.int64)
    runs = live_runs(rows)
    live = int(runs[2].sum())
    return runs if len(runs[0]) * RUNS_DIV <= live else None


def translate(words: np.ndarray, rows: np.ndarray, runs: tuple[np.ndarray, ...] | None) -> tuple[np.ndarray, int]:
    """One segment's packed words (ceil(docs/64), bits past its documents zero) of the row
    filter ``words`` (uint64, over the version's rows), and its survivor count."""
    out = np.zeros((len(rows) + 63) // 64, np.uint64)
    if runs is not None:
        n = copy_runs(words, runs[0], runs[1], runs[2], out)
    else:
        n = copy_rows(words, np.ascontiguousarray(rows, np.int64), out)
    return out, int(n)


def warm() -> Any:
    """Load every signature a stack calls (on tiny arrays), so a failure shows here, once;
    returns ``translate``. numba starts without its BLAS probe (``kernels.numba_start``) when no
    index kernel has started it yet."""
    numba_start.start()
    rows = np.array([0, -1, 1], np.int64)
    words = np.ones(1, np.uint64)
    runs = live_runs(rows)
    translate(words, rows, runs)
    translate(words, rows, None)
    return translate
