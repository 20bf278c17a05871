"""The chunks and embeddings steps' heavy loops as Ray Data pipelines (``RayExecutor``).

Only the per-document and per-text work moves to Ray; everything that decides *what* to
do and *what is published* stays in the local step and runs unchanged on the driver:
which documents need chunking (source hashes, withdrawals, parse failures), which chunks
need a vector (the incremental rule, RESTRICTED chunks left out), the versioned Parquet
write and the atomic manifest swap. So a Ray build publishes the same rows as a local one
by construction, and a Ray failure surfaces before anything is written: a half-built
version is never published.

* ``chunk_on_ray``: Ray Data reads the raw-document Parquet segments, keeps each wanted
  file's newest row (the rule of ``raw.fetch_documents``), turns rows into Documents with
  ``raw.table_documents`` and chunks them in ``map_batches`` tasks with the chunker the
  driver's spec builds (checked by its key). The driver gets back the Documents and their
  chunk lists, exactly the objects the local loop makes.
* ``embed_on_ray``: an actor pool, one model loaded per actor (``RAGSPINE_EMBED_THREADS``
  = its CPUs), embeds the same 256-text groups the local step embeds (``embed_in_batches``),
  so every model call sees the same texts as locally and the vectors are byte-identical
  (the ONNX backends sort a group by length into their padded batches of 8). Groups are
  dispatched longest first, so the pool's last task is a short one.

Faults: Ray retries a task whose worker died (``RETRIES`` times; an actor is restarted
and reloads its model); past that the step fails with ``RayStepFailed``, before the
publish. ``inject_worker_kills`` is the test hook: a worker SIGKILLs itself while a
marker file it creates exclusively says a kill is still owed (counted by files, not time).

The warehouse never imports this module: its callers pass ``step_executor()`` (a
``RayExecutor`` when ``RAGSPINE_EXECUTOR=ray``, else None, the local default) to
``build_chunks`` and ``build_embeddings`` (``warehouse/step_executor.py``).
"""

from __future__ import annotations

import os
import pickle
import signal
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from .. import settings
from ..corpus import make_chunker
from ..retrieval.chunking.chunking import Chunk
from ..retrieval.vector.batching import DEFAULT_STREAM_BATCH
from ..retrieval.vector.embedding_backends import backend_model_id, make_embedding_backend
from ..warehouse.raw import RAW_COLUMNS, table_documents
from ..warehouse.versioned import Published, WarehouseError
from .cluster import ClusterInfo, ray_cluster
from .config import executor

RETRIES = 3  # task retries / actor restarts after a worker dies, per task or actor
DOCS_PER_TASK = 64  # documents per chunking batch: small enough to spread a few hundred documents
Log = Callable[[str], None] | None


class RayStepFailed(WarehouseError):
    """A distributed step could not finish (workers kept dying, a model would not load);
    raised before the publish, so the previous version stays the published one."""


@dataclass(frozen=True)
class FaultHook:
    """Test hook: a worker of one of ``stages`` SIGKILLs itself at a batch while fewer than
    ``times`` marker files ``<folder>/<stage>-<i>`` exist (each kill creates one, exclusively)."""

    folder: str
    stages: tuple[str, ...]
    times: int = 1


_fault: FaultHook | None = None


@contextmanager
def inject_worker_kills(folder: str | os.PathLike[str], *stages: str, times: int = 1) -> Iterator[None]:
    """Within the block, Ray workers of each of ``stages`` ("chunks", "embeddings") kill
    themselves with SIGKILL ``times`` times per stage, each at the start of a batch."""
    global _fault
    before, _fault = _fault, FaultHook(str(folder), tuple(stages), times)
    try:
        yield
    finally:
        _fault = before


