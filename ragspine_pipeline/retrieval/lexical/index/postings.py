"""Build the BM25 postings arrays from token lists (the in-memory build).

Everything a query reads is an array here, gathered in one ``Postings`` record: the same
record is what the on-disk format (``format.file``) writes and what a memory-mapped open
(``index.mapped``) hands back, so the kernels cannot tell a built index from a mapped one.

Layout: CSC postings (term -> sorted doc positions) with, per posting, the exact float64
saturation factor ``w = tf / (tf + norm(doc))`` of the full corpus and the raw term
frequency (smallest unsigned int that fits). Per term: df, idf over the corpus, the
largest ``w`` (MaxScore's bound), the block-max bounds of ``BLOCK_SIZE`` postings, and
for long lists of a large corpus a bitset row (survivor df by popcount).
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace

import numpy as np

from ..format.raw import BLOCK_SIZE, RawPostings
from ..kernels.filter_stats import RANK_WORDS
from .reference import bm25_idf

__all__ = ["ARRAY_NAMES", "BITSET_DF_FRACTION", "BLOCK_SIZE", "RANK_WORDS", "Postings", "bitsets", "build_postings",
           "count_postings", "postings_from_raw", "tf_dtype"]
# Filtered queries: postings lists with df >= N / BITSET_DF_FRACTION get a bitset (corpora
# of at least the caller's ``bitset_min_docs`` documents), so their survivor df is a popcount.
BITSET_DF_FRACTION = 16


@dataclass(frozen=True)
class Postings:
    """The arrays of a built BM25 index (names are the on-disk array names).

    ``doc_len`` is uint32: the filtered kernel reads one length per survivor, and half the
    bytes of int64 is half the pages to map.
    """

    indptr: np.ndarray  # int64 [n_terms + 1]: term t's postings are indptr[t]:indptr[t+1]
    indices: np.ndarray  # int32 [postings]: doc positions, ascending within a term
    tf: np.ndarray  # uint8/16/32 [postings]: raw term frequency
    w: np.ndarray  # float64 [postings]: tf / (tf + k1 (1 - b + b len/avgdl)), full corpus
    df: np.ndarray  # int64 [n_terms]
    doc_len: np.ndarray  # uint32 [n_docs]
    idf: np.ndarray  # float64 [n_terms]: full-corpus idf
    w_max: np.ndarray  # float64 [n_terms]: max w of the term (MaxScore bound)
    bptr: np.ndarray  # int64 [n_terms + 1]: term t's block maxima are bmax[bptr[t]:bptr[t+1]]
    bmax: np.ndarray  # float64 [blocks]: max w per BLOCK_SIZE postings
    bit_row: np.ndarray  # int32 [n_terms]: row of bits, or -1
    bits: np.ndarray  # uint64 [rows, ceil(n_docs / 64)]: postings bitsets of long lists

    def arrays(self) -> dict[str, np.ndarray]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


ARRAY_NAMES = tuple(f.name for f in fields(Postings))


@dataclass(frozen=True)
class CorpusStats:
    """Corpus-wide statistics for a segment that holds only part of the corpus: its ``w``
    and ``idf`` are then those of the whole corpus, so its scores are the corpus's."""

    n_docs: int
    total_len: int
    df: dict[str, int]  # term -> documents of the whole corpus holding it


def build_postings(
    docs_tokens: Sequence[Sequence[str]], k1: float, b: float, bitset_min_docs: int,
    corpus: CorpusStats | None = None,
) -> tuple[Postings, dict[str, int]]:
    """(postings, vocabulary term -> id) of token lists held in memory.

    ``corpus``: statistics of the whole corpus when these documents are one segment of it
    (default: these documents). A corpus too large for token lists is built by
    ``refresh.stream_build`` into the same ``RawPostings`` and weighted by ``postings_from_raw``.
    """
    raw, vocab = count_postings(docs_tokens)
    if corpus is not None:
        corpus_df = np.fromiter((corpus.df[t] for t in vocab), np.int64, len(vocab))
        raw = replace(raw, corpus_docs=corpus.n_docs, corpus_len=corpus.total_len, corpus_df=corpus_df)
    return postings_from_raw(raw, k1, b, bitset_min_docs), vocab


def count_postings(docs_tokens: Sequence[Sequence[str]]) -> tuple[RawPostings, dict[str, int]]:
    """(raw postings, vocabulary term -> id) by one in-place sort of (term, doc) keys.

    Term ids go into a compact ``array('i')`` (4 bytes each) rather than a list of Python
    ints (~36 bytes each), which bounds peak build memory.
    """
    vocab: dict[str, int] = {}
    setdefault = vocab.setdefault
    flat = array("i")
    extend = flat.extend
    n_docs = len(docs_tokens)
    lens = np.empty(n_docs, dtype=np.int64)
    for i, toks in enumerate(docs_tokens):
        lens[i] = len(toks)
        extend([setdefault(t, len(vocab)) for t in toks])
    n_terms = len(vocab)
    stride = max(n_docs, 1)
    # key = term * N + doc, sorted in place: term-major, doc ascending = CSC order.
    keys = np.frombuffer(flat, dtype=np.int32).astype(np.int64)
    del flat
    keys *= stride
    keys += np.repeat(np.arange(n_docs, dtype=np.int64), lens)
    keys.sort()
    if len(keys):
        starts = np.flatnonzero(np.concatenate(([True], keys[1:] != keys[:-1])))
        counts = np.diff(np.append(starts, len(keys)))
        uniq = keys[starts]
    else:
        counts = uniq = np.zeros(0, np.int64)
    del keys
    post_terms = uniq // stride
    indices = (uniq - post_terms * stride).astype(np.int32)
    del uniq
    indptr = np.zeros(n_terms + 1, dtype=np.int64)
    np.cumsum(np.bincount(post_terms, minlength=n_terms), out=indptr[1:])
    raw = RawPostings(indptr=indptr, indices=indices, tf=counts.astype(tf_dtype(counts)),
                      doc_len=lens.astype(np.uint32), terms=list(vocab))
    return raw, vocab


