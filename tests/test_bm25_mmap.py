"""The published, memory-mapped BM25 index answers exactly as the built one, and a damaged
file is a clear error naming it: never a wrong answer, never a crash."""

import struct
import zlib
from pathlib import Path

import numpy as np
import pytest

from ragspine_pipeline.retrieval.lexical.format.file import (
    FORMAT_VERSION,
    HEADER_BYTES,
    CorruptIndexError,
    IndexFormatError,
    IndexVersionError,
    pack_header,
)
from ragspine_pipeline.retrieval.lexical.index import bm25
from ragspine_pipeline.retrieval.lexical.index.bm25 import BM25Index, bm25_scores
from ragspine_pipeline.retrieval.lexical.index.mapped import MappedBM25Index, open_index
from ragspine_pipeline.retrieval.lexical.refresh.publish import write_index

SHARED_EVAL = Path(__file__).resolve().parents[1].parent / "shared" / "eval"
KERNELS = ("numba", "numpy")


def zipf_corpus(n_docs: int, n_vocab: int = 400, seed: int = 0, max_len: int = 40):
    rng = np.random.default_rng(seed)
    vocab = [f"w{i}" for i in range(n_vocab)] + ["营收", "ünïcode"]
    p = 1.0 / np.arange(1, len(vocab) + 1) ** 1.1
    p /= p.sum()
    docs = [list(rng.choice(vocab, size=int(rng.integers(0, max_len)), p=p)) for _ in range(n_docs)]
    queries = [list(rng.choice(vocab, size=int(rng.integers(1, 6)), p=p)) for _ in range(40)]
    queries += [["absent"], [], ["w1", "w1", "absent", "w3"], ["营收", "ünïcode"]]
    return docs, queries


def publish(tmp_path: Path, docs, name: str = "lex.bm25", **kw) -> tuple[BM25Index, Path]:
    built = BM25Index(docs, **kw)
    path = write_index(built, tmp_path / name, doc_ids=[f"doc-{i:06d}" for i in range(len(docs))])
    return built, path


def same(a, b) -> None:
    assert a.ids.tolist() == b.ids.tolist()
    assert np.array_equal(a.scores, b.scores)  # the same bytes through the same kernels


@pytest.mark.parametrize("kernel", KERNELS)
def test_mapped_equals_built_and_reference(tmp_path, kernel):
    docs, queries = zipf_corpus(3000, seed=1)
    built, path = publish(tmp_path, docs, kernel=kernel)
    mapped = open_index(path, kernel=kernel)
    assert isinstance(mapped, MappedBM25Index) and mapped.kernel == built.kernel
    assert (mapped.n_docs, mapped.total_len, mapped.avgdl) == (built.n_docs, built.total_len, built.avgdl)
    for q in queries:
        for k in (1, 10, 100):
            same(mapped.search(q, k=k), built.search(q, k=k))
        assert np.array_equal(mapped.get_scores(q), built.get_scores(q))
        ref = bm25_scores(q, docs)
        want = sorted((i for i, s in enumerate(ref) if s > 0), key=lambda i: (-ref[i], i))[:10]
        res = mapped.search(q, k=10)
        assert np.allclose(res.scores, [ref[i] for i in want], atol=1e-9, rtol=0)
    got = mapped.search_batch(queries, k=10, threads=2)
    for q, r in zip(queries, got, strict=True):
        same(r, built.search(q, k=10))
    assert mapped.doc_ids([0, 17, len(docs) - 1]) == ["doc-000000", "doc-000017", f"doc-{len(docs) - 1:06d}"]