def _maybe_die(hook: FaultHook | None, stage: str) -> None:
    if hook is None or stage not in hook.stages:
        return
    for i in range(hook.times):
        try:
            os.close(os.open(Path(hook.folder) / f"{stage}-{i}", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            continue
        os.kill(os.getpid(), signal.SIGKILL)


@dataclass(frozen=True)
class RayJob:
    """What one distributed step did, for its Dagster metadata."""

    cluster: ClusterInfo
    batches: int
    rows: int
    seconds: float
    busy_s: float | None = None  # summed over workers: wall time inside the model calls
    cpu_s: float | None = None  # summed over workers: CPU time of those calls (busy_s / cpu_s: starved or not)

    def metadata(self) -> dict[str, Any]:
        rate = round(self.rows / self.seconds, 1) if self.rows and self.seconds > 0 else None
        md = {"executor": "ray", **self.cluster.metadata(), "ray_batches": self.batches, "ray_rows": self.rows,
              "ray_seconds": round(self.seconds, 3), "ray_rows_per_s": rate}
        if self.busy_s is not None:
            md.update(ray_worker_busy_s=round(self.busy_s, 3), ray_worker_cpu_s=round(self.cpu_s or 0.0, 3))
        return md


def _quiet_data_context() -> None:
    """No Ray Data progress bars: the step logs its progress through its own ``log``."""
    import ray.data  # lazy: Ray, the heavy optional [scale] extra, where a step runs on Ray

    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False
    ctx.print_on_execution_start = False


def _run(dataset: Any, total: int, count: Callable[[pa.Table], int], desc: str, log: Log,
         ) -> tuple[list[pa.Table], int, float]:
    """Execute ``dataset``, logging after each output batch; (outputs, batches, seconds).
    A Ray error (workers died past their retries, a worker raised) is a RayStepFailed."""
    t0 = time.perf_counter()
    out: list[pa.Table] = []
    done = 0
    try:
        for batch in dataset.iter_batches(batch_size=None, batch_format="pyarrow"):
            out.append(batch)
            done += count(batch)
            if log is not None:
                log(f"{desc} on ray: {done}/{total} after batch {len(out)}")
    except Exception as exc:  # noqa: BLE001 - every Ray failure ends the step the same way
        raise RayStepFailed(f"{desc} on Ray failed, nothing was published: {type(exc).__name__}: "
                            f"{str(exc)[:800]}") from exc
    return out, len(out), time.perf_counter() - t0


# ----------------------------------------------------------------------------- chunks

def _owner_files(raw_pub: Published, wanted: set[str]) -> dict[str, str]:
    """source_path -> the newest raw segment holding its row (newer segments win, as in
    ``fetch_documents``); reads only the ``source_path`` column."""
    owners: dict[str, str] = {}
    left = set(wanted)
    for path in reversed(raw_pub.table_paths("documents")):
        if not left:
            break
        keys = set(pq.read_table(path, columns=["source_path"]).column("source_path").to_pylist())
        for key in keys & left:
            owners[key] = os.path.normpath(str(path))
        left -= keys
    if left:
        raise WarehouseError(f"raw version {raw_pub.version}: no row for {len(left)} documents to chunk "
                             f"(e.g. {sorted(left)[:3]})")
    return owners


_CHUNKERS: dict[str, Any] = {}


def _chunker(spec: str | None, key: str) -> Any:
    """The chunker of ``spec`` in this worker (built once), which must be the driver's ``key``."""
    if key not in _CHUNKERS:
        chunker = make_chunker(spec)
        if chunker.key != key:
            raise RuntimeError(f"a Ray worker built chunker {chunker.key!r} from {spec!r}, "
                               f"not the driver's {key!r}")
        _CHUNKERS[key] = chunker
    return _CHUNKERS[key]


def _chunk_batch(batch: pa.Table, *, spec: str | None, key: str, owners: dict[str, str],
                 fault: FaultHook | None) -> pa.Table:
    """One batch of raw rows -> (doc_id, pickled Document, pickled chunk list) per wanted row."""
    _maybe_die(fault, "chunks")
    keep = [i for i, (p, s) in enumerate(zip(batch.column("path").to_pylist(),
                                            batch.column("source_path").to_pylist(), strict=True))
            if owners.get(s) == os.path.normpath(p)]
    empty = pa.table({"doc_id": pa.array([], pa.string()), "document": pa.array([], pa.binary()),
                      "chunks": pa.array([], pa.binary())})
    if not keep:
        return empty
    # Every raw column, as fetch_documents fills them (an older segment may lack one).
    rows = [{**dict.fromkeys(RAW_COLUMNS), **r} for r in batch.take(pa.array(keep, pa.int64())).to_pylist()]
    docs, _ = table_documents(pa.Table.from_pylist(rows))
    chunker = _chunker(spec, key)
    return pa.table({"doc_id": pa.array([d.doc_id for d in docs], pa.string()),
                     "document": pa.array([pickle.dumps(d) for d in docs], pa.binary()),
                     "chunks": pa.array([pickle.dumps(chunker(d)) for d in docs], pa.binary())})


def chunk_on_ray(raw_pub: Published, source_paths: dict[str, str], chunker_spec: str | None, chunker_key: str, *,
                 workers: int | None = None, log: Log = None, desc: str = "chunks",
                 ) -> tuple[dict[str, Any], dict[str, list[Chunk]], dict[str, Any]]:
    """(doc_id -> Document, doc_id -> its chunks, the Ray job's metadata) of ``source_paths``
    (doc_id -> source path), read from ``raw_pub``'s Parquet and chunked on Ray."""
    # lazy: Ray, the heavy optional [scale] extra, loaded when a step runs on Ray
    import ray.data
    from ray.data.expressions import col

    spec = settings.get("RAGSPINE_CHUNKER", chunker_spec)
    owners = _owner_files(raw_pub, set(source_paths.values()))
    files = sorted(set(owners.values()))
    with ray_cluster(workers) as cluster, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Ray's deprecation notes about its own remote args
        _quiet_data_context()
        ds = (ray.data.read_parquet(files, include_paths=True)
              .filter(expr=col("source_path").is_in(sorted(owners)))
              .repartition(target_num_rows_per_block=DOCS_PER_TASK)
              .map_batches(_chunk_batch, batch_size=DOCS_PER_TASK, batch_format="pyarrow",
                           fn_kwargs={"spec": spec, "key": chunker_key, "owners": owners, "fault": _fault},
                           compute=ray.data.TaskPoolStrategy(size=cluster.workers), num_cpus=1,
                           max_retries=RETRIES))
        out, batches, seconds = _run(ds, len(source_paths), lambda t: t.num_rows, desc, log)
    docs: dict[str, Any] = {}
    chunked: dict[str, list[Chunk]] = {}
    for t in out:
        for doc_id, doc, chunks in zip(t.column("doc_id").to_pylist(), t.column("document").to_pylist(),
                                       t.column("chunks").to_pylist(), strict=True):
            if doc_id in docs:
                raise RayStepFailed(f"{desc} on Ray: document {doc_id!r} came back twice")
            docs[doc_id] = pickle.loads(doc)
            chunked[doc_id] = pickle.loads(chunks)
    missing = sorted(set(source_paths) - set(docs))
    if missing:
        raise RayStepFailed(f"{desc} on Ray: {len(missing)} documents were not chunked (e.g. {missing[:3]})")
    return docs, chunked, RayJob(cluster, batches, len(docs), seconds).metadata()


# ------------------------------------------------------------------------- embeddings

class _Embedder:
    """One embedding model per actor, loaded once, run with the actor's CPUs as its threads."""

    def __init__(self, spec: str, model_id: str, threads: int, fault: FaultHook | None) -> None:
        # This process is the actor's alone: its thread count is the actor's CPU share,
        # not the machine's (which every actor would otherwise take).
        os.environ["RAGSPINE_EMBED_THREADS"] = str(threads)  # read when the backend is built, next
        self.backend = make_embedding_backend(spec)
        got = backend_model_id(self.backend) if self.backend is not None else None
        if got != model_id:
            raise RuntimeError(f"a Ray worker built model {got!r} from embedding spec {spec!r}, "
                               f"not the driver's {model_id!r}")
        self.fault = fault

    def __call__(self, batch: pa.Table) -> pa.Table:
        _maybe_die(self.fault, "embeddings")
        groups, blobs, counts, busy, cpu = [], [], [], [], []
        for group, texts in zip(batch.column("group").to_pylist(), batch.column("texts").to_pylist(), strict=True):
            t0, c0 = time.perf_counter(), time.process_time()
            vecs = np.asarray(self.backend.embed_texts(texts), dtype=np.float32)
            busy.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
            if vecs.ndim != 2 or len(vecs) != len(texts):
                raise RuntimeError("embedding backend returned a wrong number of vectors")
            groups.append(group)
            blobs.append(np.ascontiguousarray(vecs).tobytes())
            counts.append(vecs.shape)
        return pa.table({"group": pa.array(groups, pa.int64()), "vectors": pa.array(blobs, pa.binary()),
                         "rows": pa.array([c[0] for c in counts], pa.int64()),
                         "dim": pa.array([c[1] for c in counts], pa.int64()),
                         "busy_s": pa.array(busy, pa.float64()), "cpu_s": pa.array(cpu, pa.float64())})


def embed_on_ray(spec: str, model_id: str, texts: list[str], *, workers: int | None = None,
                 batch: int = DEFAULT_STREAM_BATCH, log: Log = None, desc: str = "embeddings",
                 ) -> tuple[np.ndarray, dict[str, Any]]:
    """(float32 vectors of ``texts`` in input order, the Ray job's metadata), embedded by a
    pool of actors that each build ``spec`` (which must give ``model_id``)."""
    import ray.data  # lazy: Ray, the heavy optional [scale] extra, where a step runs on Ray

    groups = [texts[i: i + batch] for i in range(0, len(texts), batch)]
    order = sorted(range(len(groups)), key=lambda g: -sum(len(t) for t in groups[g]))  # longest first
    with ray_cluster(workers) as cluster, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _quiet_data_context()
        ds = (ray.data.from_items([{"group": g, "texts": groups[g]} for g in order],
                                  override_num_blocks=len(groups))
              .map_batches(_Embedder, batch_size=1, batch_format="pyarrow",
                           fn_constructor_kwargs={"spec": spec, "model_id": model_id, "threads": 1,
                                                  "fault": _fault},
                           compute=ray.data.ActorPoolStrategy(size=min(cluster.workers, len(groups))),
                           num_cpus=1, max_restarts=RETRIES, max_task_retries=RETRIES))
        out, batches, seconds = _run(ds, len(texts), lambda t: int(pc.sum(t.column("rows")).as_py() or 0),
                                     desc, log)
    parts: dict[int, np.ndarray] = {}
    for t in out:
        for g, blob, rows, dim in zip(*(t.column(c).to_pylist() for c in ("group", "vectors", "rows", "dim")),
                                      strict=True):
            parts[g] = np.frombuffer(blob, dtype=np.float32).reshape(rows, dim)
    if sorted(parts) != list(range(len(groups))):
        raise RayStepFailed(f"{desc} on Ray: {len(groups) - len(parts)} of {len(groups)} groups came back missing")
    vectors = np.concatenate([parts[g] for g in range(len(groups))]) if groups else np.zeros((0, 0), np.float32)
    busy = sum(pc.sum(t.column("busy_s")).as_py() or 0.0 for t in out)
    cpu = sum(pc.sum(t.column("cpu_s")).as_py() or 0.0 for t in out)
    return vectors, RayJob(cluster, batches, len(texts), seconds, busy, cpu).metadata()


class RayExecutor:
    """The chunks and embeddings steps' heavy part on Ray (the warehouse's ``StepExecutor``):
    ``workers`` per job (default ``RAGSPINE_RAY_WORKERS``)."""

    def __init__(self, workers: int | None = None) -> None:
        self.workers = workers

    def chunk(self, raw_pub: Published, source_paths: dict[str, str], chunker_spec: str | None, chunker_key: str, *,
              log: Log, desc: str) -> tuple[dict[str, Any], dict[str, list[Chunk]], dict[str, Any]]:
        return chunk_on_ray(raw_pub, source_paths, chunker_spec, chunker_key, workers=self.workers, log=log,
                            desc=desc)

    def embed(self, spec: str, model_id: str, texts: list[str], *, log: Log, desc: str
              ) -> tuple[np.ndarray, dict[str, Any]]:
        return embed_on_ray(spec, model_id, texts, workers=self.workers, log=log, desc=desc)

    def no_work(self) -> dict[str, Any]:
        return {"executor": "ray", "ray_batches": 0}


def step_executor(value: str | None = None) -> RayExecutor | None:
    """The executor ``value`` (else ``RAGSPINE_EXECUTOR``) names for the chunks and
    embeddings steps: Ray's, or None (the warehouse's local default). An unknown name is a
    SettingsError naming the variable."""
    return RayExecutor() if executor(value) == "ray" else None
