"""The product's pre-filter reaches BM25 in the cheap form (issue #27 item 4, caller side).

``HybridRetriever`` evaluates the metadata predicates into a bool mask; the compiled
filtered kernel prepares positions (few survivors) or packed words faster than a mask, so
the retriever hands those over (``hybrid.bm25_candidates``: packed words, or the positions
the dense channel computed anyway when they are few). These tests pin the choice
and that the answers are the bool mask's, bit for bit, at every selectivity.
"""

from __future__ import annotations

import numpy as np
import pytest

from ragspine_pipeline.retrieval.chunking.chunking import Chunk, SourceLocator
from ragspine_pipeline.retrieval.filters import compile_filters, predicate_mask
from ragspine_pipeline.retrieval.hybrid import retriever as hybrid
from ragspine_pipeline.retrieval.hybrid.bm25_handover import bm25_candidates
from ragspine_pipeline.retrieval.hybrid.filter_codes import code_values, coded_mask
from ragspine_pipeline.retrieval.hybrid.retriever import FILTER_FIELDS, HybridRetriever
from ragspine_pipeline.retrieval.lexical.index.bm25 import BM25Index
from ragspine_pipeline.retrieval.lexical.index.filter import (
    FEW_SURVIVORS_DIV,
    PackedFilter,
    handover,
)

pytest.importorskip("numba")

N_CHUNKS = 12_800  # N // 64 = 200 survivors: 50% and 5% go packed, 0.1% and 0.01% as positions
# One metadata field per selectivity, so each filter keeps exactly its share of chunks.
KEEPS = {"topic": 0.5, "entity": 0.05, "geography": 0.001, "period": 0.0001}


def _chunks() -> list[Chunk]:
    rng = np.random.default_rng(5)
    vocab = np.array([f"w{i}" for i in range(300)])
    p = 1.0 / np.arange(1, 301) ** 1.1
    p /= p.sum()
    picks = {f: set(rng.choice(N_CHUNKS, max(1, round(k * N_CHUNKS)), replace=False).tolist())
             for f, k in KEEPS.items()}
    out = []
    for i in range(N_CHUNKS):
        text = " ".join(rng.choice(vocab, int(rng.integers(5, 30)), p=p).tolist())
        meta = {f: ("yes" if i in picks[f] else "no") for f in KEEPS}
        out.append(Chunk(f"c{i:05d}", f"d{i:05d}", "", text, SourceLocator(f"d{i:05d}", 0, len(text)), **meta))
    return out


class _CountingBackend:
    """A deterministic embedding backend (token counts of a few words): enough to run the
    dense channel, which ranks the survivors' positions."""

    def embed_texts(self, texts: list[str]) -> list[list[float]]:
        return [[1.0 + t.split().count(w) for w in ("w0", "w1", "w2", "w7")] for t in texts]


@pytest.fixture(scope="module")
def retrievers() -> dict[str, HybridRetriever]:
    chunks = _chunks()
    plain = HybridRetriever(chunks, channels=("bm25",))
    assert plain.index._kernels is not None  # the compiled route is the one that takes the cheap forms
    dense = HybridRetriever(chunks, embedding_backend=_CountingBackend(), bm25_index=plain.index)
    return {"bm25": plain, "hybrid": dense}


QUERIES = ["w0 w5", "w1 w17 w40", "w250", "w3 w3 w299", "w2 w8 w13 w21 w34"]


