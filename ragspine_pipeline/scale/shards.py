"""A library served as S hash shards on Ray, queried by exact two-phase scatter-gather.

Why: one process holding a whole library is one failure domain and one machine's memory.
Each shard is a Ray actor (restarted by Ray when it dies, ``max_restarts``) that
memory-maps only its own doc_id hash buckets of the published BM25 index
(``bm25_segments.open_segments(folder, buckets=...)``, nothing rebuilt) and holds only
its part of the dense vectors. ``ShardedBM25`` stands where the single index stood in the
``HybridRetriever`` (``attach``), so the one-door assembly — filters, glossary variants,
fusion, rerank, the RESTRICTED exits, snippets — is unchanged:

- unfiltered BM25: one phase; segments carry corpus-wide statistics, so each shard's
  top-k is the corpus top-k restricted to its documents;
- filtered BM25: phase 1 sums every shard's ``survivor_stats`` (N, df, length over the
  filter survivors), phase 2 scores every shard with those global statistics;
- dense: each shard ranks its own vectors by the exact float64 cosine the single index
  computes (``dense_topk``: the same bits wherever a vector sits);

and every merge is the exact top-k by (score desc, corpus position asc): position is
chunk_id order, so ties fall as in one index. Each phase has a deadline
(``RAGSPINE_SHARD_TIMEOUT_S``): a shard that misses it or fails is a ``ShardUnavailable``
(the service answers 503 with its message), unless the request opened a
``shard_request(allow_partial=True)`` scope, which then records the missing shards so the
response is marked ``"partial": true``. Never a silently partial answer.

Ray starts, names and restarts the shards and tells a front where each listens
(``describe``); the per-query calls travel over ``wire`` (a framed socket, tens of
microseconds instead of a Ray call's ~1 ms on a busy 2-core box). Ray is imported only
where actors are started or described. The front (``ShardedBM25``, ``attach``) lives in
``front.py``; this module holds what runs in a shard process.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..retrieval.hybrid.dense_topk import dense_top
from ..retrieval.lexical.index.topk import ScoredDocs, empty_scored
from ..retrieval.lexical.refresh.segments import SurvivorStats, open_segments
from ..retrieval.link.assembly_warm import WarmReport, probe_tokens, warm_index
from .config import require_ray
from .front import ShardedBM25, attach, ids_digest
from .layout import index_token_batches, write_layout
from .requests import ShardRequest, ShardUnavailable, ShardUnhealthy, shard_request
from .vectors import VectorSource
from .wire import WireLimits, WireServer, scored_frame

NAMESPACE = "ragspine"
SHARD_RESTARTS = -1  # a killed shard always comes back (it only maps files)
SHARD_THREADS = 2  # concurrent calls a shard answers (numpy and the kernels release the GIL)
SHARD_UNHEALTHY_EXIT = 75  # the exit status of a shard that ends itself to be restarted
MAX_QUERY_VECTOR_BYTES = 8 << 20  # query vectors of one request (e.g. 512 variants x 4096 float32)

log = logging.getLogger("ragspine.scale")


def assign_buckets(buckets_total: int, shards: int) -> list[tuple[int, ...]]:
    """Bucket b goes to shard ``b % shards``; every shard needs at least one bucket."""
    if shards < 1:
        raise ValueError(f"shards must be >= 1 (got {shards})")
    if shards > buckets_total:
        raise ValueError(f"{shards} shards need at least {shards} hash buckets; the published index has "
                         f"{buckets_total}: republish it with RAGSPINE_BM25_BUCKETS >= {shards}, or serve fewer "
                         "shards")
    return [tuple(range(i, buckets_total, shards)) for i in range(shards)]


def segment_buckets(folder: str | os.PathLike[str]) -> int:
    """How many hash buckets the segment files in ``folder`` split the corpus into (0: none)."""
    files = sorted(Path(folder).glob("bm25-*-of-*.rsbm25"))
    return int(files[0].name.rsplit("-of-", 1)[1].split(".")[0]) if files else 0


def unpack_mask(packed: np.ndarray | None, n_docs: int) -> np.ndarray | None:
    return None if packed is None else np.unpackbits(packed, count=n_docs).astype(bool)


def _exit_for_restart(reason: str) -> None:
    """End this shard actor's process: Ray core calls no health method on an actor, it
    restarts one whose process died (``max_restarts``), so a shard that can no longer
    accept is replaced this way (an unexpected exit, not ``exit_actor``, which Ray would
    take as final)."""
    log.error("shard process %d exits so that Ray restarts it: %s", os.getpid(), reason)
    logging.shutdown()
    os._exit(SHARD_UNHEALTHY_EXIT)


def _in_ray_actor() -> bool:
    try:  # a shard built outside Ray (tests, benchmarks) runs without it
        import ray  # lazy: Ray, the heavy optional [scale] extra
    except ImportError:
        return False
    return bool(ray.is_initialized() and ray.get_runtime_context().get_actor_id())


class BM25Shard:
    """The body of one shard actor: its buckets' segments, mapped, and its vectors.

    ``limits``: its listener's (``WireLimits``; the frame size is this shard's packed
    mask plus ``MAX_QUERY_VECTOR_BYTES``, whatever the limits say). Run as a Ray actor, a
    shard whose listener can no longer accept ends its process so that Ray restarts it.
    """

    def __init__(self, folder: str, buckets: Sequence[int], vectors: VectorSource | None = None,
                 limits: WireLimits | None = None) -> None:
        self.index = open_segments(folder, buckets)
        self.buckets = tuple(self.index.buckets)
        pos = np.concatenate([s._global_pos for s in self.index.segments]) if self.index.segments else np.zeros(0)
        ids = [cid for s in self.index.segments for cid in s.doc_ids(range(s.n_docs))]
        order = np.argsort(pos, kind="stable")
        self.positions = pos[order].astype(np.int64)
        self.chunk_ids = [ids[i] for i in order.tolist()]
        self.vectors = vectors.rows(self.positions, self.chunk_ids) if vectors is not None else None
        self._warm()
        frame = -(-self.index.n_docs // 8) + MAX_QUERY_VECTOR_BYTES  # the packed mask and the query vectors
        limits = dataclasses.replace(limits or WireLimits(), max_payload=frame)
        self.wire = WireServer(self.answer, host=_node_host(), limits=limits,
                               on_unhealthy=_exit_for_restart if _in_ray_actor() else None)

    def _warm(self) -> None:
        """What a first query would pay, paid before the shard says where it listens (a
        front waits for ``describe``, so a replica is ready only after its shards are warm),
        not inside the first deadline: each segment's file read into the page cache, its
        heaviest terms checked and its kernels called unfiltered and filtered (the serving
        warm-up's ``warm_index``), then the shard's own steps once (unfiltered search,
        survivor statistics, filtered search with them). Kept in ``self.warmed``."""
        self.warmed = WarmReport()
        toks = None
        for seg in self.index.segments:
            warm_index(seg, report=self.warmed)
            toks = toks or probe_tokens(seg)
        if toks and self.index.n_docs:
            t0 = time.perf_counter()
            packed = np.packbits(np.arange(self.index.n_docs) % 2 == 0)
            self.search(toks, 1)
            self.search(toks, 1, packed, self.survivor_stats([toks], packed)[0])
            self.warmed.add("shard probe", time.perf_counter() - t0)
        log.info("shard %s warmed: %s", list(self.buckets), self.warmed.describe())

    def check_health(self) -> None:
        """Raise ``ShardUnhealthy`` when the listener cannot accept (what Serve would call
        on a deployment; the front calls it through ``describe`` and has Ray restart the
        shard)."""
        why = self.wire.health()
        if why is not None:
            raise ShardUnhealthy(f"shard {list(self.buckets)} cannot accept connections: {why}")

    def describe(self) -> dict[str, Any]:
        """Which corpus positions this shard holds (and a digest of their chunk ids), its
        pid; ``ShardUnhealthy`` when its listener cannot accept (no endpoint to hand out)."""
        self.check_health()
        ep = self.wire.endpoint
        return {"pid": os.getpid(), "buckets": list(self.buckets), "positions": self.positions,
                "ids_digest": ids_digest(self.chunk_ids), "n_docs": self.index.n_docs,
                "dense": self.vectors is not None, "wire": (ep.host, ep.port, ep.secret)}

    def answer(self, header: dict[str, Any], payload: bytes) -> tuple[dict[str, Any], bytes]:
        """One wire request (``op`` search, stats or dense; the packed mask and query
        vectors in the payload) answered with result arrays as raw bytes."""
        op = header.get("op")
        mask_bytes = payload[int(header.get("qv_bytes", 0)):]
        packed = np.frombuffer(mask_bytes, np.uint8) if header.get("mask") else None
        if op == "search":
            st = header.get("stats")
            stats = None if st is None else SurvivorStats(int(st["n"]), int(st["total_len"]),
                                                          np.asarray(st["df"], np.int64))
            return scored_frame([self.search(list(header["q"]), int(header["k"]), packed, stats)])
        if op == "stats":
            assert packed is not None, "stats need a filter mask"
            got = self.survivor_stats([list(q) for q in header["qs"]], packed)
            return {"stats": [{"n": int(x.n), "total_len": int(x.total_len), "df": x.df.tolist()} for x in got]}, b""
        if op == "dense":
            qv = np.frombuffer(payload[:int(header["qv_bytes"])], np.float32).reshape(int(header["rows"]), -1)
            return scored_frame(self.dense(qv, packed, int(header["depth"])))
        raise ValueError(f"unknown shard operation {op!r}")

    def held_chunk_ids(self) -> list[str]:
        """The chunk ids this shard holds, in position order (audits: RESTRICTED in none)."""
        return list(self.chunk_ids)

    def survivor_stats(self, queries: list[list[str]], packed: np.ndarray) -> list[SurvivorStats]:
        mask = unpack_mask(packed, self.index.n_docs)
        return [self.index.survivor_stats(q, mask) for q in queries]

    def search(self, query: list[str], k: int, packed: np.ndarray | None = None,
               stats: SurvivorStats | None = None) -> ScoredDocs:
        """Candidates for the front's exact merge: unfiltered, every segment's top-k side by
        side (not merged here: the front merges all shards' lists anyway); filtered, the
        shard's top-k under the global ``stats``."""
        mask = unpack_mask(packed, self.index.n_docs)
        if mask is None:  # each segment's top-k, side by side: the front's merge (tie rule included) picks
            parts = [(seg._global_pos[r.ids], r.scores) for seg, r in ((s, s.search(query, k))
                                                                       for s in self.index.segments)]
            if not parts:
                return empty_scored()
            return ScoredDocs(np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]))
        return self.index.search(query, k, mask, stats=stats)

    def dense(self, qv: np.ndarray, packed: np.ndarray | None, depth: int) -> list[ScoredDocs]:
        """Per query row: this shard's top-``depth`` by (cosine desc, position asc), the
        exact float64 cosines the single index computes (``dense_topk``: the same bits)."""
        if self.vectors is None:
            raise RuntimeError(f"shard {self.buckets} holds no dense vectors")
        mask = unpack_mask(packed, self.index.n_docs)
        keep = np.arange(len(self.positions)) if mask is None else np.flatnonzero(mask[self.positions])
        positions = self.positions[keep]
        if not len(positions):
            return [empty_scored() for _ in qv]
        mat = self.vectors if mask is None else self.vectors[keep]
        return [dense_top(mat, positions, row, depth) for row in qv]


