"""Sharded exact serving on Ray and the service on Ray Serve (issue 30, items 2-4).

Ray must keep every address on loopback, so the checks run inside a private network
namespace: ``test_in_private_network_namespace`` starts ``unshare -n -p`` (network and PID
namespaces), brings ``lo`` up and runs this file's ``inner`` tests there with
``SCALE_SERVING_IN_NETNS=1`` (they skip outside it), then ``ray stop --force`` — which sees
only that namespace's processes, so it never stops another run's cluster on a shared
machine — and checks that no Ray process is left.
Where namespaces or Ray are unavailable the outer test skips and says why.

Inside (SciFact in the slow twin, test_scifact_in_private_network_namespace): answers with S = 1, 2, 4 shards equal the single index (BM25 scores to 1e-9, the
same top-k, the same ties; dense rankings equal exactly on a four-hot embedding whose
cosines are exact in float32) on a synthetic set and on SciFact (skipped when
/work/shared/eval lacks it), with and without filters; the demo served with S = 2 on Ray
Serve answers over HTTP what the single-process service answers; no shard holds a
RESTRICTED chunk; a stopped shard gives 503, or ``partial: true`` with ``allow_partial``.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
IN_NETNS = os.environ.get("SCALE_SERVING_IN_NETNS") == "1"
inner = pytest.mark.skipif(not IN_NETNS, reason="runs inside the private network namespace that "
                                                "test_in_private_network_namespace starts")
SCIFACT = Path(os.environ.get("RAGSPINE_BENCH_DATA") or ROOT.parent / "shared" / "eval") / "scifact"


# ------------------------------------------------------------------ outer test
def _namespace_unavailable() -> str | None:
    try:
        import ray  # noqa: F401
    except ImportError:
        return "Ray is not installed (the [scale] extra)"
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        return "unshare or ip is not available"
    probe = subprocess.run(["unshare", "-n", "-p", "-f", "--mount-proc", "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        return ("cannot create a private network and PID namespace (unshare -n -p: "
                f"{probe.stderr.strip() or 'not root'})")
    return None


def _run_inner(tmp_path: Path, marks: str) -> None:
    """Run the inner tests in a private network and PID namespace; then ``ray stop --force``
    (which sees only this namespace's processes) and list any Ray process still there."""
    why = _namespace_unavailable()
    if why:
        pytest.skip(why)
    py, ray_cli = sys.executable, str(Path(sys.executable).with_name("ray"))
    script = (f"ip link set lo up; SCALE_SERVING_IN_NETNS=1 {py} -m pytest -q -x -p no:cacheprovider -p no:warnings --durations=0 "
              f"-k inner -m '{marks}' {__file__}; rc=$?; {ray_cli} stop --force >/dev/null 2>&1; "
              "echo RAY_LEFT: $(ps -eo args= | grep -E 'raylet|gcs_server|ray::|default_worker' | grep -v grep); "
              "exit $rc")
    run = subprocess.run(["unshare", "-n", "-p", "-f", "--mount-proc", "bash", "-c", script], capture_output=True,
                         text=True, timeout=600, cwd=ROOT)
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-3000:]
    assert "passed" in run.stdout and " failed" not in run.stdout, run.stdout[-3000:]
    left = [ln.strip() for ln in run.stdout.splitlines() if ln.startswith("RAY_LEFT:")]
    assert left == ["RAY_LEFT:"], left


def test_in_private_network_namespace(tmp_path: Path) -> None:
    """The default suite's checks: synthetic S = 1, 2, 4 and the demo over HTTP (S = 2)."""
    _run_inner(tmp_path, "not slow")


@pytest.mark.slow
def test_scifact_in_private_network_namespace(tmp_path: Path) -> None:
    """SciFact (5k documents) with S = 1, 2, 4, with and without a filter."""
    _run_inner(tmp_path, "slow")


# ------------------------------------------------------------------ inner fixtures
@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[Any]:
    from ragspine_pipeline.scale.serve import ensure_ray

    ray = ensure_ray()
    yield ray
    ray.shutdown()