def test_handover_packs_unless_few_positions_are_at_hand() -> None:
    n = 6400
    few = np.zeros(n, bool)
    few[np.arange(0, n, 32)[: n // FEW_SURVIVORS_DIV]] = True  # exactly N/64 survivors
    got = handover(few, np.flatnonzero(few))  # positions at hand and few: handed as they are
    assert isinstance(got, np.ndarray) and got.dtype == np.int64
    np.testing.assert_array_equal(got, np.flatnonzero(few))
    packed = handover(few)  # no positions at hand: packed words (no pass over N to find them)
    assert isinstance(packed, PackedFilter) and packed.words.dtype == np.uint64
    assert packed.words.shape == ((n + 63) // 64,)
    np.testing.assert_array_equal(packed.to_mask(n), few)
    many = few.copy()
    many[1] = True  # one more than N/64: packed even with the positions at hand
    assert isinstance(handover(many, np.flatnonzero(many)), PackedFilter)
    assert len(handover(np.zeros(n, bool), np.zeros(0, np.int64))) == 0  # nothing survives: no positions


@pytest.mark.parametrize("n", [1, 63, 64, 65, 1000, 4097])
def test_packed_words_round_trip_at_every_tail(n: int) -> None:
    """Whole uint64 words with no stray bit past N, whatever N modulo 64 and 8 is."""
    mask = np.random.default_rng(n).random(n) < 0.7
    words = PackedFilter.from_mask(mask).words
    assert words.shape == ((n + 63) // 64,)
    np.testing.assert_array_equal(PackedFilter(words).to_mask(n), mask)


def test_only_compiled_in_memory_indexes_get_the_cheap_form() -> None:
    docs = [["a", "b"], ["b"], ["c", "a"]] * 100
    mask = np.zeros(len(docs), bool)
    mask[[3, 7]] = True
    assert bm25_candidates(BM25Index(docs, kernel="numba"), None) is None
    assert isinstance(bm25_candidates(BM25Index(docs, kernel="numba"), mask), PackedFilter)
    assert bm25_candidates(BM25Index(docs, kernel="numpy"), mask) is mask  # numpy path: a mask anyway

    class Front:  # e.g. the sharded front or segments: any form would become a mask again
        n_docs = len(docs)

    assert bm25_candidates(Front(), mask, np.flatnonzero(mask)) is mask


@pytest.mark.parametrize("kind", ["bm25", "hybrid"])
@pytest.mark.parametrize("field", list(KEEPS))
def test_handed_form_reaches_the_index(retrievers, kind: str, field: str, monkeypatch) -> None:
    retriever = retrievers[kind]
    seen: list[object] = []
    search = retriever.index.search

    def spy(tokens, k=10, candidates=None):
        seen.append(candidates)
        return search(tokens, k=k, candidates=candidates)

    monkeypatch.setattr(retriever.index, "search", spy)
    retriever.search("w0 w1", filters={field: "yes"})
    (cand,) = seen
    # Positions only where the dense channel computed them anyway, and only when few.
    few = kind == "hybrid" and round(KEEPS[field] * N_CHUNKS) <= N_CHUNKS // FEW_SURVIVORS_DIV
    assert isinstance(cand, np.ndarray if few else PackedFilter)


@pytest.mark.parametrize("kind", ["bm25", "hybrid"])
@pytest.mark.parametrize("field", list(KEEPS))
def test_answers_equal_the_bool_mask_answers(retrievers, kind: str, field: str, monkeypatch) -> None:
    retriever = retrievers[kind]
    filters = {field: "yes"}

    def answers() -> list[list[tuple]]:
        return [[(h.position, h.bm25, h.vector, h.fused) for h in retriever.search(q, filters=filters, top_k=20)]
                for q in QUERIES]

    cheap = answers()
    monkeypatch.setattr(hybrid, "bm25_candidates", lambda index, mask, positions=None: mask)  # as before
    plain = answers()
    assert cheap == plain  # positions and scores bit for bit
    assert any(cheap)  # the filters keep matching chunks: the comparison is not vacuous
    mask = retriever.candidate_mask(filters)
    for q in QUERIES:
        toks = retriever.analyzer.analyze_query(q, retriever._languages)
        want = retriever.index.search(toks, k=50, candidates=mask)
        for form in (handover(mask), handover(mask, np.flatnonzero(mask))):
            got = retriever.index.search(toks, k=50, candidates=form)
            np.testing.assert_array_equal(got.ids, want.ids)
            assert got.scores.tobytes() == want.scores.tobytes()


def test_coded_mask_equals_predicate_mask_for_every_operator() -> None:
    """Verdicts per distinct value give the per-chunk mask, with values of mixed types
    (1, True and 1.0 are equal and hash alike, and stay apart), missing values and a field
    whose distinct values are too many to code."""
    rng = np.random.default_rng(2)
    pool = np.empty(9, object)
    pool[:] = ["a", "b", "", None, 1, True, 1.0, 2, "2024-01"]
    n = 5000
    cols = {"topic": pool[rng.integers(0, len(pool), n)], "period": pool[rng.integers(0, len(pool), n)]}
    cols["chunk_id"] = np.array([f"c{i}" for i in range(n)], dtype=object)  # all distinct: per chunk
    fields = {"topic": str, "period": str, "chunk_id": str, "version": int}
    cols["version"] = pool[rng.integers(4, 8, n)]  # numbers and a bool
    filter_sets = [
        {"topic": "a"}, {"topic": {"ne": "a"}}, {"topic": {"in": ["a", ""]}}, {"topic": {"nin": ["b"]}},
        {"period": {"gte": "2024"}}, {"period": {"between": ["a", "b"]}}, {"version": 1}, {"version": {"gt": 1}},
        {"version": {"in": [2]}}, {"chunk_id": {"lt": "c3"}, "topic": {"ne": "b"}}, {"chunk_id": "c17"},
    ]
    codes = {f: code_values(c) for f, c in cols.items()}
    assert codes["chunk_id"].codes is None and codes["topic"].codes is not None
    assert len(codes["version"].values) == 4  # True, 1 and 1.0 coded apart
    for filters in filter_sets:
        preds = compile_filters(filters, fields)
        want = predicate_mask(preds, cols.__getitem__, n)
        np.testing.assert_array_equal(coded_mask(preds, cols.__getitem__, codes.__getitem__, n), want)
        assert 0 < want.sum() < n or filters == {"chunk_id": "c17"}
    for filters in ({"topic": "zzz"}, {"topic": {"nin": ["zzz"]}}):  # no value passes / every value passes
        preds = compile_filters(filters, fields)
        want = predicate_mask(preds, cols.__getitem__, n)
        assert want.sum() in (0, n)
        np.testing.assert_array_equal(coded_mask(preds, cols.__getitem__, codes.__getitem__, n), want)


def test_unhashable_values_are_evaluated_per_chunk() -> None:
    col = np.empty(3, object)
    col[:] = [["x"], "a", "a"]
    assert code_values(col).codes is None
    preds = compile_filters({"topic": "a"}, {"topic": str})
    got = coded_mask(preds, lambda f: col, lambda f: code_values(col), 3)
    np.testing.assert_array_equal(got, [False, True, True])


def test_retriever_mask_is_the_predicate_mask(retrievers) -> None:
    r = retrievers["bm25"]
    for filters in ({"topic": "yes", "entity": {"ne": "yes"}}, {"geography": {"in": ["yes", "maybe"]}},
                    [("chunk_id", "lt", "c00100"), ("period", "eq", "no")]):
        want = predicate_mask(compile_filters(filters, FILTER_FIELDS), r._column, len(r))
        np.testing.assert_array_equal(r.candidate_mask(filters), want)


def test_a_compiled_packed_index_gets_the_cheap_form_and_the_same_answers(tmp_path) -> None:
    # The packed file index takes packed words and positions as the plain one does (room F3),
    # so the retriever hands them over instead of an N-sized bool mask.
    pytest.importorskip("numba")
    from tests.test_bm25_mmap import zipf_corpus
    from tests.test_bm25_packed import publish_both

    docs, queries = zipf_corpus(3000, seed=11)
    packed, _plain = publish_both(tmp_path, docs)
    assert packed._kernels is not None
    rng = np.random.default_rng(5)
    for keep in (0.5, 0.05, 0.002):
        mask = rng.random(len(docs)) < keep
        handed = bm25_candidates(packed, mask, np.flatnonzero(mask))
        assert handed is not mask
        for q in queries[:20]:
            got, want = packed.search(q, k=10, candidates=handed), packed.search(q, k=10, candidates=mask)
            assert got.ids.tolist() == want.ids.tolist() and np.array_equal(got.scores, want.scores)
