"""The streaming BM25 build: the same postings as the in-memory build however the corpus is
batched and however small the memory budget, the same answers once published (one file,
hash-bucket segments, the warehouse's lexical files)."""

import numpy as np
import pyarrow as pa
import pytest

from ragspine_pipeline.retrieval.chunking.chunking import Chunk, SourceLocator
from ragspine_pipeline.retrieval.hybrid.retriever import HybridRetriever
from ragspine_pipeline.retrieval.lexical.format.file import IndexFormatError
from ragspine_pipeline.retrieval.lexical.format.raw_order import sorted_raw
from ragspine_pipeline.retrieval.lexical.index.bm25 import BM25Index
from ragspine_pipeline.retrieval.lexical.index.mapped import open_index
from ragspine_pipeline.retrieval.lexical.index.postings import count_postings
from ragspine_pipeline.retrieval.lexical.refresh.segments import (
    open_segments,
    write_segments_stream,
)
from ragspine_pipeline.retrieval.lexical.refresh.stream_build import (
    StreamCounter,
    TermIds,
    build_index_file,
    count_stream,
    encode_batch,
)
from ragspine_pipeline.warehouse.lexical_files import (
    BM25_SEGMENTS,
    bm25_file,
    open_bm25_file,
    write_bm25_file,
)

LIST = pa.list_(pa.string())
LAYOUTS = ["plain", "packed"]


def zipf_docs(n: int, vocab: int = 400, seed: int = 0, max_len: int = 30) -> list[list[str]]:
    rng = np.random.default_rng(seed)
    p = 1.0 / np.arange(1, vocab + 1) ** 1.1
    p /= p.sum()
    return [[f"t{t}" for t in rng.choice(vocab, size=int(rng.integers(0, max_len)), p=p)] for _ in range(n)]


def awkward_docs() -> list[list[str]]:
    docs = zipf_docs(1500, seed=3)
    docs[0] = []  # empty documents, first and later
    docs[5] = ["x"] * 300 + ["t1"]  # tf > 255: a uint16 tf column
    docs[7] = []
    docs[8] = ["營收", "下滑", "é", "x", "", "Ωmega"]  # unicode, and the empty string is a term
    docs[-1] = []
    return docs


def as_batches(docs, size: int, form: str) -> list:
    parts = [docs[i:i + size] for i in range(0, len(docs), size)]
    parts.insert(1, [])  # a batch of zero documents
    if form == "arrow":
        return [pa.array(p, LIST) for p in parts]
    if form == "chunked":
        return [pa.chunked_array([pa.array(p[:50], LIST), pa.array(p[50:], LIST)]) for p in parts]
    return parts


def assert_same_raw(raw, vocab, ref, ref_vocab) -> None:
    """The streaming count is the in-memory one with term ids in lexicographic order (format 4)."""
    ref = sorted_raw(ref)
    assert [t.encode("utf-8", "surrogatepass") for t in raw.terms] == sorted(
        t.encode("utf-8", "surrogatepass") for t in ref_vocab)
    assert dict(vocab) == {t: i for i, t in enumerate(ref.terms)} and list(raw.terms) == list(ref.terms)
    for name in ("indptr", "indices", "tf", "doc_len"):
        got, want = np.asarray(getattr(raw, name)), np.asarray(getattr(ref, name))
        assert got.dtype == want.dtype and np.array_equal(got, want), name


@pytest.mark.parametrize("kernel", ["numpy", "auto"])
@pytest.mark.parametrize("run_postings", [None, 7, 997])
@pytest.mark.parametrize("form", ["python", "arrow", "chunked"])
def test_count_stream_equals_count_postings(tmp_path, kernel, run_postings, form):
    docs = awkward_docs()
    ref, ref_vocab = count_postings(docs)
    raw, vocab = count_stream(as_batches(docs, 333, form), tmp_dir=tmp_path, run_postings=run_postings,
                              kernel=kernel)
    assert_same_raw(raw, vocab, ref, ref_vocab)


