"""The published vector file (issue 47 item 2): format, exactness of the mapped scorer
against the in-memory exact path, integrity checks, and the warehouse's publish/serve."""

from __future__ import annotations

import os
import pickle
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest

from ragspine_pipeline.retrieval.hybrid.dense_topk import dense_top, exact_cosines
from ragspine_pipeline.retrieval.lexical.format.file import CorruptIndexError, IndexFormatError
from ragspine_pipeline.retrieval.vector.published import (
    VECTOR_FILE,
    VectorFileVersionError,
    open_vectors,
    unit_rows,
)
from ragspine_pipeline.retrieval.vector.published_scan import approx_scores, quantize, query_norm
from ragspine_pipeline.retrieval.vector.published_write import write_vectors


def _ids(n: int) -> list[str]:
    return [f"doc{i // 7}#{i % 7}-{i:07d}" for i in range(n)]


def _publish(tmp_path: Path, mat: np.ndarray, batch: int = 997) -> Path:
    n, d = mat.shape
    return write_vectors(tmp_path / VECTOR_FILE, (mat[lo:lo + batch] for lo in range(0, n, batch)), n, d, _ids(n))


def _same(a, b) -> None:
    assert np.array_equal(a.ids, b.ids)
    assert np.array_equal(np.asarray(a.scores).view(np.uint64), np.asarray(b.scores).view(np.uint64))


def _clustered(rng: np.random.Generator, n: int, d: int, k: int = 40) -> np.ndarray:
    """Realistic-ish embeddings: topics (cluster centres) plus noise, one shared offset
    (real models' cosines sit in a narrow band), normalized as serving normalizes."""
    centres = rng.standard_normal((k, d)).astype(np.float32)
    raw = centres[rng.integers(k, size=n)] + 0.8 * rng.standard_normal((n, d)).astype(np.float32) + 1.5
    return unit_rows(raw)


def test_rows_round_trip_bit_for_bit_and_unit_rows_is_preloads_normalization(tmp_path):
    rng = np.random.default_rng(0)
    raw = rng.standard_normal((3000, 48)).astype(np.float32) * 3
    raw[17] = 0.0
    whole = unit_rows(raw)
    batched = np.concatenate([unit_rows(raw[lo:lo + 512]) for lo in range(0, 3000, 512)])
    assert np.array_equal(whole.view(np.uint32), batched.view(np.uint32))  # batch-invariant
    norms = np.linalg.norm(raw, axis=1, keepdims=True)  # HybridRetriever.preload_vectors' expression
    assert np.array_equal(whole.view(np.uint32), (raw / np.where(norms == 0, 1, norms)).astype(np.float32).view(np.uint32))
    pv = open_vectors(_publish(tmp_path, whole))
    assert len(pv) == 3000 and pv.dim == 48
    assert np.array_equal(pv.unit_rows(np.arange(3000)).view(np.uint32), whole.view(np.uint32))
    assert pv.chunk_ids() == _ids(3000)
    again = pickle.loads(pickle.dumps(pv))  # by path: the copy maps the same file
    assert len(pickle.dumps(pv)) < 1000 and np.array_equal(again.unit_rows(np.arange(5)), whole[:5])
    assert not list(tmp_path.glob(".*tmp*"))  # the temp file was renamed into place


def test_the_bound_holds_for_every_row(tmp_path):
    rng = np.random.default_rng(1)
    for d in (8, 64, 384):
        mat = _clustered(rng, 2000, d)
        codes, scale, bound = quantize(mat)
        qs = unit_rows(np.vstack([mat[:20] + 0.05 * rng.standard_normal((20, d)).astype(np.float32),
                                  rng.standard_normal((5, d)).astype(np.float32)]))
        approx = approx_scores(codes, scale, np.arange(len(mat)), qs)
        for j, q in enumerate(qs):
            exact = exact_cosines(mat, q.astype(np.float64))
            assert (np.abs(exact - approx[j].astype(np.float64)) <= bound * query_norm(q)).all()


