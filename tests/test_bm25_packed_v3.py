"""Format 3's packed tables (#47 item 4, bytes): idf per distinct df, the bit-set terms as
a list, no lengths beside their codes; and a format 2 file of the same index still opens
and answers identically (published snapshots must not break)."""

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from ragspine_pipeline.retrieval.lexical.format.file import (
    FORMAT_VERSION,
    CorruptIndexError,
    hash_vocab_arrays,
    write_file,
)
from ragspine_pipeline.retrieval.lexical.format.vocab_fc import FC_ARRAYS
from ragspine_pipeline.retrieval.lexical.index import bm25
from ragspine_pipeline.retrieval.lexical.index.mapped import open_index
from ragspine_pipeline.retrieval.lexical.index.packed import BLOCK_ARRAYS, norm_of, w_of
from ragspine_pipeline.retrieval.lexical.index.packed_narrow import (
    BMAX_STEP,
    narrow_maxtf,
    quantize_bmax,
    to_u32,
)
from ragspine_pipeline.retrieval.lexical.index.packed_tables import idf_table, term_idf
from ragspine_pipeline.retrieval.lexical.index.postings import count_postings
from ragspine_pipeline.retrieval.lexical.refresh.publish import write_packed
from tests.test_bm25_mmap import zipf_corpus
from tests.test_bm25_packed import ref_top, same

_V2_ORDER = ("data", "blk_off", "blk_last", "blk_dbits", "blk_tbits", "blk_bmax", "blk_maxtf", "blk_minlen",
             "indptr", "bptr", "idf", "w_max", "bit_row", "bits", "doc_len", "doc_code", "code_len")


def wide_arrays(ix) -> dict[str, np.ndarray]:
    """The per-term and per-block arrays of a packed index as formats 1-3 stored them
    (``index.packed`` before the narrowing: int64 pointers and offsets, exact float64
    maxima, uint32 tf and length bounds), recomputed from its decoded postings with the
    old encoder's formula."""
    a = ix._file.arrays
    bp = a["bptr"].astype(np.int64)
    indptr = np.asarray(ix.indptr, np.int64)
    pairs = [ix.decode(t) for t in range(ix.n_terms)]
    docs = np.concatenate([d for d, _ in pairs]).astype(np.int64)
    tfs = np.concatenate([f for _, f in pairs]).astype(np.int64)
    blk = np.arange(int(bp[-1]), dtype=np.int64)
    term = np.searchsorted(bp, blk, side="right") - 1
    starts = indptr[term] + (blk - bp[term]) * 128
    norm = norm_of(ix.doc_len, ix.k1, ix.b, ix._w_avgdl)
    bmax = np.maximum.reduceat(w_of(tfs, norm[docs]), starts) if len(starts) else np.zeros(0)
    nonempty = np.flatnonzero(np.diff(bp))
    w_max = np.zeros(ix.n_terms)
    w_max[nonempty] = np.maximum.reduceat(bmax, bp[nonempty])
    doc_len = np.asarray(ix.doc_len, np.int64)
    return {"blk_off": a["blk_off"].astype(np.int64), "blk_bmax": bmax,
            "blk_maxtf": np.maximum.reduceat(tfs, starts).astype(np.uint32),
            "blk_minlen": np.minimum.reduceat(doc_len[docs], starts).astype(np.uint32),
            "indptr": indptr, "bptr": bp, "w_max": w_max}