def test_memory_budget_spills_runs_and_merges(tmp_path):
    docs = zipf_docs(6000, vocab=20000, max_len=80)
    counter = StreamCounter(tmp_path, memory_mib=1)  # runs of 65,536 postings
    for i in range(0, len(docs), 700):
        counter.add(pa.array(docs[i:i + 700], LIST))
    raw, vocab = counter.finish()
    assert raw.n_postings > 2 * 65_536 and len(counter.runs) >= 3 and isinstance(raw.indices, np.memmap)
    assert_same_raw(raw, vocab, *count_postings(docs))


def test_tokens_arrow_cannot_encode_take_the_python_path(tmp_path):
    docs = [["a", "\ud800"], ["\ud800", "b", "a"], [], ["c", "a", "\ud800"], ["d", "b"]]  # lone surrogates
    batches = [docs[:2], pa.array([["c", "a", "x"]], LIST), docs[2:4], pa.array([["d", "b"]], LIST)]
    raw, vocab = count_stream(batches, tmp_dir=tmp_path)
    assert_same_raw(raw, vocab, *count_postings(docs[:2] + [["c", "a", "x"]] + docs[2:4] + [["d", "b"]]))


def test_bad_batches_are_clear_errors(tmp_path):
    with pytest.raises(TypeError, match="list<string>"):
        encode_batch(pa.array([1, 2]), TermIds())
    with pytest.raises(ValueError, match="null token"):
        encode_batch(pa.array([["a", None]], LIST), TermIds())
    ids, offs = encode_batch(pa.array([["a"], None, ["b", "a"]], LIST), TermIds())  # a null list: no tokens
    assert ids.tolist() == [0, 1, 0] and offs.tolist() == [0, 1, 1, 3]
    with pytest.raises(ValueError, match="doc ids"):
        build_index_file([[["a"]]], tmp_path / "x.rsbm25", k1=1.5, b=0.75, doc_ids=["a", "b"])


def queries(docs, n: int = 40, seed: int = 1) -> list[list[str]]:
    rng = np.random.default_rng(seed)
    terms = sorted({t for d in docs for t in d})
    return [list(rng.choice(terms, size=int(rng.integers(1, 5)))) for _ in range(n)] + [["absent"], ["x", "t1"]]


def assert_same_hits(a, b) -> None:
    assert a.ids.tolist() == b.ids.tolist()
    np.testing.assert_allclose(a.scores, b.scores, rtol=0, atol=1e-9)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_published_file_answers_as_bm25index(tmp_path, layout):
    docs = awkward_docs()
    ids = [f"d{i:05d}" for i in range(len(docs))]
    report = build_index_file(as_batches(docs, 400, "arrow"), tmp_path / "i.rsbm25", k1=1.2, b=0.7, doc_ids=ids,
                              layout=layout, memory_mib=1)
    assert (report.docs, report.terms, report.layout) == (len(docs), len(count_postings(docs)[1]), layout)
    assert report.bytes == (tmp_path / "i.rsbm25").stat().st_size and report.peak_rss_mib > 0
    ref = BM25Index(docs, k1=1.2, b=0.7)
    mapped = open_index(tmp_path / "i.rsbm25")
    assert mapped.same_doc_ids(ids)
    mask = np.random.default_rng(0).random(len(docs)) < 0.3
    for q in queries(docs):
        assert_same_hits(mapped.search(q, 10), ref.search(q, 10))
        assert_same_hits(mapped.search(q, 10, candidates=mask), ref.search(q, 10, candidates=mask))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_bucket_segments_answer_as_one_index(tmp_path, layout):
    docs = awkward_docs()
    ids = [f"doc-{i}" for i in range(len(docs))]
    report = write_segments_stream(tmp_path, as_batches(docs, 500, "chunked"), ids, buckets=4, k1=1.5, b=0.75,
                                   layout=layout, memory_mib=1)
    assert len(report.paths) == 4 and report.docs == len(docs)
    ref = BM25Index(docs)
    seg = open_segments(tmp_path)
    seg.verify()
    assert seg.same_doc_ids(ids) and not seg.same_doc_ids(ids[::-1])
    assert seg.doc_ids([0, 8, len(docs) - 1]) == [ids[0], ids[8], ids[-1]]
    mask = np.random.default_rng(2).random(len(docs)) < 0.1
    for q in queries(docs):
        assert_same_hits(seg.search(q, 10), ref.search(q, 10))
        assert_same_hits(seg.search(q, 10, candidates=mask), ref.search(q, 10, candidates=mask))
    part = open_segments(tmp_path, [1, 3])  # a shard: only its buckets' documents
    held = np.zeros(len(docs), bool)
    held[np.concatenate([s._global_pos for s in part.segments])] = True
    for q in queries(docs, 10):
        full = ref.search(q, len(docs))
        keep = held[full.ids]
        got = part.search(q, 10)
        assert got.ids.tolist() == full.ids[keep][:10].tolist()


