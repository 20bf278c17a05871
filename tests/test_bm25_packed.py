"""The packed postings layout answers exactly as the plain one and the reference formula
(same top-k, same ties, identical scores), unfiltered, filtered, batched, segmented and
through the numpy fallback; and a damaged packed file is a clear error naming it."""

import struct
import zlib
from collections import Counter
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from ragspine_pipeline.retrieval.lexical.format.file import (
    FORMAT_VERSION,
    HEADER_BYTES,
    CorruptIndexError,
    IndexVersionError,
    doc_bucket,
    pack_header,
)
from ragspine_pipeline.retrieval.lexical.index.bm25 import bm25_scores
from ragspine_pipeline.retrieval.lexical.index.mapped import MappedBM25Index, open_index
from ragspine_pipeline.retrieval.lexical.index.packed import (
    BLOCK_SIZE,
    PackedArrays,
    decode_term,
    encode,
)
from ragspine_pipeline.retrieval.lexical.index.packed_index import PackedBM25Index
from ragspine_pipeline.retrieval.lexical.index.postings import count_postings
from ragspine_pipeline.retrieval.lexical.refresh.publish import (
    write_layout,
    write_packed,
    write_plain,
)
from tests.test_bm25_mmap import KERNELS, SHARED_EVAL, damaged_outcome, zipf_corpus  # noqa: E402  (the same sets and kernels)


def publish_both(tmp_path: Path, docs, *, name: str = "lex", kernel: str = "auto", **kw):
    """(packed index, plain index) of the same documents, both published and mapped."""
    raw, _vocab = count_postings(docs)
    ids = [f"doc-{i:06d}" for i in range(len(docs))]
    packed = write_packed(raw, tmp_path / f"{name}.packed", k1=1.5, b=0.75, doc_ids=ids, **kw)
    plain = write_plain(raw, tmp_path / f"{name}.plain", k1=1.5, b=0.75, doc_ids=ids, **kw)
    return open_index(packed, kernel=kernel), open_index(plain, kernel=kernel)


def same(a, b) -> None:
    assert a.ids.tolist() == b.ids.tolist()
    assert np.array_equal(a.scores, b.scores)  # bit for bit: the same operations in the same order


def ref_top(q, docs, k, positions=None):
    pos = list(range(len(docs))) if positions is None else [int(x) for x in positions]
    ref = bm25_scores(q, [docs[i] for i in pos])
    order = sorted((j for j, s in enumerate(ref) if s > 0), key=lambda j: (-ref[j], j))[:k]
    return [pos[j] for j in order], [ref[j] for j in order]


def test_codec_round_trips_every_list_and_the_plain_bounds(monkeypatch):
    from ragspine_pipeline.retrieval.lexical.index import packed as bm25_packed
    from ragspine_pipeline.retrieval.lexical.index import packed_narrow as bm25_packed_narrow
    from ragspine_pipeline.retrieval.lexical.index.postings import postings_from_raw

    docs, _ = zipf_corpus(3000, seed=11)
    docs[5] = ["w0"] * 300 + ["w7"] * 70_000  # tf > 255 and > 65535: wide tf fields
    raw, _ = count_postings(docs)
    enc = encode(raw, 1.5, 0.75)
    data = np.concatenate(list(enc.words()))
    terms = enc.term_arrays()
    pk = PackedArrays(data=data, bptr=terms["bptr"], last_count=terms["last_count"], code_len=enc.code_len,
                      **enc.blocks)
    for t in range(raw.n_terms):
        d, f = decode_term(pk, t)
        s, e = raw.indptr[t], raw.indptr[t + 1]
        assert np.array_equal(d, raw.indices[s:e]) and np.array_equal(f, raw.tf[s:e])
    plain = postings_from_raw(raw, 1.5, 0.75, 1 << 30)
    # The narrowed bounds (index.packed_narrow): the least q x BMAX_STEP >= the exact max w.
    step = bm25_packed_narrow.BMAX_STEP
    q = enc.blocks["blk_bmax"].astype(np.float64)
    assert (q * step >= plain.bmax).all() and ((q == 0) | ((q - 1) * step < plain.bmax)).all()
    assert (enc.w_max >= plain.w_max).all() and (enc.w_max - plain.w_max < 2 * step).all()
    assert np.array_equal(enc.code_len[enc.blocks["blk_minlen"]], np.minimum.reduceat(
        raw.doc_len[raw.indices], np.arange(0, raw.n_postings, 1)[np.concatenate(
            [np.arange(raw.indptr[t], raw.indptr[t + 1], BLOCK_SIZE) for t in range(raw.n_terms)])]))
    assert int(enc.blocks["blk_maxtf"].max()) == bm25_packed_narrow.MAXTF_SAT  # tf 70,000 saturates
    assert np.array_equal(enc.idf, plain.idf)
    monkeypatch.setattr(bm25_packed, "compiled", lambda: None)  # the numpy encoder: the same bytes
    enc_np = encode(raw, 1.5, 0.75)
    assert np.array_equal(np.concatenate(list(enc_np.words())), data)
    assert all(np.array_equal(enc_np.blocks[x], enc.blocks[x]) for x in enc.blocks)
    assert len(data) * 4 < 0.25 * raw.n_postings * 13  # far below the plain layout's 13 bytes a posting