def _node_host() -> str:
    """The address this node's Ray processes use (127.0.0.1 inside a private network
    namespace); loopback for a shard built outside a Ray worker (tests, benchmarks)."""
    try:  # a shard built outside Ray (tests, benchmarks) runs without it
        import ray  # lazy: Ray, the heavy optional [scale] extra
    except ImportError:
        return "127.0.0.1"
    return str(ray.util.get_node_ip_address()) if ray.is_initialized() else "127.0.0.1"


def shard_actor_class() -> Any:
    """``BM25Shard`` as a Ray actor class: no CPU reserved (S shards fit any cluster),
    restarted whenever its process dies, ``SHARD_THREADS`` calls at once."""
    ray = require_ray()
    return ray.remote(num_cpus=0, max_restarts=SHARD_RESTARTS, max_concurrency=SHARD_THREADS)(BM25Shard)


def start_shards(folder: str | os.PathLike[str], shards: int, *, vectors: VectorSource | None = None,
                 name: str | None = None, limits: WireLimits | None = None) -> list[Any]:
    """S shard actors over the segment files in ``folder`` (bucket b on shard b % S).

    ``name``: make them named, detached actors (``{name}/{i}of{S}`` in the ragspine
    namespace), shared by every replica of a service and found again if they exist.
    ``limits``: their listeners' (``WireLimits``; default ones otherwise).
    """
    total = segment_buckets(folder)
    if total == 0:
        raise FileNotFoundError(f"{folder}: no BM25 segment files (bm25-*-of-*.rsbm25) to shard")
    cls = shard_actor_class()
    handles = []
    for i, buckets in enumerate(assign_buckets(total, shards)):
        opts: dict[str, Any] = {}
        if name:
            opts = {"name": f"{name}/{i}of{shards}", "namespace": NAMESPACE, "lifetime": "detached",
                    "get_if_exists": True}
        handles.append(cls.options(**opts).remote(str(folder), list(buckets), vectors, limits))
    return handles


__all__ = ["NAMESPACE", "BM25Shard", "ShardRequest", "ShardUnavailable", "ShardUnhealthy", "ShardedBM25", "VectorSource",
           "assign_buckets", "attach", "ids_digest", "index_token_batches", "segment_buckets", "shard_actor_class",
           "shard_request", "start_shards", "write_layout"]
