"""``_match_block`` (a packed block looked up at sorted keys) finds exactly the keys the
block holds, with their tfs, for every gap width: its shortcuts (consecutive documents
with no gaps stored, and 1-bit gaps passed a 32-gap word at a time by popcount) must
land on the same index as decoding gap by gap, including a last word that is part
padding and keys below, between and at the block's ends."""

import numpy as np
import pytest

from ragspine_pipeline.retrieval.lexical.kernels.filter_stats import popcount64
from ragspine_pipeline.retrieval.lexical.kernels.packed import _BLOCK, _match_block, encode_slice


def packed_block(docs: np.ndarray, tfs: np.ndarray, prev: int) -> tuple:
    """``docs``/``tfs`` packed as block 1 after document ``prev`` (-1: it opens its term;
    block 0 stands for the previous block, only its last doc set): (data, off, dbits,
    tbits, last) with the read-ahead pad."""
    n_docs = int(docs[-1]) + 1
    out = np.zeros(4 * _BLOCK + 8, np.uint32)
    blocks = (np.zeros(3, np.int64), np.zeros(2, np.int32), np.zeros(2, np.uint8), np.zeros(2, np.uint8),
              np.zeros(2, np.float64), np.zeros(2, np.uint32), np.zeros(2, np.uint32))
    words = encode_slice(docs.astype(np.int32), tfs.astype(np.uint32), np.ones(n_docs), np.ones(n_docs, np.uint32),
                         np.array([len(docs)], np.int64), np.array([prev < 0]), max(prev, 0), out,
                         tuple(b[1:] for b in blocks), 0)
    assert words >= 0  # 0: consecutive documents, every tf 1
    off, last, dbits, tbits = blocks[0], blocks[1], blocks[2], blocks[3]
    off[2] = words
    last[0] = max(prev, 0)
    return out[:words + 2], off, dbits, tbits, last


@pytest.mark.parametrize("density", [1.0, 0.97, 0.7, 0.5, 0.3, 0.05])
@pytest.mark.parametrize("n", [1, 2, 31, 32, 33, 63, 64, 65, 100, _BLOCK])
def test_match_block_finds_exactly_the_held_keys(density, n):
    rng = np.random.default_rng(int(density * 1000) + n)
    for trial in range(20):
        prev = -1 if trial % 2 else int(rng.integers(0, 50))
        wide = 2 if density >= 0.5 else 4 if density > 0.1 else 40  # >= 0.5: 1-bit gaps
        gaps = 1 + (rng.random(n) >= density) * rng.integers(1, wide, n)
        docs = prev + np.cumsum(gaps)
        tfs = rng.integers(1, 3 if trial % 3 else 1000, n)
        data, off, dbits, tbits, last = packed_block(docs, tfs, prev)
        if density == 1.0:
            assert dbits[1] == 0
        held = dict(zip(docs.tolist(), tfs.tolist(), strict=True))
        span = np.arange(max(prev - 3, 0), int(docs[-1]) + 4)
        # A few keys far apart (whole gap words passed) or many (decoded gap by gap).
        size = int(rng.integers(1, 4)) if trial % 4 < 2 else int(rng.integers(1, 3 * n + 2))
        keys = np.sort(rng.choice(span, size=min(len(span), size), replace=False))
        keys = keys.astype(np.int64)
        hit_key = np.empty(_BLOCK, np.int64)
        hit_tf = np.empty(_BLOCK, np.int64)
        # From the first key after the previous block (as every caller starts).
        x0 = int(np.searchsorted(keys, prev, side="right"))
        x, m = _match_block(data, off, dbits, tbits, last, 1, prev < 0, n, keys, x0, len(keys), hit_key, hit_tf)
        want = [(i, held[k]) for i, k in enumerate(keys.tolist()) if i >= x0 and k in held]
        assert [(int(a), int(b)) for a, b in zip(hit_key[:m], hit_tf[:m], strict=True)] == want
        assert x == int(np.searchsorted(keys, docs[-1], side="right"))


def test_popcount_counts_every_32_bit_gap_word():
    """The 1-bit gap shortcut counts a packed word's bits with ``popcount64`` (one uint32 word
    widened to uint64)."""
    words = np.random.default_rng(5).integers(0, 2**32, 2000, dtype=np.uint64).astype(np.uint32)
    for w in [*words.tolist(), 0, 1, 2**31, 2**32 - 1]:
        assert popcount64(np.uint64(np.uint32(w))) == bin(w).count("1")
