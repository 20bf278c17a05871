"""The packed encoder's slices (encoded two at a time on threads, block offsets shifted
after) give the same words and block arrays as one slice, compiled or numpy."""

import numpy as np
import pytest

from ragspine_pipeline.retrieval.lexical.index import packed as bm25_packed
from ragspine_pipeline.retrieval.lexical.index.postings import count_postings


def zipf_docs(n: int, vocab: int = 300, seed: int = 2) -> list[list[str]]:
    rng = np.random.default_rng(seed)
    p = 1.0 / np.arange(1, vocab + 1) ** 1.1
    p /= p.sum()
    return [[f"t{t}" for t in rng.choice(vocab, size=int(rng.integers(0, 40)), p=p)] for _ in range(n)]


def encoded(raw, slice_blocks: int, monkeypatch) -> tuple[np.ndarray, dict, np.ndarray]:
    monkeypatch.setattr(bm25_packed, "SLICE_BLOCKS", slice_blocks)
    enc = bm25_packed.encode(raw, 1.2, 0.75)
    words = np.concatenate(list(enc.words()))
    return words, {k: v.copy() for k, v in enc.blocks.items()}, enc.w_max.copy()


@pytest.mark.parametrize("compiled", [True, False])
def test_sliced_encoding_equals_one_slice(monkeypatch, compiled):
    if not compiled:
        monkeypatch.setattr(bm25_packed, "compiled", lambda: None)
    elif bm25_packed.compiled() is None:
        pytest.skip("numba not installed")
    raw, _vocab = count_postings(zipf_docs(3000))
    words, blocks, w_max = encoded(raw, 1 << 30, monkeypatch)
    assert int(raw.indptr[-1]) > 10 * bm25_packed.BLOCK_SIZE
    for size in (1, 3, 7):
        got_words, got_blocks, got_w_max = encoded(raw, size, monkeypatch)
        assert np.array_equal(got_words, words) and np.array_equal(got_w_max, w_max)
        for name, want in blocks.items():
            assert np.array_equal(got_blocks[name], want), name
