"""A corpus published as hash-bucket segments: any subset maps without a rebuild, and its
scores are the corpus's (unfiltered and filtered), equal to one index and the reference."""

import numpy as np
import pytest

from ragspine_pipeline.retrieval.lexical.format.file import CorruptIndexError, doc_bucket
from ragspine_pipeline.retrieval.lexical.index.bm25 import BM25Index, bm25_scores
from ragspine_pipeline.retrieval.lexical.refresh.segments import (
    open_segments,
    segment_name,
    write_segments,
)


def corpus(n=1500, seed=3):
    rng = np.random.default_rng(seed)
    vocab = [f"w{i}" for i in range(120)]
    p = 1.0 / np.arange(1, 121) ** 1.1
    p /= p.sum()
    docs = [list(rng.choice(vocab, size=int(rng.integers(0, 30)), p=p)) for _ in range(n)]
    queries = [list(rng.choice(vocab, size=int(rng.integers(1, 5)), p=p)) for _ in range(25)]
    return docs, [f"chunk-{i:05d}" for i in range(n)], queries + [["absent"], ["w0", "w0"]]


def ref_top(q, docs, k, positions=None):
    pos = list(range(len(docs))) if positions is None else [int(x) for x in positions]
    ref = bm25_scores(q, [docs[i] for i in pos])
    order = sorted((j for j, s in enumerate(ref) if s > 0), key=lambda j: (-ref[j], j))[:k]
    return [pos[j] for j in order], [ref[j] for j in order]


def ranked(res) -> list[tuple[float, int]]:
    return [(-s, i) for i, s in zip(res.ids.tolist(), res.scores.tolist(), strict=True)]


@pytest.mark.parametrize("buckets", [1, 3, 8])
def test_all_segments_equal_one_index_and_the_reference(tmp_path, buckets):
    docs, ids, queries = corpus()
    paths = write_segments(tmp_path, docs, ids, buckets=buckets)
    assert [p.name for p in paths] == [segment_name(b, buckets) for b in range(buckets)]
    seg = open_segments(tmp_path)
    one = BM25Index(docs)
    for q in queries:
        want = one.search(q, k=10)
        got = seg.search(q, k=10)
        assert got.ids.tolist() == want.ids.tolist()
        assert np.allclose(got.scores, want.scores, atol=1e-9, rtol=0)
        assert np.allclose(got.scores, ref_top(q, docs, 10)[1], atol=1e-9, rtol=0)
    mask = np.random.default_rng(1).random(len(docs)) < 0.2
    for q in queries[:10]:
        got = seg.search(q, k=10, candidates=mask)
        r_ids, r_scores = ref_top(q, docs, 10, np.flatnonzero(mask))  # survivor statistics
        assert got.ids.tolist() == r_ids and np.allclose(got.scores, r_scores, atol=1e-12, rtol=0)
        assert seg.search(q, k=10, candidates=np.flatnonzero(mask)).ids.tolist() == r_ids


def test_a_shard_maps_only_its_buckets_and_shards_merge_to_the_corpus_top_k(tmp_path):
    docs, ids, queries = corpus(seed=4)
    write_segments(tmp_path, docs, ids, buckets=4)
    shards = [open_segments(tmp_path, [0, 1]), open_segments(tmp_path, [2, 3])]
    assert shards[0].buckets == [0, 1] and len(shards[0].segments) == 2
    mine = {i for i, d in enumerate(ids) if doc_bucket(d, 4) in (0, 1)}
    full = open_segments(tmp_path)
    for q in queries:
        part = shards[0].search(q, k=5)
        assert set(part.ids.tolist()) <= mine
        corpus_scores = bm25_scores(q, docs)  # a shard's scores are the corpus's own
        assert np.allclose(part.scores, [corpus_scores[i] for i in part.ids.tolist()], atol=1e-9, rtol=0)
        merged = sorted(ranked(shards[0].search(q, k=5)) + ranked(shards[1].search(q, k=5)))[:5]
        assert [i for _, i in merged] == full.search(q, k=5).ids.tolist()
    mask = np.ones(len(docs), bool)
    mask[::4] = False
    with pytest.raises(ValueError, match=r"lacks buckets \[2, 3\]"):
        shards[0].search(queries[0], k=5, candidates=mask)
    # The two-step protocol: every shard's survivor statistics, summed, then each shard scores.
    for q in queries[:5]:
        stats = shards[0].survivor_stats(q, mask) + shards[1].survivor_stats(q, mask)
        merged = sorted(ranked(shards[0].search(q, 5, mask, stats=stats))
                        + ranked(shards[1].search(q, 5, mask, stats=stats)))[:5]
        assert [i for _, i in merged] == full.search(q, k=5, candidates=mask).ids.tolist()
        assert [i for _, i in merged] == ref_top(q, docs, 5, np.flatnonzero(mask))[0]


def test_segments_of_different_corpora_do_not_mix(tmp_path):
    docs, ids, _ = corpus(200)
    write_segments(tmp_path / "a", docs, ids, buckets=2)
    write_segments(tmp_path / "b", docs[:100], ids[:100], buckets=2)
    (tmp_path / "b" / segment_name(1, 2)).replace(tmp_path / "a" / segment_name(1, 2))
    with pytest.raises(CorruptIndexError, match="same corpus"):
        open_segments(tmp_path / "a")
    with pytest.raises(FileNotFoundError):
        open_segments(tmp_path / "b", [1])
