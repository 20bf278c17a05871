"""Publish a BM25 index as an immutable, verified file (``format.file`` layout).

Why a module of its own: publishing is write + verify + atomic rename, and the verify step
is the reader's (``index.mapped``), so the format module stays free of both.

Two entry points: ``write_index`` publishes a built ``BM25Index`` (plain layout); the
layout writers take counted postings (``RawPostings``, e.g. from the streaming build):
``write_plain`` (exact float64 weights per posting), ``write_packed`` (``index.packed``:
block-packed gaps and tfs, a fraction of the bytes) and ``write_layout``, which picks one
of the two by ``format.raw.choose_layout``.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from ..format.file import (
    ChunkedArray,
    CorruptIndexError,
    id_digest,
    strings_to_blob,
    vocab_arrays,
    vocab_block,
    write_file,
)
from ..format.raw import PACKED, PLAIN, RawPostings, choose_layout
from ..format.raw_order import sorted_raw
from ..index import bm25
from ..index.bm25 import BM25Index
from ..index.mapped import open_index
from ..index.packed import PACKED_BITSET_FRACTION, encode, length_codes
from ..index.packed_tables import idf_table
from ..index.postings import bitsets, postings_from_raw


def write_index(index: BM25Index, path: str | os.PathLike[str], *, doc_ids: Sequence[str] | None = None,
                bucket: int = 0, buckets: int = 1, global_pos: np.ndarray | None = None,
                corpus: tuple[int, int] = (0, 0)) -> Path:
    """Write ``index`` to ``path`` atomically and return the path.

    The file is written beside ``path`` under a temporary name, fsynced, opened again
    and verified whole (every block checksum, the structure), then renamed into place and
    the folder fsynced: readers see the old file, or the complete new one. ``doc_ids`` (one
    per indexed document, in position order) are stored for the reader's ``doc_ids``.
    A segment of a larger corpus (``refresh.segments``) also gives its documents' corpus
    positions (``global_pos``) and the corpus's (document count, summed length).
    """
    if not isinstance(index.vocab, dict):
        raise TypeError("write_index needs a built BM25Index (its vocabulary a dict), not a mapped one")
    extras = _extras(index.n_docs, doc_ids, bucket, buckets, global_pos)
    path = Path(path)
    arrays: dict[str, np.ndarray | ChunkedArray] = dict(index.postings().arrays())
    arrays.update(vocab_arrays(index.vocab))  # front-coded when its ids are in lexicographic order
    arrays.update(extras)
    scalars = {"k1": index.k1, "b": index.b, "n_docs": index.n_docs, "n_terms": len(index.vocab),
               "total_len": index.total_len, "bucket": bucket, "buckets": buckets,
               "corpus_docs": int(corpus[0]), "corpus_len": int(corpus[1]), "layout": PLAIN,
               "vocab_block": vocab_block(arrays)}
    return _publish(path, arrays, scalars)


def _publish(path: Path, arrays: dict[str, np.ndarray | ChunkedArray], scalars: dict[str, Any]) -> Path:
    """Write to a temp file beside ``path``, verify it whole, rename it into place.

    The file is opened for the check with the numpy query path: verifying runs no query,
    and a packed file's block check runs compiled anyway (``index.packed.compiled``), so a
    publishing process never loads (or, on a fresh install, compiles: minutes per dtype)
    the query kernels. A serving process warms its own at open."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{threading.get_ident()}")
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


def _extras(n_docs: int, doc_ids: Sequence[str] | None, bucket: int, buckets: int,
            global_pos: np.ndarray | None) -> dict[str, np.ndarray]:
    """The doc-id and corpus-position arrays, after checking them against ``n_docs``."""
    if doc_ids is not None and len(doc_ids) != n_docs:
        raise ValueError(f"doc_ids has {len(doc_ids)} entries for {n_docs} indexed documents")
    if not 0 <= bucket < buckets:
        raise ValueError(f"bucket must be in 0..{buckets - 1} (got {bucket})")
    out: dict[str, np.ndarray] = {}
    if doc_ids is not None:
        out["doc_id_off"], out["doc_id_blob"] = strings_to_blob(doc_ids)
        # What an open compares with the served records' ids (bm25_format.id_digest).
        out["doc_id_digest"] = np.frombuffer(id_digest(out["doc_id_off"], out["doc_id_blob"]), np.uint8)
    if global_pos is not None:
        if len(global_pos) != n_docs:
            raise ValueError(f"global_pos has {len(global_pos)} entries for {n_docs} indexed documents")
        out["global_pos"] = np.asarray(global_pos, np.int64)
    return out


def _raw_vocab(raw: RawPostings) -> dict[str, int]:
    vocab = {term: tid for tid, term in enumerate(raw.terms)}
    if len(vocab) != raw.n_terms:
        raise ValueError(f"RawPostings has {raw.n_terms} postings lists for {len(vocab)} distinct terms")
    return vocab


def _corpus(raw: RawPostings) -> tuple[int, int]:
    """(corpus documents, corpus length) for the TOC: (0, 0) when ``raw`` is the corpus."""
    return (0, 0) if raw.corpus_docs is None else (int(raw.corpus_docs), int(raw.corpus_len or 0))


