"""The lexical index's BM25 file: written into a version folder, served mapped, with the
same hits as the index rebuilt from tokens."""

import numpy as np
import pytest

from ragspine_pipeline.retrieval.chunking.chunking import Chunk, SourceLocator
from ragspine_pipeline.retrieval.hybrid.retriever import HybridRetriever
from ragspine_pipeline.retrieval.lexical.format.file import FORMAT_VERSION, IndexFormatError
from ragspine_pipeline.retrieval.lexical.index.bm25 import BM25Index
from ragspine_pipeline.warehouse.lexical_files import (
    BM25_FILE,
    bm25_file,
    open_bm25_file,
    write_bm25_file,
)

WORDS = ["revenue", "fell", "margin", "rose", "guidance", "cash", "debt", "营收", "下滑", "audit"]


def corpus(n: int = 300, seed: int = 0):
    rng = np.random.default_rng(seed)
    chunks, tokens = [], []
    for i in rng.permutation(n).tolist():  # not in chunk_id order: the writer sorts
        toks = list(rng.choice(WORDS, size=int(rng.integers(1, 12))))
        text = " ".join(toks)
        cid = f"doc{i % 37:03d}#{i:05d}"
        chunks.append(Chunk(chunk_id=cid, doc_id=cid.split("#")[0], title="t", text=text,
                            source_locator=SourceLocator(cid.split("#")[0], 0, len(text)),
                            topic=("finance" if i % 3 else "legal")))
        tokens.append(toks)
    return chunks, tokens


def test_written_file_serves_the_same_hits_as_tokens(tmp_path):
    chunks, tokens = corpus()
    ids = [c.chunk_id for c in chunks]
    meta = write_bm25_file(tmp_path / "v000002", ids, tokens)
    assert meta["bm25_file"] == BM25_FILE and meta["bm25_format"] == FORMAT_VERSION
    assert meta["bm25_docs"] == len(chunks) and meta["bm25_bytes"] == (tmp_path / "v000002" / BM25_FILE).stat().st_size
    served = sorted(ids)
    mapped = open_bm25_file(tmp_path / "v000002", served)
    assert mapped is not None and mapped.doc_ids([0, 1]) == served[:2]
    from_tokens = HybridRetriever(chunks, docs_tokens=tokens, channels=("bm25",))
    from_file = HybridRetriever(chunks, docs_tokens=None, channels=("bm25",), bm25_index=mapped)
    assert from_file.index is mapped
    for q in ("revenue fell", "营收下滑 audit", "cash debt guidance", "absent words"):
        for filters in (None, {"topic": "legal"}):
            a = from_tokens.search(q, top_k=10, filters=filters)
            b = from_file.search(q, top_k=10, filters=filters)
            assert [(h.chunk.chunk_id, h.bm25, h.fused) for h in a] == [(h.chunk.chunk_id, h.bm25, h.fused) for h in b]


def test_missing_or_mismatched_file_falls_back_and_damage_is_an_error(tmp_path):
    chunks, tokens = corpus(50)
    ids = [c.chunk_id for c in chunks]
    assert bm25_file(tmp_path) is None and open_bm25_file(tmp_path) is None  # a version from before
    write_bm25_file(tmp_path, ids, tokens)
    assert open_bm25_file(tmp_path, sorted(ids)[1:]) is None  # serves fewer chunks: rebuild as before
    assert open_bm25_file(tmp_path, sorted(ids)) is not None
    with pytest.raises(ValueError, match="not these"):
        HybridRetriever(chunks[1:], channels=("bm25",), bm25_index=open_bm25_file(tmp_path))
    with pytest.raises(ValueError, match="not these"):
        HybridRetriever(chunks, channels=("bm25",), bm25_index=BM25Index([["x"]]))
    path = tmp_path / BM25_FILE
    path.write_bytes(path.read_bytes()[:-7])
    with pytest.raises(IndexFormatError, match=BM25_FILE):
        open_bm25_file(tmp_path, sorted(ids))
    with pytest.raises(ValueError, match="unique"):
        write_bm25_file(tmp_path, ["a", "a"], [["x"], ["y"]])


def test_narrative_index_passes_a_published_index_through(tmp_path):
    from ragspine_pipeline.retrieval.link.narrative_index import NarrativeIndex

    chunks, tokens = corpus(120, seed=2)
    write_bm25_file(tmp_path, [c.chunk_id for c in chunks], tokens)
    mapped = open_bm25_file(tmp_path, sorted(c.chunk_id for c in chunks))
    served = NarrativeIndex.from_chunks(chunks, bm25_index=mapped, channels=("bm25",))
    rebuilt = NarrativeIndex.from_chunks(chunks, docs_tokens=tokens, channels=("bm25",))
    assert served.retriever.index is mapped
    for q in ("revenue margin", "营收"):
        a = [(h.chunk.chunk_id, h.bm25) for h in served.retriever.search(q, top_k=5)]
        assert a == [(h.chunk.chunk_id, h.bm25) for h in rebuilt.retriever.search(q, top_k=5)] and a