def tf_dtype(counts: np.ndarray) -> type[np.unsignedinteger]:
    """The smallest unsigned integer type holding every term frequency of ``counts``."""
    max_tf = int(counts.max()) if len(counts) else 0
    return np.uint8 if max_tf < 2**8 else np.uint16 if max_tf < 2**16 else np.uint32


def postings_from_raw(raw: RawPostings, k1: float, b: float, bitset_min_docs: int) -> Postings:
    """The plain layout's arrays (exact float64 ``w`` per posting, idf, bounds, bitsets) of
    counted postings; the corpus statistics are ``raw``'s corpus_* when it is a segment."""
    indptr, indices, n_docs, n_terms = raw.indptr, raw.indices, raw.n_docs, raw.n_terms
    lens = raw.doc_len.astype(np.int64)
    df = np.diff(indptr)
    if raw.corpus_docs is None:
        avgdl = float(lens.sum()) / n_docs if n_docs else 0.0
        idf = bm25_idf(n_docs, df.astype(np.float64)) if n_terms else np.zeros(0)
    else:
        avgdl = int(raw.corpus_len or 0) / raw.corpus_docs if raw.corpus_docs else 0.0
        corpus_df = np.asarray(raw.corpus_df, np.float64)
        idf = bm25_idf(raw.corpus_docs, corpus_df) if n_terms else np.zeros(0)
    # Exact float64 tf-saturation factor per posting for the unfiltered path:
    # score = sum_t idf_t * (k1 + 1) * w[t, d]. Filtered queries recompute from tf.
    safe = avgdl if avgdl > 0 else 1.0
    norm = k1 * (1.0 - b + b * lens / safe)
    w = np.asarray(raw.tf).astype(np.float64)
    denom = norm[indices]
    denom += w
    np.divide(w, denom, out=w)
    del denom, norm
    bptr, bmax = block_max(indptr, df, w)
    bit_row, bits = bitsets(indptr, indices, df, n_docs, bitset_min_docs)
    w_max = np.zeros(n_terms, dtype=np.float64)
    nonempty = np.flatnonzero(df)
    if len(nonempty):
        w_max[nonempty] = np.maximum.reduceat(w, indptr[nonempty])
    return Postings(indptr=indptr, indices=indices, tf=raw.tf, w=w, df=df, doc_len=lens.astype(np.uint32),
                    idf=np.asarray(idf, np.float64), w_max=w_max, bptr=bptr, bmax=bmax,
                    bit_row=bit_row, bits=bits)


def block_max(indptr: np.ndarray, df: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Max w per block of BLOCK_SIZE postings of each term (``bptr[t]``: the term's first
    block), so the compiled kernel can skip whole blocks of a long list that cannot reach
    the top k."""
    n_blocks = (df + BLOCK_SIZE - 1) // BLOCK_SIZE
    bptr = np.zeros(len(df) + 1, np.int64)
    np.cumsum(n_blocks, out=bptr[1:])
    total = int(bptr[-1])
    if total == 0:
        return bptr, np.zeros(1, np.float64)
    first = np.repeat(indptr[:-1], n_blocks)
    nth = np.arange(total, dtype=np.int64) - np.repeat(bptr[:-1], n_blocks)
    return bptr, np.maximum.reduceat(w, first + nth * BLOCK_SIZE)


def bitsets(indptr: np.ndarray, indices: np.ndarray, df: np.ndarray, n_docs: int,
            min_docs: int) -> tuple[np.ndarray, np.ndarray]:
    """Bitsets of the longest postings lists (df >= N/16) of a corpus of ``min_docs`` or more.

    A filtered query needs each query term's df over the filter survivors. For a long list
    that is a popcount of (list bits & filter bits) over N/64 words instead of a pass over
    df postings; at df >= N/16 the bitset is at most half the size of the list's int32
    ids, and such terms are few.
    """
    n_terms = len(df)
    bit_row = np.full(n_terms, -1, np.int32)
    dense = (np.flatnonzero(df * BITSET_DF_FRACTION >= n_docs) if n_docs >= min_docs
             else np.zeros(0, np.int64))
    words = (n_docs + 63) // 64
    bits = np.zeros((len(dense), words), np.uint64)
    if not len(dense):
        return bit_row, bits
    row = np.zeros(words * 64, np.bool_)
    for r, t in enumerate(dense.tolist()):
        row[:] = False
        row[indices[indptr[t]:indptr[t + 1]]] = True
        bits[r] = np.packbits(row, bitorder="little").view(np.uint64)
    bit_row[dense] = np.arange(len(dense), dtype=np.int32)
    return bit_row, bits