class FourHot:
    """An embedding backend whose unit vectors have four equal non-zero entries: every
    cosine is a multiple of 1/4, exact in float32 whatever the summation order, so dense
    rankings (and their many ties) must match the single index exactly."""

    dim, model_id = 64, "four-hot-64"

    def _one(self, text: str) -> list[float]:
        v = [0.0] * self.dim
        words = text.split() or [""]
        for i in range(4):
            h = hashlib.blake2b(f"{words[i % len(words)]}|{i}".encode(), digest_size=4).digest()
            slot = (int.from_bytes(h, "little") % 16) * 4 + i  # four distinct slots
            v[slot] = 1.0
        return v

    def embed_texts(self, texts: list[str]) -> list[list[float]]:
        return [self._one(t) for t in texts]


def _synthetic(n: int = 2000) -> tuple[list[Any], list[str]]:
    from ragspine_pipeline.retrieval.chunking.chunking import Chunk, SourceLocator

    rng = np.random.default_rng(7)
    words = [f"w{i}" for i in range(150)]
    chunks = []
    for i in range(n):
        text = " ".join(rng.choice(words, int(rng.integers(2, 25))))
        chunks.append(Chunk(f"c{i:05d}", f"d{i // 3}", "t", text, SourceLocator(f"d{i // 3}", 0, len(text)),
                            entity=f"E{i % 5}", period=str(2000 + i % 7)))
    queries = [" ".join(rng.choice(words, int(rng.integers(1, 4)))) for _ in range(18)] + ["w1 w1 w2", "unknown"]
    return chunks, queries


def _retriever(chunks: list[Any], backend: Any = None) -> Any:
    from ragspine_pipeline.retrieval.hybrid.retriever import HybridRetriever

    channels = ("bm25", "dense") if backend is not None else ("bm25",)
    h = HybridRetriever(chunks, embedding_backend=backend, channels=channels)
    if backend is not None:
        h.preload_vectors(np.asarray(backend.embed_texts([c.text for c in h.chunks]), np.float32))
    return h


def _sharded(single: Any, chunks: list[Any], folder: Path, shards: int, backend: Any = None) -> tuple[Any, Any]:
    from ragspine_pipeline.scale import shards as S

    vectors = None
    if backend is not None:
        np.save(folder / "vectors.npy", single._vectors.mat)
        vectors = S.VectorSource(npy=str(folder / "vectors.npy"))
    handles = S.start_shards(folder / "segments", shards, vectors=vectors)
    front = S.ShardedBM25(handles)
    h = _retriever(chunks, backend)
    S.attach(h, front)
    return h, handles


def _same_hits(a: list[Any], b: list[Any], where: str) -> None:
    assert [x.position for x in a] == [x.position for x in b], where
    for x, y in zip(a, b, strict=True):
        assert abs(x.bm25 - y.bm25) <= 1e-9 and abs(x.fused - y.fused) <= 1e-9, where
        assert (x.vector is None) == (y.vector is None), where
        if x.vector is not None:
            assert x.vector == y.vector, where


FILTERS = (None, {"entity": "E1"}, {"entity": "E2", "period": "2003"}, {"period": {"gte": "2004"}})


@inner
@pytest.mark.parametrize("dense", [None, "four-hot", "gauss"], ids=["bm25", "hybrid-ties", "hybrid-float"])
def test_inner_synthetic_equals_single_index(ray_cluster: Any, tmp_path: Path, dense: str | None) -> None:
    """FourHot: cosines exact in float32, many ties; GaussWords: dense float vectors whose
    float32 dot products depend on summation order (the shards' float64 cosines must still
    be the single index's bits)."""
    from test_scale_exact import GaussWords

    from ragspine_pipeline.scale import shards as S

    chunks, queries = _synthetic()
    backend = {"four-hot": FourHot, "gauss": GaussWords}[dense]() if dense else None
    single = _retriever(chunks, backend)
    S.write_layout(tmp_path / "segments", single.index, [c.chunk_id for c in single.chunks], 4)
    if dense:  # the BM25 run covers S = 1, 2, 4; the dense merge needs more than one shard
        queries = queries[:12]
    for n in ((2, 4) if dense else (1, 2, 4)):
        sharded, handles = _sharded(single, chunks, tmp_path, n, backend)
        ray_cluster.get([h.check_health.remote() for h in handles])  # what a front asks before relinking
        for q in queries:
            for f in FILTERS:
                _same_hits(single.search(q, filters=f, top_k=15), sharded.search(q, filters=f, top_k=15),
                           f"S={n} query={q!r} filters={f}")
        for h in handles:
            ray_cluster.kill(h)


