"""Sharded hybrid answers equal one process (issue 44, item 5), without Ray.

The shards here are ``BM25Shard`` objects in this process, each behind its own wire
listener on 127.0.0.1, and the front a ``ShardedBM25`` over their channels: the same
scatter-gather the Ray service runs, minus Ray's placement. Embeddings are dense float
vectors (a word-seeded Gaussian per word, summed), whose float32 dot products depend on
summation order: with the old float32 ranking a chunk's cosine differed between the whole
matrix and a shard's rows (up to 5e-6 relative), so dense and fused scores did too.
Now the dense scores are equal bit for bit and the fused and BM25 scores within 1e-9,
with RRF and with convex fusion (which min-max normalises over the union of candidates,
in the front, as one process does), with and without filters, S = 2 and 3; and the demo
corpus's golden queries, published in 2 hash buckets, answer the same from 2 shards as
from one process, BM25 and hybrid.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ragspine_pipeline.retrieval.hybrid.dense_topk import (
    dense_top,
    exact_cosines,
    float32_dot_bound,
)


class GaussWords:
    """A deterministic embedding with dense float entries: each word a seeded Gaussian
    vector, a text the sum of its words' (so related texts have related vectors)."""

    dim, model_id = 96, "gauss-words-96"

    def _word(self, w: str) -> np.ndarray:
        seed = int.from_bytes(hashlib.blake2b(w.encode(), digest_size=8).digest(), "little")
        return np.random.default_rng(seed).standard_normal(self.dim)

    def embed_texts(self, texts: list[str]) -> list[list[float]]:
        return [np.sum([self._word(w) for w in (t.split() or [""])], axis=0).tolist() for t in texts]


def synthetic_chunks(n: int = 1500) -> list[Any]:
    """test_scale_serving's synthetic chunks (words w0-w149, entities E0-E4, periods 2000-2006)."""
    from test_scale_serving import _synthetic

    return _synthetic(n)[0]


def in_process_front(folder: Path, shards: int, vectors: Any = None, limits: Any = None) -> tuple[Any, list[Any]]:
    """``ShardedBM25`` over ``shards`` in-process shards of the layout in ``folder``."""
    from ragspine_pipeline.scale.shards import (
        BM25Shard,
        ShardedBM25,
        assign_buckets,
        segment_buckets,
    )

    bodies = [BM25Shard(str(folder), b, vectors, limits) for b in assign_buckets(segment_buckets(folder), shards)]
    return ShardedBM25([None] * shards, infos=[b.describe() for b in bodies], timeout_s=30.0), bodies


def same_hits(a: list[Any], b: list[Any], where: str) -> None:
    assert [x.position for x in a] == [x.position for x in b], where
    for x, y in zip(a, b, strict=True):
        assert abs(x.bm25 - y.bm25) <= 1e-9 * max(1.0, abs(x.bm25)), where
        assert abs(x.fused - y.fused) <= 1e-9 * max(1.0, abs(x.fused)), where
        assert x.vector == y.vector, (where, x.vector, y.vector)  # the same bits


def test_dense_cosines_are_the_same_bits_wherever_a_vector_sits() -> None:
    rng = np.random.default_rng(3)
    mat = rng.standard_normal((3001, 384)).astype(np.float32)
    mat /= np.linalg.norm(mat, axis=1, keepdims=True)
    q = rng.standard_normal(384).astype(np.float32)
    q /= np.linalg.norm(q)
    pos = np.arange(len(mat))
    full = dense_top(mat, pos, q, 40)
    for shards in (2, 3, 7):
        parts = [dense_top(mat[i::shards], pos[i::shards], q, 40) for i in range(shards)]
        ids = np.concatenate([p.ids for p in parts])
        scores = np.concatenate([p.scores for p in parts])
        order = np.lexsort((ids, -scores))[:40]
        assert ids[order].tolist() == full.ids.tolist() and scores[order].tolist() == full.scores.tolist()
    exact = exact_cosines(mat, q.astype(np.float64))
    assert np.array_equal(exact[7::3], exact_cosines(mat[7::3], q.astype(np.float64)))
    assert np.max(np.abs((mat @ q) - exact)) <= float32_dot_bound(384)  # the preselection's margin holds
    # The float32 scores alone do differ by position (the failure this fixes); the exact ones cannot.
    assert full.scores.dtype == np.float64


