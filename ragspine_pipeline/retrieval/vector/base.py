"""The embedding-backend protocol, its error, and the model id every cache keys on.

This is the bottom of ``vector/``: the backends (``embedding_backends``, ``onnx_backend``)
and the ``auto`` policy all import it, and it imports none of them, so the factory can
import the ONNX module at the top and the ONNX module no longer reaches back into the
factory's module for its error class (the cycle the function-level imports used to dodge).
"""

from __future__ import annotations

import hashlib
import importlib.util
from typing import Any, Protocol, runtime_checkable

_PROBE_TEXT = "RAGSpine model id probe: revenue fell 营收下滑"

__all__ = ["EmbeddingBackend", "EmbeddingBackendUnavailable", "backend_model_id", "onnx_extra_available"]


@runtime_checkable
class EmbeddingBackend(Protocol):
    """Turns texts into vectors (one list of floats per text, same dimension for all).

    That is the whole contract. A backend may also expose ``model_id`` (a string naming
    the model, used by caches and lineage) and ``embed_queries`` (asymmetric encoders);
    both are optional.
    """

    def embed_texts(self, texts: list[str]) -> list[list[float]]: ...


class EmbeddingBackendUnavailable(RuntimeError):
    """The requested backend cannot be built here; the message names the missing piece."""


def backend_model_id(backend: Any) -> str:
    """The backend's ``model_id`` when it has a non-empty string one; else a derived id.

    The derived id is the class path plus a hash of the vector the backend gives a fixed
    probe text (rounded to 5 decimals): stable across runs and processes for the same
    model, and different when the model (or its configuration, e.g. the dimension)
    changes, so the warehouse's "embedded with the same model" test stays sound.
    """
    mid = getattr(backend, "model_id", None)
    if isinstance(mid, str) and mid.strip():
        return mid
    if not callable(getattr(backend, "embed_texts", None)):
        raise TypeError(f"{type(backend).__name__} is not an EmbeddingBackend: it needs embed_texts(texts)")
    vecs = backend.embed_texts([_PROBE_TEXT])
    try:
        probe = [round(float(x), 5) + 0.0 for x in vecs[0]]  # + 0.0 folds -0.0 into 0.0
    except (TypeError, IndexError, ValueError):
        raise TypeError(f"{type(backend).__name__}.embed_texts did not return a list of vectors") from None
    digest = hashlib.sha1(repr(probe).encode()).hexdigest()[:12]
    cls = type(backend)
    return f"{cls.__module__}.{cls.__qualname__}@{digest}"


def onnx_extra_available() -> bool:
    """Whether the ``[embed-onnx]`` extra imports here (checked without importing it)."""
    return all(importlib.util.find_spec(m) is not None for m in ("onnxruntime", "fastembed"))