@pytest.mark.parametrize("kernel", KERNELS)
def test_packed_equals_plain_and_reference(tmp_path, kernel):
    docs, queries = zipf_corpus(3000, seed=1)
    docs[7] = ["w2"] * 400  # tf > 255
    packed, plain = publish_both(tmp_path, docs, kernel=kernel)
    assert isinstance(packed, PackedBM25Index) and isinstance(plain, MappedBM25Index)
    assert packed.kernel == plain.kernel == kernel
    assert (packed.n_docs, packed.total_len, packed.avgdl) == (plain.n_docs, plain.total_len, plain.avgdl)
    for q in queries:
        for k in (1, 10, 100, 5000):  # k > N included
            same(packed.search(q, k=k), plain.search(q, k=k))
        assert np.array_equal(packed.get_scores(q), plain.get_scores(q))
        r_ids, r_scores = ref_top(q, docs, 10)
        res = packed.search(q, k=10)
        assert res.ids.tolist() == r_ids and np.allclose(res.scores, r_scores, atol=1e-9, rtol=0)
    got = packed.search_batch(queries, k=10, threads=2)
    for q, r in zip(queries, got, strict=True):
        same(r, plain.search(q, k=10))
    ids, sc, cnt = packed.search_batch_arrays(queries, k=10)
    want = plain.search_batch_arrays(queries, k=10)
    assert np.array_equal(ids, want[0]) and np.array_equal(sc, want[1]) and np.array_equal(cnt, want[2])
    assert packed.doc_ids([0, 17]) == ["doc-000000", "doc-000017"]
    assert packed.same_doc_ids([f"doc-{i:06d}" for i in range(len(docs))])
    assert packed.nbytes < plain.nbytes / 3


@pytest.mark.parametrize("bitsets", [False, True])
@pytest.mark.parametrize("keep", [0.5, 0.05, 0.001, 0.0001])
def test_filtered_equality_at_every_selectivity(tmp_path, monkeypatch, keep, bitsets):
    from ragspine_pipeline.retrieval.lexical.index import bm25

    if bitsets:  # long lists get popcount bitsets (normally only from 65,536 docs)
        monkeypatch.setattr(bm25, "BITSET_MIN_DOCS", 0)
    docs, queries = zipf_corpus(20_000, n_vocab=300, seed=2, max_len=25)
    packed, plain = publish_both(tmp_path, docs)
    assert (packed._file.arrays["bits"].shape[0] > 0) == bitsets
    packed_np = open_index(packed.path, kernel="numpy")
    plain_np = open_index(plain.path, kernel="numpy")
    rng = np.random.default_rng(int(keep * 1e4))
    mask = rng.random(len(docs)) < keep
    mask[[3, 11]] = True
    pos = np.flatnonzero(mask)
    for q in queries[:12] + queries[-3:]:
        res = packed.search(q, k=10, candidates=mask)
        same(res, plain.search(q, k=10, candidates=mask))
        same(packed_np.search(q, k=10, candidates=pos), plain_np.search(q, k=10, candidates=mask))
        r_ids, r_scores = ref_top(q, docs, 10, pos)  # N, df and avgdl over the survivors
        assert res.ids.tolist() == r_ids and np.allclose(res.scores, r_scores, atol=1e-9, rtol=0)
        assert np.array_equal(packed.get_scores(q, mask), plain.get_scores(q, mask))