@inner
@pytest.mark.slow
def test_inner_scifact_equals_single_index(ray_cluster: Any, tmp_path: Path) -> None:
    if not (SCIFACT / "corpus.jsonl").is_file():
        pytest.skip(f"SciFact is not under {SCIFACT}")
    from ragspine_pipeline.eval.beir import load_beir
    from ragspine_pipeline.retrieval.chunking.chunking import Chunk, SourceLocator
    from ragspine_pipeline.scale import shards as S

    ds = load_beir(SCIFACT)
    chunks = []
    for i, d in enumerate(ds.corpus.values()):
        text = f"{d.title}\n{d.text}"
        chunks.append(Chunk(d.doc_id, d.doc_id, d.title, text, SourceLocator(d.doc_id, 0, len(text)),
                            entity=f"E{i % 3}", language="en"))
    queries = [ds.queries[q] for q in ds.judged_queries[:40]]
    single = _retriever(chunks)
    S.write_layout(tmp_path / "segments", single.index, [c.chunk_id for c in single.chunks], 4)
    for n in (1, 2, 4):
        sharded, handles = _sharded(single, chunks, tmp_path, n)
        for q in queries:
            for f in (None, {"entity": "E1"}):
                _same_hits(single.search(q, filters=f, top_k=10), sharded.search(q, filters=f, top_k=10),
                           f"SciFact S={n} query={q!r} filters={f}")
        for h in handles:
            ray_cluster.kill(h)


@inner
@pytest.mark.slow
def test_inner_a_shard_out_of_descriptors_is_replaced_by_ray(ray_cluster: Any, tmp_path: Path) -> None:
    """The issue's failure: a shard whose accept() fails (EMFILE) stayed alive but
    unreachable and Ray never restarted it. Now its listener reports unhealthy, the shard
    ends its process and Ray restarts it; a new connection is answered again."""
    from ragspine_pipeline.scale import shards as S
    from ragspine_pipeline.scale.wire import Endpoint, WireClient, WireLimits, encode_frame

    chunks, _ = _synthetic(300)
    single = _retriever(chunks)
    S.write_layout(tmp_path / "segments", single.index, [c.chunk_id for c in single.chunks], 2)
    limits = WireLimits(unhealthy_after_s=0.5, handshake_timeout_s=120, backoff_max_s=0.1)
    (handle,) = S.start_shards(tmp_path / "segments", 1, limits=limits)
    info = ray_cluster.get(handle.describe.remote())
    pid = info["pid"]
    used = len(os.listdir(f"/proc/{pid}/fd"))
    subprocess.run(["prlimit", f"--pid={pid}", f"--nofile={used + 3}:{used + 3}"], check=True)
    hogs = [socket.create_connection(tuple(info["wire"][:2]), timeout=5) for _ in range(10)]
    deadline = time.monotonic() + 120
    while True:  # a fresh connection (as a new front, or a busy one, opens) is answered again
        try:
            now = ray_cluster.get(handle.describe.remote(), timeout=10)
            client = WireClient(Endpoint(*now["wire"]))
            head, _ = client.receive(client.send(encode_frame({"op": "search", "q": ["w1"], "k": 3, "stats": None,
                                                               "mask": False}), 5.0), 5.0)
            client.close()
            if "lens" in head:
                break
        except Exception:  # noqa: BLE001 - unhealthy, restarting or not answering yet: ask again
            pass
        assert time.monotonic() < deadline, "the shard never accepted again (alive but unreachable)"
        time.sleep(0.2)
    assert now["pid"] != pid  # a new process: Ray replaced the shard
    for sock in hogs:
        sock.close()
    ray_cluster.kill(handle)


