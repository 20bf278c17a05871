"""An index scored as one part of a stack (refresh segments, #27 item 1): each part reports
``survivor_stats`` of a filter, the parts' sum goes back to every part's
``search(..., stats=...)``, and the merged top-k equals one index over the whole corpus
under the same filter (N, df and avgdl over all the survivors). Every filter form, both
published layouts and the in-memory index, the compiled kernels (both packed routes) and
the numpy path; an index given its own statistics answers as its filtered query, bit for
bit."""

from pathlib import Path

import numpy as np
import pytest

from ragspine_pipeline.retrieval.lexical.index import (
    bm25,
)
from ragspine_pipeline.retrieval.lexical.index import (
    packed_filter_search as bm25_packed_filter_search,
)
from ragspine_pipeline.retrieval.lexical.index.bm25 import BM25Index
from ragspine_pipeline.retrieval.lexical.index.corpus_stats import CorpusStats
from ragspine_pipeline.retrieval.lexical.index.filter import PackedFilter
from tests.test_bm25_packed import publish_both

pytest.importorskip("numba")

N_DOCS = 3000
CUTS = (0, 1500, 2700, N_DOCS)  # parts A, B, C (C: few enough that 0.1% takes the few-survivor routes)
KEEPS = (1.0, 0.5, 0.05, 0.001)


def _corpus(seed: int = 3) -> tuple[list[list[str]], list[list[str]]]:
    """Zipf documents of 5-60 tokens over ~300 terms; "onlya" occurs in part A alone."""
    rng = np.random.default_rng(seed)
    vocab = [f"w{i}" for i in range(300)]
    p = 1.0 / np.arange(1, len(vocab) + 1) ** 1.1
    p /= p.sum()
    docs = [list(rng.choice(vocab, size=int(rng.integers(5, 61)), p=p)) for _ in range(N_DOCS)]
    for d in rng.choice(CUTS[1], 40, replace=False).tolist():
        docs[d].append("onlya")
    queries = [list(rng.choice(vocab, size=int(rng.integers(1, 5)), p=p)) for _ in range(6)]
    queries += [["w0", "w3", "w0"], ["onlya", "w5"], ["w2", "absent", "onlya", "w2"], ["w40", "w1", "w9", "w0"]]
    return docs, queries


@pytest.fixture(scope="module")
def stack(tmp_path_factory) -> dict:
    """The corpus, its parts as in-memory indexes and as plain and packed published files
    (bitset rows on: the rank routes), each with the numba kernels and the numpy path."""
    mp = pytest.MonkeyPatch()
    mp.setattr(bm25, "BITSET_MIN_DOCS", 0)
    try:
        docs, queries = _corpus()
        tmp = Path(tmp_path_factory.mktemp("stack"))
        parts: dict[str, list] = {}
        for i in range(len(CUTS) - 1):
            sub = docs[CUTS[i]:CUTS[i + 1]]
            packed, plain = publish_both(tmp, sub, name=f"p{i}")
            packed_np, plain_np = publish_both(tmp, sub, name=f"n{i}", kernel="numpy")
            for name, ix in (("memory", BM25Index(sub)), ("memory-numpy", BM25Index(sub, kernel="numpy")),
                             ("plain", plain), ("packed", packed), ("plain-numpy", plain_np),
                             ("packed-numpy", packed_np)):
                parts.setdefault(name, []).append(ix)
        whole = BM25Index(docs, kernel="numpy")
    finally:
        mp.undo()
    return {"docs": docs, "queries": queries, "parts": parts, "whole": whole}


def _masks() -> list[np.ndarray]:
    rng = np.random.default_rng(11)
    out = []
    for keep in KEEPS:
        m = rng.random(N_DOCS) < keep
        m[[7, CUTS[2] + 5]] = True  # B and C keep someone at 0.1% too
        out.append(m)
    return out


def _forms(mask: np.ndarray) -> list[tuple[str, list]]:
    """The filter of each part in every form (one PackedFilter per part, reused)."""
    sl = [mask[CUTS[i]:CUTS[i + 1]] for i in range(len(CUTS) - 1)]
    forms = [("mask", sl), ("positions", [np.flatnonzero(m) for m in sl]),
             ("packed", [PackedFilter.from_mask(m) for m in sl])]
    if mask.all():
        forms.append(("none", [None] * len(sl)))
    return forms


def _stack_top(parts: list, q: list[str], k: int, cands: list) -> tuple[list[int], np.ndarray, CorpusStats]:
    stats = CorpusStats.zero(len(q))
    for ix, c in zip(parts, cands, strict=True):
        stats = stats + ix.survivor_stats(q, c)
    rows = []
    for i, (ix, c) in enumerate(zip(parts, cands, strict=True)):
        got = ix.search(q, k, c, stats=stats)
        rows += [(-s, int(d) + CUTS[i]) for d, s in zip(got.ids.tolist(), got.scores.tolist(), strict=True)]
    rows.sort()
    rows = rows[:k]
    return [d for _, d in rows], np.array([-s for s, _ in rows]), stats


