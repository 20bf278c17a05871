"""Merging segments' top-k: near-ties ordered by position (as one index orders exact ties),
and a shard whose filter survivors hold no query term answers empty instead of failing."""

import numpy as np

from ragspine_pipeline.retrieval.lexical.index.bm25 import BM25Index
from ragspine_pipeline.retrieval.lexical.index.topk import merge_top_k
from ragspine_pipeline.retrieval.lexical.refresh.segments import (
    SurvivorStats,
    open_segments,
    write_segments,
)


def test_near_ties_fall_by_position_and_real_gaps_by_score():
    got = merge_top_k(np.array([9, 7, 3, 5]), np.array([2.0, 2.0 + 4e-15, 1.0, 2.0 - 1e-9]), 3)
    assert got.ids.tolist() == [7, 9, 5]  # 9 and 7 one tie (position order), 5 is really lower
    assert merge_top_k(np.array([1]), np.array([0.0]), 5).ids.tolist() == []


def test_a_shard_without_matching_survivors_answers_empty(tmp_path):
    docs = [["alpha", "beta"], ["beta"], ["gamma"], ["alpha"], ["delta", "beta"], ["gamma", "gamma"]]
    ids = [f"c{i}" for i in range(len(docs))]
    write_segments(tmp_path, docs, ids, buckets=2)
    whole = open_segments(tmp_path)
    mask = np.zeros(len(docs), bool)
    mask[[2, 5]] = True  # survivors hold only "gamma"
    q = ["alpha", "gamma"]
    stats = whole.survivor_stats(q, mask)
    one = BM25Index(docs).search(q, k=5, candidates=mask)
    assert whole.search(q, k=5, candidates=mask).ids.tolist() == one.ids.tolist()
    for bucket in range(2):
        part = open_segments(tmp_path, buckets=[bucket])
        got = part.search(q, k=5, candidates=mask, stats=stats)
        assert set(got.ids.tolist()) <= {2, 5}
    none = SurvivorStats(stats.n, stats.total_len, np.zeros(len(q), np.int64))
    assert open_segments(tmp_path, buckets=[0]).search(["alpha"], k=5, candidates=mask, stats=none).ids.tolist() == []
