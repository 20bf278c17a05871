"""Format 4's vocabulary (#47 item 4, bytes T3): term ids in the lexicographic order of the
terms' UTF-8 bytes in every file written from counted postings, the front-coded dictionary
(every term and every absent token looked up right, whatever its bytes), its structure
checked at publish, and older hash-table files still open, answer identically and refresh
into the new vocabulary."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ragspine_pipeline.retrieval.lexical.format import vocab_fc
from ragspine_pipeline.retrieval.lexical.format.file import (
    FORMAT_VERSION,
    CorruptIndexError,
    hash_vocab_arrays,
    write_file,
)
from ragspine_pipeline.retrieval.lexical.format.raw_order import TermOrderView, sorted_raw
from ragspine_pipeline.retrieval.lexical.index.bm25 import BM25Index
from ragspine_pipeline.retrieval.lexical.index.mapped import open_index
from ragspine_pipeline.retrieval.lexical.index.postings import count_postings
from ragspine_pipeline.retrieval.lexical.refresh.merge import merge_index_file, plan_merge
from ragspine_pipeline.retrieval.lexical.refresh.publish import (
    write_index,
    write_packed,
    write_plain,
)

K1, B = 1.2, 0.75
WRITERS = {"plain": write_plain, "packed": write_packed}


def awkward_terms() -> list[str]:
    """Terms whose bytes stress the dictionary: shared 8-byte prefixes (equal head keys),
    NUL bytes, a term that is a prefix of others, long terms, non-ASCII, the empty term."""
    terms = [f"prefix-shared-{i:04d}" for i in range(300)]
    terms += ["ab", "ab\x00", "ab\x00\x00", "abc", "a", "", "é", "éa", "營收", "下滑", "Ωmega", "\U0001f600"]
    terms += ["x" * 300, "x" * 300 + "y", "x" * 299, "z" * 70000]  # lengths past u8 (and u16) fields
    terms += [f"w{i}" for i in range(1, 1200, 7)]
    return terms


def corpus(seed: int = 0, n: int = 600) -> list[list[str]]:
    rng = np.random.default_rng(seed)
    terms = awkward_terms()
    docs = [[terms[int(t)] for t in rng.integers(0, len(terms), int(rng.integers(0, 25)))] for _ in range(n)]
    docs[1] = list(terms)  # every term held somewhere
    return docs


def absent_tokens(terms: list[str]) -> list[str]:
    out = ["prefix-shared-", "prefix-shared-0300", "prefix-shared-00", "ab\x00\x00\x00", "aa", "b", "ww", "w0",
           "x" * 301, "z" * 69999, "\U0010ffff", "\x00", "prefix-shared-0005\x00", "Ω", "營"]
    known = set(terms)
    return [t for t in out if t not in known]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fc")
    docs = corpus()
    raw, vocab = count_postings(docs)
    out = {name: open_index(w(raw, tmp / f"{name}.rsbm25", k1=K1, b=B)) for name, w in WRITERS.items()}
    return docs, raw, vocab, out


@pytest.mark.parametrize("layout", list(WRITERS))
def test_ids_are_the_lexicographic_order_and_every_term_is_found(files, layout):
    docs, raw, vocab, out = files
    ix = out[layout]
    toc = ix._file.toc
    assert toc.version == FORMAT_VERSION == 4 and toc.vocab_block == vocab_fc.VOCAB_BLOCK
    assert not {"vocab_hash", "vocab_tid", "vocab_off", "vocab_blob"} & set(toc.arrays)
    want = sorted(vocab, key=lambda t: t.encode("utf-8", "surrogatepass"))
    assert [ix.vocab.term(t) for t in range(len(ix.vocab))] == want
    off, blob = ix.vocab.terms()
    assert [blob[off[i]:off[i + 1]].tobytes().decode() for i in range(len(want))] == want
    for tid, term in enumerate(want):
        assert ix.vocab.get(term) == tid and term in ix.vocab
    for token in absent_tokens(want):
        assert ix.vocab.get(token) is None and token not in ix.vocab
    ix.verify()
    # The postings follow the ids: term t's are the in-memory count's of the same term.
    for term in ("ab", "prefix-shared-0007", "", "z" * 70000):
        t_old, t_new = vocab[term], ix.vocab.get(term)
        s, e = raw.indptr[t_old], raw.indptr[t_old + 1]
        assert np.array_equal(np.asarray(ix.indices[ix.indptr[t_new]:ix.indptr[t_new + 1]]), raw.indices[s:e])


@pytest.mark.parametrize("layout", list(WRITERS))
def test_answers_are_the_in_memory_index_s(files, layout):
    docs, _raw, _vocab, out = files
    built = BM25Index(docs, k1=K1, b=B)
    rng = np.random.default_rng(3)
    terms = awkward_terms()
    for _ in range(30):
        q = [terms[int(t)] for t in rng.integers(0, len(terms), 3)] + ["absent-token"]
        got, ref = out[layout].search(q, k=10), built.search(q, k=10)
        assert got.ids.tolist() == ref.ids.tolist() and np.allclose(got.scores, ref.scores, rtol=1e-12, atol=0)


def test_an_index_built_in_memory_keeps_the_hash_table(tmp_path):
    """``write_index`` writes the built index's own ids; out of order, they get the hash table."""
    docs = corpus(n=100)
    built = BM25Index(docs, k1=K1, b=B)
    ix = open_index(write_index(built, tmp_path / "h.rsbm25"))
    assert ix._file.toc.vocab_block == 0 and "vocab_hash" in ix._file.toc.arrays
    assert {t: ix.vocab.get(t) for t in built.vocab} == dict(built.vocab)
    ix.verify()


