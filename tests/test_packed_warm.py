"""A packed file warms the filtered kernel for its own length width only (#27 item 2).

Opening a packed file compiles (or loads from numba's cache) every entry point it will call,
so its first query never compiles; the filtered kernel is specialised on the dtype of the
compact lengths (``bm25_filter.compact_lengths``), which the file's longest length decides.
Warming all three widths tripled that kernel's compile and load time for nothing.
"""

from __future__ import annotations

import numpy as np
import pytest

from ragspine_pipeline.retrieval.lexical.index import filter as bm25_filter
from ragspine_pipeline.retrieval.lexical.index.mapped import open_index
from ragspine_pipeline.retrieval.lexical.index.packed import length_codes
from ragspine_pipeline.retrieval.lexical.index.packed_index import _lengths_dtype
from ragspine_pipeline.retrieval.lexical.index.postings import count_postings
from ragspine_pipeline.retrieval.lexical.refresh.publish import write_packed
from tests.test_bm25_mmap import zipf_corpus


@pytest.mark.parametrize("longest", [0, 40, 255, 256, 300, 65_535, 65_536, 100_000])
def test_the_width_warmed_is_the_width_the_queries_use(longest):
    doc_len = np.array([0, 1, longest, 3, longest // 2], np.uint32)
    codes = length_codes(doc_len)
    assert codes is not None
    with_codes = {"doc_len": doc_len, "doc_code": codes[0], "code_len": codes[1]}
    without = {"doc_len": doc_len}
    expected = bm25_filter.compact_lengths(doc_len).dtype
    assert _lengths_dtype(with_codes) == expected == _lengths_dtype(without)


def test_a_files_first_filtered_query_compiles_nothing(tmp_path):
    kernels = pytest.importorskip("ragspine_pipeline.retrieval.lexical.kernels.packed_filtered")
    docs, queries = zipf_corpus(500, seed=5)
    raw, _ = count_postings(docs)
    ix = open_index(write_packed(raw, tmp_path / "lex.packed", k1=1.5, b=0.75,
                                 doc_ids=[f"d{i:04d}" for i in range(len(docs))]), kernel="numba")
    warmed = set(kernels.search_filtered.signatures)
    mask = np.random.default_rng(3).random(len(docs)) < 0.4
    for q in queries[:10]:
        ix.search(q, k=5, candidates=mask)
        ix.search(q, k=5, candidates=np.flatnonzero(mask))
    assert set(kernels.search_filtered.signatures) == warmed
    lengths = ix._filter_support.lengths()
    assert lengths.dtype == np.uint8  # the file's longest document is under 256 tokens
    assert "uint8" in {str(sig[11].dtype) for sig in warmed}  # the width used was warmed at open
