"""Publish a built ``BM25Index`` as an immutable, verified file (``bm25_format`` layout).

Why a module of its own: publishing is write + verify + atomic rename, and the verify step
is the reader's (``bm25_mapped``), so the format module stays free of both.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from .bm25 import BM25Index
from .bm25_format import CorruptIndexError, strings_to_blob, vocab_arrays, write_file
from .bm25_mapped import open_index


def write_index(index: BM25Index, path: str | os.PathLike[str], *, doc_ids: Sequence[str] | None = None,
                bucket: int = 0, buckets: int = 1, global_pos: np.ndarray | None = None,
                corpus: tuple[int, int] = (0, 0)) -> Path:
    """Write ``index`` to ``path`` atomically and return the path.

    The file is written beside ``path`` under a temporary name, fsynced, opened again
    and verified whole (every block checksum, the structure), then renamed into place and
    the folder fsynced: readers see the old file, or the complete new one. ``doc_ids`` (one
    per indexed document, in position order) are stored for the reader's ``doc_ids``.
    A segment of a larger corpus (``bm25_segments``) also gives its documents' corpus
    positions (``global_pos``) and the corpus's (document count, summed length).
    """
    if not isinstance(index.vocab, dict):
        raise TypeError("write_index needs a built BM25Index (its vocabulary a dict), not a mapped one")
    if doc_ids is not None and len(doc_ids) != index.n_docs:
        raise ValueError(f"doc_ids has {len(doc_ids)} entries for {index.n_docs} indexed documents")
    if not 0 <= bucket < buckets:
        raise ValueError(f"bucket must be in 0..{buckets - 1} (got {bucket})")
    path = Path(path)
    arrays = dict(index.postings().arrays())
    arrays.update(vocab_arrays(index.vocab))
    if doc_ids is not None:
        arrays["doc_id_off"], arrays["doc_id_blob"] = strings_to_blob(doc_ids)
    if global_pos is not None:
        if len(global_pos) != index.n_docs:
            raise ValueError(f"global_pos has {len(global_pos)} entries for {index.n_docs} indexed documents")
        arrays["global_pos"] = np.asarray(global_pos, np.int64)
    scalars = {"k1": index.k1, "b": index.b, "n_docs": index.n_docs, "n_terms": len(index.vocab),
               "total_len": index.total_len, "bucket": bucket, "buckets": buckets,
               "corpus_docs": int(corpus[0]), "corpus_len": int(corpus[1])}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        write_file(tmp, arrays, scalars)
        open_index(tmp, kernel="numpy").verify()
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise
    _fsync_dir(path.parent)
    return path


def _fsync_dir(folder: Path) -> None:
    """Make the rename durable (POSIX); where folders cannot be opened or synced, skip."""
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


__all__ = ["CorruptIndexError", "write_index"]