@pytest.mark.parametrize("depth", [1, 10, 100])
def test_top_equals_the_exact_path_on_a_realistic_set(tmp_path, depth):
    rng = np.random.default_rng(depth)
    mat = _clustered(rng, 6000, 96)
    pv = open_vectors(_publish(tmp_path, mat))
    everything = np.arange(len(mat))
    qv = unit_rows(mat[rng.integers(len(mat), size=30)] + 0.3 * rng.standard_normal((30, 96)).astype(np.float32))
    for got, row in zip(pv.top(qv, everything, depth), qv, strict=True):  # all queries in one scan
        _same(got, dense_top(mat, everything, row, depth))
    assert max(pv.last_pool) < len(mat) // 4  # the int8 pass really pre-selects
    for frac in (0.5, 0.05, 0.003):  # a pre-filter: only the survivors' rows
        keep = np.flatnonzero(rng.random(len(mat)) < frac)
        for row in qv[:8]:
            _same(pv.top(row[None], keep, depth)[0], dense_top(mat[keep], keep, row, depth))


def test_top_equals_the_exact_path_on_adversarial_near_ties(tmp_path):
    rng = np.random.default_rng(7)
    d = 32
    base = unit_rows(rng.standard_normal((1, d)).astype(np.float32))[0]
    rows = [base] * 60  # exact ties: position order decides
    for k in range(200):  # one ulp away, either way, in one coordinate
        v = base.copy()
        v[k % d] = np.nextafter(v[k % d], np.float32(np.inf if k % 2 else -np.inf))
        rows.append(v)
    for k in range(200):  # the same cosine reached by different rows (a rotation in a plane orthogonal to q)
        v = np.zeros(d, np.float32)
        v[0], v[1 + k % (d - 1)] = 0.6, 0.8 * (1 if k % 2 else -1)
        rows.append(v)
    rows += list(unit_rows(rng.standard_normal((3000, d)).astype(np.float32)))
    rows += [np.zeros(d, np.float32)] * 40  # zero vectors (cosine 0, ties among themselves)
    mat = np.ascontiguousarray(np.array(rows, np.float32))
    mat = mat[rng.permutation(len(mat))]
    pv = open_vectors(_publish(tmp_path, mat))
    everything = np.arange(len(mat))
    e0 = np.zeros(d, np.float32)
    e0[0] = 1.0
    queries = [base, e0, -base, np.zeros(d, np.float32), unit_rows(rng.standard_normal((1, d)).astype(np.float32))[0]]
    for depth in (1, 5, 59, 60, 61, 130, 300):
        for q in queries:
            _same(pv.top(q[None], everything, depth)[0], dense_top(mat, everything, q, depth))
        keep = np.flatnonzero(rng.random(len(mat)) < 0.3)
        _same(pv.top(base[None], keep, depth)[0], dense_top(mat[keep], keep, base, depth))


def test_small_sets_and_empty_inputs(tmp_path):
    mat = unit_rows(np.random.default_rng(3).standard_normal((30, 16)).astype(np.float32))
    pv = open_vectors(_publish(tmp_path, mat))
    q = mat[4]
    _same(pv.top(q[None], np.arange(30), 10)[0], dense_top(mat, np.arange(30), q, 10))  # n <= 4 depth
    assert pv.top(q[None], np.zeros(0, np.int64), 10)[0].ids.size == 0
    assert pv.top(q[None], np.arange(30), 0)[0].ids.size == 0
    with pytest.raises(IndexError):
        pv.top(q[None], np.array([30]), 5)
    empty = write_vectors(tmp_path / "empty.rsvec", [], 0, 16, [])
    assert len(open_vectors(empty)) == 0