def as_version2(ix, dst: Path) -> Path:
    """The format 2 file of a packed index, as the version 2 writer laid it out: idf and
    bit_row per term, doc_len beside the codes, the wide per-term and per-block arrays."""
    a = ix._file.arrays
    toc = ix._file.toc
    arrays = dict(a)
    arrays.update(wide_arrays(ix))
    arrays["idf"] = term_idf(ix._idf, ix.df, np.arange(ix.n_terms))
    row = np.full(ix.n_terms, -1, np.int32)
    row[a["bit_terms"]] = np.arange(len(a["bit_terms"]), dtype=np.int32)
    arrays["bit_row"] = row
    arrays["doc_len"] = np.asarray(ix.doc_len, np.uint32)
    for name in ("idf_df", "idf_val", "bit_terms", "last_count", "wmax_terms", "wmax_q", *FC_ARRAYS):
        arrays.pop(name, None)
    arrays.update(hash_vocab_arrays(*ix.vocab.terms()))  # format 4's front-coded vocabulary as a hash table
    ordered = {n: arrays.pop(n) for n in _V2_ORDER if n in arrays}
    ordered.update(arrays)
    scalars = {k: getattr(toc, k) for k in ("k1", "b", "n_docs", "n_terms", "total_len", "bucket", "buckets",
                                            "corpus_docs", "corpus_len", "layout")}
    write_file(dst, ordered, scalars, version=2)
    return dst