@pytest.mark.parametrize("fusion", ["rrf", "convex"])
def test_sharded_hybrid_equals_one_process(tmp_path: Path, fusion: str) -> None:
    from ragspine_pipeline.retrieval.hybrid.fusion import FusionConfig
    from ragspine_pipeline.retrieval.hybrid.retriever import HybridRetriever
    from ragspine_pipeline.scale.shards import VectorSource, attach, write_layout

    chunks = synthetic_chunks()
    backend = GaussWords()
    cfg = FusionConfig("convex", 0.5) if fusion == "convex" else FusionConfig()

    def retriever() -> Any:
        h = HybridRetriever(chunks, embedding_backend=backend, channels=("bm25", "dense"), fusion=cfg)
        h.preload_vectors(np.asarray(backend.embed_texts([c.text for c in h.chunks]), np.float32))
        return h

    single = retriever()
    write_layout(tmp_path / "seg", single.index, [c.chunk_id for c in single.chunks], 3)
    np.save(tmp_path / "v.npy", single._vectors.mat)
    rng = np.random.default_rng(5)
    queries = [" ".join(f"w{i}" for i in rng.integers(0, 150, int(rng.integers(1, 4)))) for _ in range(10)]
    for shards in (2, 3):
        front, bodies = in_process_front(tmp_path / "seg", shards, VectorSource(npy=str(tmp_path / "v.npy")))
        sharded = retriever()
        attach(sharded, front)
        for q in queries:
            for f in (None, {"entity": "E1"}, {"period": {"gte": "2003"}}):
                same_hits(single.search(q, filters=f, top_k=12), sharded.search(q, filters=f, top_k=12),
                          f"S={shards} {fusion} query={q!r} filters={f}")
        for b in bodies:
            b.wire.close()


def test_the_front_takes_outside_statistics_as_the_segments_do(tmp_path: Path) -> None:
    """A ranking across libraries sums survivor statistics over every library and scores
    each with the sum: the shards' front answers both calls as the published segments
    (``SegmentedBM25``, what one process serves) do."""
    from ragspine_pipeline.retrieval.hybrid.retriever import HybridRetriever
    from ragspine_pipeline.retrieval.lexical.index.corpus_stats import CorpusStats
    from ragspine_pipeline.retrieval.lexical.refresh.segments import SurvivorStats, open_segments
    from ragspine_pipeline.scale.shards import write_layout

    single = HybridRetriever(synthetic_chunks(600))
    write_layout(tmp_path, single.index, [c.chunk_id for c in single.chunks], 3)
    segments = open_segments(tmp_path)
    front, bodies = in_process_front(tmp_path, 2)
    mask = np.zeros(600, bool)
    mask[::4] = True
    everything = np.ones(600, bool)
    for q in (["w1", "w7"], ["w3", "w3", "nothing"], ["w140"]):
        for m in (mask, everything):
            want, got = segments.survivor_stats(q, m), front.survivor_stats(q, m)
            assert (got.n, got.total, got.df.tolist()) == (want.n, want.total_len, want.df.tolist())
        alls = front.survivor_stats(q)  # None: every document (BM25Index's convention)
        assert (alls.n, alls.total, alls.df.tolist()) == (600, single.index.total_len,
                                                          segments.survivor_stats(q, everything).df.tolist())
        want = segments.survivor_stats(q, mask)
        wider = SurvivorStats(3 * want.n, 3 * want.total_len, 2 * want.df)  # as if other libraries added theirs
        for stats in (None, wider, CorpusStats(wider.n, wider.total_len, wider.df)):  # either kind of sum
            a = segments.search(q, 9, mask, stats=None if stats is None else wider)
            b = front.search(q, 9, mask, stats=stats)
            assert a.ids.tolist() == b.ids.tolist() and np.allclose(a.scores, b.scores, rtol=1e-12, atol=0)
        for a in (segments.search(q, 9, everything, stats=wider), segments.search(q, 9, None, stats=wider)):
            b = front.search(q, 9, None, stats=CorpusStats(wider.n, wider.total_len, wider.df))
            assert a.ids.tolist() == b.ids.tolist() and np.allclose(a.scores, b.scores, rtol=1e-12, atol=0)
        seg_all = segments.survivor_stats(q) + front.survivor_stats(q)  # None: every document; sums mix kinds
        assert (seg_all.n, seg_all.total) == (1200, 2 * single.index.total_len)
    for body in bodies:
        body.wire.close()