def _flip(path: Path, at: int) -> None:
    os.chmod(path, 0o644)
    with open(path, "r+b") as fh:
        fh.seek(at)
        b = fh.read(1)
        fh.seek(at)
        fh.write(bytes([b[0] ^ 0x5A]))


def test_damage_is_an_error_naming_the_file(tmp_path):
    rng = np.random.default_rng(5)
    mat = unit_rows(rng.standard_normal((5000, 64)).astype(np.float32))
    src = _publish(tmp_path, mat)
    toc = open_vectors(src).toc["arrays"]
    q = mat[9][None]

    codes = tmp_path / "codes.rsvec"
    shutil.copy(src, codes)
    _flip(codes, toc["codes"].offset + 64 * 4000 + 3)
    pv = open_vectors(codes)  # opening reads no data block
    with pytest.raises(CorruptIndexError, match="codes.rsvec"):
        pv.top(q, np.arange(5000), 10)
    with pytest.raises(CorruptIndexError, match="codes.rsvec"):
        open_vectors(codes).warm()  # a serving process finds it at start
    open_vectors(src).warm()

    rows = tmp_path / "rows.rsvec"
    shutil.copy(src, rows)
    _flip(rows, toc["rows"].offset + 4 * 64 * 4000 + 5)  # row 4000
    pv = open_vectors(rows)
    assert np.array_equal(pv.unit_rows(np.array([0, 9, 100])), mat[[0, 9, 100]])  # other pages serve
    with pytest.raises(CorruptIndexError, match="'rows' block"):
        pv.unit_rows(np.array([4000]))

    short = tmp_path / "short.rsvec"
    short.write_bytes(src.read_bytes()[:-100])
    with pytest.raises(CorruptIndexError, match="short.rsvec"):
        open_vectors(short)

    newer = tmp_path / "newer.rsvec"
    raw = bytearray(src.read_bytes())
    raw[8:12] = struct.pack("<I", 99)
    newer.write_bytes(bytes(raw))
    with pytest.raises(VectorFileVersionError, match="version 99"):
        open_vectors(newer)

    toc_bad = tmp_path / "toc.rsvec"
    shutil.copy(src, toc_bad)
    _flip(toc_bad, toc_bad.stat().st_size - 40)
    with pytest.raises(IndexFormatError):
        open_vectors(toc_bad)


def test_a_failed_publish_leaves_nothing(tmp_path):
    mat = unit_rows(np.random.default_rng(2).standard_normal((100, 8)).astype(np.float32))
    with pytest.raises(ValueError, match="99 vectors fed for 100"):
        write_vectors(tmp_path / VECTOR_FILE, [mat[:99]], 100, 8, _ids(100))
    assert not list(tmp_path.iterdir())


# ------------------------------------------------------------------ warehouse
LIB = "acme_policies"  # holds RESTRICTED documents


def _warehouse(tmp_path: Path):
    """A fresh warehouse of one demo library, chunked and indexed, not yet embedded."""
    from ragspine_pipeline.paths import DEMO_ROOT
    from ragspine_pipeline.retrieval.vector.embedding_backends import make_embedding_backend
    from ragspine_pipeline.warehouse import pipeline as P
    from ragspine_pipeline.warehouse.versioned import VersionedTables

    wh = VersionedTables(tmp_path / "wh")
    P.build_raw_documents(wh, DEMO_ROOT, LIB)
    for step in (P.build_chunks, P.build_lexical_index):
        step(wh, LIB)
    return P, wh, LIB, make_embedding_backend("deterministic:64")


