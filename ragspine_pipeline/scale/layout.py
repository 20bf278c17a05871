"""A library published as one BM25 file, laid out in hash buckets (tests and benchmarks).

Why: serving maps the hash-bucket segments a library was published with
(``RAGSPINE_BM25_BUCKETS``); a test or a benchmark that has only the one-file index writes
the same layout from it once, with the streaming segment writer (bounded memory), instead
of rebuilding the corpus.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..retrieval.lexical.refresh.segments import write_segments_stream


def index_token_batches(index: Any, batch_docs: int = 20000) -> Iterator[list[list[str]]]:
    """The documents of a built BM25 index as bags of tokens (term repeated tf times), in
    position order, ``batch_docs`` at a time: BM25 reads counts only, so segments written
    from these score as the index does. The postings are turned document-major once in
    numpy (a few arrays the size of the postings); only one batch is Python lists at a time.
    Lets a library published as one file be laid out in buckets for a test or a benchmark.
    A refresh stack (``bm25_stack``) gives its live documents in row order."""
    if hasattr(index, "segments") and hasattr(index, "rows"):
        yield from _stack_token_batches(index, batch_docs)
        return
    vocab = index.vocab
    n_terms = len(np.asarray(index.indptr)) - 1
    if callable(getattr(vocab, "term", None)):
        terms = [vocab.term(t) for t in range(n_terms)]
    else:
        terms = [""] * n_terms
        for s, t in vocab.items():
            terms[t] = s
    indptr = np.asarray(index.indptr)
    indices = np.asarray(index.indices).astype(np.int64)
    term_of = np.repeat(np.arange(n_terms, dtype=np.int64), np.diff(indptr))
    order = np.argsort(indices, kind="stable")  # by document, then term id
    docs, term_of, tf = indices[order], term_of[order], np.asarray(index.tf)[order].astype(np.int64)
    del order, indices
    doc_ptr = np.searchsorted(docs, np.arange(index.n_docs + 1))
    for a in range(0, index.n_docs, batch_docs):
        b = min(index.n_docs, a + batch_docs)
        t_part, f_part = term_of[doc_ptr[a]:doc_ptr[b]].tolist(), tf[doc_ptr[a]:doc_ptr[b]].tolist()
        base = int(doc_ptr[a])
        batch = []
        for d in range(a, b):
            toks: list[str] = []
            for j in range(int(doc_ptr[d]) - base, int(doc_ptr[d + 1]) - base):
                toks.extend([terms[t_part[j]]] * f_part[j])
            batch.append(toks)
        yield batch


def _stack_token_batches(stack: Any, batch_docs: int) -> Iterator[list[list[str]]]:
    """A stack's live documents as bags of tokens, in row order (every segment's documents
    are held once as Python lists: a test's or a benchmark's size)."""
    docs: list[list[str] | None] = [None] * stack.n_docs
    for seg, rows in zip(stack.segments, stack.rows, strict=True):
        pos = 0
        for batch in index_token_batches(seg, batch_docs):
            for toks in batch:
                if rows[pos] >= 0:
                    docs[int(rows[pos])] = toks
                pos += 1
    for a in range(0, stack.n_docs, batch_docs):
        yield [d if d is not None else [] for d in docs[a:a + batch_docs]]


def write_layout(folder: str | os.PathLike[str], index: Any, doc_ids: Sequence[str], buckets: int) -> Path:
    """Write ``index`` (one file) as ``buckets`` hash-bucket segments into ``folder`` with the
    streaming segment writer (bounded memory): the layout a library published with
    ``RAGSPINE_BM25_BUCKETS=buckets`` has (tests and benchmarks; serving maps published buckets)."""
    Path(folder).mkdir(parents=True, exist_ok=True)
    write_segments_stream(folder, index_token_batches(index), list(doc_ids), buckets=buckets, k1=index.k1,
                          b=index.b)
    return Path(folder)


__all__ = ["index_token_batches", "write_layout"]
