"""The lexical index's published BM25 file: written into a version folder, opened mapped.

Why: a snapshot that publishes only tokens makes every serving process rebuild the BM25
index (seconds and gigabytes per process, #27). The ``lexical_index`` step writes the built
index once, as an immutable verified file (``retrieval/lexical/bm25_format``) in its own
version folder; serving maps it (``open_bm25_file``) and hands it to the retriever
(``HybridRetriever(..., bm25_index=...)``), which then tokenizes nothing.

The file's documents are the chunks it was built over, in chunk_id order (the retriever's
position order, so ties fall by chunk_id), with their chunk ids recorded. A version
without the file (a warehouse from before) or whose chunk ids are not exactly the served
ones (an older snapshot served less the documents hidden since) returns None here: the
caller serves from the tokens as before. A damaged file is an error naming it, never a
fallback that hides it.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..retrieval.lexical.bm25 import DEFAULT_B, DEFAULT_K1, BM25Index
from ..retrieval.lexical.bm25_format import FORMAT_VERSION
from ..retrieval.lexical.bm25_mapped import MappedBM25Index, open_index
from ..retrieval.lexical.bm25_publish import write_index

BM25_FILE = "bm25.rsbm25"

__all__ = ["BM25_FILE", "bm25_file", "open_bm25_file", "write_bm25_file"]


def write_bm25_file(version_dir: str | Path, chunk_ids: Sequence[str], docs_tokens: Sequence[Sequence[str]], *,
                    k1: float = DEFAULT_K1, b: float = DEFAULT_B) -> dict[str, Any]:
    """Build the BM25 index of these chunks (any order; unique ids) and publish it as
    ``version_dir/BM25_FILE`` (atomic, verified). Returns the manifest metadata to record."""
    if len(chunk_ids) != len(docs_tokens):
        raise ValueError(f"{len(chunk_ids)} chunk ids for {len(docs_tokens)} token lists")
    if len(set(chunk_ids)) != len(chunk_ids):
        raise ValueError("chunk ids must be unique")
    t0 = time.perf_counter()
    order = sorted(range(len(chunk_ids)), key=chunk_ids.__getitem__)
    index = BM25Index([docs_tokens[i] for i in order], k1=k1, b=b, kernel="numpy")
    path = write_index(index, Path(version_dir) / BM25_FILE, doc_ids=[chunk_ids[i] for i in order])
    return {"bm25_file": BM25_FILE, "bm25_format": FORMAT_VERSION, "bm25_docs": index.n_docs,
            "bm25_bytes": path.stat().st_size, "bm25_k1": index.k1, "bm25_b": index.b,
            "bm25_seconds": round(time.perf_counter() - t0, 3)}


def bm25_file(version_dir: str | Path) -> Path | None:
    """The version's BM25 file, or None for a version written before there was one."""
    path = Path(version_dir) / BM25_FILE
    return path if path.is_file() else None


def open_bm25_file(version_dir: str | Path, served_ids: Sequence[str] | None = None, *,
                   kernel: str = "auto") -> MappedBM25Index | None:
    """The version's BM25 index, memory-mapped; None when there is no file, or when
    ``served_ids`` (sorted by chunk id) are not exactly the indexed chunks.

    Raises ``IndexFormatError`` (corrupt, truncated, newer format) naming the file.
    """
    path = bm25_file(version_dir)
    if path is None:
        return None
    index = open_index(path, kernel=kernel)
    if served_ids is not None and not index.same_doc_ids(served_ids):
        return None
    return index
