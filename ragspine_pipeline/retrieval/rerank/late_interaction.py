"""Late interaction (ColBERT-style MaxSim) over per-token embeddings.

Score of a passage = sum over query tokens of the best cosine with any passage token
(``maxsim``). No ColBERT-trained checkpoint ships in any package reachable here, so the
default token encoder is the **multilingual-e5-small token states** — the same shipped
model the dense channel uses (``onnx_backend``), run through ONNX Runtime with its
``last_hidden_state`` kept per token. That is "late interaction over e5 token states",
*not* ColBERT: e5 was trained for mean-pooled sentence vectors, and the benchmark says
how well its token states rank. ``RAGSPINE_COLBERT_MODEL`` may name a local folder with
a real ColBERT ONNX export (model.onnx with input_ids/attention_mask -> per-token
vectors, plus tokenizer.json); it is then used instead, with no prefixes.

Passage token vectors are computed once per text (cached by content hash), so the
candidates of a query batch are encoded once and reused by later queries;
``encode_documents`` gives a library the same matrices to precompute. ``maxsim`` is the
scoring function the visual slot reuses for page-patch embeddings.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ... import settings
from ..vector.base import EmbeddingBackendUnavailable
from ..vector.onnx_backend import MODELS, prepare_model
from .errors import RerankerUnavailable
from .onnx_cross_encoder import load_tokenizer, model_max_length, onnx_session
from .scoring import DEFAULT_BATCH_SIZE, DEFAULT_RERANK_TOP_N, PassageCache, ScoringReranker

COLBERT_ENV = "RAGSPINE_COLBERT_MODEL"
COLBERT_FILES = ("model.onnx", "tokenizer.json")

__all__ = ["COLBERT_ENV", "LateInteractionReranker", "TokenEncoder", "maxsim"]


def maxsim(query_tokens: np.ndarray, doc_tokens: np.ndarray) -> float:
    """Sum over query rows of the max dot product with any document row (rows are
    expected L2-normalised, so this is the sum of best cosines). Empty -> 0."""
    q = np.asarray(query_tokens, dtype=np.float32)
    d = np.asarray(doc_tokens, dtype=np.float32)
    if q.ndim != 2 or d.ndim != 2 or (q.size and d.size and q.shape[1] != d.shape[1]):
        raise ValueError(f"maxsim needs two 2-D token matrices of one width (got {q.shape} and {d.shape})")
    if not len(q) or not len(d):
        return 0.0
    return float((q @ d.T).max(axis=1).sum())


class TokenEncoder:
    """Per-token L2-normalised vectors from an ONNX encoder folder (model.onnx + tokenizer.json)."""

    def __init__(self, folder: Path, *, query_prefix: str = "", passage_prefix: str = "",
                 max_length: int | None = None, model_id: str = "", threads: int | None = None) -> None:
        missing = [f for f in COLBERT_FILES if not (folder / f).is_file()]
        if missing:
            raise RerankerUnavailable(f"token encoder folder {str(folder)!r} lacks {', '.join(missing)}")
        self.max_length = max_length or model_max_length(folder)
        self.session = onnx_session(folder / "model.onnx", threads)
        self.tok = load_tokenizer(folder / "tokenizer.json", self.max_length)
        self._inputs = {i.name for i in self.session.get_inputs()}
        self._output = self.session.get_outputs()[0].name
        self.query_prefix, self.passage_prefix = query_prefix, passage_prefix
        self.model_id = model_id or folder.name

    def encode(self, texts: Sequence[str], *, is_query: bool) -> list[np.ndarray]:
        if not texts:
            return []
        prefix = self.query_prefix if is_query else self.passage_prefix
        enc = self.tok.encode_batch([prefix + t for t in texts])
        ids = np.asarray([e.ids for e in enc], dtype=np.int64)
        mask = np.asarray([e.attention_mask for e in enc], dtype=np.int64)
        feed = {"input_ids": ids, "attention_mask": mask}
        if "token_type_ids" in self._inputs:
            feed["token_type_ids"] = np.zeros_like(ids)
        states = np.asarray(self.session.run([self._output], feed)[0], dtype=np.float32)
        if states.ndim != 3 or states.shape[:2] != ids.shape:
            raise ValueError(f"{self.model_id}: expected per-token output [batch, tokens, dim], got {states.shape}")
        out = []
        for b in range(len(texts)):
            rows = states[b, mask[b].astype(bool)]
            out.append(rows / np.maximum(np.linalg.norm(rows, axis=1, keepdims=True), 1e-12))
        return out


_ENCODERS: dict[str, TokenEncoder] = {}
_LOCK = threading.Lock()


def _default_encoder(max_length: int | None) -> TokenEncoder:
    """RAGSPINE_COLBERT_MODEL's folder when set, else the shipped e5's token states."""
    env = (settings.get(COLBERT_ENV) or "").strip()
    key = f"{env or 'e5'}|{max_length}"
    with _LOCK:
        if key in _ENCODERS:
            return _ENCODERS[key]
        if env:
            folder = Path(env).expanduser()
            missing = [f for f in COLBERT_FILES if not (folder / f).is_file()]
            if missing:
                raise RerankerUnavailable(f"{COLBERT_ENV}={env!r}: the folder lacks {', '.join(missing)} "
                                          f"(a ColBERT ONNX export needs {' + '.join(COLBERT_FILES)})")
            enc = TokenEncoder(folder, max_length=max_length, model_id=f"colbert:{folder.name}")
        else:
            spec = MODELS["e5"]
            try:
                folder, digest = prepare_model(spec)
            except EmbeddingBackendUnavailable as exc:
                raise RerankerUnavailable(
                    f"reranker 'colbert' (late interaction over e5 token states) needs the shipped e5 "
                    f"model: {exc}; or set {COLBERT_ENV} to a ColBERT ONNX folder") from None
            enc = TokenEncoder(folder, query_prefix=spec.query_prefix, passage_prefix=spec.passage_prefix,
                               max_length=max_length, model_id=f"e5-token-states@{digest[:12]}")
        _ENCODERS[key] = enc
        return enc


class LateInteractionReranker(ScoringReranker):
    """MaxSim between query and passage token vectors (e5 token states by default)."""

    name = "colbert"

    def __init__(self, encoder: TokenEncoder | None = None, *, top_n: int = DEFAULT_RERANK_TOP_N,
                 batch_size: int = DEFAULT_BATCH_SIZE, max_length: int | None = None,
                 cache_size: int = 20_000) -> None:
        super().__init__(top_n=top_n, batch_size=batch_size)
        self.encoder = encoder if encoder is not None else _default_encoder(max_length)
        self.model_id = self.encoder.model_id
        self._passages = PassageCache(cache_size)
        self._last_query: tuple[str, np.ndarray] | None = None

    @property
    def max_length(self) -> int:
        return self.encoder.max_length

    def encode_passages(self, texts: Sequence[str]) -> list[np.ndarray]:
        """Passage token matrices straight from the encoder (no cache): what a library precomputes."""
        return self.encoder.encode(list(texts), is_query=False)

    def encode_documents(self, texts: Sequence[str]) -> list[np.ndarray]:
        """Passage token matrices; each distinct text is encoded once (content-hash cache)."""
        return self._passages.encode(texts, lambda batch: self.encoder.encode(batch, is_query=False), self.batch_size)

    def score_texts(self, query: str, texts: Sequence[str]) -> list[float]:
        last = self._last_query
        if last is not None and last[0] == query:
            q = last[1]  # a query's batches share its token vectors
        else:
            q = self.encoder.encode([query], is_query=True)[0]
            self._last_query = (query, q)
        return [maxsim(q, d) for d in self.encode_documents(texts)]
