"""The embeddings step's model choice and progress (kept out of pipeline.py on purpose).

Progress (issue 43: a 34-minute index printed nothing until each library ended): after
each batch ``EmbedProgress`` counts the texts embedded and, at most ``PROGRESS_EVERY_S``
seconds apart (and after the first and the last batch), logs ``embeddings[LIB]: done/total
texts (p%), R texts/s, ETA …``; a document with more than ``LARGE_FILE_CHUNKS`` chunks to
embed is announced with its expected time when the embedding reaches it. Every line goes
to the step's ``log`` (the Dagster asset passes ``context.log.info``, ``ragspine index
--in-process`` prints) and to the ``ragspine.progress`` logger, which ``ragspine index``
prints while the code location runs (its Dagster console is quiet).

With ``RAGSPINE_EMBEDDING_BACKEND=auto`` the model is chosen per library from the
evaluation table (``retrieval/vector/auto_policy.py``), over the library's whole active,
non-RESTRICTED chunk set -- not over the chunks a refresh happens to embed, so an
incremental run cannot switch models half-way. The concrete model key becomes the
embeddings version's ``spec`` (so the snapshot rebuilds exactly that model for queries),
and the choice (group, model, fusion, why, and every language the library holds, per
document) is stored in its metadata and the snapshot's.

The published vector file (issue 47): ``write_vector_file`` writes the served chunks' unit
vectors into the version before it is published (``retrieval/vector/published``: int8
pre-selection, exact float32 rescoring, shared pages), and ``write_ann_file`` the ANN
index beside it where the version is large enough; ``serve_vectors`` hands a snapshot's
retriever the mapped file, or the table's rows for a version from before the file.
"""

from __future__ import annotations

import logging
import os
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..retrieval.hybrid.fusion import fusion_configured, fusion_from_env
from ..retrieval.lexical.format.file import id_digest
from ..retrieval.vector import ann
from ..retrieval.vector.base import EmbeddingBackendUnavailable
from ..retrieval.vector.batching import DEFAULT_STREAM_BATCH, embed_in_batches
from ..retrieval.vector.embedding_backends import backend_model_id
from ..retrieval.vector.published import FORMAT_VERSION as VECTOR_FORMAT
from ..retrieval.vector.published import (
    VECTOR_FILE,
    PublishedVectors,
    open_vectors,
    unit_rows,
)
from ..retrieval.vector.published_write import write_vectors
from ..sensitivity import is_restricted
from ..vector_cache import shared_reuse
from .chunk_tables import active_chunk_table, served_chunk_table, withheld_docs
from .served_refresh import aligned_rows
from .step_executor import StepExecutor, step_executor
from .versioned import read_segments

LOG = logging.getLogger("ragspine.warehouse.embeddings")
PROGRESS_LOG = logging.getLogger("ragspine.progress")
PROGRESS_EVERY_S = 10.0
"""Longest wait between two progress lines while a step embeds (docs/pipeline.md)."""
LARGE_FILE_CHUNKS = 2000
"""A document with more chunks than this to embed is announced with its expected time."""


def resolve_library_backend(backend: Any, spec: str, pub_chunks: Any) -> tuple[Any, str, dict[str, Any]]:
    """(backend to embed with, spec to record, metadata to add) for one library."""
    if backend is None or not callable(getattr(backend, "resolve", None)):
        return backend, spec, {}
    # The served chunks only (no RESTRICTED, no withheld document): the profile and the choice
    # reach the manifest, the UI metadata and every served score, so hidden text must not vote.
    withheld = withheld_docs(pub_chunks)
    t = active_chunk_table(pub_chunks, columns=["doc_id", "text", "language", "sensitivity"])
    items = [(txt, lang, doc) for doc, txt, lang, sens in zip(
        t.column("doc_id").to_pylist(), t.column("text").to_pylist(), t.column("language").to_pylist(),
        t.column("sensitivity").to_pylist(), strict=True) if doc not in withheld and not is_restricted(sens)]
    choice = backend.resolve(items)
    fusion = fusion_from_env() if fusion_configured() else choice.fusion
    auto = {k: v for k, v in choice.to_dict().items() if k != "evidence"}
    auto["profile"] = choice.evidence.get("profile")
    return backend.backend_for(choice.model), choice.model, {"auto": auto, "fusion": fusion.to_dict()}