@pytest.fixture(scope="module")
def both(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("v3")
    docs, queries = zipf_corpus(3000, n_vocab=800, seed=11, max_len=60)
    raw, _ = count_postings(docs)
    ids = [f"d{i:05d}" for i in range(len(docs))]
    with pytest.MonkeyPatch.context() as mp:  # long lists get bitsets (normally from 65,536 docs)
        mp.setattr(bm25, "BITSET_MIN_DOCS", 0)
        v3 = open_index(write_packed(raw, tmp / "lex.packed", k1=1.5, b=0.75, doc_ids=ids))
    v2 = open_index(as_version2(v3, tmp / "lex2.packed"))
    return v3, v2, docs, queries


def test_format3_stores_the_compact_tables(both):
    v3, v2, _docs, _queries = both
    a3, a2 = v3._file.arrays, v2._file.arrays
    assert v3._file.toc.version == FORMAT_VERSION == 4 and v2._file.toc.version == 2
    assert {"idf", "bit_row", "doc_len"}.isdisjoint(a3) and {"idf_df", "idf_val", "bit_terms"} <= set(a3)
    assert len(a3["bit_terms"]) == a3["bits"].shape[0] > 0  # the bitset routes are exercised
    assert len(a3["idf_val"]) == len(np.unique(v3.df)) < v3.n_terms
    # The same floats per term as a per-term array (picked from it, never recomputed).
    assert np.array_equal(term_idf(v3._idf, v3.df, np.arange(v3.n_terms)), a2["idf"])
    assert np.array_equal(v3.doc_len, a2["doc_len"]) and not v3.doc_len.flags.writeable
    assert v3.path.stat().st_size < v2.path.stat().st_size
    v3.verify()
    v2.verify()


@pytest.mark.parametrize("kernel", ["auto", "numpy"])
def test_a_format2_file_answers_as_its_format3_twin(both, kernel):
    v3, v2, docs, queries = both
    if kernel == "numpy":
        v3, v2 = open_index(v3.path, kernel="numpy"), open_index(v2.path, kernel="numpy")
    mask = np.random.default_rng(2).random(len(docs)) < 0.3
    few = np.flatnonzero(np.random.default_rng(3).random(len(docs)) < 0.01)
    for q in queries[:40]:
        got = v3.search(q, k=10)
        same(got, v2.search(q, k=10))
        r_ids, r_sc = ref_top(q, docs, 10)
        assert got.ids.tolist() == r_ids and np.allclose(got.scores, r_sc, atol=1e-9, rtol=0)
        same(v3.search(q, k=10, candidates=mask), v2.search(q, k=10, candidates=mask))
        same(v3.search(q, k=10, candidates=few), v2.search(q, k=10, candidates=few))
    b3, b2 = v3.search_batch_arrays(queries[:40], k=10), v2.search_batch_arrays(queries[:40], k=10)
    for x, y in zip(b3, b2, strict=True):
        assert np.array_equal(x, y)


def test_a_segment_keeps_its_corpus_idf_per_term(tmp_path):
    docs, queries = zipf_corpus(400, seed=4)
    raw, _ = count_postings(docs)
    raw = replace(raw, corpus_docs=1000, corpus_len=int(np.asarray(raw.doc_len).sum()) * 3,
                  corpus_df=np.diff(raw.indptr) * 2 + 1)  # not a function of the local df
    ix = open_index(write_packed(raw, tmp_path / "seg.packed", k1=1.2, b=0.75))
    a = ix._file.arrays
    assert "idf" in a and "idf_df" not in a and len(a["idf"]) == ix.n_terms
    ix.verify()
    v2 = open_index(as_version2(ix, tmp_path / "seg2.packed"))
    numpy_ix = open_index(ix.path, kernel="numpy")
    for q in queries[:20]:
        got = ix.search(q, k=10)
        same(got, v2.search(q, k=10))
        by_numpy = numpy_ix.search(q, k=10)  # another summation order: the last bit may differ
        assert got.ids.tolist() == by_numpy.ids.tolist() and np.allclose(got.scores, by_numpy.scores, rtol=1e-12)


def test_idf_table_refuses_an_idf_that_is_not_a_function_of_df():
    keys, vals = idf_table(np.array([3, 1, 3, 2]), np.array([0.5, 2.0, 0.5, 1.0]))
    assert keys.tolist() == [1, 2, 3] and vals.tolist() == [2.0, 1.0, 0.5]
    with pytest.raises(ValueError, match="per term"):
        idf_table(np.array([3, 3]), np.array([0.5, 0.6]))


def test_a_flipped_table_byte_is_caught_at_open(tmp_path, both):
    v3 = both[0]
    spec = v3._file.toc.arrays["idf_val"]
    raw = bytearray(v3.path.read_bytes())
    raw[spec.offset + 3] ^= 0x10
    bad = tmp_path / "bad.packed"
    bad.write_bytes(bytes(raw))
    with pytest.raises(CorruptIndexError, match="checksum"):
        open_index(bad)


def test_a_refresh_merges_a_format2_previous_file_into_format3(tmp_path):
    from tests.test_bm25_merge import _build, _corpus, _edit, _merge, _queries, assert_same_answers

    old = _corpus(n=1500)
    prev3 = open_index(_build(tmp_path / "prev.packed", old, "packed"))
    prev2 = as_version2(prev3, tmp_path / "prev2.packed")
    new, changed = _edit(old)
    _merge(prev2, tmp_path / "from2.packed", new, "packed", "auto", changed)
    _merge(prev3.path, tmp_path / "from3.packed", new, "packed", "auto", changed)
    from2, from3 = open_index(tmp_path / "from2.packed"), open_index(tmp_path / "from3.packed")
    assert from2._file.toc.version == FORMAT_VERSION and from2.path.read_bytes() == from3.path.read_bytes()
    assert_same_answers(from2, open_index(_build(tmp_path / "fresh.packed", new, "packed")), len(new), _queries())


def test_an_older_file_reads_as_the_narrowed_arrays(both):
    """A format 2 file (wide pointers, offsets and exact bounds) is read through this
    version's narrowed shapes (``packed_tables.narrowed``): the very arrays its twin stores,
    so one set of kernels answers both."""
    v3, v2, _docs, _queries = both
    a3, a2 = v3._file.arrays, v2._file.arrays
    assert "last_count" not in v2._file.toc.arrays and v2._file.toc.arrays["blk_bmax"].dtype == "<f8"
    for name in ("bptr", "last_count", "wmax_terms", "wmax_q", *BLOCK_ARRAYS):
        assert a2[name].dtype == a3[name].dtype and np.array_equal(a2[name], a3[name]), name
    assert np.array_equal(v2.indptr, v3.indptr) and np.array_equal(v2.df, v3.df)


def test_narrowed_bounds_only_loosen():
    w = np.concatenate([np.linspace(0.0, 1.0, 100_003), np.random.default_rng(5).random(10_000)])
    q = quantize_bmax(w).astype(np.float64)
    assert (q * BMAX_STEP >= w).all() and ((q == 0) | ((q - 1) * BMAX_STEP < w)).all()
    assert np.array_equal(narrow_maxtf(np.array([1, 254, 255, 256, 70_000])), [1, 254, 255, 255, 255])
    with pytest.raises(ValueError, match="buckets"):
        to_u32(np.array([0, 1 << 32], np.int64), "postings words")