def warehouse_corpus(n: int = 400, seed: int = 0):
    rng = np.random.default_rng(seed)
    words = ["revenue", "fell", "margin", "rose", "guidance", "cash", "debt", "營收", "下滑", "audit"]
    chunks, tokens = [], []
    for i in rng.permutation(n).tolist():  # not in chunk_id order: the writer sorts
        toks = list(rng.choice(words, size=int(rng.integers(0, 12))))
        cid = f"doc{i % 37:03d}#{i:05d}"
        text = " ".join(toks)
        chunks.append(Chunk(chunk_id=cid, doc_id=cid.split("#")[0], title="t", text=text,
                            source_locator=SourceLocator(cid.split("#")[0], 0, len(text)),
                            topic=("finance" if i % 3 else "legal")))
        tokens.append(toks)
    return chunks, tokens


@pytest.mark.parametrize("buckets", [1, 4])
@pytest.mark.parametrize("arrow", [False, True])
def test_warehouse_round_trip(tmp_path, buckets, arrow):
    chunks, tokens = warehouse_corpus()
    ids = [c.chunk_id for c in chunks]
    arrow_tokens = pa.chunked_array([pa.array(tokens[i:i + 150], LIST) for i in range(0, len(tokens), 150)])
    meta = write_bm25_file(tmp_path, pa.array(ids) if arrow else ids, arrow_tokens if arrow else tokens,
                           buckets=buckets)
    assert meta["bm25_buckets"] == buckets and meta["bm25_docs"] == len(chunks)
    assert bm25_file(tmp_path).name == (meta["bm25_file"])
    assert (bm25_file(tmp_path).name == BM25_SEGMENTS) == (buckets > 1)
    served = sorted(ids)
    assert open_bm25_file(tmp_path, served[1:]) is None and open_bm25_file(tmp_path, served[::-1]) is None
    mapped = open_bm25_file(tmp_path, served)
    assert mapped is not None and mapped.doc_ids([0, 5]) == [served[0], served[5]]
    from_tokens = HybridRetriever(chunks, docs_tokens=tokens, channels=("bm25",))
    from_file = HybridRetriever(chunks, docs_tokens=None, channels=("bm25",), bm25_index=mapped)
    for q in ("revenue fell", "營收下滑 audit", "cash debt guidance", "absent words"):
        for filters in (None, {"topic": "legal"}):
            a = from_tokens.search(q, top_k=10, filters=filters)
            b = from_file.search(q, top_k=10, filters=filters)
            assert [h.chunk.chunk_id for h in a] == [h.chunk.chunk_id for h in b]
            np.testing.assert_allclose([h.bm25 for h in a], [h.bm25 for h in b], rtol=0, atol=1e-9)


def test_damaged_or_missing_segment_is_an_error_naming_it(tmp_path):
    chunks, tokens = warehouse_corpus(120, seed=4)
    ids = [c.chunk_id for c in chunks]
    write_bm25_file(tmp_path, ids, tokens, buckets=3)
    seg = sorted((tmp_path / BM25_SEGMENTS).glob("*.rsbm25"))[1]
    seg.write_bytes(seg.read_bytes()[:-9])
    with pytest.raises(IndexFormatError, match=seg.name):
        open_bm25_file(tmp_path, sorted(ids))
    seg.unlink()
    with pytest.raises(FileNotFoundError, match=seg.name):
        open_bm25_file(tmp_path, sorted(ids))