@pytest.mark.parametrize("bitsets", [False, True])
@pytest.mark.parametrize("keep", [0.5, 0.05, 0.001, 0.0001])
def test_mapped_filtered_uses_survivor_statistics(tmp_path, monkeypatch, keep, bitsets):
    if bitsets:  # long lists get popcount bitsets (normally only from 65,536 docs)
        monkeypatch.setattr(bm25, "BITSET_MIN_DOCS", 0)
    docs, queries = zipf_corpus(20_000, n_vocab=300, seed=2, max_len=25)
    built, path = publish(tmp_path, docs)
    mapped, mapped_np = open_index(path), open_index(path, kernel="numpy")
    built_np = BM25Index.from_postings(built.postings(), built.vocab, k1=built.k1, b=built.b, kernel="numpy")
    assert (mapped._bits.shape[0] > 0) == bitsets
    rng = np.random.default_rng(int(keep * 1e4))
    mask = rng.random(len(docs)) < keep
    mask[[3, 11]] = True
    pos = np.flatnonzero(mask)
    sub = [docs[i] for i in pos]
    for q in queries[:12] + queries[-2:]:
        res = mapped.search(q, k=10, candidates=mask)
        same(res, built.search(q, k=10, candidates=mask))
        # Positions mean the same filter; the numpy path on mapped arrays equals it on built ones.
        same(mapped_np.search(q, k=10, candidates=pos), built_np.search(q, k=10, candidates=mask))
        ref = bm25_scores(q, sub)  # N, df and avgdl over the survivors only
        want = sorted((i for i, s in enumerate(ref) if s > 0), key=lambda i: (-ref[i], i))[:10]
        assert np.allclose(res.scores, [ref[i] for i in want], atol=1e-9, rtol=0)


@pytest.mark.parametrize("name", sorted(p.name for p in SHARED_EVAL.iterdir() if (p / "corpus.jsonl").exists())
                         if SHARED_EVAL.is_dir() else [])
def test_every_shared_set_mapped_equals_built(tmp_path, name):
    from ragspine_pipeline.eval.beir import load_beir
    from ragspine_pipeline.retrieval.lexical.analysis.analyzer import make_analyzer

    ds = load_beir(SHARED_EVAL / name)
    an = make_analyzer("unicode")
    docs = [an(f"{d.title}\n\n{d.text}") for d in ds.corpus.values()]
    queries = [an(ds.queries[q]) for q in ds.judged_queries[:50]]
    built, path = publish(tmp_path, docs)
    mapped = open_index(path)
    mask = np.random.default_rng(5).random(len(docs)) < 0.1
    for q in queries:
        same(mapped.search(q, k=100), built.search(q, k=100))
        same(mapped.search(q, k=10, candidates=mask), built.search(q, k=10, candidates=mask))
    for q in queries[:5]:
        ref = bm25_scores(q, docs)
        want = sorted((i for i, s in enumerate(ref) if s > 0), key=lambda i: (-ref[i], i))[:100]
        assert np.allclose(mapped.search(q, k=100).scores, [ref[i] for i in want], atol=1e-9, rtol=0)


def test_empty_and_degenerate_indexes(tmp_path):
    for docs in ([[]], [[], []], [["a"]], [["a", "a", "b"], []]):
        built, path = publish(tmp_path, docs, name=f"d{len(docs)}.bm25")
        mapped = open_index(path)
        mapped.verify()
        for q in (["a"], ["b", "a"], ["zz"], []):
            same(mapped.search(q, k=5), built.search(q, k=5))
            same(mapped.search(q, k=5, candidates=np.ones(len(docs), bool)),
                 built.search(q, k=5, candidates=np.ones(len(docs), bool)))


def test_vocabulary_lookup_and_hash_collisions(tmp_path, monkeypatch):
    from ragspine_pipeline.retrieval.lexical.format import file as bm25_format
    from ragspine_pipeline.retrieval.lexical.index import mapped as bm25_mapped

    docs = [["x", "y"], ["y", "z", "z"], ["q"]]
    # A writer whose hashes are not the reader's is caught at publish, not served.
    monkeypatch.setattr(bm25_format, "term_hash", lambda t: 7)
    with pytest.raises(CorruptIndexError, match="structure"):
        publish(tmp_path, docs, name="bad.bm25")
    assert not list(tmp_path.iterdir())
    # Every term hashing alike: lookups must still compare the strings, never mix terms.
    monkeypatch.setattr(bm25_mapped, "term_hash", lambda t: 7)
    monkeypatch.setattr(bm25_mapped, "bytes_hash", lambda b: 7)
    built, path = publish(tmp_path, docs)
    mapped = open_index(path)
    assert {t: mapped.vocab.get(t) for t in ("x", "y", "z", "q", "nope")} == {**built.vocab, "nope": None}
    assert "z" in mapped.vocab and "nope" not in mapped.vocab and len(mapped.vocab) == 4
    for q in (["z"], ["x", "q"], ["nope"]):
        same(mapped.search(q, k=3), built.search(q, k=3))


