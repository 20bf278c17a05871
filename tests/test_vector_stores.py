import numpy as np
import pytest

from ragspine_pipeline.retrieval.filters import FilterError
from ragspine_pipeline.retrieval.vector.parquet_store import ParquetVectorStore
from ragspine_pipeline.retrieval.vector.store import InProcessVectorStore, VectorStore


@pytest.fixture(params=["memory", "parquet", "lancedb"])
def store(request, tmp_path):
    if request.param == "memory":
        return InProcessVectorStore()
    if request.param == "parquet":
        return ParquetVectorStore(tmp_path / "v.parquet")
    pytest.importorskip("lancedb")
    from ragspine_pipeline.retrieval.vector.lancedb_store import LanceDBVectorStore

    return LanceDBVectorStore(tmp_path / "lance")


def test_protocol_upsert_query_delete_where_and_ties(store):
    assert isinstance(store, VectorStore)
    rng = np.random.default_rng(0)
    vecs = rng.normal(size=(20, 8)).astype(np.float32)
    ids = [f"c{i:02d}" for i in range(20)]
    meta = [{"entity": "A" if i % 2 else "B", "period": str(2020 + i % 4)} for i in range(20)]
    assert store.upsert(ids, vecs, meta) == 20 and store.count() == 20
    top = store.query(vecs[3], k=3)
    assert top[0].id == "c03" and abs(top[0].score - 1) < 1e-5
    assert all(h.metadata["entity"] == "A" for h in store.query(vecs[3], k=10, where={"entity": "A"}))
    assert {h.id for h in store.query(vecs[3], k=20, where={"period": {"between": ["2021", "2022"]}})} == \
        {i for i, m in zip(ids, meta, strict=True) if "2021" <= m["period"] <= "2022"}
    assert {h.id for h in store.query(vecs[0], k=20, where={"entity": {"in": ["B"]}, "period": {"ne": "2020"}})} == \
        {i for i, m in zip(ids, meta, strict=True) if m["entity"] == "B" and m["period"] != "2020"}
    # Identical vectors tie: id ascending.
    store.upsert(["z1", "a1"], [vecs[5], vecs[5]], [{"entity": "T", "period": "x"}] * 2)
    tied = [h.id for h in store.query(vecs[5], k=3) if abs(h.score - 1) < 1e-5]
    assert tied == ["a1", "c05", "z1"]
    # Upsert replaces; delete removes.
    store.upsert(["c03"], [vecs[4]], [{"entity": "A", "period": "2023"}])
    assert store.count() == 22 and store.query(vecs[4], k=2)[0].id in ("c03", "c04")
    assert store.delete(["c03", "nope"]) == 1 and store.count() == 21
    # Operands are values, never SQL: a quote in a value matches nothing instead of everything.
    assert store.query(vecs[0], k=20, where={"entity": "A' OR '1'='1"}) == []
    with pytest.raises(FilterError, match="colour"):
        store.query(vecs[0], where={"colour": "red"})
