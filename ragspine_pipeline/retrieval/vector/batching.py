"""Embedding a long list of texts in bounded batches, with a progress hook.

Why: one ``embed_texts`` call over a whole corpus holds every intermediate list and the
ONNX Runtime arena sized for the whole call; batches of ``batch`` texts keep peak memory
at one batch plus the output matrix, and let long work report progress (``progress(done,
total)`` after each batch -- the CLI wires tqdm to it, the Dagster step its logger).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ... import settings

ProgressHook = Callable[[int, int], None]
DEFAULT_STREAM_BATCH = 256


def embed_in_batches(backend: Any, texts: Sequence[str], *, batch: int = DEFAULT_STREAM_BATCH,
                     progress: ProgressHook | None = None, queries: bool = False) -> np.ndarray:
    """Vectors of ``texts`` (float32 matrix, input order), ``batch`` texts per backend call.

    Identical texts are embedded once (the copies get the same row), and the distinct texts
    go to the backend longest first: every batch then holds texts of similar length, so the
    tokenizer's dynamic padding (pad to the longest of the batch) adds few pad tokens, and
    the first progress lines give a pessimistic rather than an optimistic ETA. Length is
    counted in characters: a tokenizer-free proxy of token length. ``progress(done, total)``
    counts distinct texts.
    """
    if batch <= 0:
        raise ValueError("batch must be > 0")
    fn = backend.embed_texts
    if queries:
        fn = getattr(backend, "embed_queries", None) or backend.embed_texts
    if not texts:
        return np.zeros((0, 0), dtype=np.float32)
    first: dict[str, int] = {}
    row_of = np.fromiter((first.setdefault(t, len(first)) for t in texts), dtype=np.int64, count=len(texts))
    distinct = list(first)
    order = sorted(range(len(distinct)), key=lambda i: (-len(distinct[i]), i))
    out: np.ndarray | None = None
    done = 0
    for i in range(0, len(order), batch):
        rows = order[i: i + batch]
        vecs = np.asarray(fn([distinct[j] for j in rows]), dtype=np.float32)
        if vecs.ndim != 2 or len(vecs) != len(rows):
            raise RuntimeError("embedding backend returned a wrong number of vectors")
        if out is None:
            out = np.empty((len(distinct), vecs.shape[1]), dtype=np.float32)
        out[rows] = vecs
        done += len(rows)
        if progress is not None:
            progress(done, len(distinct))
    assert out is not None
    return out if len(distinct) == len(texts) and bool((row_of == np.arange(len(texts))).all()) else out[row_of]


def tqdm_progress(desc: str, *, enabled: bool = True, stream: Any = None) -> ProgressHook | None:
    """A tqdm bar on stderr as a progress hook; None (silent) when disabled, when stderr is
    not a terminal (logs, pipes, ``--json`` runs) or when ``RAGSPINE_PROGRESS=0``."""
    out = stream if stream is not None else sys.stderr
    if not enabled or not settings.get("RAGSPINE_PROGRESS"):
        return None
    if stream is None and not (hasattr(out, "isatty") and out.isatty()):
        return None
    try:
        # lazy: tqdm (~4 ms of import), only when a bar is drawn on a terminal
        from tqdm import tqdm
    except ImportError:  # progress is cosmetic
        return None
    bar: dict[str, Any] = {}

    def hook(done: int, total: int) -> None:
        if "bar" not in bar:
            bar["bar"] = tqdm(total=total, desc=desc, unit="text", file=out, leave=False, mininterval=0.5)
        b = bar["bar"]
        b.update(done - b.n)
        if done >= total:
            b.close()
            bar.clear()

    return hook


def log_progress(log: Callable[[str], None], desc: str, *, every: float = 0.1) -> ProgressHook:
    """A progress hook that logs ``desc: done/total (p%)`` each ``every`` of the way (and at the end)."""
    state = {"next": 0.0}

    def hook(done: int, total: int) -> None:
        frac = done / total if total else 1.0
        if frac >= state["next"] or done >= total:
            log(f"{desc}: {done}/{total} ({100 * frac:.0f}%)")
            state["next"] = frac + every

    return hook