def test_demo_golden_queries_from_two_shards_equal_one_process(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """The demo published in 2 hash buckets with stored (deterministic) vectors; the shards
    map the published segments and read their vectors from the warehouse, as served."""
    from ragspine_pipeline.corpus import DEMO_ROOT, list_libraries, load_golden
    from ragspine_pipeline.retrieval.vector.embedding_backends import DeterministicHashBackend
    from ragspine_pipeline.scale.serve import published_segments
    from ragspine_pipeline.scale.shards import VectorSource, attach
    from ragspine_pipeline.warehouse import pipeline as P
    from ragspine_pipeline.warehouse.common import LEXICAL, SNAPSHOT
    from ragspine_pipeline.warehouse.versioned import VersionedTables

    monkeypatch.setenv("RAGSPINE_BM25_BUCKETS", "2")
    wh = VersionedTables(tmp_path / "wh")
    libs = list_libraries()
    for lib in libs:
        P.build_raw_documents(wh, DEMO_ROOT, lib)
        P.build_chunks(wh, lib)
        P.build_lexical_index(wh, lib)
        P.build_embeddings(wh, lib, DeterministicHashBackend(), "deterministic")
        P.publish_snapshot(wh, lib)
    golden = load_golden(DEMO_ROOT / "golden_queries.json")
    compared = 0
    for lib in libs:
        single = P.load_snapshot_index(wh, lib).retriever
        sharded = P.load_snapshot_index(wh, lib).retriever
        meta = wh.latest(SNAPSHOT, lib).manifest["metadata"]
        folder = published_segments(Path(wh.get(LEXICAL, lib, meta["lexical_index"]).path))
        assert folder is not None, "the lexical index was not published in buckets"
        vectors = VectorSource(warehouse=str(wh.root), library=lib, version=str(meta["embeddings"]))
        front, bodies = in_process_front(folder, 2, vectors)
        attach(sharded, front)
        assert "dense" in single.channels and single.embedding_backend is not None
        for g in golden:
            for channels in (("bm25", "dense"), ("bm25",)):
                a, b = single.with_channels(channels), sharded.with_channels(channels)
                same_hits(a.search(g["query"], filters=g.get("filters"), top_k=10),
                          b.search(g["query"], filters=g.get("filters"), top_k=10),
                          f"{lib} {channels} {g['query']!r}")
                compared += 1
        for body in bodies:
            body.wire.close()
    assert compared >= 2 * len(golden)
    _service_answers_equal(wh.root, golden)


def _service_answers_equal(root: Path, golden: list[dict[str, Any]]) -> None:
    """The whole service, one process against 2 in-process shards per library (the Ray
    service's ``ShardedAssembly`` with its shards built here): every golden query and a
    search across libraries (the global ranking sums each library's statistics and merges
    raw cosines) answer the same JSON, scores to 1e-9; BM25 and hybrid. Across libraries,
    one process over bucketed libraries was a 500 (SegmentedBM25), and the sharded one
    failed on the released vector matrix (global_rank read it directly)."""
    import dataclasses

    from fastapi.testclient import TestClient
    from service_fixtures import wait_ready
    from test_scale_serving import _differences

    from ragspine_pipeline.scale.serve import ShardedAssembly, published_segments
    from ragspine_pipeline.scale.shards import VectorSource
    from ragspine_pipeline.service.app import create_app
    from ragspine_pipeline.service.served import ServedLibraries
    from ragspine_pipeline.warehouse.common import LEXICAL, SNAPSHOT

    bodies: list[Any] = []

    @dataclasses.dataclass
    class InProcessShards(ShardedAssembly):
        def _front(self, wh: Any, library: str, version: str, hybrids: list[Any]) -> Any:
            meta = wh.get(SNAPSHOT, library, version).manifest["metadata"]
            folder = published_segments(Path(wh.get(LEXICAL, library, meta["lexical_index"]).path))
            vectors = VectorSource(warehouse=str(wh.root), library=library, version=str(meta["embeddings"]))
            front, made = in_process_front(folder, self.shards, vectors)
            bodies.extend(made)
            return front

    sharded_app = create_app(root, served=ServedLibraries(dataclasses.replace(InProcessShards.resolve(root),
                                                                              shards=2)))
    loopback = "http://127.0.0.1"
    with TestClient(create_app(root), base_url=loopback) as single, TestClient(sharded_app,
                                                                               base_url=loopback) as sharded:
        wait_ready(single.get)
        wait_ready(sharded.get)
        queries = [(g["query"], g.get("filters")) for g in golden] + [("revenue", None), ("risk supply", None)]
        for query, filters in queries:
            for mode in (None, "bm25"):
                body = {"query": query, "filters": filters, "top_k": 8, "mode": mode}
                want, got = single.post("/v1/search", json=body), sharded.post("/v1/search", json=body)
                assert want.status_code == got.status_code == 200, (body, want.text, got.text)
                assert want.json()["snippets"] or filters, body
                assert not _differences(want.json(), got.json()), (body, _differences(want.json(), got.json()))
    assert bodies, "the sharded service built no shards"
    for body in bodies:
        body.wire.close()