@pytest.mark.parametrize("kernel", [pytest.param("numba", marks=pytest.mark.slow), "numpy"])
def test_without_length_codes_weights_come_from_the_lengths(tmp_path, monkeypatch, kernel):
    """A corpus of more than 65,536 distinct lengths has no length codes: the kernels then
    index the weight tables by length (and compute past them); the answers do not change.
    The numba twin is slow: it compiles every packed entry point for uint32 lengths
    (~100 s cold), for a corpus shape that needs documents of 65,536+ distinct lengths."""
    from ragspine_pipeline.retrieval.lexical.index import packed_index as bm25_packed_index
    from ragspine_pipeline.retrieval.lexical.refresh import publish as bm25_publish

    monkeypatch.setattr(bm25_publish, "length_codes", lambda doc_len: None)
    monkeypatch.setattr(bm25_packed_index, "_TABLE_MAX", 30)  # longer documents computed in the kernel
    docs, queries = zipf_corpus(3000, seed=12, max_len=60)
    packed, plain = publish_both(tmp_path, docs, kernel=kernel)
    assert "doc_code" not in packed._file.arrays
    mask = np.random.default_rng(2).random(len(docs)) < 0.3
    for q in queries:
        same(packed.search(q, k=10), plain.search(q, k=10))
        same(packed.search(q, k=10, candidates=mask), plain.search(q, k=10, candidates=mask))


def test_degenerate_corpora(tmp_path):
    cases = ([[]], [[], []], [["a"]], [["a", "a", "b"], []], [["a"]] * 300,  # a term in every doc
             [["x"] * 1000, ["x", "y"], []])
    for i, docs in enumerate(cases):
        for kernel in KERNELS:
            packed, plain = publish_both(tmp_path, docs, name=f"d{i}", kernel=kernel)
            packed.verify()
            everyone = np.ones(len(docs), bool)
            for q in (["a"], ["b", "a"], ["zz"], [], ["x", "y", "x"]):
                for k in (1, 5, 1000):
                    same(packed.search(q, k=k), plain.search(q, k=k))
                    same(packed.search(q, k=k, candidates=everyone), plain.search(q, k=k, candidates=everyone))


def test_write_layout_dispatches_on_the_chosen_layout(tmp_path, monkeypatch):
    docs, _ = zipf_corpus(200)
    raw, _ = count_postings(docs)
    assert isinstance(open_index(write_layout(raw, tmp_path / "a", layout="packed", k1=1.2, b=0.7)),
                      PackedBM25Index)
    assert isinstance(open_index(write_layout(raw, tmp_path / "b", layout="plain", k1=1.2, b=0.7)),
                      MappedBM25Index)
    monkeypatch.setenv("RAGSPINE_BM25_LAYOUT", "auto")
    monkeypatch.setenv("RAGSPINE_BM25_PACKED_FROM", str(raw.n_postings))
    ix = open_index(write_layout(raw, tmp_path / "c", k1=1.2, b=0.7))
    assert isinstance(ix, PackedBM25Index) and (ix.k1, ix.b) == (1.2, 0.7)
    monkeypatch.setenv("RAGSPINE_BM25_PACKED_FROM", str(raw.n_postings + 1))
    assert isinstance(open_index(write_layout(raw, tmp_path / "d", k1=1.2, b=0.7)), MappedBM25Index)


def test_packed_segments_keep_the_corpus_statistics(tmp_path):
    from ragspine_pipeline.retrieval.lexical.refresh.segments import open_segments, segment_name

    docs, queries = zipf_corpus(2500, n_vocab=150, seed=5, max_len=30)
    ids = [f"chunk-{i:05d}" for i in range(len(docs))]
    buckets = 3
    df = Counter(t for d in docs for t in set(d))
    total = sum(map(len, docs))
    bucket_of = np.array([doc_bucket(d, buckets) for d in ids])
    for bk in range(buckets):
        pos = np.flatnonzero(bucket_of == bk)
        raw, vocab = count_postings([docs[i] for i in pos])
        raw = replace(raw, corpus_docs=len(docs), corpus_len=total,
                      corpus_df=np.array([df[t] for t in vocab], np.int64))
        write_packed(raw, tmp_path / segment_name(bk, buckets), k1=1.5, b=0.75, doc_ids=[ids[i] for i in pos],
                     bucket=bk, buckets=buckets, global_pos=pos)
    seg = open_segments(tmp_path)
    assert all(isinstance(s, PackedBM25Index) for s in seg.segments)
    for q in queries:
        r_ids, r_scores = ref_top(q, docs, 10)
        got = seg.search(q, k=10)
        assert got.ids.tolist() == r_ids and np.allclose(got.scores, r_scores, atol=1e-9, rtol=0)
    mask = np.random.default_rng(1).random(len(docs)) < 0.2
    for q in queries[:10]:
        r_ids, r_scores = ref_top(q, docs, 10, np.flatnonzero(mask))
        got = seg.search(q, k=10, candidates=mask)
        assert got.ids.tolist() == r_ids and np.allclose(got.scores, r_scores, atol=1e-12, rtol=0)


