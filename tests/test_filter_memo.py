"""A filter reused across queries remembers what only its survivors decide, per index, and
a retriever keeps each filter expression's survivors (issue #27 item 4: a repeated filter
costs no pass over N).

The answers must not move by a bit: a reused ``PackedFilter`` answers as a fresh one (and
as the bool mask), its remembered survivor df equals a count over the postings, a filter
never carries one index's statistics to another, and a caller's array changed after the
filter was made does not change the filter.
"""

from __future__ import annotations

import math
import pickle

import numpy as np
import pytest

from ragspine_pipeline.retrieval.filters import Predicate, compile_filters
from ragspine_pipeline.retrieval.hybrid.filter_codes import (
    MAX_KEY_VALUES,
    CachedFilter,
    FilterCache,
    filter_key,
)
from ragspine_pipeline.retrieval.hybrid.retriever import FILTER_FIELDS, HybridRetriever
from ragspine_pipeline.retrieval.lexical.index.filter import DF_SLOTS, PackedFilter
from ragspine_pipeline.retrieval.lexical.index.packed_filter_support import support
from tests.test_bm25_mmap import zipf_corpus
from tests.test_bm25_packed import publish_both, same
from tests.test_filter_handover import QUERIES, _chunks

pytest.importorskip("numba")


def _entry(f: PackedFilter, ix):
    """What ``f`` remembers on the packed index ``ix``."""
    ref, surv = f._memo[id(support(ix))]
    assert ref() is support(ix)
    return surv


def test_reused_filter_answers_as_a_fresh_one_and_remembers_exact_df(tmp_path):
    docs, queries = zipf_corpus(12_800, n_vocab=300, seed=4, max_len=25)
    packed, plain = publish_both(tmp_path, docs)
    rng = np.random.default_rng(3)
    for keep in (0.5, 0.05, 0.001):
        mask = rng.random(len(docs)) < keep
        reused = PackedFilter.from_mask(mask)
        for _round in range(2):  # the second round reads every df from the memo
            for q in queries:
                want = plain.search(q, k=10, candidates=PackedFilter.from_mask(mask))  # a fresh filter each query
                same(packed.search(q, k=10, candidates=reused), want)
                same(plain.search(q, k=10, candidates=reused), want)
        surv = _entry(reused, packed)
        assert surv.n == int(mask.sum()) and surv.total == sum(len(d) for d, m in zip(docs, mask, strict=True) if m)
        assert reused._memo and len(reused._memo) == 2  # one entry per index: packed and plain
        entries = surv.known[surv.known != 0]
        assert len(entries) > 0 or keep == 0.001  # a dense filter counts df; a sparse one gathers it
        for e in entries.tolist():
            term = packed.vocab.term((e >> 32) - 1)
            want_df = sum(1 for d, m in zip(docs, mask, strict=True) if m and term in d)
            assert e & 0xFFFFFFFF == want_df, (keep, term)


def test_df_cache_slots_are_bounded_and_shared_exactly(tmp_path, monkeypatch):
    """Four slots for a 300-term vocabulary: terms evict each other and every answer still
    equals a fresh filter's (a slot names its term; a stale one is never read as another's)."""
    from ragspine_pipeline.retrieval.lexical.index import filter as bm25_filter

    assert len(bm25_filter.df_cache(10**7, 10**6)) == bm25_filter.DF_SLOTS
    assert len(bm25_filter.df_cache(300, 10**6)) == 512 and len(bm25_filter.df_cache(0, 5)) == 0
    monkeypatch.setattr(bm25_filter, "DF_SLOTS", 4)
    docs, queries = zipf_corpus(6400, n_vocab=300, seed=6, max_len=25)
    packed, plain = publish_both(tmp_path, docs)
    mask = np.random.default_rng(1).random(len(docs)) < 0.4
    reused = PackedFilter.from_mask(mask)
    for _round in range(2):
        for q in queries:
            want = plain.search(q, k=10, candidates=PackedFilter.from_mask(mask))
            same(packed.search(q, k=10, candidates=reused), want)
            same(plain.search(q, k=10, candidates=reused), want)
    assert len(_entry(reused, packed).known) == 4


def test_filter_is_not_carried_across_indexes(tmp_path):
    docs_a, queries = zipf_corpus(6400, n_vocab=200, seed=1, max_len=20)
    docs_b, _ = zipf_corpus(6400, n_vocab=200, seed=2, max_len=20)
    a, _ = publish_both(tmp_path, docs_a, name="a")
    b, _ = publish_both(tmp_path, docs_b, name="b")
    mask = np.random.default_rng(0).random(6400) < 0.5
    f = PackedFilter.from_mask(mask)
    for q in queries[:20]:
        for ix in (a, b, a):
            same(ix.search(q, k=10, candidates=f), ix.search(q, k=10, candidates=PackedFilter.from_mask(mask)))
    assert len(f._memo) == 2