def as_hash_file(ix, dst: Path, version: int = 3) -> Path:
    """The same index with the hash-table vocabulary of formats 1-3 (the same term ids)."""
    a, toc = ix._file.arrays, ix._file.toc
    arrays = {n: v for n, v in a.items() if n not in vocab_fc.FC_ARRAYS}
    arrays.update(hash_vocab_arrays(*ix.vocab.terms()))
    scalars = {k: getattr(toc, k) for k in ("k1", "b", "n_docs", "n_terms", "total_len", "bucket", "buckets",
                                            "corpus_docs", "corpus_len", "layout")}
    write_file(dst, arrays, scalars, version=version)
    return dst


@pytest.mark.parametrize("layout", list(WRITERS))
def test_a_hash_table_file_answers_as_its_front_coded_twin(files, tmp_path, layout):
    docs, _raw, vocab, out = files
    new = out[layout]
    old = open_index(as_hash_file(new, tmp_path / "old.rsbm25"))
    assert old._file.toc.version == 3 and old._file.toc.vocab_block == 0
    old.verify()
    for term in vocab:
        assert old.vocab.get(term) == new.vocab.get(term)
    for token in absent_tokens(list(vocab)):
        assert old.vocab.get(token) is None
    rng = np.random.default_rng(5)
    terms = awkward_terms()
    for _ in range(20):
        q = [terms[int(t)] for t in rng.integers(0, len(terms), 3)]
        a, b = old.search(q, k=10), new.search(q, k=10)
        assert a.ids.tolist() == b.ids.tolist() and np.array_equal(a.scores, b.scores)


@pytest.mark.parametrize("layout", list(WRITERS))
def test_a_refresh_of_a_hash_table_file_writes_the_new_vocabulary(tmp_path, layout):
    docs = corpus(seed=2, n=300)
    ids = [f"c{i:05d}" for i in range(len(docs))]
    raw, _ = count_postings(docs)
    first = open_index(WRITERS[layout](raw, tmp_path / "v1.rsbm25", k1=K1, b=B, doc_ids=ids))
    old = open_index(as_hash_file(first, tmp_path / "v1_old.rsbm25"))
    new_docs = docs[5:] + [["brand-new", "ab"], ["aaa-new", "prefix-shared-0001"]]
    new_ids = ids[5:] + ["c99998", "c99999"]
    plan = plan_merge(old, new_ids)
    merge_index_file(old, tmp_path / "v2.rsbm25", plan, [[new_docs[i] for i in plan.added_pos.tolist()]],
                     k1=K1, b=B, doc_ids=new_ids, layout=layout)
    merged = open_index(tmp_path / "v2.rsbm25")
    fresh_raw, _ = count_postings(new_docs)
    fresh = open_index(WRITERS[layout](fresh_raw, tmp_path / "fresh.rsbm25", k1=K1, b=B, doc_ids=new_ids))
    assert merged._file.toc.vocab_block == vocab_fc.VOCAB_BLOCK
    assert (tmp_path / "v2.rsbm25").read_bytes() == (tmp_path / "fresh.rsbm25").read_bytes()
    merged.verify()
    assert merged.vocab.get("brand-new") == fresh.vocab.get("brand-new") is not None