@pytest.mark.parametrize("name", sorted(p.name for p in SHARED_EVAL.iterdir() if (p / "corpus.jsonl").exists())
                         if SHARED_EVAL.is_dir() else [])
def test_every_shared_set_packed_equals_plain(tmp_path, name):
    from ragspine_pipeline.eval.beir import load_beir
    from ragspine_pipeline.retrieval.lexical.analysis.analyzer import make_analyzer

    ds = load_beir(SHARED_EVAL / name)
    an = make_analyzer("unicode")
    docs = [an(f"{d.title}\n\n{d.text}") for d in ds.corpus.values()]
    queries = [an(ds.queries[q]) for q in ds.judged_queries[:50]]
    packed, plain = publish_both(tmp_path, docs)
    mask = np.random.default_rng(5).random(len(docs)) < 0.1
    for q in queries:
        same(packed.search(q, k=100), plain.search(q, k=100))
        same(packed.search(q, k=10, candidates=mask), plain.search(q, k=10, candidates=mask))
    for q in queries[:5]:
        r_ids, r_scores = ref_top(q, docs, 100)
        assert np.allclose(packed.search(q, k=100).scores, r_scores, atol=1e-9, rtol=0)


# --------------------------------------------------------------------- damage
def test_truncated_and_bit_flipped_packed_files_are_clear_errors(tmp_path):
    docs, queries = zipf_corpus(3000, seed=4)
    packed, _plain = publish_both(tmp_path, docs)
    raw = packed.path.read_bytes()
    bad = tmp_path / "bad.packed"
    for size in (0, 10, HEADER_BYTES, HEADER_BYTES + 1000, len(raw) // 2, len(raw) - 40, len(raw) - 1):
        bad.write_bytes(raw[:size])
        with pytest.raises(CorruptIndexError, match="bad.packed"):
            open_index(bad)
    rng = np.random.default_rng(9)
    positions = list(rng.integers(0, len(raw), 50)) + [0, 9, 61, len(raw) - 5, len(raw) - 30]
    outcomes = []
    for at in positions:
        flipped = bytearray(raw)
        flipped[int(at)] ^= 1 << int(rng.integers(0, 8))
        bad.write_bytes(bytes(flipped))
        outcomes.append(damaged_outcome(bad, docs, queries, packed))  # the intact packed index
    assert outcomes == ["error"] * len(positions)


def test_a_flip_in_packed_words_fails_the_first_query_that_reads_them(tmp_path):
    docs, queries = zipf_corpus(16_000, seed=6)  # words past the first checksum block (64 KiB)
    packed, _plain = publish_both(tmp_path, docs)
    t = packed.vocab.get("w0")
    spec = packed._toc.arrays["data"]
    assert spec.nbytes > 2 * 65536  # the tables verified at open lie in later blocks
    at = spec.offset + 4 * int(packed._file.arrays["blk_off"][packed._file.arrays["bptr"][t]]) + 1
    raw = bytearray(packed.path.read_bytes())
    raw[at] ^= 0x10
    packed.path.write_bytes(bytes(raw))
    damaged = open_index(packed.path)
    with pytest.raises(CorruptIndexError, match="checksum mismatch") as err:
        damaged.search(["w0"], k=10)
    assert str(packed.path) in str(err.value)


@pytest.mark.parametrize("numba", [True, False])
def test_a_writer_bug_is_caught_by_the_structure_checks(tmp_path, monkeypatch, numba):
    from ragspine_pipeline.retrieval.lexical.index import (
        packed as bm25_packed,
    )
    from ragspine_pipeline.retrieval.lexical.index import (
        packed_verify as bm25_packed_verify,
    )

    if not numba:  # the numpy encoder and the numpy full check
        monkeypatch.setattr(bm25_packed, "compiled", lambda: None)
        monkeypatch.setattr(bm25_packed_verify, "compiled", lambda: None)
    docs, _ = zipf_corpus(500, seed=7)
    raw, _ = count_postings(docs)
    real = bm25_packed._encode_slice

    def skewed(enc, b0, b1, base):  # right checksums, wrong skip data
        words = real(enc, b0, b1, base)
        enc.blocks["blk_last"][b0] += 1
        return words

    monkeypatch.setattr(bm25_packed, "_encode_slice", skewed)
    with pytest.raises(CorruptIndexError, match="skip data"):
        write_packed(raw, tmp_path / "skewed.packed", k1=1.5, b=0.75)
    assert not list(tmp_path.iterdir())  # nothing published, no temp file left


def test_newer_version_or_unknown_layout_names_both(tmp_path):
    docs, _ = zipf_corpus(100)
    packed, _plain = publish_both(tmp_path, docs)
    raw = bytearray(packed.path.read_bytes())
    head = struct.unpack_from("<8sIIQQQIIQI", raw)
    assert head[1] == FORMAT_VERSION == 4
    for version in (FORMAT_VERSION + 1, 0):
        bad = bytearray(raw)
        bad[:HEADER_BYTES] = pack_header(head[3], head[4], head[5], head[6], head[8], version=version)
        packed.path.write_bytes(bytes(bad))
        with pytest.raises(IndexVersionError) as err:
            open_index(packed.path)
        assert f"version {version}" in str(err.value) and f"version {FORMAT_VERSION}" in str(err.value)
    # A packed TOC in a version 1 file (which predates layouts) is refused, naming the layout.
    toc_off, toc_len = head[4], head[5]
    toc = bytes(raw[toc_off:toc_off + toc_len])
    bad = bytearray(raw)
    bad[:HEADER_BYTES] = pack_header(head[3], toc_off, toc_len, zlib.crc32(toc), head[8], version=1)
    packed.path.write_bytes(bytes(bad))
    with pytest.raises(IndexVersionError, match="'packed'") as err:
        open_index(packed.path)
    assert str(packed.path) in str(err.value)


def test_block_boundaries_and_long_lists(tmp_path):
    """Lists of exactly 1, 127, 128, 129 and 3 x 128 postings, dense and sparse ids."""
    rng = np.random.default_rng(3)
    n = 2000
    docs = [[] for _ in range(n)]
    for term, df in (("a", 1), ("b", BLOCK_SIZE - 1), ("c", BLOCK_SIZE), ("d", BLOCK_SIZE + 1),
                     ("e", 3 * BLOCK_SIZE), ("f", n)):
        for d in rng.choice(n, size=df, replace=False):
            docs[d] += [term] * int(rng.integers(1, 4))
    packed, plain = publish_both(tmp_path, docs)
    packed.verify()
    for q in (["a"], ["b", "c"], ["d", "e", "f"], ["f"], ["e", "e", "a"]):
        for k in (1, 10, 300):
            same(packed.search(q, k=k), plain.search(q, k=k))
        t = packed.vocab.get(q[0])
        assert packed.indices[packed.indptr[t]:packed.indptr[t + 1]].tolist() == \
            plain.indices[plain.indptr[t]:plain.indptr[t + 1]].tolist()


@pytest.mark.slow
def test_a_million_documents_packed_equals_plain(tmp_path):
    """1M synthetic Zipf documents through the packed and plain layouts: identical answers."""
    rng = np.random.default_rng(7)
    n, v = 1_000_000, 50_000
    p = 1.0 / np.arange(1, v + 1) ** 1.1
    p /= p.sum()
    lens = np.maximum(rng.poisson(30, n), 1)
    docs_t = rng.choice(v, size=int(lens.sum()), p=p).astype(np.int64)
    doc_of = np.repeat(np.arange(n, dtype=np.int64), lens)
    keys, tf = np.unique(docs_t * n + doc_of, return_counts=True)
    terms = keys // n
    from ragspine_pipeline.retrieval.lexical.format.raw import RawPostings

    indptr = np.zeros(v + 1, np.int64)
    np.cumsum(np.bincount(terms, minlength=v), out=indptr[1:])
    raw = RawPostings(indptr=indptr, indices=(keys % n).astype(np.int32), tf=tf.astype(np.uint8),
                      doc_len=lens.astype(np.uint32), terms=[f"w{i}" for i in range(v)])
    packed = open_index(write_packed(raw, tmp_path / "m.packed", k1=1.5, b=0.75))
    plain = open_index(write_plain(raw, tmp_path / "m.plain", k1=1.5, b=0.75))
    queries = [[f"w{t}" for t in rng.choice(v, size=int(rng.integers(2, 6)), p=p)] for _ in range(100)]
    mask = rng.random(n) < 0.05
    for q in queries:
        same(packed.search(q, k=10), plain.search(q, k=10))
        same(packed.search(q, k=10, candidates=mask), plain.search(q, k=10, candidates=mask))