def embed_for_step(backend: Any, spec: str, texts: list[str], library: str, log: Callable[[str], None] | None,
                   executor: StepExecutor | None, ids: Sequence[str] | None = None) -> tuple[Any, dict[str, Any]]:
    """(vectors of ``texts``, the executor's job metadata and the reuse counts): embedded here
    in bounded batches (``executor`` None), or by ``executor``, e.g. Ray's actor pool that
    builds ``spec`` per actor (it must build the same model id as ``backend``: a mismatch
    fails the step).
    ``ids``: the chunk ids of ``texts`` (``doc#ordinal-hash``), so that a large document is
    announced by name.

    A text is embedded once per process and model (issue 47): the backend's
    ``vector_cache.shared_reuse`` store, keyed by (model id, normalised text hash), hands
    back the vector of a text this step, another library or an earlier version already
    embedded (the shipped models are loaded once per process, so one store serves them
    all; ``RAGSPINE_EMBED_CACHE`` keeps it on disk for later processes); only the distinct
    texts it lacks reach the model. ``reuse`` in the returned
    metadata counts them."""
    executor = step_executor(executor)  # an object or None, never a name
    if not texts:
        return [], (executor.no_work() if executor is not None else {})
    model_id = backend_model_id(backend)
    job: dict[str, Any] = {}

    say = progress_line(log)

    def embed_missing(missing: list[str]) -> Any:
        if len(missing) < len(texts):
            say(f"embeddings[{library}]: {len(texts):,} texts, {len(texts) - len(missing):,} of them duplicates or "
                f"embedded earlier with {model_id}: {len(missing):,} to embed")
        if executor is None:
            first_id: dict[str, str] = {}
            for cid, t in zip(ids or (), texts, strict=False):
                first_id.setdefault(t, cid)
            return embed_with_progress(backend, missing, library, log,
                                       ids=[first_id.get(t, "") for t in missing] if ids else None)
        vecs, meta = executor.embed(spec, model_id, missing, log=log or LOG.info, desc=f"embeddings[{library}]")
        job.update(meta)
        return vecs

    vecs, counts = shared_reuse(backend).embed(model_id, texts, embed_missing)
    if not counts["embedded"]:
        say(f"embeddings[{library}]: {len(texts):,}/{len(texts):,} texts reused from earlier embeddings with "
            f"{model_id}, none embedded (100%)")
    return vecs, {**job, "reuse": counts}


def progress_line(log: Callable[[str], None] | None) -> Callable[[str], None]:
    """A line sink: the step's ``log`` (else this module's logger) and ``ragspine.progress``."""
    def say(line: str) -> None:
        (log or LOG.info)(line)
        PROGRESS_LOG.info(line)

    return say


def _duration(seconds: float) -> str:
    s = int(round(seconds))
    return f"{s // 3600}h{s // 60 % 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


def large_documents(ids: Sequence[str] | None, threshold: int | None = None) -> list[tuple[str, int, int]]:
    """(doc id, index of its first text, texts) of each document over ``threshold`` texts
    (default ``LARGE_FILE_CHUNKS``)."""
    if not ids:
        return []
    threshold = LARGE_FILE_CHUNKS if threshold is None else threshold
    docs = [cid.rpartition("#")[0] or cid for cid in ids]
    counts = Counter(docs)
    first: dict[str, int] = {}
    for i, d in enumerate(docs):
        first.setdefault(d, i)
    return sorted(((d, first[d], n) for d, n in counts.items() if n > threshold), key=lambda x: x[1])


@dataclass
class EmbedProgress:
    """The progress hook of one embedding step (``progress(done, total)`` after each
    batch): counts, rate and ETA at most ``every_s`` apart, large documents announced."""

    desc: str
    say: Callable[[str], None]
    every_s: float = PROGRESS_EVERY_S
    batch: int = DEFAULT_STREAM_BATCH
    large: list[tuple[str, int, int]] = field(default_factory=list)
    clock: Callable[[], float] = time.monotonic
    calls: int = 0
    lines: int = 0
    _t0: float = field(default=0.0, init=False)
    _last_line: float = field(default=0.0, init=False)
    _last_call: float = field(default=0.0, init=False)

    def __post_init__(self) -> None:
        self._t0 = self._last_line = self._last_call = self.clock()

    def _emit(self, line: str) -> None:
        self.lines += 1
        self.say(line)

    def __call__(self, done: int, total: int) -> None:
        now = self.clock()
        self.calls += 1
        batch_s, self._last_call = now - self._last_call, now
        elapsed = max(now - self._t0, 1e-9)
        rate = done / elapsed
        while self.large and self.large[0][1] < done + self.batch:  # reached by the next batch
            doc, _, n = self.large.pop(0)
            self._emit(f"{self.desc}: {doc} has {n:,} chunks to embed (over {LARGE_FILE_CHUNKS:,}): "
                       f"about {_duration(n / rate)} at {rate:,.1f} texts/s")
        if done >= total:
            self._emit(f"{self.desc}: {done:,}/{total:,} texts in {_duration(elapsed)}, {rate:,.1f} texts/s (100%)")
        elif self.calls == 1 or now - self._last_line + batch_s >= self.every_s:
            # The next line would come a batch later: write it now so no gap passes every_s.
            eta = (total - done) / rate if rate > 0 else 0.0
            self._emit(f"{self.desc}: {done:,}/{total:,} texts ({100 * done / total:.0f}%), {rate:,.1f} texts/s, "
                       f"ETA {_duration(eta)}")
        else:
            return
        self._last_line = now


