"""A stack's compiled filter translation (``bm25_stack_filters``): each segment's packed
words of a row filter built from the filter's words in one pass, equal to the numpy
translation (``bm25_stack.mask_filters``, the fallback and oracle) for every filter form and
row layout, and a stack answers a fresh filter exactly as the one index over its chunks."""

from __future__ import annotations

import numpy as np
import pytest
from test_bm25_merge import _corpus
from test_bm25_stack import DEEP, QUERIES, _assert_same, _publish, _refresh

from ragspine_pipeline.retrieval.lexical.index.filter import PackedFilter
from ragspine_pipeline.retrieval.lexical.index.mapped import open_index
from ragspine_pipeline.retrieval.lexical.kernels import stack_filters as sf
from ragspine_pipeline.retrieval.lexical.refresh.stack import StackedBM25, mask_filters
from ragspine_pipeline.warehouse.lexical_files import BM25_FILE, open_bm25_file, write_bm25_file


def _layout(rng: np.random.Generator, n_docs: int, n_segs: int, dead: float, scatter: bool) -> list[np.ndarray]:
    """Rows of ``n_segs`` segments over ``n_docs`` rows: each live row in one segment (its
    rows ascending), ``dead`` of each segment's positions dead (-1). ``scatter``: rows dealt
    to segments at random (delta-like); else in contiguous blocks (base-like, long runs)."""
    owner = rng.integers(0, n_segs, n_docs)
    owner = owner if scatter else np.sort(owner)
    out = []
    for s in range(n_segs):
        live = np.flatnonzero(owner == s)
        n_dead = int(rng.binomial(len(live) + 3, dead)) if s != 1 else 0
        rows = np.concatenate([live, np.full(n_dead, -1, np.int64)])
        keep = np.sort(rng.permutation(len(rows))[: len(live)])  # where the live rows sit, ascending
        seg = np.full(len(rows), -1, np.int64)
        seg[keep] = live
        out.append(seg)
    return out


def _compiled(cand, rows_of: list[np.ndarray], runs: bool | None) -> list:
    """The compiled translation of a mask or packed filter; ``runs`` forces a kernel (None: the plan's)."""
    words = cand.words if isinstance(cand, PackedFilter) else PackedFilter.from_mask(cand).words
    out = []
    for rows in rows_of:
        plan = sf.plan(rows) if runs is None else (sf.live_runs(rows) if runs else None)
        seg_words, n = sf.translate(words, rows, plan)
        assert seg_words.shape == ((len(rows) + 63) // 64,)
        assert n == int(np.unpackbits(seg_words.view(np.uint8)).sum())
        out.append(PackedFilter(seg_words) if n else False)
    return out


def _same(a: list, b: list) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert (x is False) == (y is False)
        if x is not False:
            assert np.array_equal(x.words, y.words)


@pytest.mark.parametrize("n_docs", [0, 1, 5, 63, 64, 65, 200, 1000, 4099])
@pytest.mark.parametrize("scatter", [False, True])
def test_compiled_translation_equals_numpy(n_docs, scatter):
    rng = np.random.default_rng(n_docs * 2 + scatter)
    for n_segs, dead in ((1, 0.0), (1, 0.3), (2, 0.01), (3, 0.2), (4, 0.9)):
        rows_of = _layout(rng, n_docs, n_segs, dead, scatter)
        rows_of.append(np.zeros(0, np.int64))  # an empty segment
        rows_of.append(np.full(int(rng.integers(1, 130)), -1, np.int64))  # an all-dead one
        for keep in (0.0, 0.003, 0.5, 1.0):
            mask = rng.random(n_docs) < keep
            want = mask_filters(mask, rows_of, n_docs)
            for cand in (mask, PackedFilter.from_mask(mask)):
                for runs in (None, True, False):
                    _same(_compiled(cand, rows_of, runs), want)


def test_runs_cover_every_live_position():
    rng = np.random.default_rng(7)
    for rows in _layout(rng, 3000, 3, 0.05, False) + _layout(rng, 3000, 2, 0.5, True):
        run_p, run_r, run_len = sf.live_runs(rows)
        pos = np.concatenate([np.arange(p, p + k) for p, k in zip(run_p, run_len, strict=True)] or [[]])
        got = np.concatenate([np.arange(r, r + k) for r, k in zip(run_r, run_len, strict=True)] or [[]])
        assert np.array_equal(pos, np.flatnonzero(rows >= 0)) and np.array_equal(got, rows[rows >= 0])
        assert (run_len > 0).all()
    base = _layout(rng, 10000, 2, 0.01, False)[0]
    assert sf.plan(base) is not None  # long runs: copied by runs
    assert sf.plan(_layout(rng, 10000, 4, 0.0, True)[0]) is None  # scattered: position by position


def _stack(tmp_path, layout: str) -> tuple[StackedBM25, object, int]:
    corpus = _corpus(n=1200)
    _publish(tmp_path / "v0", None, corpus, layout=layout)
    corpus, changed = _refresh(corpus, seed=3, frac=0.03)
    meta = _publish(tmp_path / "v1", tmp_path / "v0", corpus, changed=changed, layout=layout, stack=DEEP)
    assert meta["bm25_build"] == "stacked"
    ids = sorted(corpus)
    stack = open_bm25_file(tmp_path / "v1", ids)
    assert isinstance(stack, StackedBM25)
    write_bm25_file(tmp_path / "fresh", ids, [corpus[c] for c in ids], layout=layout)
    return stack, open_index(tmp_path / "fresh" / BM25_FILE), len(ids)


@pytest.mark.parametrize("layout", ["plain", "packed"])
def test_stack_answers_fresh_filters_as_one_index(tmp_path, layout):
    stack, ref, n = _stack(tmp_path, layout)
    assert stack.segments[0].kernel == "numba"
    _assert_same(stack, ref, n)
    assert stack._plans() is not None  # the compiled translation served those filters
    rng = np.random.default_rng(11)
    for keep in (0.7, 0.02):
        mask = rng.random(n) < keep
        got = stack._segment_filters(mask)[0]
        _same(got, mask_filters(mask, stack.rows, n))
        for q in QUERIES[:4]:  # a fresh mask every query: the translation each time
            x, y = stack.search(q, 10, candidates=mask.copy()), ref.search(q, 10, candidates=mask)
            assert np.array_equal(x.ids, y.ids)
            np.testing.assert_allclose(x.scores, y.scores, rtol=1e-9, atol=0)


def test_numpy_stack_keeps_the_numpy_translation(tmp_path):
    stack, ref, n = _stack(tmp_path, "packed")
    numpy_stack = StackedBM25([open_index(s.path, kernel="numpy") for s in stack.segments], stack.rows, n)
    assert numpy_stack._plans() is None
    _assert_same(numpy_stack, ref, n)


def test_malformed_filters_are_still_errors(tmp_path):
    stack, _ref, n = _stack(tmp_path, "packed")
    with pytest.raises(ValueError):
        stack.search(["t1"], 10, candidates=np.ones(n + 1, np.bool_))
    with pytest.raises(ValueError):
        stack.search(["t1"], 10, candidates=PackedFilter(np.zeros((n + 63) // 64 + 1, np.uint64)))
    if n % 64:
        with pytest.raises(ValueError):
            stack.search(["t1"], 10, candidates=PackedFilter(np.full((n + 63) // 64, 2**64 - 1, np.uint64)))
