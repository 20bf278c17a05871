"""The front of a sharded library: the index a ``HybridRetriever`` searches, answered by
its shards (``shards.py``) over their wire channels by exact scatter-gather.

Why its own module: the shard actor (what runs in each shard process) and the front
(what runs in every service replica) share only the wire protocol and the chunk-id
digest; the front's merges, deadlines, partial answers and channel renewal are here.
See ``shards.py`` for the two-phase query and why every merge is exact.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..retrieval.lexical.index.bm25 import candidate_mask
from ..retrieval.lexical.index.corpus_stats import CorpusStats
from ..retrieval.lexical.index.topk import ScoredDocs, empty_scored, merge_top_k
from .config import require_ray, shard_timeout_s
from .requests import _REQUEST, ShardUnavailable, ShardUnhealthy
from .wire import Endpoint, ShardRefused, WireClient, WireError, encode_frame, scored_parts


def ids_digest(ids: Sequence[str]) -> str:
    """One digest of chunk ids in order: a shard proves it holds exactly the front's chunks."""
    h = hashlib.sha256()
    for cid in ids:
        h.update(cid.encode("utf-8", "surrogatepass"))
        h.update(b"\0")
    return h.hexdigest()


class ShardedBM25:
    """The index a ``HybridRetriever`` searches, answered by shard actors (exact merges).

    Duck-types what the retriever asks of an index: ``n_docs``, ``k1``/``b``, ``path`` and
    ``search(tokens, k, candidates)``; ``dense_rankings`` stands for the retriever's own
    dense ranking over its vectors. Queries go over each shard's wire channel; a shard
    whose channel broke (it died, or missed a deadline) is asked again over Ray where it
    listens now (a restarted shard listens elsewhere), within the same deadline.
    """

    def __init__(self, shards: Sequence[Any], *, timeout_s: float | None = None, path: str | None = None,
                 infos: Sequence[dict[str, Any]] | None = None) -> None:
        self.shards = list(shards)
        self.timeout_s = shard_timeout_s(timeout_s)
        self.path = path
        if infos is None:  # opening waits for every shard
            infos = require_ray().get([s.describe.remote() for s in self.shards])  # type: ignore[attr-defined]
        self.infos = list(infos)  # given: shards built in this process (tests, benchmarks), no Ray
        counts = {int(x["n_docs"]) for x in self.infos}
        if len(counts) != 1:
            raise ValueError(f"shards disagree on the corpus size: {sorted(counts)}")
        self.n_docs = counts.pop()
        seen = np.concatenate([x["positions"] for x in self.infos])
        if len(seen) != self.n_docs or not np.array_equal(np.sort(seen), np.arange(self.n_docs)):
            raise ValueError(f"the shards do not partition the corpus: they hold {len(seen)} positions of "
                             f"{self.n_docs} (a bucket missing or held twice)")
        self.dense = all(x["dense"] for x in self.infos)
        self._links: list[WireClient | None] = [WireClient(Endpoint(*x["wire"])) for x in self.infos]
        self._relink = threading.Lock()

    def check_chunks(self, chunk_ids: Sequence[str]) -> None:
        """Every shard holds exactly the served chunks at its positions (so a chunk left
        out of the served index — RESTRICTED — is in no shard)."""
        if len(chunk_ids) != self.n_docs:
            raise ValueError(f"the shards index {self.n_docs} chunks, the served snapshot {len(chunk_ids)}")
        for i, x in enumerate(self.infos):
            if ids_digest([chunk_ids[p] for p in x["positions"].tolist()]) != x["ids_digest"]:
                raise ValueError(f"shard {i} (buckets {x['buckets']}) does not hold the served chunks at its "
                                 "positions: the segments are not this snapshot's")

    # ------------------------------------------------------------ scatter-gather
    def _broken(self, i: int, link: WireClient) -> None:
        with self._relink:
            if self._links[i] is link:
                self._links[i] = None
        link.close()

    def _relinked(self, stale: Sequence[int], deadline: float) -> dict[int, WireClient | str]:
        """Where the shards whose channel broke listen now (a restarted shard listens
        elsewhere): asked over Ray all at once, within the deadline; a shard is used again
        only if it still holds the same chunks. The reason instead of a channel when not."""
        out: dict[int, WireClient | str] = {i: "its channel broke (an in-process shard: no Ray to ask)"
                                            for i in stale if self.shards[i] is None}
        stale = [i for i in stale if i not in out]
        if not stale:
            return out
        ray = require_ray()
        refs = {i: self.shards[i].describe.remote() for i in stale}
        ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=max(deadline - time.monotonic(), 1e-3))
        done = set(ready)
        for i, ref in refs.items():
            if ref not in done:
                out[i] = "no answer within the deadline (the shard is restarting)"
                continue
            try:
                info = ray.get(ref)
            except Exception as exc:  # noqa: BLE001 - Ray says why the shard cannot be reached
                out[i] = _unreachable(exc)
                if isinstance(getattr(exc, "cause", None), ShardUnhealthy):  # alive but cannot accept:
                    ray.kill(self.shards[i], no_restart=False)  # Ray restarts it (max_restarts)
                continue
            if info["ids_digest"] != self.infos[i]["ids_digest"]:
                out[i] = f"failed: it came back holding other chunks (buckets {info['buckets']})"
                continue
            with self._relink:
                link = self._links[i] = self._links[i] or WireClient(Endpoint(*info["wire"]))
            out[i] = link
        return out

    def _scatter(self, frames: dict[int, bytes], deadline: float,
                 missing: dict[int, str]) -> dict[int, tuple[WireClient, Any]]:
        """Send every shard its request: first on the live channels (a healthy shard never
        waits for a restarting one), then on the channels renewed over Ray."""
        sent: dict[int, tuple[WireClient, Any]] = {}
        stale = []
        for i, frame in frames.items():
            link = self._links[i]
            try:
                if link is None:
                    stale.append(i)
                else:
                    sent[i] = (link, link.send(frame, max(deadline - time.monotonic(), 1e-3)))
            except ShardRefused as exc:  # alive, at its connection cap: say so (the channel is fine)
                missing[i] = f"failed: {exc}"
            except WireError:  # a channel to a shard that died since: renew it below
                self._broken(i, link)
                stale.append(i)
        for i, got in (self._relinked(stale, deadline) if stale else {}).items():
            if isinstance(got, str):
                missing[i] = got
                continue
            try:
                sent[i] = (got, got.send(frames[i], max(deadline - time.monotonic(), 1e-3)))
            except WireError as exc:
                self._broken(i, got)
                missing[i] = f"{type(exc).__name__} (the shard is restarting or unreachable)"
        return sent

    def _gather(self, phase: str, calls: dict[int, tuple[dict[str, Any], bytes]]) -> dict[int, Any]:
        """Answers of one phase by shard: every request is sent first, then the answers
        are read within the shard deadline. A shard that fails, breaks its channel or misses
        the deadline is recorded in the request scope (allow_partial) or raised as
        ``ShardUnavailable``."""
        deadline = time.monotonic() + self.timeout_s
        out: dict[int, Any] = {}
        missing: dict[int, str] = {}
        encoded: dict[tuple[int, int], bytes] = {}  # a request shared by several shards is encoded once
        frames = {}
        for i, (header, payload) in calls.items():
            key = (id(header), id(payload))
            if key not in encoded:
                encoded[key] = encode_frame(header, payload)
            frames[i] = encoded[key]
        sent = self._scatter(frames, deadline, missing)
        for i, (link, sock) in sent.items():
            try:
                head, payload = link.receive(sock, deadline - time.monotonic())
            except TimeoutError:
                self._broken(i, link)
                missing[i] = f"no answer within {self.timeout_s:g} s (RAGSPINE_SHARD_TIMEOUT_S)"
                continue
            except WireError as exc:
                self._broken(i, link)
                missing[i] = f"{type(exc).__name__} (the shard died or is unreachable: {exc})"
                continue
            if "error" in head:  # the shard's code failed: a bug, say it
                missing[i] = f"failed: {head['error']}"
            else:
                out[i] = (head, payload)
        if missing:
            req = _REQUEST.get()
            if req is None or not req.allow_partial or not out:
                raise ShardUnavailable(phase, missing)
            req.missing.update(missing)
        return out

    def _phase1(self, q: list[str], packed: bytes) -> dict[int, dict[str, Any]]:
        got = self._gather("statistics", {i: ({"op": "stats", "qs": [q], "mask": True}, packed)
                                          for i in range(len(self.shards))})
        return {i: head["stats"][0] for i, (head, _) in got.items()}

    def survivor_stats(self, query_tokens: Sequence[str], candidates: Any = None) -> CorpusStats:
        """The statistics phase alone, summed over the shards (``candidates`` None: every
        document): this corpus's part of a sum across libraries, as ``BM25Index.survivor_stats``."""
        mask = np.ones(self.n_docs, bool) if candidates is None else candidate_mask(candidates, self.n_docs)
        per = self._phase1(list(query_tokens), np.packbits(mask).tobytes())
        return CorpusStats(sum(int(x["n"]) for x in per.values()), sum(int(x["total_len"]) for x in per.values()),
                           np.sum([np.asarray(x["df"], np.int64) for x in per.values()], axis=0)
                           if per else np.zeros(len(query_tokens), np.int64))

    def search(self, query_tokens: Sequence[str], k: int = 10, candidates: Any = None, *,
               stats: Any = None) -> ScoredDocs:
        """Top-k by (score desc, position asc) over every shard: one phase unfiltered, two
        (global survivor statistics, then scoring) with ``candidates``; with ``stats`` (N,
        summed length, df per token: a caller's sum over more than this corpus,
        ``CorpusStats`` or ``SurvivorStats``) one scoring phase with them, over
        ``candidates`` or every document."""
        if k <= 0:
            return empty_scored()
        q = list(query_tokens)
        if candidates is None and stats is None:
            req = {"op": "search", "q": q, "k": k, "stats": None, "mask": False}
            parts = self._gather("search", {i: (req, b"") for i in range(len(self.shards))})
            return _merge([scored_parts(*p)[0] for p in parts.values()], k)
        mask = np.ones(self.n_docs, bool) if candidates is None else candidate_mask(candidates, self.n_docs)
        if not mask.any():
            return empty_scored()
        packed = np.packbits(mask).tobytes()
        if stats is None:
            per = self._phase1(q, packed)
            total = {"n": sum(int(x["n"]) for x in per.values()),
                     "total_len": sum(int(x["total_len"]) for x in per.values()),
                     "df": np.sum([np.asarray(x["df"], np.int64) for x in per.values()], axis=0).tolist()}
            targets = [i for i in sorted(per) if any(per[i]["df"])]  # no survivor holds a token: nothing to score
        else:
            length = getattr(stats, "total_len", None)
            total = {"n": int(stats.n), "total_len": int(stats.total if length is None else length),
                     "df": np.asarray(stats.df, np.int64).tolist()}
            targets = list(range(len(self.shards)))
        req = {"op": "search", "q": q, "k": k, "stats": total, "mask": True}
        parts = self._gather("search", {i: (req, packed) for i in targets})
        return _merge([scored_parts(*p)[0] for p in parts.values()], k)

    def dense_top_vectors(self, qv: np.ndarray, positions: np.ndarray, depth: int) -> list[ScoredDocs]:
        """``HybridRetriever.dense_top_vectors`` over the shards: per unit query vector,
        each shard ranks its vectors (exact float64 cosines), the merge keeps the top
        ``depth`` by (cosine desc, position asc)."""
        if len(positions) == 0:
            return [empty_scored() for _ in qv]
        qv = np.ascontiguousarray(qv, np.float32)
        packed = b""
        if len(positions) != self.n_docs:
            mask = np.zeros(self.n_docs, bool)
            mask[positions] = True
            packed = np.packbits(mask).tobytes()
        head = {"op": "dense", "rows": len(qv), "depth": depth, "qv_bytes": qv.nbytes, "mask": bool(packed)}
        got = self._gather("dense", {i: (head, qv.tobytes() + packed) for i in range(len(self.shards))})
        parts = [scored_parts(*p) for p in got.values()]
        return [_merge([p[row] for p in parts], depth, positive=False) for row in range(len(qv))]