def write_plain(raw: RawPostings, path: str | os.PathLike[str], *, k1: float, b: float,
                doc_ids: Sequence[str] | None = None, bucket: int = 0, buckets: int = 1,
                global_pos: np.ndarray | None = None) -> Path:
    """Publish counted postings in the plain layout (weights, bounds and bitsets computed
    here, ``index.postings.postings_from_raw``), atomically and verified as ``write_index``.
    Term ids are renumbered in lexicographic order first (``format.raw_order``)."""
    raw = sorted_raw(raw)
    raw = replace(raw, indices=np.asarray(raw.indices), tf=np.asarray(raw.tf))  # computed on whole arrays
    postings = postings_from_raw(raw, float(k1), float(b), bm25.BITSET_MIN_DOCS)
    index = BM25Index.from_postings(postings, _raw_vocab(raw), k1=k1, b=b, kernel="numpy")
    return write_index(index, path, doc_ids=doc_ids, bucket=bucket, buckets=buckets, global_pos=global_pos,
                       corpus=_corpus(raw))


def write_packed(raw: RawPostings, path: str | os.PathLike[str], *, k1: float, b: float,
                 doc_ids: Sequence[str] | None = None, bucket: int = 0, buckets: int = 1,
                 global_pos: np.ndarray | None = None) -> Path:
    """Publish counted postings in the packed layout (``index.packed``), atomically and
    verified (every block decoded and its skip data recomputed before the rename).

    ``raw``'s arrays may be memory maps of any size: they are encoded a slice of blocks at a
    time and streamed into the file. A segment (``raw.corpus_docs`` set) keeps the corpus's
    statistics in its weights and idf, as ``write_index`` with ``corpus=``. Term ids are
    renumbered in lexicographic order first (``format.raw_order``: the front-coded
    vocabulary of format 4).
    """
    raw = sorted_raw(raw)
    if k1 < 0 or not 0.0 <= b <= 1.0:
        raise ValueError(f"BM25 needs k1 >= 0 and 0 <= b <= 1 (got k1={k1}, b={b})")
    extras = _extras(raw.n_docs, doc_ids, bucket, buckets, global_pos)
    enc = encode(raw, float(k1), float(b))
    doc_len = np.asarray(raw.doc_len, np.uint32)
    # data first: its generator fills the block and per-term arrays written after it.
    arrays: dict[str, np.ndarray | ChunkedArray] = {"data": ChunkedArray("<u4", enc.words())}
    arrays.update(enc.blocks)
    indptr = np.asarray(raw.indptr, np.int64)
    df = np.diff(indptr)
    bit_row, bits = bitsets(indptr, raw.indices, np.where(df * PACKED_BITSET_FRACTION >= raw.n_docs, df, 0),
                            raw.n_docs, bm25.BITSET_MIN_DOCS)
    arrays.update(enc.term_arrays())  # bptr, last_count, wmax_terms/wmax_q (index.packed_narrow)
    # Format 3 (index.packed_tables): idf per distinct df (per term for a segment, whose
    # idf is the corpus's), the bit-set terms instead of a row per term, and no lengths
    # beside their codes.
    if raw.corpus_docs is None:
        arrays["idf_df"], arrays["idf_val"] = idf_table(df, enc.idf)
    else:
        arrays["idf"] = enc.idf
    arrays.update(bit_terms=np.flatnonzero(bit_row >= 0).astype(np.int32), bits=bits)
    codes = length_codes(doc_len)
    if codes is not None:
        arrays["doc_code"], arrays["code_len"] = codes
    else:
        arrays["doc_len"] = doc_len
    arrays.update(vocab_arrays(raw.terms))  # sorted_raw: distinct terms, ids in their order
    arrays.update(extras)
    corpus = _corpus(raw)
    scalars = {"k1": float(k1), "b": float(b), "n_docs": raw.n_docs, "n_terms": raw.n_terms,
               "total_len": int(doc_len.sum(dtype=np.int64)), "bucket": bucket, "buckets": buckets,
               "corpus_docs": corpus[0], "corpus_len": corpus[1], "layout": PACKED,
               "vocab_block": vocab_block(arrays)}
    return _publish(Path(path), arrays, scalars)


def write_layout(raw: RawPostings, path: str | os.PathLike[str], *, layout: str | None = None, k1: float,
                 b: float, doc_ids: Sequence[str] | None = None, bucket: int = 0, buckets: int = 1,
                 global_pos: np.ndarray | None = None) -> Path:
    """Publish ``raw`` in the layout ``choose_layout(raw.n_postings, layout)`` picks
    (``layout`` or ``RAGSPINE_BM25_LAYOUT``: plain, packed, or auto by size)."""
    chosen = choose_layout(raw.n_postings, layout)
    writer = {PLAIN: write_plain, PACKED: write_packed}[chosen]
    return writer(raw, path, k1=k1, b=b, doc_ids=doc_ids, bucket=bucket, buckets=buckets, global_pos=global_pos)


def _fsync_dir(folder: Path) -> None:
    """Make the rename durable (POSIX); where folders cannot be opened or synced, skip."""
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


__all__ = ["CorruptIndexError", "write_index", "write_layout", "write_packed", "write_plain"]