def test_the_embeddings_step_publishes_the_served_vectors_and_serving_maps_them(published_demo):
    from ragspine_pipeline.retrieval.vector.embedding_backends import DeterministicHashBackend
    from ragspine_pipeline.scale.vectors import VectorSource
    from ragspine_pipeline.sensitivity import is_restricted
    from ragspine_pipeline.warehouse import pipeline as P
    from ragspine_pipeline.warehouse.chunk_tables import active_chunk_table, published_chunks
    from ragspine_pipeline.warehouse.embeddings_step import vector_file
    from ragspine_pipeline.warehouse.versioned import VersionedTables

    wh, lib, backend = VersionedTables(published_demo), LIB, DeterministicHashBackend()
    emb = wh.latest("embeddings", lib)
    pv = open_vectors(vector_file(emb.path))
    t = active_chunk_table(published_chunks(wh, lib, None), columns=["sensitivity"])
    hidden = {c for c, s in zip(t.column("chunk_id").to_pylist(), t.column("sensitivity").to_pylist(), strict=True)
              if is_restricted(s)}
    assert hidden and not hidden & set(pv.chunk_ids())  # no row for a RESTRICTED chunk
    idx = P.load_snapshot_index(wh, lib)
    h = idx.retriever
    ids = h._chunk_ids()
    assert pv.chunk_ids() == ids
    vec = wh.read("embeddings", lib, "vectors", emb.version)
    rows = {c: v for c, v in zip(vec.column("chunk_id").to_pylist(), vec.column("vector").to_pylist(), strict=True)}
    # A shard reads its rows from the file: the bits preload_vectors makes of the table's rows.
    some = np.arange(1, len(ids), 3)
    got = VectorSource(warehouse=str(published_demo), library=lib, version=emb.version).rows(some, [ids[i] for i in some])
    assert np.array_equal(got.view(np.uint32), unit_rows(np.array([rows[ids[i]] for i in some], np.float32)).view(np.uint32))
    if not callable(getattr(h, "install_vectors", None)):
        pytest.skip("HybridRetriever has no install_vectors hook yet")
    assert h._vectors.source is not None and h._vectors.mat is None  # mapped, no float32 matrix
    # The same answers as the preloaded table (the path before the file).
    ref = P.load_snapshot_index(wh, lib)
    ref_h = ref.retriever
    ref_h.preload_vectors(np.array([rows[c] for c in ids], np.float32), chunk_ids=ids)
    assert ref_h._vectors.source is None
    qv = unit_rows(np.asarray(backend.embed_texts(["travel policy", "expenses approval", "security"]), np.float32))
    everything = np.arange(len(ids))
    for depth in (3, 20):
        for a, b in zip(h.dense_top_vectors(qv, everything, depth), ref_h.dense_top_vectors(qv, everything, depth),
                        strict=True):
            _same(a, b)


def test_a_version_without_the_file_is_not_reused(tmp_path):
    from ragspine_pipeline.warehouse.embeddings_step import vector_file

    P, wh, lib, backend = _warehouse(tmp_path)
    first = P.build_embeddings(wh, lib, backend, "deterministic:64")
    assert P.build_embeddings(wh, lib, backend, "deterministic:64").metadata["reused"] is True
    vector_file(first.published.path).unlink()  # as a warehouse written before the file
    again = P.build_embeddings(wh, lib, backend, "deterministic:64")
    assert again.metadata["reused"] is False and again.metadata["embedded"] == 0
    assert vector_file(wh.latest("embeddings", lib).path) is not None


def test_a_large_enough_version_gets_its_ann_index_beside_the_file(tmp_path, monkeypatch):
    pytest.importorskip("faiss")
    ann = pytest.importorskip("ragspine_pipeline.retrieval.vector.ann")
    from ragspine_pipeline.warehouse.embeddings_step import ANN_FILE, ann_file, vector_file

    monkeypatch.setenv("RAGSPINE_ANN", "auto")
    monkeypatch.setenv("RAGSPINE_ANN_MIN_VECTORS", "1")
    P, wh, lib, backend = _warehouse(tmp_path)
    res = P.build_embeddings(wh, lib, backend, "deterministic:64")
    assert res.metadata["ann_file"] == ANN_FILE
    emb = wh.latest("embeddings", lib)
    index, pv = ann.open_ann(ann_file(emb.path)), open_vectors(vector_file(emb.path))
    assert index.size == len(pv)
    q = pv.unit_rows(np.array([3]))[0]
    assert 3 in index.search(q, 5).tolist()  # same row order as the vector file