def test_write_is_atomic_and_rejects_a_mapped_source(tmp_path, monkeypatch):
    from ragspine_pipeline.retrieval.lexical.refresh import publish as bm25_publish

    docs, _ = zipf_corpus(200)
    built, path = publish(tmp_path, docs)
    before = path.read_bytes()

    def broken(*a, **kw):
        raise CorruptIndexError("tmp", "simulated verification failure")

    monkeypatch.setattr(bm25_publish, "open_index", broken)
    with pytest.raises(CorruptIndexError):
        write_index(BM25Index(docs[:50]), path)
    assert path.read_bytes() == before  # the published file is untouched
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lex.bm25"]  # no temp file left
    monkeypatch.undo()
    with pytest.raises(TypeError):
        write_index(open_index(path), tmp_path / "again.bm25")
    with pytest.raises(ValueError):
        write_index(built, tmp_path / "ids.bm25", doc_ids=["only-one"])


# --------------------------------------------------------------------- damage
def damaged_outcome(path: Path, docs, queries, built) -> str:
    """Open and query a possibly damaged file: "error" (a typed error naming the file) or
    "same" (every answer equals the intact index's). Anything else fails the test."""
    try:
        mapped = open_index(path)
        for kernel_q in queries:
            same(mapped.search(kernel_q, k=10), built.search(kernel_q, k=10))
        mask = np.zeros(len(docs), bool)
        mask[::3] = True
        for q in queries[:5]:
            same(mapped.search(q, k=10, candidates=mask), built.search(q, k=10, candidates=mask))
        mapped.verify()
    except IndexFormatError as exc:
        assert str(path) in str(exc)
        return "error"
    return "same"


