"""``static``: the fast embedding tier -- static word vectors shipped inside a PyPI wheel.

Why: a transformer encoder runs ~25-70 chunks/s on two cores, so a million chunks take
hours (issue 47). A static model looks each token's vector up in a table and averages
them: thousands of chunks/s, no ONNX session, no attention. ``wordllama`` 0.4.0.post1 ships
its ``l2_supercat`` table (32k Llama-2 tokens x 256 dims, float16, 16 MB) and the matching
tokenizer *inside the wheel*; ``model2vec`` 0.10.0 ships no weights (its models come from a
model hub) and is therefore not used.

The wheel's own ``WordLlama.load`` looks for the tokenizer under ``tokenizer/`` while the
wheel ships it under ``tokenizers/``, and then downloads it from the model hub. This module
never calls ``load``: it opens the two shipped files itself and builds
``WordLlamaInference`` from them, so nothing is ever downloaded (``tests/test_embed_static.py``
runs it with networking unshared where the host allows).

The tokenizer and the training are English (Llama-2 vocabulary): ``auto_policy`` counts
``static`` among the English-only models, and its measured quality decides the rest.
"""

from __future__ import annotations

import hashlib
import importlib.util
import threading
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from .base import EmbeddingBackendUnavailable

WORDLLAMA_CONFIG = "l2_supercat"
WORDLLAMA_DIM = 256
WEIGHTS = f"weights/{WORDLLAMA_CONFIG}_{WORDLLAMA_DIM}.safetensors"
TOKENIZER = f"tokenizers/{WORDLLAMA_CONFIG}_tokenizer_config.json"
DEFAULT_BATCH = 256  # texts per tokenizer/pooling call; the pooling is a few matrix sums


def _package_files() -> tuple[Path, Path]:
    spec = importlib.util.find_spec("wordllama")
    if spec is None or not spec.origin:
        raise EmbeddingBackendUnavailable(
            "backend 'static' needs the wordllama package (pip install 'ragspine-pipeline[embed-static]')")
    root = Path(spec.origin).parent
    weights, tok = root / WEIGHTS, root / TOKENIZER
    if not weights.exists() or not tok.exists():
        raise EmbeddingBackendUnavailable(f"static: the wordllama wheel lacks {WEIGHTS} or {TOKENIZER}")
    return weights, tok


def _digest(*paths: Path) -> str:
    h = hashlib.sha256()
    for p in paths:
        with open(p, "rb") as fh:
            for block in iter(lambda fh=fh: fh.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()


class StaticEmbeddingBackend:
    """Mean-pooled static token vectors (wordllama ``l2_supercat``, 256-d), L2-normalised.

    Symmetric: queries and passages are embedded the same way. Texts are cut at
    ``max_chars`` (a static model has no position limit, but a 20 MB line would tokenize
    into one huge batch).
    """

    def __init__(self, *, batch_size: int = DEFAULT_BATCH, max_chars: int = 8192) -> None:
        weights, tok = _package_files()
        try:
            # lazy: wordllama and its safetensors and tokenizers (the optional [embed-static] extra)
            from safetensors import safe_open
            from tokenizers import Tokenizer
            from wordllama.inference import WordLlamaInference
        except ImportError as exc:  # pragma: no cover - wordllama depends on both
            raise EmbeddingBackendUnavailable(f"backend 'static': {exc}") from None
        with safe_open(str(weights), framework="np", device="cpu") as f:
            table = f.get_tensor("embedding.weight")
        self._model = WordLlamaInference(table, Tokenizer.from_file(str(tok)), binary=False)
        self.model_id = f"wordllama-{WORDLLAMA_CONFIG}-{WORDLLAMA_DIM}@{_digest(weights, tok)[:12]}"
        self.dim = int(table.shape[1])
        self.batch_size = batch_size
        self.max_chars = max_chars
        self.calls = 0

    def embed_texts(self, texts: Sequence[str]) -> list[list[float]]:
        if not texts:
            return []
        self.calls += 1
        cut = [t[: self.max_chars] for t in texts]
        vecs = np.asarray(self._model.embed(cut, norm=False, batch_size=self.batch_size), dtype=np.float32)
        vecs = vecs.reshape(len(cut), -1)
        vecs /= np.maximum(np.linalg.norm(vecs, axis=1, keepdims=True), 1e-12)
        return vecs.tolist()

    def embed_queries(self, texts: Sequence[str]) -> list[list[float]]:
        return self.embed_texts(texts)


_LOADED: list[StaticEmbeddingBackend] = []
_LOCK = threading.Lock()


def make_static_backend() -> StaticEmbeddingBackend:
    """One loaded table per process (16 MB; stateless, thread-safe for inference)."""
    with _LOCK:
        if not _LOADED:
            _LOADED.append(StaticEmbeddingBackend())
        return _LOADED[0]
