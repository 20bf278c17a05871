"""The dense ANN path (retrieval/vector/ann.py): build, open, recall, pre-filter semantics."""

from __future__ import annotations

import numpy as np
import pytest

faiss = pytest.importorskip("faiss")

from ragspine_pipeline.retrieval.vector import ann  # noqa: E402


def _vectors(n: int, dim: int = 32, seed: int = 0) -> np.ndarray:
    """Clustered unit vectors on a low-dimensional manifold (an 8-d Gaussian mixture lifted to
    ``dim``), the structure embeddings have; the same map for every seed."""
    w = np.random.default_rng(99).standard_normal((8, dim))
    centers = np.random.default_rng(98).standard_normal((40, 8))
    rs = np.random.default_rng(seed)
    z = centers[rs.integers(0, 40, n)] + 0.5 * rs.standard_normal((n, 8))
    x = np.tanh(z @ w) + 0.05 * rs.standard_normal((n, dim))
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def _exact(x: np.ndarray, q: np.ndarray, k: int, mask: np.ndarray | None = None) -> set[int]:
    s = x.astype(np.float64) @ q.astype(np.float64)
    if mask is not None:
        s = np.where(mask, s, -np.inf)
    return set(np.argsort(-s, kind="stable")[:k].tolist())


def _rescored(x: np.ndarray, q: np.ndarray, cand: np.ndarray, k: int) -> set[int]:
    s = x[cand].astype(np.float64) @ q.astype(np.float64)
    return set(cand[np.argsort(-s, kind="stable")[:k]].tolist())


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    x = _vectors(6000)
    path = tmp_path_factory.mktemp("ann") / "v1" / "dense.hnsw"
    ann.build_ann(x, path, threads=1)
    return x, path


def test_build_is_atomic_and_deterministic(built, tmp_path):
    x, path = built
    assert path.is_file()
    assert not [p for p in path.parent.iterdir() if p.name.endswith(".tmp")]
    again = tmp_path / "again.hnsw"
    ann.build_ann(x, again, threads=1)
    assert again.read_bytes() == path.read_bytes()


def test_open_and_unfiltered_recall(built):
    x, path = built
    idx = ann.open_ann(path)
    assert (idx.size, idx.dim) == x.shape
    queries = _vectors(50, seed=1)
    hits = 0
    for q in queries:
        cand = idx.search(q, 10, None)
        assert cand is not None and cand.dtype == np.int64 and len(cand) >= 10
        assert len(set(cand.tolist())) == len(cand)
        hits += len(_rescored(x, q, cand, 10) & _exact(x, q, 10))
    assert hits / (10 * len(queries)) >= 0.95


@pytest.mark.parametrize("kept", [0.5, 0.05])
def test_filtered_returns_survivors_only_with_recall(built, kept, monkeypatch):
    x, path = built
    monkeypatch.setattr(ann, "FILTER_EXACT_BELOW", 100)  # let the graph answer at this small size
    monkeypatch.setattr(ann, "FILTER_EXACT_FRACTION", 0.001)
    idx = ann.open_ann(path)
    mask = np.random.default_rng(5).random(len(x)) < kept
    hits = 0
    queries = _vectors(40, seed=2)
    for i, q in enumerate(queries):
        allowed = mask if i % 2 else np.flatnonzero(mask)  # a mask or a position array
        cand = idx.search(q, 10, allowed)
        assert cand is not None and mask[cand].all()
        hits += len(_rescored(x, q, cand, 10) & _exact(x, q, 10, mask))
    assert hits / (10 * len(queries)) >= 0.95


def test_few_survivors_hand_back_to_the_exact_scan(built):
    x, path = built
    idx = ann.open_ann(path)
    q = _vectors(1, seed=3)[0]
    few = np.zeros(len(x), dtype=bool)
    few[[3, 77, 4000]] = True
    assert idx.filter_is_exact(3)
    assert idx.search(q, 10, few) is None
    assert idx.search(q, 10, np.zeros(len(x), dtype=bool)).size == 0
    everything = np.ones(len(x), dtype=bool)
    assert set(idx.search(q, 10, everything).tolist()) == set(idx.search(q, 10, None).tolist())


def test_bad_inputs_are_refused(built, tmp_path):
    x, path = built
    idx = ann.open_ann(path)
    with pytest.raises(ValueError):
        idx.search(np.zeros(5, dtype=np.float32), 10, None)
    with pytest.raises(ValueError):
        idx.search(x[0], 10, np.ones(3, dtype=bool))
    with pytest.raises(ValueError):
        idx.search(x[0], 10, np.array([len(x)]))
    with pytest.raises(ValueError):
        ann.build_ann(np.zeros((0, 8), dtype=np.float32), tmp_path / "empty.hnsw")
    with pytest.raises(FileNotFoundError):
        ann.open_ann(tmp_path / "missing.hnsw")