def test_packed_filter_owns_its_words(tmp_path):
    docs, queries = zipf_corpus(3000, n_vocab=200, seed=9, max_len=20)
    packed, _ = publish_both(tmp_path, docs)
    mask = np.zeros(len(docs), bool)
    mask[::3] = True
    words = PackedFilter.from_mask(mask).words.copy()
    f = PackedFilter(words)
    first = [packed.search(q, k=10, candidates=f) for q in queries[:10]]
    words[:] = 0  # the caller's array changes; the filter (and what it remembers) must not
    np.testing.assert_array_equal(f.to_mask(len(docs)), mask)
    for q, want in zip(queries[:10], first, strict=True):
        same(packed.search(q, k=10, candidates=f), want)
    assert PackedFilter(words) != PackedFilter(words)  # identity: no element-wise comparison
    back = pickle.loads(pickle.dumps(f))  # used, so it remembers (weakly): pickled as its words only
    assert f._memo and not back._memo
    np.testing.assert_array_equal(back.to_mask(len(docs)), mask)
    same(packed.search(queries[0], k=10, candidates=back), first[0])


def test_filter_key_names_values_with_their_type():
    def key(filters):
        return filter_key(compile_filters(filters, FILTER_FIELDS))

    assert key({"topic": "a"}) == key({"topic": "a"}) != key({"topic": "b"})
    assert key({"topic": {"in": ["a", "b"]}}) == key({"topic": {"in": ["a", "b"]}}) != key({"topic": {"in": ["a"]}})
    assert key({"topic": "a", "entity": "b"}) != key({"topic": "a"})
    # 1, 1.0 and True are equal in Python but are different filter values here.
    assert len({filter_key([Predicate("version", "eq", v)]) for v in (1, 1.0, True)}) == 3
    assert filter_key([Predicate("version", "gt", math.nan)]) is None  # NaN never equals itself: not kept
    assert filter_key([Predicate("topic", "in", [{"a": 1}])]) is None  # unhashable: not kept
    assert filter_key([Predicate("topic", "in", [str(i) for i in range(MAX_KEY_VALUES + 1)])]) is None  # too long


def test_filter_cache_bounds_entries_and_bytes():
    cache = FilterCache(max_entries=3, max_bytes=10_000)
    for i in range(5):
        cache.put(i, CachedFilter(np.zeros(1000, bool)))
    assert len(cache) == 3 and cache.get(0) is None and cache.get(4) is not None
    cache.get(2)  # recently used: kept
    cache.put(9, CachedFilter(np.zeros(9000, bool)))
    # Over the bytes: the least recently used go first (3, then 4), until the rest fits.
    assert cache.get(3) is None and cache.get(4) is None
    assert cache.get(2) is not None and cache.get(9) is not None
    # A PackedFilter is counted with what it may remember per index: its df cache and positions.
    words = PackedFilter.from_mask(np.ones(640, bool))
    entry = CachedFilter(np.zeros(640, bool), bm25=words)
    assert entry.nbytes() == 640 + 2 * words.words.nbytes + DF_SLOTS * 8


@pytest.mark.parametrize("channels", [("bm25",), ("bm25", "dense")])
def test_retriever_keeps_each_filter_expression(channels):
    from tests.test_filter_handover import _CountingBackend

    chunks = _chunks()
    backend = _CountingBackend() if "dense" in channels else None
    cached = HybridRetriever(chunks, channels=channels, embedding_backend=backend)
    uncached = HybridRetriever(chunks, channels=channels, embedding_backend=backend)
    uncached._filter_cache = FilterCache(max_entries=0)

    def answers(r, filters):
        return [[(h.position, h.bm25, h.vector, h.fused) for h in r.search(q, filters=filters, top_k=20)]
                for q in QUERIES]

    for filters in ({"topic": "yes"}, {"entity": "yes"}, {"topic": "yes", "geography": "no"}):
        want = answers(uncached, filters)
        assert answers(cached, filters) == want == answers(cached, filters)
        mask = cached.candidate_mask(filters)
        assert [[(h.position, h.bm25, h.vector, h.fused) for h in cached.search(q, mask=mask, top_k=20)]
                for q in QUERIES] == want  # a caller's mask: computed per call, same answers
    assert len(cached._filter_cache) == 3 and len(uncached._filter_cache) == 0
