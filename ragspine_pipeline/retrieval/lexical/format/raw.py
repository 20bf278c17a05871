"""Raw postings: what a BM25 build has counted before any layout is chosen.

Why: the streaming build (``refresh.stream_build``) and the two on-disk postings layouts
(plain: ``index.postings.Postings`` with exact float64 weights; packed: ``index.packed``,
block-packed doc-id deltas and term frequencies) meet here. The builder produces one
``RawPostings`` (its arrays may be ``numpy.memmap`` views of spill files, so a 10M-chunk
corpus never sits in RAM as Python objects); a layout writer consumes it in bounded slices.
``choose_layout`` is the one rule that picks the layout for a corpus.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .... import settings

PLAIN, PACKED = "plain", "packed"
# Postings per block-max bound, in both layouts (the kernels read this constant; the file
# format's block arrays are counted in it).
BLOCK_SIZE = 128


@dataclass(frozen=True)
class RawPostings:
    """Term-major (CSC) postings of one corpus or one segment, counts only.

    Term t's postings are ``indices[indptr[t]:indptr[t+1]]`` (doc positions, strictly
    ascending) with raw term frequencies ``tf`` at the same offsets. ``terms[t]`` is term
    t's text; ``doc_len[d]`` is document d's token count. ``corpus_docs`` /
    ``corpus_len`` / ``corpus_df`` are the whole corpus's N, total length and per-term df
    when these postings are one segment of it (None: these postings are the corpus).
    """

    indptr: np.ndarray  # int64 [n_terms + 1]
    indices: np.ndarray  # int32 [postings]
    tf: np.ndarray  # uint8/uint16/uint32 [postings]
    doc_len: np.ndarray  # uint32 [n_docs]
    terms: Sequence[str]  # [n_terms]
    corpus_docs: int | None = None
    corpus_len: int | None = None
    corpus_df: np.ndarray | None = None  # int64 [n_terms], aligned with ``terms``

    @property
    def n_docs(self) -> int:
        return int(len(self.doc_len))

    @property
    def n_terms(self) -> int:
        return int(len(self.indptr) - 1)

    @property
    def n_postings(self) -> int:
        return int(self.indptr[-1]) if len(self.indptr) else 0


def choose_layout(n_postings: int, layout: str | None = None) -> str:
    """``plain`` or ``packed`` for a corpus of ``n_postings`` postings.

    ``layout`` (an argument, else ``RAGSPINE_BM25_LAYOUT``): ``plain``/``packed`` force
    one; ``auto`` picks packed from ``RAGSPINE_BM25_PACKED_FROM`` postings on, where the
    plain layout's 13 bytes a posting stop fitting comfortably in memory and on disk.
    """
    chosen = settings.get("RAGSPINE_BM25_LAYOUT", layout)
    if chosen != "auto":
        return str(chosen)
    return PACKED if n_postings >= int(settings.get("RAGSPINE_BM25_PACKED_FROM")) else PLAIN


def build_memory_budget(mib: int | None = None) -> int:
    """Bytes the streaming build may hold in memory runs before it spills one to disk
    (``mib`` or ``RAGSPINE_BM25_BUILD_MEMORY_MIB``)."""
    return int(settings.get("RAGSPINE_BM25_BUILD_MEMORY_MIB", mib)) << 20


def publish_buckets(value: int | None = None) -> int:
    """Hash buckets the published index is split into (``value`` or ``RAGSPINE_BM25_BUCKETS``)."""
    return int(settings.get("RAGSPINE_BM25_BUCKETS", value))
