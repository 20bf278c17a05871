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
    """Vectors of ``texts`` (float32 matrix, input order), ``batch`` texts per backend call."""
    if batch <= 0:
        raise ValueError("batch must be > 0")
    fn = backend.embed_texts
    if queries:
        fn = getattr(backend, "embed_queries", None) or backend.embed_texts
    if not texts:
        return np.zeros((0, 0), dtype=np.float32)
    parts: list[np.ndarray] = []
    done = 0
    for i in range(0, len(texts), batch):
        part = list(texts[i: i + batch])
        vecs = np.asarray(fn(part), dtype=np.float32)
        if vecs.ndim != 2 or len(vecs) != len(part):
            raise RuntimeError("embedding backend returned a wrong number of vectors")
        parts.append(vecs)
        done += len(part)
        if progress is not None:
            progress(done, len(texts))
    return np.concatenate(parts) if len(parts) > 1 else parts[0]


def tqdm_progress(desc: str, *, enabled: bool = True, stream: Any = None) -> ProgressHook | None:
    """A tqdm bar on stderr as a progress hook; None (silent) when disabled, when stderr is
    not a terminal (logs, pipes, ``--json`` runs) or when ``RAGSPINE_PROGRESS=0``."""
    out = stream if stream is not None else sys.stderr
    if not enabled or not settings.get("RAGSPINE_PROGRESS"):
        return None
    if stream is None and not (hasattr(out, "isatty") and out.isatty()):
        return None
    try:
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