def embed_with_progress(backend: Any, texts: list[str], library: str, log: Callable[[str], None] | None = None,
                        *, ids: Sequence[str] | None = None, batch: int = DEFAULT_STREAM_BATCH,
                        clock: Callable[[], float] = time.monotonic) -> list:
    """Embed in bounded batches, reporting progress (see ``EmbedProgress``)."""
    if not texts:
        return []
    say = progress_line(log)
    desc = f"embeddings[{library}]"
    say(f"{desc}: {len(texts):,} texts to embed in batches of {batch}")
    hook = EmbedProgress(desc, say, batch=batch, large=large_documents(ids), clock=clock)
    return embed_in_batches(backend, texts, batch=batch, progress=hook)


# ---------------------------------------------------------------- the published vector file
ANN_FILE = "vectors.ann"
"""The ANN index beside the vector file (``write_ann_file``), same row order."""
VECTOR_BATCH = 65536
"""Served rows normalized and written at a time (a float32 batch of ~100 MB at d=384)."""


def vector_file(version_dir: str | os.PathLike[str]) -> Path | None:
    """The embeddings version's published vector file, or None (a version from before it)."""
    path = Path(version_dir) / VECTOR_FILE
    return path if path.is_file() else None


def write_vector_file(wh: Any, library: str, pub: Any, chunks_version: str,
                      metadata: dict[str, Any]) -> dict[str, Any]:
    """Write ``VECTOR_FILE`` into the (unpublished) embeddings version ``pub``: the unit
    vectors of the chunks a snapshot of ``chunks_version`` serves (active, not withheld,
    not RESTRICTED: no row for a hidden chunk, as the served index), in chunk_id order
    (the retriever's positions), normalized exactly as ``preload_vectors`` normalizes.
    Returns the metadata to report; a served chunk without a vector writes no file
    (``vector_file_skipped`` says why; serving then reads the table, as before)."""
    t0 = time.perf_counter()
    ids = served_chunk_table(wh, library, chunks_version, columns=["chunk_id"]).column("chunk_id").combine_chunks()
    table = read_segments(pub, "vectors", columns=["chunk_id", "vector"])
    n = table.num_rows
    if n and len(pc.unique(table.column("chunk_id"))) != n:  # the newest row of an id wins (aligned_rows)
        table = table.take(pa.array(np.arange(n - 1, -1, -1)))
    where = pc.index_in(ids, value_set=table.column("chunk_id").combine_chunks())
    if where.null_count:
        return {"vector_file": None, "vector_file_skipped": f"{where.null_count} served chunks have no vector"}
    where = where.to_numpy(zero_copy_only=False).astype(np.int64)
    dim = int(metadata.get("dim") or 0)
    col = table.column("vector")

    def batches():
        for lo in range(0, len(where), VECTOR_BATCH):
            vec = col.take(pa.array(where[lo:lo + VECTOR_BATCH])).combine_chunks()
            flat = vec.flatten().to_numpy(zero_copy_only=False).astype(np.float32, copy=False)
            yield unit_rows(flat.reshape(len(vec), dim))

    path = write_vectors(Path(pub.path) / VECTOR_FILE, batches(), len(where), dim, _id_blob(ids),
                         metadata={"model_id": metadata.get("model_id"), "library": library,
                                   "chunks_version": chunks_version})
    out = {"vector_file": VECTOR_FILE, "vector_format": VECTOR_FORMAT, "vector_rows": len(where),
           "vector_bytes": path.stat().st_size, "vector_seconds": round(time.perf_counter() - t0, 3)}
    return {**out, **write_ann_file(path)}