def _differences(a: Any, b: Any, path: str = "") -> list[str]:
    """Where two JSON answers differ; every score (BM25, cosine, fused) may differ by 1e-9
    (relative above 1), nothing else (docs/scale.md's promise)."""
    if isinstance(a, dict) and isinstance(b, dict):
        if set(a) != set(b):
            return [f"{path}: keys {sorted(set(a) ^ set(b))}"]
        return [d for k in a for d in _differences(a[k], b[k], f"{path}.{k}")]
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [f"{path}: {len(a)} items vs {len(b)}"]
        return [d for i, (x, y) in enumerate(zip(a, b, strict=True)) for d in _differences(x, y, f"{path}[{i}]")]
    if isinstance(a, float) and isinstance(b, float):
        return [] if abs(a - b) <= 1e-9 * max(1.0, abs(a)) else [f"{path}: {a} vs {b}"]
    return [] if a == b else [f"{path}: {a!r} vs {b!r}"]


@inner
def test_inner_served_demo_over_http(ray_cluster: Any, tmp_path: Path) -> None:
    import httpx
    from fastapi.testclient import TestClient
    from service_fixtures import build_warehouse, wait_ready

    from ragspine_pipeline.corpus import load_golden
    from ragspine_pipeline.paths import DEMO_ROOT
    from ragspine_pipeline.scale import serve as SV
    from ragspine_pipeline.sensitivity import is_restricted
    from ragspine_pipeline.service.app import create_app
    from ragspine_pipeline.warehouse.chunk_tables import active_chunks
    from ragspine_pipeline.warehouse.versioned import VersionedTables

    # Published in 2 hash buckets: the shards map the published segments (the production path).
    os.environ["RAGSPINE_BM25_BUCKETS"] = "2"
    try:
        wh, _ = build_warehouse(tmp_path)
    finally:
        del os.environ["RAGSPINE_BM25_BUCKETS"]
    queries = [{"query": g["query"], "filters": g.get("filters")} for g in load_golden(DEMO_ROOT / "golden_queries.json")]
    SV.deploy(SV.config_from(wh, shards=2, port=8000, timeout_s=2.0))
    try:
        client = httpx.Client(base_url="http://127.0.0.1:8000", timeout=60)
        wait_ready(client.get, timeout_s=120)
        with TestClient(create_app(wh), base_url="http://127.0.0.1") as single:  # a loopback Host
            wait_ready(single.get)
            for q in queries:
                for mode in (None, "bm25"):
                    body = {"query": q["query"], "filters": q["filters"], "top_k": 10, "mode": mode}
                    want, got = single.post("/v1/search", json=body), client.post("/v1/search", json=body)
                    assert got.status_code == want.status_code == 200, got.text
                    assert not _differences(want.json(), got.json()), (body, _differences(want.json(), got.json()))
            bad = {"query": "revenue", "filters": {"entity": "NO_SUCH"}}
            assert client.post("/v1/search", json=bad).json() == single.post("/v1/search", json=bad).json()
        names = SV.shard_actors()
        assert len(names) == 4  # two libraries, two shards each
        shards = [ray_cluster.get_actor(n, namespace="ragspine") for n in names]
        held = {cid for s in shards for cid in ray_cluster.get(s.held_chunk_ids.remote())}
        infos = [ray_cluster.get(s.describe.remote()) for s in shards]
        store = VersionedTables(wh)
        restricted = {c.chunk_id for lib in ("acme_policies", "acme_reports") for c in active_chunks(store, lib)
                      if is_restricted(c.sensitivity)}
        assert restricted and not (held & restricted)

        # A stopped shard: 503 naming it, or an answer marked partial when the request allows it.
        victim = next(i for i in infos if "acme_reports" in names[infos.index(i)])
        body = {"query": "revenue", "top_k": 5, "libraries": ["acme_reports"], "mode": "bm25"}
        os.kill(victim["pid"], signal.SIGSTOP)
        try:
            r = client.post("/v1/search", json=body)
            assert r.status_code == 503 and r.json()["error"] == "unavailable", r.text
            assert "did not answer" in r.json()["message"] and "allow_partial" in r.json()["message"]
            r = client.post("/v1/search", json={**body, "allow_partial": True})
            assert r.status_code == 200 and r.json()["partial"] is True and r.json()["missing_shards"], r.text
        finally:
            os.kill(victim["pid"], signal.SIGCONT)
        deadline = time.monotonic() + 30
        while True:  # the stopped shard catches up: whole answers again, never marked partial
            r = client.post("/v1/search", json=body)
            if r.status_code == 200:
                assert "partial" not in r.json()
                break
            assert time.monotonic() < deadline, r.text
            time.sleep(0.1)
    finally:
        SV.shutdown()


