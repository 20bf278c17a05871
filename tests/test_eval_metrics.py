import json
import math

import pytest

from ragspine_pipeline.eval.beir import DatasetError, load_beir
from ragspine_pipeline.eval.metrics import (
    dedupe_keep_best,
    mean_metrics,
    mrr_at_k,
    ndcg_at_k,
    recall_at_k,
)


def test_ndcg_hand_computed_graded():
    qrels = {"a": 3, "b": 1, "c": 2, "z": 0}
    ranked = ["b", "x", "a"]
    dcg = 1 / math.log2(2) + 0 + 3 / math.log2(4)
    idcg = 3 / math.log2(2) + 2 / math.log2(3) + 1 / math.log2(4)
    assert ndcg_at_k(ranked, qrels, 10) == pytest.approx(dcg / idcg)
    assert ndcg_at_k(["a", "c", "b"], qrels, 3) == pytest.approx(1.0)
    # Cut at k applies to the ideal ranking too.
    assert ndcg_at_k(["a"], qrels, 1) == pytest.approx(1.0)
    assert ndcg_at_k([], qrels, 10) == 0.0


def test_recall_and_mrr():
    qrels = {"a": 1, "b": 2, "c": 0}
    assert recall_at_k(["c", "b", "x"], qrels, 2) == 0.5
    assert recall_at_k(["a", "b"], qrels, 100) == 1.0
    assert mrr_at_k(["c", "x", "a"], qrels, 10) == pytest.approx(1 / 3)
    assert mrr_at_k(["c", "x", "a"], qrels, 2) == 0.0


def test_mean_over_judged_queries_and_chunk_dedupe():
    assert dedupe_keep_best(["d1", "d2", "d1", "d3", "d2"]) == ["d1", "d2", "d3"]
    m = mean_metrics({"q1": ["a"], "q2": []}, {"q1": {"a": 1}, "q2": {"b": 1}, "q3": {"c": 0}})
    assert m == {"ndcg@10": 0.5, "recall@100": 0.5, "mrr@10": 0.5}


def test_load_beir(tmp_path):
    (tmp_path / "qrels").mkdir()
    (tmp_path / "corpus.jsonl").write_text(json.dumps({"_id": "d1", "title": "T", "text": "x"}) + "\n")
    (tmp_path / "queries.jsonl").write_text(json.dumps({"_id": "1", "text": "q"}) + "\n")
    (tmp_path / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n1\td1\t2\n")
    ds = load_beir(tmp_path)
    assert ds.qrels == {"1": {"d1": 2}} and ds.judged_queries == ["1"] and ds.corpus["d1"].title == "T"
    (tmp_path / "corpus.jsonl").write_text("{bad json\n")
    with pytest.raises(DatasetError, match="invalid JSON"):
        load_beir(tmp_path)
    with pytest.raises(DatasetError):
        load_beir(tmp_path / "nope")