def write_ann_file(path: Path) -> dict[str, Any]:
    """The ANN index of the vector file at ``path`` (``retrieval/vector/ann``), written
    beside it as ``ANN_FILE`` for a version of at least ``RAGSPINE_ANN_MIN_VECTORS`` rows
    (``ann_wanted``), built from the file's own verified rows (mapped: no second copy).
    Without the ``[ann]`` extra (faiss) nothing is written and ``ann_skipped`` says why;
    serving then scans exactly, as without an index."""
    pv = open_vectors(path)
    if not ann.ann_wanted(len(pv)):
        return {}
    t0 = time.perf_counter()
    try:
        ann.build_ann(pv.matrix(), path.parent / ANN_FILE)
    except EmbeddingBackendUnavailable as exc:
        return {"ann_file": None, "ann_skipped": str(exc)}
    return {"ann_file": ANN_FILE, "ann_format": getattr(ann, "FORMAT", None),
            "ann_seconds": round(time.perf_counter() - t0, 3)}


def ann_file(version_dir: str | os.PathLike[str]) -> Path | None:
    """The embeddings version's ANN index (``write_ann_file``), or None."""
    path = Path(version_dir) / ANN_FILE
    return path if path.is_file() else None


def _id_blob(ids: Any) -> tuple[np.ndarray, np.ndarray]:
    """An Arrow string array as ``strings_to_blob``'s (int64 offsets from 0, UTF-8 bytes)."""
    bufs = ids.buffers()
    off = np.frombuffer(bufs[1], np.int32)[ids.offset:ids.offset + len(ids) + 1].astype(np.int64)
    blob = np.frombuffer(bufs[2], np.uint8)[off[0]:off[-1]] if len(ids) else np.zeros(0, np.uint8)
    return off - off[0], blob


def open_vector_file(version_dir: str | os.PathLike[str], served: Any) -> PublishedVectors | None:
    """The version's vector file, mapped, when its rows are exactly the served chunks
    (``served``: a ``ChunkColumns`` or an Arrow array of the served ids, chunk_id order),
    compared by their ``id_digest``; None when there is none or the ids differ (an older
    snapshot served less what is hidden now: the caller reads the table). A damaged file
    raises ``IndexFormatError`` naming it."""
    path = vector_file(version_dir)
    if path is None:
        return None
    digest = getattr(served, "id_digest", None)
    if digest is None:
        blob = served.chunk_id_blob() if callable(getattr(served, "chunk_id_blob", None)) else _id_blob(served)
        digest = id_digest(*blob)
    pv = open_vectors(path)
    return pv if len(pv) == len(served) and pv.ids_digest() == digest else None


def serve_vectors(emb: Any, retriever: Any, chunks: Any, ids: Any, error: str) -> None:
    """Give ``retriever`` the vectors of embeddings version ``emb`` for its served
    ``chunks``: its vector file mapped (``attach_vector_file``), else the table's rows
    aligned by chunk id (``ids``, or the ids of ``chunks``; every one must have a row;
    ``error`` says where otherwise) and preloaded, as before the file."""
    if attach_vector_file(emb, retriever, chunks if ids is None else ids):
        return
    if ids is None:
        ids = chunks.column("chunk_id").combine_chunks()
    vec = aligned_rows(read_segments(emb, "vectors"), ids, error).column("vector").combine_chunks()
    dim = len(vec[0]) if len(vec) else 0
    flat = vec.flatten().to_numpy(zero_copy_only=False).astype(np.float32, copy=False)
    retriever.preload_vectors(flat.reshape(len(vec), dim) if len(vec) else np.zeros((0, dim), np.float32),
                              chunk_ids=ids.to_pylist())


def attach_vector_file(emb: Any, retriever: Any, served: Any) -> bool:
    """Serve the dense channel of ``retriever`` from ``emb``'s vector file (mapped, shared
    by every process; ``HybridRetriever.install_vectors``). False when the version has no
    file for these chunks or the retriever cannot take one: the caller preloads the table."""
    install = getattr(retriever, "install_vectors", None)
    if not callable(install):
        return False
    pv = open_vector_file(emb.path, served)
    if pv is None:
        return False
    attach_ann_file(pv)
    install(pv)
    return True


def attach_ann_file(pv: Any) -> bool:
    """Attach the ANN index written beside ``pv``'s file (``write_ann_file``) when queries
    use one (``RAGSPINE_ANN=auto``). Without the file, or without the ``[ann]`` extra
    (faiss), the dense channel stays exact, as for a version under the size threshold."""
    path = Path(pv.path).parent / ANN_FILE
    if not path.is_file():
        return False
    try:
        if not ann.ann_used():
            return False
        return bool(pv.attach_ann(ann.open_ann(path)))
    except (ImportError, OSError, RuntimeError, ann.AnnIndexFormatError) as exc:
        # A damaged or foreign index file costs speed, never answers: the exact ranking serves
        # (its vectors are checked on their own), and the log names the file to republish.
        logging.getLogger(__name__).warning("ANN index %s not used (exact dense ranking): %s", path.name, exc)
        return False