def test_top_with_an_ann_index_scores_exactly_keeps_survivors_and_refuses_a_stale_index(tmp_path):
    """The dense channel over an attached ANN index (issue 47 item 3): the graph picks the
    candidates, the file rescored them, so every returned score is the exact path's own
    float64 cosine; a filter's survivors only; an index of another size is never attached."""
    pytest.importorskip("faiss")
    from ragspine_pipeline.retrieval.vector import ann

    rng = np.random.default_rng(7)
    mat = _clustered(rng, 3000, 32)
    pv = open_vectors(_publish(tmp_path, mat))
    ann.build_ann(mat, tmp_path / "v.ann", threads=1)
    index = ann.open_ann(tmp_path / "v.ann")
    assert pv.attach_ann(index) and pv.ann is index
    queries = unit_rows(rng.standard_normal((20, 32)).astype(np.float32) + 1.5)
    everything = np.arange(len(mat))
    hits = 0
    for q in queries:
        got = pv.top(q[None, :], everything, 10)[0]
        exact = dense_top(mat, everything, q, 10)
        sims = exact_cosines(mat[got.ids], np.asarray(q, np.float64))
        assert np.array_equal(np.asarray(got.scores).view(np.uint64), sims.view(np.uint64))
        hits += len(set(got.ids.tolist()) & set(exact.ids.tolist()))
    assert hits >= 0.9 * 10 * len(queries)  # approximate set, exact scores
    kept = np.flatnonzero(rng.random(len(mat)) < 0.5)
    got = pv.top(queries[:1], kept, 10)[0]
    assert len(got.ids) == 10 and set(got.ids.tolist()) <= set(kept.tolist())
    few = kept[:25]  # under the index's survivor threshold: the exact path answers
    _same(pv.top(queries[:1], few, 10)[0], dense_top(mat[few], few, queries[0], 10))
    ann.build_ann(mat[:2000], tmp_path / "stale.ann", threads=1)
    other = open_vectors(_publish(tmp_path / "b" if (tmp_path / "b").mkdir() is None else tmp_path, mat))
    assert not other.attach_ann(ann.open_ann(tmp_path / "stale.ann")) and other.ann is None


def test_a_retriever_served_from_shards_does_not_warm_the_scan_it_never_runs(published_demo, monkeypatch):
    """A Ray replica's retriever ranks dense on its shards (``scale.front.attach`` puts the
    shards' step in place of its own): the warm-up leaves its vector file's scan arrays
    unread, and still runs its probe. The same retriever ranking itself warms them."""
    from ragspine_pipeline.retrieval.link.assembly_warm import ranks_dense_here, warm_hybrid
    from ragspine_pipeline.retrieval.vector.published import PublishedVectors
    from ragspine_pipeline.warehouse import pipeline as P
    from ragspine_pipeline.warehouse.versioned import VersionedTables

    warmed = []
    monkeypatch.setattr(PublishedVectors, "warm", lambda self: warmed.append(self.path))
    h = P.load_snapshot_index(VersionedTables(published_demo), LIB).retriever
    if getattr(h._vectors, "source", None) is None:
        pytest.skip("the demo version serves no published vector file")
    assert ranks_dense_here(h)
    warm_hybrid(h)
    assert len(warmed) == 1

    class Front:  # what attach installs: another object's bound method
        calls = 0

        def dense_top_vectors(self, qv, positions, depth):
            Front.calls += 1
            return PublishedVectors.top(h._vectors.source, qv, positions, depth)

    h.dense_top_vectors = Front().dense_top_vectors
    assert not ranks_dense_here(h)
    report = warm_hybrid(h)
    assert len(warmed) == 1 and Front.calls >= 1 and "vectors" not in report.seconds