# ------------------------------------------------------------------ without Ray
def test_buckets_are_assigned_round_robin_and_too_many_shards_is_a_clear_error() -> None:
    from ragspine_pipeline.scale.shards import assign_buckets

    assert assign_buckets(4, 1) == [(0, 1, 2, 3)]
    assert assign_buckets(4, 2) == [(0, 2), (1, 3)]
    assert assign_buckets(5, 4) == [(0, 4), (1,), (2,), (3,)]
    with pytest.raises(ValueError, match="RAGSPINE_BM25_BUCKETS >= 4"):
        assign_buckets(2, 4)


def test_a_bucket_layout_holds_every_chunk_once(tmp_path: Path) -> None:
    """write_layout from a built index, then the shards' segments: a partition of the
    corpus positions whose recorded ids are the chunks at those positions."""
    from ragspine_pipeline.scale.shards import BM25Shard, ids_digest, write_layout

    chunks, _ = _synthetic(300)
    single = _retriever(chunks)
    ids = [c.chunk_id for c in single.chunks]
    write_layout(tmp_path, single.index, ids, 3)
    parts = [BM25Shard(str(tmp_path), b).describe() for b in ([0, 2], [1])]
    held = np.sort(np.concatenate([p["positions"] for p in parts]))
    assert np.array_equal(held, np.arange(len(ids)))
    for p in parts:
        assert p["ids_digest"] == ids_digest([ids[i] for i in p["positions"].tolist()])


def test_serve_refuses_shard_flags_without_ray(capsys: pytest.CaptureFixture[str]) -> None:
    from ragspine_pipeline.service.main import serve_main

    assert serve_main(["--shards", "2"]) == 2
    assert "--shards: only with --ray" in capsys.readouterr().err
    assert serve_main(["--ray", "--workers", "2"]) == 2
    assert "--workers: not with --ray" in capsys.readouterr().err


def test_near_equal_bm25_scores_from_two_segments_are_a_tie_ordered_by_position() -> None:
    """Copies of one text in two segments may score one ulp apart (each segment's kernel
    sums terms in its own order); the merge orders them by position, as one index does."""
    from ragspine_pipeline.retrieval.lexical.index.topk import merge_top_k as bm25_order

    s = 25.62076037
    got = bm25_order(np.array([83850, 58557, 33264, 7, 9]),
                     np.array([s, np.nextafter(s, 0), s, 30.0, 0.0]), 3)
    assert got.ids.tolist() == [7, 33264, 58557]
    assert bm25_order(np.array([5, 4]), np.array([2.0, 2.0 - 1e-9]), 2).ids.tolist() == [5, 4]