def _unreachable(exc: BaseException) -> str:
    """Why Ray could not say where a shard listens (it failed, is restarting or gone)."""
    ray = require_ray()
    if isinstance(exc, ray.exceptions.RayTaskError):  # type: ignore[attr-defined]
        return f"failed: {type(exc.cause).__name__}: {exc.cause}"
    if isinstance(exc, ray.exceptions.RayError):  # type: ignore[attr-defined]
        return f"{type(exc).__name__} (the shard is restarting or unreachable)"
    return f"failed: {type(exc).__name__}: {exc}"


def _merge(parts: Any, k: int, *, positive: bool = True) -> ScoredDocs:
    """The top-k of the shards' top-k lists by (score desc, position asc): BM25 with
    ``merge_top_k``'s near-ties, cosines exactly (they may be <= 0)."""
    parts = list(parts)
    if not parts:
        return empty_scored()
    ids = np.concatenate([p.ids for p in parts]).astype(np.int64)
    scores = np.concatenate([p.scores for p in parts]).astype(np.float64)
    if positive:
        return merge_top_k(ids, scores, k)
    order = np.lexsort((ids, -scores))[:k]
    return ScoredDocs(ids[order], scores[order])


def attach(hybrid: Any, front: ShardedBM25) -> None:
    """Serve ``hybrid`` (a HybridRetriever) from the shards: its BM25 index becomes the
    front, its dense ranking the shards' (when it has a dense channel), its own vector
    matrix is released. Everything else of the retriever — filters, variants, fusion —
    stays as it is."""
    ids = hybrid.chunks.chunk_ids() if callable(getattr(hybrid.chunks, "chunk_ids", None)) else [
        c.chunk_id for c in hybrid.chunks]
    front.check_chunks(ids)
    hybrid.index = front
    if hybrid.embedding_backend is not None and "dense" in hybrid.channels:
        if not front.dense:
            raise ValueError("the retriever has a dense channel but its shards hold no vectors")
        # The instance's dense step, now scatter-gather (queries are still embedded by the
        # retriever, the same code and bits as one process).
        hybrid.dense_top_vectors = front.dense_top_vectors
        hybrid._vectors.mat = None
        hybrid._vectors.have[:] = True


__all__ = ["ShardedBM25", "attach", "ids_digest"]
