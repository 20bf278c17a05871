"""``CrossEncoderReranker``: a local cross-encoder ONNX graph scored with ONNX Runtime.

No package reachable here ships cross-encoder weights (see the README's rerank section),
so the model is a folder the operator provides — ``RAGSPINE_RERANKER_MODEL`` — holding an
exported cross-encoder (e.g. an ms-marco MiniLM or bge-reranker ONNX export):

    model.onnx       inputs input_ids, attention_mask (token_type_ids when the graph has
                     it); output logits of shape (batch,), (batch, 1) or (batch, 2)
    tokenizer.json   a Hugging Face ``tokenizers`` file
    (optional) tokenizer_config.json / config.json: model_max_length /
                     max_position_embeddings, the truncation length (else 512)

Nothing is downloaded: a missing folder or file is ``RerankerUnavailable`` naming the
variable and the files. Query and passage are encoded as one pair and truncated together
to the model's max length (longest first, so a long passage never pushes the query out).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ... import settings
from ...cpus import usable_cpus
from .errors import RerankerUnavailable
from .scoring import DEFAULT_BATCH_SIZE, DEFAULT_RERANK_TOP_N, ScoringReranker

MODEL_ENV = "RAGSPINE_RERANKER_MODEL"
REQUIRED_FILES = ("model.onnx", "tokenizer.json")
DEFAULT_MAX_LENGTH = 512

__all__ = ["MODEL_ENV", "REQUIRED_FILES", "CrossEncoderReranker", "model_max_length", "onnx_session",
           "load_tokenizer"]


def model_max_length(folder: Path, default: int = DEFAULT_MAX_LENGTH) -> int:
    """The truncation length a model folder declares (tokenizer_config, then config), capped at 512
    for BERT-style position tables; ``default`` when neither says."""
    for name, key in (("tokenizer_config.json", "model_max_length"), ("config.json", "max_position_embeddings")):
        p = folder / name
        if p.is_file():
            try:
                v = json.loads(p.read_text(encoding="utf-8")).get(key)
            except (OSError, ValueError, AttributeError):
                continue
            if isinstance(v, int) and not isinstance(v, bool) and 0 < v < 1_000_000:
                return min(v, default)
    return default


def onnx_session(path: Path, threads: int | None = None):
    """An ONNX Runtime CPU session (``RerankerUnavailable`` without onnxruntime)."""
    try:
        import onnxruntime as ort  # lazy: onnxruntime, the optional [rerank] extra (heavy)
    except ImportError:
        raise RerankerUnavailable("local rerankers need onnxruntime (pip install "
                                  "'ragspine-pipeline[rerank]')") from None
    opts = ort.SessionOptions()
    n = threads or usable_cpus()
    opts.intra_op_num_threads = n
    opts.inter_op_num_threads = 1
    return ort.InferenceSession(str(path), sess_options=opts, providers=["CPUExecutionProvider"])


def load_tokenizer(path: Path, max_length: int, *, pad_id: int | None = None):
    """A ``tokenizers.Tokenizer`` truncating to ``max_length`` and padding to the batch's longest."""
    try:
        from tokenizers import Tokenizer  # lazy: tokenizers, the optional [rerank] extra
    except ImportError:
        raise RerankerUnavailable("local rerankers need the tokenizers package (pip install "
                                  "'ragspine-pipeline[rerank]')") from None
    tok = Tokenizer.from_file(str(path))
    tok.enable_truncation(max_length=max_length)
    pid = pad_id
    if pid is None:
        for cand in ("[PAD]", "<pad>"):
            pid = tok.token_to_id(cand)
            if pid is not None:
                break
    tok.enable_padding(pad_id=pid or 0, pad_token=tok.id_to_token(pid or 0) or "[PAD]")
    return tok


def _resolve_folder(folder: str | os.PathLike[str] | None) -> Path:
    raw = folder if folder is not None else (settings.get(MODEL_ENV) or "")
    expected = " + ".join(REQUIRED_FILES)
    if not str(raw).strip():
        raise RerankerUnavailable(
            f"reranker 'cross_encoder' needs local cross-encoder model weights: set {MODEL_ENV} to a "
            f"folder with {expected} (e.g. an exported ms-marco MiniLM or bge-reranker); no installed "
            "package ships cross-encoder weights and nothing is downloaded at run time")
    path = Path(raw).expanduser()
    missing = [f for f in REQUIRED_FILES if not (path / f).is_file()]
    if missing:
        raise RerankerUnavailable(f"{MODEL_ENV}={str(raw)!r}: the cross-encoder folder lacks "
                                  f"{', '.join(missing)} (it needs {expected})")
    return path


class CrossEncoderReranker(ScoringReranker):
    """Pairwise (query, passage) relevance from a cross-encoder ONNX graph; batched."""

    name = "cross_encoder"

    def __init__(self, model_dir: str | os.PathLike[str] | None = None, *, top_n: int = DEFAULT_RERANK_TOP_N,
                 batch_size: int = DEFAULT_BATCH_SIZE, max_length: int | None = None,
                 threads: int | None = None) -> None:
        super().__init__(top_n=top_n, batch_size=batch_size)
        self.model_dir = _resolve_folder(model_dir)
        self.max_length = max_length or model_max_length(self.model_dir)
        try:
            self._session = onnx_session(self.model_dir / "model.onnx", threads)
            self._tok = load_tokenizer(self.model_dir / "tokenizer.json", self.max_length)
        except RerankerUnavailable:
            raise
        except Exception as exc:  # a corrupt graph or tokenizer file: say which folder
            raise RerankerUnavailable(f"{MODEL_ENV}={str(self.model_dir)!r}: cannot load the "
                                      f"cross-encoder ({type(exc).__name__}: {exc})") from exc
        self._inputs = {i.name for i in self._session.get_inputs()}
        if not {"input_ids", "attention_mask"} <= self._inputs:
            raise RerankerUnavailable(f"{self.model_dir / 'model.onnx'}: a cross-encoder graph needs "
                                      f"inputs input_ids and attention_mask (it has {sorted(self._inputs)})")
        self._output = self._session.get_outputs()[0].name

    def score_texts(self, query: str, texts: Sequence[str]) -> list[float]:
        if not texts:
            return []
        enc = self._tok.encode_batch([(query, t) for t in texts])
        feed = {"input_ids": np.asarray([e.ids for e in enc], dtype=np.int64),
                "attention_mask": np.asarray([e.attention_mask for e in enc], dtype=np.int64)}
        if "token_type_ids" in self._inputs:
            feed["token_type_ids"] = np.asarray([e.type_ids for e in enc], dtype=np.int64)
        logits = np.asarray(self._session.run([self._output], feed)[0], dtype=np.float64)
        if logits.ndim == 2 and logits.shape[1] == 2:  # two-class head: relevant minus not
            logits = logits[:, 1] - logits[:, 0]
        return logits.reshape(len(texts), -1)[:, 0].tolist()