# ------------------------------------------------------------------ the wire channel (no Ray)
def test_a_shard_answers_over_its_wire_channel_what_its_methods_return(tmp_path: Path) -> None:
    """search (unfiltered and with global statistics), statistics and dense ranking over
    the socket equal the shard's own methods; results travel as raw arrays, no pickle."""
    from ragspine_pipeline.retrieval.lexical.refresh.segments import SurvivorStats
    from ragspine_pipeline.scale.shards import BM25Shard, VectorSource, write_layout
    from ragspine_pipeline.scale.wire import Endpoint, WireClient, encode_frame, scored_parts

    chunks, queries = _synthetic(400)
    single = _retriever(chunks, FourHot())
    write_layout(tmp_path, single.index, [c.chunk_id for c in single.chunks], 2)
    np.save(tmp_path / "v.npy", single._vectors.mat)
    shard = BM25Shard(str(tmp_path), [1], VectorSource(npy=str(tmp_path / "v.npy")))
    client = WireClient(Endpoint(*shard.describe()["wire"]))
    mask = np.zeros(shard.index.n_docs, bool)
    mask[::3] = True
    packed = np.packbits(mask)

    def call(header: dict[str, Any], payload: bytes = b"") -> tuple[dict[str, Any], bytes]:
        return client.receive(client.send(encode_frame(header, payload), 5.0), 5.0)

    for q in (single.analyzer.analyze_query(x, single._languages) for x in queries[:6]):
        want = shard.search(q, 7)
        got = scored_parts(*call({"op": "search", "q": q, "k": 7, "stats": None, "mask": False}))[0]
        assert got.ids.tolist() == want.ids.tolist() and got.scores.tolist() == want.scores.tolist()
        st = call({"op": "stats", "qs": [q], "mask": True}, packed.tobytes())[0]["stats"][0]
        assert st["df"] == shard.survivor_stats([q], packed)[0].df.tolist()
        stats = SurvivorStats(2 * st["n"], 2 * st["total_len"], 2 * np.asarray(st["df"], np.int64))
        want = shard.search(q, 7, packed, stats)
        got = scored_parts(*call({"op": "search", "q": q, "k": 7, "mask": True,
                                  "stats": {"n": stats.n, "total_len": stats.total_len,
                                            "df": stats.df.tolist()}}, packed.tobytes()))[0]
        assert got.ids.tolist() == want.ids.tolist() and got.scores.tolist() == want.scores.tolist()
    qv = np.asarray(FourHot().embed_texts(queries[:3]), np.float32) / 2.0  # four ones: norm 2
    head = {"op": "dense", "rows": 3, "depth": 5, "qv_bytes": qv.nbytes, "mask": True}
    got = scored_parts(*call(head, qv.tobytes() + packed.tobytes()))
    for g, w in zip(got, shard.dense(qv, packed, 5), strict=True):
        assert g.ids.tolist() == w.ids.tolist() and g.scores.tolist() == w.scores.tolist()
    assert "unknown shard operation" in call({"op": "nope"})[0]["error"]  # a failure is an answer
    shard.wire.close()


def test_the_wire_refuses_a_wrong_secret_and_drops_a_late_answer() -> None:
    import threading

    from ragspine_pipeline.scale.wire import (
        Endpoint,
        WireClient,
        WireError,
        WireServer,
        encode_frame,
    )

    release = threading.Event()

    def handler(header: dict[str, Any], payload: bytes) -> tuple[dict[str, Any], bytes]:
        if header.get("slow"):
            release.wait(10)
        return {"echo": header["n"]}, payload[::-1]

    server = WireServer(handler)
    ep = server.endpoint
    ok = WireClient(ep)
    assert ok.receive(ok.send(encode_frame({"n": 1}, b"abc"), 5.0), 5.0) == ({"echo": 1}, b"cba")
    bad = WireClient(Endpoint(ep.host, ep.port, b"x" * len(ep.secret)))
    with pytest.raises(WireError):  # the server closes a connection with the wrong secret
        bad.receive(bad.send(encode_frame({"n": 2}), 5.0), 5.0)
    sock = ok.send(encode_frame({"n": 3, "slow": True}), 5.0)
    with pytest.raises(TimeoutError):
        ok.receive(sock, 0.05)
    assert sock.fileno() == -1  # closed: its late answer can never be read as another query's
    release.set()
    assert ok.receive(ok.send(encode_frame({"n": 4}, b"z"), 5.0), 5.0) == ({"echo": 4}, b"z")  # a fresh connection
    server.close()