def test_an_unsorted_or_malformed_dictionary_is_refused_at_publish(tmp_path, files):
    _docs, _raw, _vocab, out = files
    ix = out["packed"]
    a = dict(ix._file.arrays)
    toc = ix._file.toc
    scalars = {k: getattr(toc, k) for k in ("k1", "b", "n_docs", "n_terms", "total_len", "bucket", "buckets",
                                            "corpus_docs", "corpus_len", "layout", "vocab_block")}
    off, blob = ix.vocab.terms()
    swapped = np.arange(ix.n_terms)
    swapped[[3, 4]] = swapped[[4, 3]]  # two terms out of order: well formed, not sorted
    terms_off = np.concatenate([[0], np.cumsum(np.diff(off)[swapped])])
    terms_blob = np.concatenate([blob[off[t]:off[t + 1]] for t in swapped])
    bad = {**a, **vocab_fc.front_code(terms_off, terms_blob)}
    write_file(tmp_path / "unsorted.rsbm25", bad, scalars)
    with pytest.raises(CorruptIndexError, match="structure"):
        open_index(tmp_path / "unsorted.rsbm25").verify()
    lens = np.array(a["vocab_lens"])
    h = next(h for h in range(1, len(lens) // vocab_fc.VOCAB_BLOCK) if lens[h * vocab_fc.VOCAB_BLOCK] != vocab_fc.LONG)
    lens[h * vocab_fc.VOCAB_BLOCK] |= 0x10  # a head that is not whole
    write_file(tmp_path / "head.rsbm25", {**a, "vocab_lens": lens}, scalars)
    with pytest.raises(CorruptIndexError, match="structure"):
        open_index(tmp_path / "head.rsbm25").verify()
    assert vocab_fc.fc_problem(dict(open_index(tmp_path / "head.rsbm25")._file.arrays), ix.n_terms,
                               vocab_fc.VOCAB_BLOCK) == "vocabulary prefixes reach past the term before them"
    with pytest.raises(CorruptIndexError, match="vocabulary arrays are malformed"):
        open_index(tmp_path / "head.rsbm25").vocab.terms()  # every term at once: checked first too


def test_term_order_view_reads_what_a_gather_reads():
    rng = np.random.default_rng(7)
    df = rng.integers(0, 9, 50)
    indptr = np.concatenate([[0], np.cumsum(df)])
    indices = rng.integers(0, 1000, int(indptr[-1])).astype(np.int32)
    order = rng.permutation(50)
    new_ptr = np.concatenate([[0], np.cumsum(df[order])])
    want = np.concatenate([indices[indptr[t]:indptr[t + 1]] for t in order])
    view = TermOrderView(indices, indptr, order, new_ptr)
    assert np.array_equal(np.asarray(view), want) and len(view) == len(want) and view.dtype == np.int32
    for a, b in [(0, len(want)), (3, 17), (len(want) - 1, len(want)), (5, 5)]:
        assert np.array_equal(view[a:b], want[a:b])
    assert view[-1] == want[-1] and np.array_equal(view[10:2:-3], want[10:2:-3])


def test_a_view_over_a_copying_slice_reader_reads_runs_not_the_whole_base():
    """A base whose ``np.asarray`` would copy (``array_is_map`` False, e.g. another view) is
    read run by run through ``read``; the answer is the same gather."""
    rng = np.random.default_rng(11)
    df = rng.integers(0, 40, 300)
    indptr = np.concatenate([[0], np.cumsum(df)])
    indices = rng.integers(0, 10_000, int(indptr[-1])).astype(np.int32)
    o1, o2 = rng.permutation(300), rng.permutation(300)
    p1 = np.concatenate([[0], np.cumsum(df[o1])])
    inner = TermOrderView(indices, indptr, o1, p1)
    assert not inner.array_is_map

    def refuse(*_a, **_k):
        raise AssertionError("the whole base was gathered")

    inner.__array__ = refuse  # type: ignore[method-assign]
    p2 = np.concatenate([[0], np.cumsum(df[o1][o2])])
    outer = TermOrderView(inner, p1, o2, p2)
    want = np.concatenate([indices[indptr[t]:indptr[t + 1]] for t in o1[o2]])
    for a, b in [(0, len(want)), (100, 900), (len(want) - 7, len(want))]:
        assert np.array_equal(outer.read(a, b), want[a:b])


def test_sorted_raw_is_the_identity_on_sorted_terms_and_refuses_repeats():
    raw, _ = count_postings([["b", "a"], ["c", "a"]])
    s = sorted_raw(raw)
    assert list(s.terms) == ["a", "b", "c"] and sorted_raw(s) is s
    assert np.asarray(s.indices).tolist() == [0, 1, 0, 1] and s.indptr.tolist() == [0, 2, 3, 4]
    from dataclasses import replace

    with pytest.raises(ValueError, match="distinct"):
        sorted_raw(replace(raw, terms=["b", "a", "b"]))