@pytest.mark.slow
def test_a_larger_zipf_corpus_counts_the_same_through_many_runs(tmp_path):
    rng = np.random.default_rng(11)
    p = 1.0 / np.arange(1, 50_001) ** 1.1
    p /= p.sum()
    lens = rng.poisson(40, 150_000)
    toks = rng.choice(50_000, size=int(lens.sum()), p=p)
    names = np.array([f"w{i}" for i in range(50_000)], dtype=object)
    flat = names[toks].tolist()
    bounds = np.concatenate(([0], np.cumsum(lens))).tolist()
    docs = [flat[bounds[i]:bounds[i + 1]] for i in range(len(lens))]
    counter = StreamCounter(tmp_path, memory_mib=64)  # ~4M postings a run
    counter.consume(pa.array(docs[i:i + 20_000], LIST) for i in range(0, len(docs), 20_000))
    raw, vocab = counter.finish()
    assert len(counter.runs) >= 2
    assert_same_raw(raw, vocab, *count_postings(docs))


def test_young_gc_is_deferred_while_batches_stream_and_restored_after(tmp_path):
    import gc

    from ragspine_pipeline.retrieval.lexical.refresh import gc_pause as sb

    before = gc.get_threshold()
    seen = []

    def batches():
        for i in range(3):
            seen.append(gc.get_threshold()[0])
            yield [["a", f"t{i}"], ["b"]]
        raise RuntimeError("the caller's generator fails")

    with pytest.raises(RuntimeError, match="generator fails"):
        StreamCounter(tmp_path).consume(batches())
    assert seen == [max(before[0], sb.YOUNG_GC_THRESHOLD)] * 3 and gc.get_threshold() == before
    with sb.young_gc_deferred():  # nested (another build in flight): the outermost restores
        with sb.young_gc_deferred():
            assert gc.get_threshold()[0] == max(before[0], sb.YOUNG_GC_THRESHOLD)
        assert gc.get_threshold()[0] == max(before[0], sb.YOUNG_GC_THRESHOLD)
    assert gc.get_threshold() == before


@pytest.mark.parametrize("kernel", ["auto", "numpy"])
@pytest.mark.parametrize("range_postings", [None, 7])
def test_sliced_finish_reads_the_merged_runs_and_writes_the_same_packed_bytes(tmp_path, monkeypatch, range_postings,
                                                                              kernel):
    """``finish(mapped=False)``: the merged postings come back as slice readers (never mapped
    whole; issue 47 item 4), runs spilled and merged a range of terms at a time (7 postings:
    most ranges one or two terms, the long lists a range each), and the packed file written
    from them is byte for byte the one written from the in-memory postings."""
    from ragspine_pipeline.retrieval.lexical.refresh import spill_io
    from ragspine_pipeline.retrieval.lexical.refresh import stream_build as sb
    from ragspine_pipeline.retrieval.lexical.refresh.publish import write_packed

    if range_postings:
        monkeypatch.setattr(spill_io, "MERGE_POSTINGS", range_postings)
        monkeypatch.setattr(sb, "SPILL_RANGE_POSTINGS", range_postings)
    docs = awkward_docs()
    ref, ref_vocab = count_postings(docs)
    ref = sorted_raw(ref)  # read through format.raw_order.TermOrderView
    counter = StreamCounter(tmp_path / "spill", run_postings=301, kernel=kernel)
    raw, vocab = counter.consume(as_batches(docs, 250, "arrow")).finish(mapped=False)
    assert len(counter.runs) >= 5 and isinstance(raw.indices, spill_io.NpyReader)
    assert_same_raw(raw, vocab, ref, ref_vocab)
    n = raw.n_postings
    assert np.array_equal(raw.indices[n - 40:n - 3], ref.indices[n - 40:n - 3])
    assert raw.indices[-1] == ref.indices[-1] and raw.tf[5] == ref.tf[5] and len(raw.indices[n:n + 9]) == 0
    assert np.array_equal(raw.indices[10:3:-2], ref.indices[10:3:-2])
    with pytest.raises(IndexError):
        raw.indices[n]
    write_packed(raw, tmp_path / "sliced.rsbm25", k1=1.2, b=0.75)
    write_packed(ref, tmp_path / "memory.rsbm25", k1=1.2, b=0.75)
    assert (tmp_path / "sliced.rsbm25").read_bytes() == (tmp_path / "memory.rsbm25").read_bytes()
    assert not list((tmp_path / "spill").glob("run*"))  # the runs are removed once merged