def test_truncated_files_are_clear_errors(tmp_path):
    docs, queries = zipf_corpus(2000, seed=3)
    built, path = publish(tmp_path, docs)
    raw = path.read_bytes()
    cut = tmp_path / "cut.bm25"
    for size in (0, 10, HEADER_BYTES, HEADER_BYTES + 1000, len(raw) // 2, len(raw) - 40, len(raw) - 1):
        cut.write_bytes(raw[:size])
        with pytest.raises(CorruptIndexError, match="cut.bm25"):
            open_index(cut)
    with pytest.raises(CorruptIndexError, match="missing.bm25"):
        open_index(tmp_path / "missing.bm25")
    cut.write_bytes(raw + b"\0")  # extended is as wrong as truncated
    with pytest.raises(CorruptIndexError, match="cut.bm25"):
        open_index(cut)


def test_bit_flips_never_give_a_wrong_answer(tmp_path):
    docs, queries = zipf_corpus(4000, seed=4)
    built, path = publish(tmp_path, docs)
    raw = bytearray(path.read_bytes())
    rng = np.random.default_rng(9)
    flipped = tmp_path / "flip.bm25"
    outcomes = []
    positions = list(rng.integers(0, len(raw), 60)) + [0, 9, 20, 61, len(raw) - 5, len(raw) - 30]
    for at in positions:
        bad = bytearray(raw)
        bad[int(at)] ^= 1 << int(rng.integers(0, 8))
        flipped.write_bytes(bytes(bad))
        outcomes.append(damaged_outcome(flipped, docs, queries, built))
    # verify() reads every block, so every flip (data, padding, tables) is caught.
    assert outcomes == ["error"] * len(positions)


def test_a_flip_in_postings_fails_the_first_query_that_reads_them(tmp_path):
    docs, queries = zipf_corpus(4000, seed=6)
    built, path = publish(tmp_path, docs)
    mapped = open_index(path)
    t = built.vocab["w0"]
    spec = mapped._toc.arrays["w"]
    at = spec.offset + 8 * int(built.indptr[t]) + 3  # inside w0's first saturation factor
    raw = bytearray(path.read_bytes())
    raw[at] ^= 0x10
    path.write_bytes(bytes(raw))
    damaged = open_index(path)  # header, TOC and tables are intact: opening succeeds
    with pytest.raises(CorruptIndexError, match="checksum mismatch") as err:
        damaged.search(["w0"], k=10)
    assert str(path) in str(err.value)


def test_the_doc_id_digest_is_recorded_checked_at_publish_and_checksummed(tmp_path, monkeypatch):
    from ragspine_pipeline.retrieval.lexical.format.file import id_digest, strings_to_blob
    from ragspine_pipeline.retrieval.lexical.refresh import publish as bm25_publish

    docs, _ = zipf_corpus(300, seed=2)
    _, path = publish(tmp_path, docs)
    ids = [f"doc-{i:06d}" for i in range(len(docs))]
    assert open_index(path).doc_id_digest() == id_digest(*strings_to_blob(ids))
    assert id_digest(*strings_to_blob(["ab", "c"])) != id_digest(*strings_to_blob(["a", "bc"]))
    spec = open_index(path)._toc.arrays["doc_id_digest"]
    raw = bytearray(path.read_bytes())
    raw[spec.offset + 5] ^= 0x01
    path.write_bytes(bytes(raw))
    with pytest.raises(CorruptIndexError, match="checksum mismatch"):
        open_index(path).doc_id_digest()
    # A writer that recorded a wrong digest never gets its file published.
    real = bm25_publish._extras
    monkeypatch.setattr(bm25_publish, "_extras", lambda *a: {**real(*a), "doc_id_digest": np.zeros(32, np.uint8)})
    with pytest.raises(CorruptIndexError, match="inconsistent"):
        publish(tmp_path, docs, name="bad.bm25")
    assert not (tmp_path / "bad.bm25").exists()


def test_unknown_or_newer_format_version_names_both(tmp_path):
    docs, _ = zipf_corpus(100)
    _built, path = publish(tmp_path, docs)
    raw = bytearray(path.read_bytes())
    head = struct.unpack_from("<8sIIQQQIIQI", raw)
    for version in (FORMAT_VERSION + 1, 0):
        raw[:HEADER_BYTES] = pack_header(head[3], head[4], head[5], head[6], head[8], version=version)
        assert zlib.crc32(bytes(raw[:60])) == struct.unpack_from("<I", raw, 60)[0]
        path.write_bytes(bytes(raw))
        with pytest.raises(IndexVersionError) as err:
            open_index(path)
        msg = str(err.value)
        assert str(path) in msg and f"version {version}" in msg and f"version {FORMAT_VERSION}" in msg
        assert (err.value.found, err.value.supported) == (version, FORMAT_VERSION)


def test_concurrent_first_queries_verify_once_and_agree(tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    docs, queries = zipf_corpus(3000, seed=8)
    built, path = publish(tmp_path, docs)
    mapped = open_index(path)
    with ThreadPoolExecutor(4) as pool:  # terms are first resolved (and verified) concurrently
        results = list(pool.map(lambda q: mapped.search(q, k=10), queries * 3))
    for q, r in zip(queries * 3, results, strict=True):
        same(r, built.search(q, k=10))


_HOLDER = """
import sys, json
from pathlib import Path
from ragspine_pipeline.retrieval.lexical.index.mapped import open_index

def uss():
    v = {}
    for line in Path("/proc/self/smaps_rollup").read_text().splitlines()[1:]:
        k, _, rest = line.partition(":")
        v[k] = int(rest.split()[0])
    return (v["Private_Clean"] + v["Private_Dirty"]) * 1024

open_index(sys.argv[2]).search(["w1"], k=3)  # kernels and their read-only variants loaded
before = uss()
ix = open_index(sys.argv[1])
ix.verify()  # reads every page of the file
ix.search(["w1", "w2"], k=10)
print(json.dumps(uss() - before), flush=True)
sys.stdin.readline()
"""


@pytest.mark.skipif(not Path("/proc/self/smaps_rollup").exists(), reason="needs Linux smaps_rollup")
def test_a_second_process_shares_the_mapped_pages(tmp_path):
    import json
    import subprocess
    import sys

    docs, _ = zipf_corpus(40_000, n_vocab=3000, seed=10, max_len=60)
    _built, path = publish(tmp_path, docs)
    _small, warm = publish(tmp_path, docs[:50], name="warm.bm25")
    size = path.stat().st_size
    script = tmp_path / "holder.py"
    script.write_text(_HOLDER)
    cmd = [sys.executable, str(script), str(path), str(warm)]
    first = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        alone = json.loads(first.stdout.readline())
        second = subprocess.run(cmd, input="\n", capture_output=True, text=True, timeout=120)
        assert second.returncode == 0, second.stderr
        shared = json.loads(second.stdout)
    finally:
        first.communicate("\n", timeout=60)
    assert alone > 0.8 * size  # alone, the mapped pages are this process's own
    assert shared < 0.1 * size, (shared, size)  # a second process adds under 10% of the index
