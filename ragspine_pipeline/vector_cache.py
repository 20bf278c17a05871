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
import threading
import unicodedata
import weakref
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from . import settings
from .retrieval.hybrid.retriever import HybridRetriever
from .retrieval.vector.batching import embed_in_batches, tqdm_progress
from .retrieval.vector.embedding_backends import backend_model_id


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


def preload_cached_vectors(retriever: HybridRetriever, cache_dir: Path, *,
                           progress: Callable[[int, int], None] | None | bool = True) -> int:
    """Install every chunk's vector from the cache, embedding only missing texts.

    Returns how many texts were embedded now (0 on a warm cache). No-op without a backend
    or without a ``model_id`` (nothing to key the cache by). Missing texts are embedded in
    bounded batches; ``progress=True`` shows a tqdm bar on stderr when it is a terminal
    (``False`` is silent, a callable gets ``(done, total)``).
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
        hook = tqdm_progress("embedding chunks") if progress is True else (progress or None)
        new = embed_in_batches(backend, [retriever.chunks[i].text for i in missing], progress=hook)
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
        return preload_cached_vectors(retriever, cache_dir, progress=progress)
    zero = np.zeros(dims.pop(), dtype=np.float32)
    mat = np.stack([zero if restricted[i] else cached[k] for i, k in enumerate(keys)])
    if missing:
        _save(path, open_keys, np.stack([cached[k] for k in open_keys]))
    retriever.preload_vectors(mat)
    return len(missing)


# --------------------------------------------------------------------------------------------
# Per-text vector cache for any backend (benchmarks, eval, long builds)
# --------------------------------------------------------------------------------------------

ProgressHook = Callable[[int, int], None]
"""``hook(done, total)`` after every batch of a long embedding job (texts, not batches)."""

_KINDS = ("passage", "query")


def _kind_key(model_id: str, kind: str, text: str) -> str:
    return hashlib.sha256(f"{model_id}\0{kind}\0{text}".encode()).hexdigest()


class CachingEmbeddingBackend:
    """Wraps a backend so every vector is computed once per (model, passage|query, text).

    Vectors are stored as content-hashed shard files (``<kind>-<sha of the keys>.npz``) in a
    folder per model id, one shard per flushed batch group, each written atomically: a long
    job that is killed keeps every finished shard, and a rerun embeds only what is missing.
    Missing texts are embedded shortest first (fewer pad tokens per batch), in groups of
    ``flush_every``, and ``progress(done, total)`` is called after each group.
    """

    def __init__(self, backend: Any, cache_dir: str | os.PathLike[str], *, flush_every: int = 256,
                 progress: ProgressHook | None = None) -> None:
        if not callable(getattr(backend, "embed_texts", None)):
            raise TypeError(f"{type(backend).__name__} is not an EmbeddingBackend: it needs embed_texts(texts)")
        if flush_every <= 0:
            raise ValueError("flush_every must be > 0")
        self.inner = backend
        self.model_id = backend_model_id(backend)
        self.folder = cache_file(Path(cache_dir), self.model_id).with_suffix("")
        self.flush_every = flush_every
        self.progress = progress
        self.embedded = {k: 0 for k in _KINDS}  # texts embedded now (not from disk), per kind
        self._mem: dict[str, dict[str, np.ndarray]] = {}

    def _table(self, kind: str) -> dict[str, np.ndarray]:
        if kind not in self._mem:
            table: dict[str, np.ndarray] = {}
            for shard in sorted(self.folder.glob(f"{kind}-*.npz")):
                table.update(_load(shard))
            self._mem[kind] = table
        return self._mem[kind]

    def cached_count(self, kind: str = "passage") -> int:
        return len(self._table(kind))

    def _embed(self, kind: str, texts: Sequence[str]) -> list[list[float]]:
        if kind not in _KINDS:
            raise ValueError(f"kind must be one of {_KINDS}")
        table = self._table(kind)
        keys = [_kind_key(self.model_id, kind, t) for t in texts]
        todo: dict[str, str] = {}
        for k, t in zip(keys, texts, strict=True):
            if k not in table and k not in todo:
                todo[k] = t
        if todo:
            fn = self.inner.embed_texts
            if kind == "query":
                fn = getattr(self.inner, "embed_queries", None) or self.inner.embed_texts
            order = sorted(todo, key=lambda k: (len(todo[k]), k))
            done = 0
            for i in range(0, len(order), self.flush_every):
                group = order[i: i + self.flush_every]
                vecs = np.asarray(fn([todo[k] for k in group]), dtype=np.float32)
                if vecs.ndim != 2 or len(vecs) != len(group):
                    raise RuntimeError("embedding backend returned a wrong number of vectors")
                shard_id = hashlib.sha256("".join(group).encode()).hexdigest()[:16]
                _save(self.folder / f"{kind}-{shard_id}.npz", group, vecs)
                table.update(zip(group, vecs, strict=True))
                done += len(group)
                self.embedded[kind] += len(group)
                if self.progress is not None:
                    self.progress(done, len(order))
        return [table[k].tolist() for k in keys]

    def embed_texts(self, texts: Sequence[str]) -> list[list[float]]:
        return self._embed("passage", texts)

    def embed_queries(self, texts: Sequence[str]) -> list[list[float]]:
        return self._embed("query", texts)

    def vectors(self, kind: str, texts: Sequence[str]) -> np.ndarray:
        """The vectors of ``texts`` as one float32 matrix (embedding what is missing)."""
        rows = self._embed(kind, texts)
        return np.asarray(rows, dtype=np.float32).reshape(len(texts), -1)


# --------------------------------------------------------------------------------------------
# Vector reuse by (model id, normalised text): within a step, across libraries and versions
# --------------------------------------------------------------------------------------------

_WS = re.compile(r"\s+")
REUSE_MAX_BYTES = 256 << 20
"""Bytes of vectors the process-wide store keeps (~170k 384-d float32 vectors); oldest go first."""


def normalise_text(text: str) -> str:
    """The text as the reuse key sees it: Unicode NFC, whitespace runs as one space, stripped.

    Every shipped tokenizer splits on whitespace and normalises Unicode itself, so two texts
    equal under this function get the same tokens and the same vector; the vector stored is
    the one of the first spelling seen.
    """
    return _WS.sub(" ", unicodedata.normalize("NFC", text)).strip()


def reuse_key(model_id: str, text: str) -> str:
    return hashlib.sha256(f"{model_id}\0{normalise_text(text)}".encode()).hexdigest()


class VectorReuse:
    """Vectors keyed by (model id, normalised text hash), so a text is embedded once.

    One store per process (``shared_reuse``) serves every library and every version the
    process builds: a chunk that moved (new id, same text), a boilerplate paragraph in many
    documents, a document copied into another library -- each is embedded once. Memory is
    bounded (``max_bytes``, oldest entries dropped first). With ``folder`` (the setting
    ``RAGSPINE_EMBED_CACHE``) vectors are also kept on disk in atomic shard files per model,
    so a later process reuses them too; only hashes and vectors are written, never text,
    and the embeddings step hands it no RESTRICTED text (those chunks are never embedded).
    """

    def __init__(self, max_bytes: int = REUSE_MAX_BYTES, folder: str | os.PathLike[str] | None = None) -> None:
        self.max_bytes = max_bytes
        self.folder = Path(folder) if folder else None
        self._mem: dict[str, np.ndarray] = {}
        self._bytes = 0
        self._loaded: set[str] = set()
        self.stats = {"texts": 0, "distinct": 0, "reused": 0, "embedded": 0}

    def _disk(self, model_id: str) -> Path | None:
        return None if self.folder is None else cache_file(self.folder, model_id).with_suffix("")

    def _put(self, key: str, vec: np.ndarray) -> None:
        if key in self._mem:
            return
        self._mem[key] = vec
        self._bytes += vec.nbytes
        while self._bytes > self.max_bytes and self._mem:
            old = next(iter(self._mem))
            self._bytes -= self._mem.pop(old).nbytes

    def _load_disk(self, model_id: str, wanted: set[str]) -> dict[str, np.ndarray]:
        folder = self._disk(model_id)
        if folder is None or not folder.is_dir():
            return {}
        found: dict[str, np.ndarray] = {}
        for shard in sorted(folder.glob("reuse-*.npz")):
            for k, v in _load(shard).items():
                if k in wanted:
                    found[k] = v
        return found

    def embed(self, model_id: str, texts: Sequence[str],
              embed_missing: Callable[[list[str]], Any]) -> tuple[np.ndarray, dict[str, int]]:
        """(vectors of ``texts`` in input order, counts of this call): ``embed_missing`` gets
        each distinct text that no store holds, once, and returns their vectors in order."""
        keys = [reuse_key(model_id, t) for t in texts]
        distinct: dict[str, str] = {}
        for k, t in zip(keys, texts, strict=True):
            distinct.setdefault(k, t)
        have = {k: self._mem[k] for k in distinct if k in self._mem}
        if len(have) < len(distinct):
            have.update(self._load_disk(model_id, set(distinct) - set(have)))
        todo = [k for k in distinct if k not in have]
        if todo:
            vecs = np.asarray(embed_missing([distinct[k] for k in todo]), dtype=np.float32)
            if vecs.ndim != 2 or len(vecs) != len(todo):
                raise RuntimeError("embedding backend returned a wrong number of vectors")
            have.update(zip(todo, vecs, strict=True))
            folder = self._disk(model_id)
            if folder is not None:
                shard = hashlib.sha256("".join(todo).encode()).hexdigest()[:16]
                _save(folder / f"reuse-{shard}.npz", todo, vecs)
        for k in distinct:
            self._put(k, have[k])
        counts = {"texts": len(texts), "distinct": len(distinct), "reused": len(distinct) - len(todo),
                  "embedded": len(todo)}
        for k, v in counts.items():
            self.stats[k] += v
        if not texts:
            return np.zeros((0, 0), dtype=np.float32), counts
        return np.stack([have[k] for k in keys]).astype(np.float32, copy=False), counts


_SHARED: dict[int, tuple[weakref.ref, dict[str, VectorReuse]]] = {}  # by id(): backends may be unhashable
_SHARED_LOCK = threading.Lock()


def _stores_of(backend: Any) -> dict[str, VectorReuse]:
    entry = _SHARED.get(id(backend))
    if entry is not None and entry[0]() is backend:
        return entry[1]
    key = id(backend)

    def forget(dead: weakref.ref) -> None:
        if key in _SHARED and _SHARED[key][0] is dead:
            del _SHARED[key]

    try:
        ref = weakref.ref(backend, forget)
    except TypeError:
        return {}
    _SHARED[key] = (ref, {})
    return _SHARED[key][1]


def shared_reuse(backend: Any) -> VectorReuse:
    """The store of ``backend`` for this process (one per ``RAGSPINE_EMBED_CACHE`` value).

    Keyed by the backend object: the shipped models are loaded once per process
    (``make_onnx_backend``, ``make_static_backend``), so every library and version a
    process builds shares one store, while a caller that builds a fresh backend (a test, a
    benchmark timing a model) starts empty. A backend that cannot be weakly referenced gets
    a fresh store each call (reuse within the call only).
    """
    folder = settings.get("RAGSPINE_EMBED_CACHE") or ""
    with _SHARED_LOCK:
        stores = _stores_of(backend)
        if folder not in stores:
            stores[folder] = VectorReuse(folder=folder or None)
        return stores[folder]