def _valid_top(ids: list[int], scores: np.ndarray, ref: np.ndarray, k: int) -> None:
    """``ids`` / ``scores`` are a top-k of the dense reference scores ``ref`` (ties by
    position, near-ties of float order either way): each score is the reference's to 1e-9,
    nothing left out scores higher, the count is the reference's."""
    matching = np.flatnonzero(ref > 0)
    assert len(ids) == min(k, len(matching))
    assert np.allclose(scores, ref[ids], atol=1e-9, rtol=0)
    assert list(scores) == sorted(scores, reverse=True)
    if len(ids) and len(ids) < len(matching):
        rest = np.setdiff1d(matching, ids)
        assert ref[rest].max() <= scores[-1] + 1e-9


def _expected_stats(docs, q, mask) -> CorpusStats:
    keep = [docs[i] for i in np.flatnonzero(mask)]
    return CorpusStats(len(keep), sum(len(d) for d in keep),
                       np.array([sum(t in d for d in keep) for t in q], np.int64))


@pytest.mark.parametrize("kind", ["memory", "plain", "packed", "memory-numpy", "plain-numpy", "packed-numpy"])
def test_stack_equals_one_index(stack, monkeypatch, kind):
    docs, parts, whole = stack["docs"], stack["parts"][kind], stack["whole"]
    routes = (0, 2) if kind == "packed" else (1,)
    for mask in _masks():
        for form, cands in _forms(mask):
            for route in routes:
                monkeypatch.setattr(bm25_packed_filter_search, "WINDOWS", route)
                for q in stack["queries"]:
                    ref = whole.get_scores(q, mask)
                    for k in (10, N_DOCS):  # pruned, and every match
                        for _ in range(2):  # a reused PackedFilter remembers its survivors and df
                            ids, scores, stats = _stack_top(parts, q, k, cands)
                            _valid_top(ids, scores, ref, k)
                    want = _expected_stats(docs, q, mask)
                    assert (stats.n, stats.total, stats.df.tolist()) == (want.n, want.total, want.df.tolist())
                    ref_top = whole.search(q, 10, mask)
                    ids, scores, _ = _stack_top(parts, q, 10, cands)
                    if len(set(np.round(ref_top.scores, 9))) == len(ref_top.scores):  # no near ties: exact order
                        assert ids == ref_top.ids.tolist(), (kind, form, q)


@pytest.mark.parametrize("kind", ["memory", "plain", "packed", "memory-numpy", "plain-numpy", "packed-numpy"])
def test_own_statistics_answer_bit_for_bit(stack, monkeypatch, kind):
    ix = stack["parts"][kind][0]
    n = ix.n_docs
    rng = np.random.default_rng(5)
    routes = (0, 1, 2) if kind == "packed" else (1,)
    for keep in KEEPS:
        mask = rng.random(n) < keep
        mask[3] = True
        for cand in (mask, np.flatnonzero(mask), PackedFilter.from_mask(mask)):
            for route in routes:
                monkeypatch.setattr(bm25_packed_filter_search, "WINDOWS", route)
                for q in stack["queries"]:
                    own = ix.survivor_stats(q, cand)
                    for k in (10, n):
                        got, want = ix.search(q, k, cand, stats=own), ix.search(q, k, cand)
                        assert got.ids.tolist() == want.ids.tolist(), (keep, q)
                        assert np.array_equal(got.scores, want.scores), (keep, q)
    for q in stack["queries"]:  # no filter: every document, as the all-keeping filter
        every = np.ones(n, bool)
        got, want = ix.search(q, 10, stats=ix.survivor_stats(q)), ix.search(q, 10, every)
        assert got.ids.tolist() == want.ids.tolist() and np.array_equal(got.scores, want.scores)
        a, b = ix.survivor_stats(q), ix.survivor_stats(q, every)
        assert (a.n, a.total, a.df.tolist()) == (b.n, b.total, b.df.tolist())


@pytest.mark.parametrize("kind", ["memory", "packed", "memory-numpy", "packed-numpy"])
def test_statistics_that_cannot_hold_the_survivors(stack, kind):
    ix = stack["parts"][kind][0]
    q = ["w0", "onlya", "absent"]
    mask = np.ones(ix.n_docs, bool)
    own = ix.survivor_stats(q, mask)
    assert own.df[2] == 0 and own.df[1] == 40
    bad = [CorpusStats(0, 0, own.df), CorpusStats(own.n, own.total, own.df * np.array([1, 0, 1])),
           CorpusStats(own.n, own.total, own.df[:2])]
    for stats in bad:
        with pytest.raises(ValueError):
            ix.search(q, 10, mask, stats=stats)
    # Statistics of a larger stack are fine, and a token this index lacks keeps its slot.
    big = own + CorpusStats(500, 9000, np.array([100, 0, 3], np.int64))
    assert len(ix.search(q, 10, mask, stats=big).ids) == 10
    # The filter's own df cache is unchanged by a stack query: its plain filtered query still
    # answers as the mask's.
    pf = PackedFilter.from_mask(mask)
    ix.search(q, 10, pf, stats=big)
    a, b = ix.search(q, 10, pf), ix.search(q, 10, mask)
    assert a.ids.tolist() == b.ids.tolist() and np.array_equal(a.scores, b.scores)