def test_settings_decide_build_and_use():
    assert ann.ann_wanted(200_000, "auto", 100_000)
    assert not ann.ann_wanted(50_000, "auto", 100_000)
    assert not ann.ann_wanted(10**7, "off", 100_000)
    assert ann.ann_wanted(200_000, "exact", 100_000) and not ann.ann_used("exact")
    assert ann.ann_used("auto")


def test_publishes_sq6_storage_not_a_float32_copy(built, tmp_path):
    x, path = built
    idx = ann.open_ann(path)
    assert idx.storage == "sq6" and idx.format == ann.FORMAT == "faiss-hnsw16-sq6-ip"
    flat, sq8 = tmp_path / "flat.hnsw", tmp_path / "sq8.hnsw"
    ann.build_ann(x, flat, threads=1, storage="flat")
    ann.build_ann(x, sq8, threads=1, storage="sq8")
    # 6 bits per dimension where the flat file holds 32, and half the neighbour lists of M=32
    assert path.stat().st_size < flat.stat().st_size - x.nbytes // 2
    assert path.stat().st_size < sq8.stat().st_size - x.nbytes // 8


@pytest.mark.parametrize("storage", ["flat", "sq8"])
def test_index_published_before_still_serves(built, tmp_path, storage):
    x, _ = built
    legacy = tmp_path / f"{storage}.hnsw"
    ann.build_ann(x, legacy, threads=1, storage=storage)
    idx = ann.open_ann(legacy)
    assert idx.storage == storage and idx.format == ann.STORAGES[storage].format
    queries = _vectors(20, seed=4)
    hits = sum(len(_rescored(x, q, idx.search(q, 10, None), 10) & _exact(x, q, 10)) for q in queries)
    assert hits / (10 * len(queries)) >= 0.95


def test_ef_search_grows_with_size_and_depth():
    for storage in ann.STORAGES:
        ref = ann.STORAGES[storage].ef_ref
        assert ann.ef_search(1_000_000, 20, storage) == ref
        assert ann.ef_search(10_000, 20, storage) == ann.EF_FLOOR  # small: the floor
        at3m = ann.ef_search(3_000_000, 20, storage)
        assert at3m >= 2 * ref - 1  # measured: the top-10 efSearch roughly doubles from 1M to 3M
        assert ann.ef_search(3_000_000, 500, storage) == 500  # never below the candidates wanted
    assert ann.ef_search(3_000_000, 20, "sq8") >= 96  # ann_3m: 96 gave recall@10 0.965, 64 gave 0.942
    assert ann.ef_search(3_000_000, 20, "sq6") >= 192  # ann_3m: 192 gave 0.961, 160 gave 0.949


def test_foreign_or_damaged_file_raises_a_typed_error_that_says_rebuild(built, tmp_path):
    from ragspine_pipeline.retrieval.lexical.format.file import IndexFormatError

    x, _ = built
    other = tmp_path / "flat_l2.index"
    faiss.write_index(faiss.IndexFlatIP(x.shape[1]), str(other))
    junk = tmp_path / "junk.hnsw"
    junk.write_bytes(b"not a faiss index at all" * 10)
    for bad in (other, junk):
        with pytest.raises(ann.AnnIndexFormatError, match="republish") as err:
            ann.open_ann(bad)
        assert isinstance(err.value, IndexFormatError) and str(bad) in str(err.value)
    with pytest.raises(ValueError):
        ann.build_ann(x, tmp_path / "x.hnsw", storage="pq")


def test_a_damaged_published_ann_file_falls_back_to_the_exact_ranking(tmp_path, monkeypatch, caplog):
    """Serving keeps answering (exactly) when the version's ANN file is not one build_ann wrote."""
    from ragspine_pipeline.warehouse.embeddings_step import ANN_FILE, attach_ann_file

    (tmp_path / ANN_FILE).write_bytes(b"not a faiss index at all" * 10)

    class Vectors:
        path = tmp_path / "vectors.rsvec"
        attached: list = []

        def attach_ann(self, index):
            self.attached.append(index)
            return True

    monkeypatch.setattr(ann, "ann_used", lambda: True)
    pv = Vectors()
    with caplog.at_level("WARNING"):
        assert attach_ann_file(pv) is False
    assert pv.attached == [] and "not used (exact dense ranking)" in caplog.text and "republish" in caplog.text
