"""On-disk chunk vectors for the engine-only path (no published warehouse snapshot).

``ragspine query`` over the DuckDB chunk store builds its index in a fresh process each
time; without this cache every call re-embedded every chunk (~25 s with e5 on the demo
corpus). Vectors are keyed by (model id, sha256 of the embedded text), so a changed chunk
or another model never reuses a stale vector, and only missing texts are embedded. The
file is written to a temporary name and renamed over the old one (atomic on POSIX and
Windows), so a crash or a concurrent reader never sees a half-written cache.

RESTRICTED chunks are never sent to the embedding backend (it may be a remote endpoint)
and never written to the cache: they get a zero vector (cosine 0), and both exits drop
them from every answer anyway.
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
from pathlib import Path

import numpy as np

from .retrieval.lexical.hybrid import HybridRetriever


def _text_key(model_id: str, text: str) -> str:
    return hashlib.sha256(f"{model_id}\0{text}".encode()).hexdigest()


def cache_file(cache_dir: Path, model_id: str) -> Path:
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", model_id)[:80]
    digest = hashlib.sha256(model_id.encode()).hexdigest()[:12]
    return Path(cache_dir) / f"{safe}-{digest}.npz"


def _load(path: Path) -> dict[str, np.ndarray]:
    try:
        with np.load(path, allow_pickle=False) as z:
            keys, vecs = z["keys"], z["vectors"]
    except (OSError, KeyError, ValueError):
        return {}  # absent or unreadable: rebuilt below
    if vecs.ndim != 2 or len(keys) != len(vecs):
        return {}
    return dict(zip(keys.tolist(), vecs, strict=True))


def _save(path: Path, keys: list[str], vecs: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, keys=np.array(keys, dtype=str), vectors=vecs.astype(np.float32))
        os.chmod(tmp, 0o644)  # mkstemp makes it owner-only; the cache is not secret
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def preload_cached_vectors(retriever: HybridRetriever, cache_dir: Path) -> int:
    """Install every chunk's vector from the cache, embedding only missing texts.

    Returns how many texts were embedded now (0 on a warm cache). No-op without a backend
    or without a ``model_id`` (nothing to key the cache by).
    """
    backend = retriever.embedding_backend
    model_id = getattr(backend, "model_id", None)
    if backend is None or not model_id or not retriever.chunks:
        return 0
    path = cache_file(cache_dir, str(model_id))
    cached = _load(path)
    restricted = retriever.restricted
    keys = [_text_key(str(model_id), c.text) for c in retriever.chunks]
    missing = [i for i, k in enumerate(keys) if k not in cached and not restricted[i]]
    if missing:
        new = np.asarray(backend.embed_texts([retriever.chunks[i].text for i in missing]), dtype=np.float32)
        if new.ndim != 2 or len(new) != len(missing):
            raise RuntimeError("embedding backend returned a wrong number of vectors")
        for i, v in zip(missing, new, strict=True):
            cached[keys[i]] = v
    open_keys = [k for i, k in enumerate(keys) if not restricted[i]]
    if not open_keys:
        return 0  # nothing open to embed: the dense channel embeds lazily (and finds nothing)
    dims = {cached[k].shape[0] for k in open_keys}
    if len(dims) != 1:  # a model id reused with another dimension: start over
        path.unlink(missing_ok=True)
        return preload_cached_vectors(retriever, cache_dir)
    zero = np.zeros(dims.pop(), dtype=np.float32)
    mat = np.stack([zero if restricted[i] else cached[k] for i, k in enumerate(keys)])
    if missing:
        _save(path, open_keys, np.stack([cached[k] for k in open_keys]))
    retriever.preload_vectors(mat)
    return len(missing)
