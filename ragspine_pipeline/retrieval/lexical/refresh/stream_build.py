"""Build BM25 postings from a stream of document batches in bounded memory (#27 item 3).

Why: the in-memory build (``index.postings.count_postings``) holds every token of the corpus
as a Python list and sorts one int64 key per token: 1M synthetic chunks peak at 2.3 GB,
10M cannot be built on a 24 GB machine. Here each batch (a sequence of token lists, or an
Arrow ``list<string>`` array as the warehouse's Parquet tokens column reads) is mapped to
term ids once (``refresh.term_ids.TermIds``, grown in first-seen order: a compiled pass over
the tokens' bytes, or Arrow's dictionary encoding without numba, so Python touches each
new term once, not each token) and counted document by document into a fixed-size run
buffer (``RAGSPINE_BM25_BUILD_MEMORY_MIB``). Two threads: one pulls the next batch (and
turns Python lists into Arrow, which holds the GIL) while the other encodes and counts the
current one (compiled, GIL released).
A full run is counting-sorted by term into CSC postings and spilled to ``tmp_dir``; at the
end the runs are merged a range of terms at a time into the corpus arrays' files
(``refresh.spill_io``). Runs hold consecutive documents, so a term's postings are its runs'
slices one after the other: the merge is a sequential copy, never a sort. Every loop is
O(tokens) (``refresh.stream_kernels``). The merged files are written and read without
memory maps (the packed writer reads them a slice at a time), so the build's resident
peak is the run buffer or the writer's tables, not the postings (issue 47 item 4).

Term ids come out in the terms' lexicographic order (format 4's front-coded vocabulary,
``format.raw_order``): each run is spilled in the sorted order of the terms known when it
is spilled (its buffer's ids relabelled in place by their rank), which is the final order
restricted to them, so the merge still reads each run's part of a range of final terms
as one contiguous slice. The result is exactly ``format.raw_order.sorted_raw`` of
``count_postings``'s on the same documents: the same ``indptr``/``indices``/``tf``/
``doc_len`` (tests check it).
"""

from __future__ import annotations

import contextlib
import os
import resource
import tempfile
import time
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from itertools import chain
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..format.raw import PACKED, RawPostings, build_memory_budget, choose_layout
from ..format.raw_order import lexicographic_order, rank_of
from ..index.postings import tf_dtype
from .gc_pause import young_gc_deferred
from .publish import write_layout
from .spill_io import NpyReader, merge_runs, term_ranges, write_npy_header
from .stream_kernels import kernels
from .term_ids import TermIds

# Bytes of run buffer per posting: doc-major (term int32 + tf uint32) and the CSC copy the
# run is sorted into (doc int32 + tf uint32).
BYTES_PER_POSTING = 16
SPILL_RANGE_POSTINGS = 1 << 24  # postings sorted and written at once when a run is spilled (~100 MB)
RELABEL_POSTINGS = 1 << 23  # run-buffer ids relabelled by rank per numpy pass (~64 MB of temporaries)
_END = object()
Batch = Sequence[Sequence[str]] | pa.Array | pa.ChunkedArray


@dataclass(frozen=True)
class _Run:
    """One spilled CSC run: term-major postings of consecutive documents."""

    indptr: Path  # int64 [terms known at the spill + 1]
    indices: Path  # int32 corpus positions
    tf: Path  # smallest unsigned type of the run


@dataclass(frozen=True)
class BuildReport:
    """What a streaming build wrote and what it cost.

    ``peak_rss_mib`` is the process's peak resident set so far (``ru_maxrss``): the build's
    own peak when the build runs in a fresh process, as the benchmark runs it.
    """

    docs: int
    postings: int
    terms: int
    layout: str
    bytes: int
    seconds: float
    count_seconds: float
    runs: int  # runs spilled to disk (0: the corpus fit one in-memory run)
    peak_rss_mib: float
    paths: tuple[str, ...] = ()


# ----------------------------------------------------------------------------- token ids
@dataclass(frozen=True)
class Prepared:
    """One piece of a batch, made without the vocabulary (so it can be prepared on another
    thread while the previous piece is counted): token offsets per document, and the tokens
    as an Arrow string array, or dictionary-encoded (distinct terms + per-token codes), or
    the token lists themselves when Arrow cannot hold them."""

    offs: np.ndarray  # int64 [docs + 1]
    dictionary: pa.Array | None = None
    codes: np.ndarray | None = None
    python: Sequence[Sequence[str]] | None = None
    values: pa.Array | None = None


def prepare(batch: Batch, *, encode: bool = True) -> list[Prepared]:
    """The vocabulary-free half of encoding a batch: Python token lists to Arrow (one C
    conversion, holds the GIL), then with ``encode`` dictionary encoding (Arrow compute,
    releases it). Without ``encode`` the tokens stay a string array for ``TermIds.encode``'s
    compiled pass on the counting thread, which is cheaper than the encoding alone.

    Strings Arrow cannot encode (lone surrogates) take the dict-per-token path.
    """
    if isinstance(batch, pa.ChunkedArray):
        return [p for chunk in batch.chunks for p in prepare(chunk, encode=encode)]
    if not isinstance(batch, pa.Array):
        try:
            arrow = pa.array(batch, type=pa.list_(pa.string()))
        except (pa.ArrowException, UnicodeError, TypeError):
            lens = np.fromiter(map(len, batch), np.int64, len(batch))
            return [Prepared(_offsets(lens), python=batch)]
        return prepare(arrow, encode=encode)  # a ChunkedArray past 2 GiB of characters
    typ = batch.type
    if not ((pa.types.is_list(typ) or pa.types.is_large_list(typ))
            and (pa.types.is_string(typ.value_type) or pa.types.is_large_string(typ.value_type))):
        raise TypeError(f"a batch of documents must be list<string> (token lists), not {typ}")
    offs = _offsets(pc.list_value_length(batch).fill_null(0).to_numpy(zero_copy_only=False))
    values = batch.flatten()
    if values.null_count:
        raise ValueError("a document holds a null token")
    if not len(values):
        return [Prepared(offs, python=[])]
    if not encode:
        return [Prepared(offs, values=values)]
    enc = values.dictionary_encode()  # distinct terms in order of first appearance
    return [Prepared(offs, enc.dictionary, enc.indices.to_numpy())]


def _offsets(lens: np.ndarray) -> np.ndarray:
    offs = np.zeros(len(lens) + 1, np.int64)
    np.cumsum(lens, out=offs[1:])
    return offs


def resolve(prep: Prepared, vocab: TermIds, k: dict[str, Any] | None = None) -> np.ndarray:
    """Term ids (int32, one per token) of a prepared piece, adding its new terms to
    ``vocab`` in first-seen order (pieces must be resolved in corpus order)."""
    if prep.python is not None:
        return _encode_python(prep.python, vocab)
    if prep.values is not None:
        return vocab.encode(prep.values, kernels() if k is None else k)
    return vocab.lookup(prep.dictionary)[prep.codes]


def encode_batch(batch: Batch, vocab: TermIds) -> tuple[np.ndarray, np.ndarray]:
    """(term id per token int32, token offsets per document int64 [docs + 1]) of one batch,
    adding its new terms to ``vocab`` in first-seen order."""
    parts = [(resolve(p, vocab), p.offs) for p in prepare(batch)]
    tids = np.concatenate([t for t, _ in parts]) if parts else np.zeros(0, np.int32)
    offs = [np.zeros(1, np.int64)]
    for _, o in parts:
        offs.append(o[1:] + offs[-1][-1])
    return tids, np.concatenate(offs)


def prepared(batches: Iterable[Batch], *, ahead: bool = True, encode: bool = True) -> Iterator[Prepared]:
    """The pieces of ``batches`` in order (``prepare``); with ``ahead``, the next batch is
    pulled and prepared on a worker thread while the caller counts the current one.

    Why: pulling a batch (the caller's generator) and converting Python lists to Arrow hold
    the GIL; the counting thread's work (compiled encode and fill, or Arrow lookups)
    releases it, so on two cores the two overlap."""
    it = iter(batches)

    def step() -> list[Prepared] | None:
        batch = next(it, _END)
        return None if batch is _END else prepare(batch, encode=encode)

    if not ahead:
        while (pieces := step()) is not None:
            yield from pieces
        return
    with ThreadPoolExecutor(1, thread_name_prefix="bm25-prepare") as pool:
        fut = pool.submit(step)
        while (pieces := fut.result()) is not None:
            fut = pool.submit(step)
            yield from pieces


def _encode_python(batch: Sequence[Sequence[str]], vocab: TermIds) -> np.ndarray:
    flat = list(chain.from_iterable(batch))
    setdefault = vocab.setdefault
    for t in dict.fromkeys(flat):  # the batch's distinct terms, first seen first
        setdefault(t, len(vocab))
    return np.fromiter(map(vocab.__getitem__, flat), np.int32, len(flat))


# ----------------------------------------------------------------------------- counting
class StreamCounter:
    """The state of one streaming count: vocabulary, run buffer, spilled runs.

    ``add`` each batch in corpus order, then ``finish`` once. ``run_postings`` is the run
    buffer's capacity in postings (default: the memory budget / ``BYTES_PER_POSTING``).
    """

    def __init__(self, tmp_dir: str | os.PathLike[str], *, memory_mib: int | None = None,
                 run_postings: int | None = None, kernel: str = "auto") -> None:
        self.tmp = Path(tmp_dir)
        self.cap = int(run_postings or build_memory_budget(memory_mib) // BYTES_PER_POSTING)
        if self.cap < 1:
            raise ValueError(f"run_postings must be >= 1 (got {run_postings})")
        self.k = kernels(kernel)
        self._arrow_encode = self.k.get("encode") is None  # no compiled encoder: Arrow's, on the worker
        self.vocab = TermIds()
        self.n_docs = 0
        self.doc_len: list[np.ndarray] = []
        self.runs: list[_Run] = []
        self._term = np.empty(0, np.int32)
        self._tf = np.empty(0, np.uint32)
        self._pos = 0
        self._run_doc0 = 0
        self._npost: list[np.ndarray] = []
        self._last = np.empty(0, np.int64)
        self._slot = np.empty(0, np.int64)

    def add(self, batch: Batch) -> None:
        """Count one batch of documents (the next ones in corpus order)."""
        for piece in prepare(batch, encode=self._arrow_encode):
            self.add_prepared(piece)

    def add_prepared(self, piece: Prepared) -> None:
        """Count one prepared piece (the next documents in corpus order)."""
        self._count(resolve(piece, self.vocab, self.k), piece.offs)

    def consume(self, batches: Iterable[Batch], *, ahead: bool = True) -> StreamCounter:
        """Count every batch, preparing the next on a worker thread (``prepared``), with
        young garbage collections deferred (``young_gc_deferred``)."""
        with young_gc_deferred():
            for piece in prepared(batches, ahead=ahead, encode=self._arrow_encode):
                self.add_prepared(piece)
        return self

    def _count(self, tids: np.ndarray, offs: np.ndarray) -> None:
        n = len(offs) - 1
        lens = np.diff(offs)
        if n and int(lens.max()) >= 2**32:
            raise ValueError("a document of 2**32 tokens or more")
        self.doc_len.append(lens.astype(np.uint32))
        self._scratch(len(self.vocab))
        if not len(self._term) and n:
            # Virtual until written: a small corpus touches only the pages it fills.
            self._term, self._tf = np.empty(self.cap, np.int32), np.empty(self.cap, np.uint32)
        npost = np.zeros(n, np.int64)
        d = 0
        while d < n:
            need = int(lens[d])
            if need > len(self._term) - self._pos:
                if self._pos:
                    self._spill(self.n_docs + d)
                if need > len(self._term):  # one document longer than the whole budget
                    self._term, self._tf = np.empty(need, np.int32), np.empty(need, np.uint32)
            done, self._pos = self.k["fill"](tids, offs, d, n, self.n_docs, self._last, self._slot,
                                             self._term, self._tf, self._pos, len(self._term), npost[d:])
            self._npost.append(npost[d:done])
            d = done
        self.n_docs += n

    def _scratch(self, n_terms: int) -> None:
        """Per-term scratch of the fill loop, grown with the vocabulary."""
        if len(self._last) < n_terms:
            grown = max(n_terms, 2 * len(self._last), 1024)
            last = np.full(grown, -1, np.int64)
            last[:len(self._last)] = self._last
            self._last, self._slot = last, np.zeros(grown, np.int64)

    def _csc(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The current run as CSC postings (indptr over every term known now)."""
        n = self._pos
        npost = np.concatenate(self._npost) if self._npost else np.zeros(0, np.int64)
        indptr = np.zeros(len(self.vocab) + 1, np.int64)
        # tf in its smallest type from the start: no narrowing copy beside the run (128-256 MB
        # of a 1 GiB budget's peak)
        indices, tf = np.empty(n, np.int32), np.empty(n, tf_dtype(self._tf[:n]))
        self.k["to_csc"](self._term, self._tf, n, npost, self._run_doc0, indptr, indices, tf)
        return indptr, indices, tf

    def _spill(self, next_doc: int, order: np.ndarray | None = None) -> None:
        """Sort the run buffer into a CSC run file set in ``tmp_dir`` and empty it.

        The CSC postings are made and written a range of about ``SPILL_RANGE_POSTINGS``
        postings at a time (``csc_range``: one pass over the run per range), so beside the
        run buffer the spill holds one range, not a sorted copy of the whole run.
        ``order``: the known terms' lexicographic order when the caller has it already
        (``finish``'s last spill: the vocabulary is complete), else sorted here."""
        n = self._pos
        npost = np.concatenate(self._npost) if self._npost else np.zeros(0, np.int64)
        n_terms = len(self.vocab)
        if order is None:
            order = lexicographic_order(self.vocab.binary())
        self._relabel(rank_of(order))
        indptr = np.zeros(n_terms + 1, np.int64)
        self.k["term_counts"](self._term, n, indptr[1:])
        np.cumsum(indptr, out=indptr)
        tf_type = np.dtype(tf_dtype(self._tf[:n]))
        i = len(self.runs)
        run = _Run(self.tmp / f"run{i:05d}-indptr.npy", self.tmp / f"run{i:05d}-indices.npy",
                   self.tmp / f"run{i:05d}-tf.npy")
        self.tmp.mkdir(parents=True, exist_ok=True)
        np.save(run.indptr, indptr)
        cursor = indptr[:-1].copy()
        with open(run.indices, "wb") as f_idx, open(run.tf, "wb") as f_tf:
            write_npy_header(f_idx, np.dtype(np.int32), n)
            write_npy_header(f_tf, tf_type, n)
            for t_lo, t_hi in term_ranges(indptr, SPILL_RANGE_POSTINGS):
                p0, p1 = int(indptr[t_lo]), int(indptr[t_hi])
                indices, tf = np.empty(p1 - p0, np.int32), np.empty(p1 - p0, tf_type)
                self.k["csc_range"](self._term, self._tf, n, npost, self._run_doc0, cursor, t_lo, t_hi, p0,
                                    indices, tf)
                indices.tofile(f_idx)
                tf.tofile(f_tf)
        self.runs.append(run)
        self._pos, self._npost, self._run_doc0 = 0, [], next_doc

    def finish(self, *, mapped: bool = True) -> tuple[RawPostings, dict[str, int]]:
        """The corpus's raw postings and its vocabulary (term -> id, first seen first).

        When runs were spilled, ``indices`` and ``tf`` (5-8 bytes a posting) are memory-mapped
        from ``tmp_dir``, or with ``mapped=False`` read a slice at a time from there
        (``spill_io.NpyReader``: for a consumer that reads them in slices, as the packed
        writer does, the process then never holds them whole); ``indptr`` (8 bytes a term)
        and ``doc_len`` (4 bytes a document) stay in memory: 40 MB at 10M documents."""
        doc_len = np.concatenate(self.doc_len) if self.doc_len else np.zeros(0, np.uint32)
        order = lexicographic_order(self.vocab.binary())
        first_seen = list(self.vocab)
        terms = [first_seen[t] for t in order.tolist()]
        del first_seen
        if not self.runs:
            self._relabel(rank_of(order))
            indptr, indices, tf = self._csc()
            self._release()
        else:
            if self._pos or self._run_doc0 < self.n_docs:
                self._spill(self.n_docs, order)  # the same vocabulary: not sorted again
            self._release()
            indptr, indices, tf = self._merge(order, mapped=mapped)
        # The vocabulary's ids become the postings' (the ranks); no term is counted after this.
        self.vocab.update(zip(terms, range(len(terms)), strict=True))
        return RawPostings(indptr, indices, tf, doc_len, terms), self.vocab

    def _relabel(self, rank: np.ndarray) -> None:
        """The run buffer's term ids replaced by their ranks (in place, a slice at a time)."""
        for a in range(0, self._pos, RELABEL_POSTINGS):
            b = min(self._pos, a + RELABEL_POSTINGS)
            self._term[a:b] = rank[self._term[a:b]]

    def _release(self) -> None:
        self._term = self._tf = self._last = self._slot = np.empty(0, np.int32)

    def _merge(self, order: np.ndarray, *, mapped: bool = True) -> tuple[np.ndarray, Any, Any]:
        """The corpus arrays from the spilled runs (``spill_io.merge_runs``, in the terms'
        final ``order``): memory maps of the merged files, or with ``mapped=False`` slice
        readers (``NpyReader``)."""
        indptr, idx_path, tf_path = merge_runs([(r.indptr, r.indices, r.tf) for r in self.runs], len(self.vocab),
                                               self.tmp, self.k["merge_run"], order=order)
        if int(indptr[-1]) == 0:
            return indptr, np.zeros(0, np.int32), np.load(tf_path)
        if mapped:
            return indptr, np.load(idx_path, mmap_mode="r"), np.load(tf_path, mmap_mode="r")
        return indptr, NpyReader(idx_path), NpyReader(tf_path)


def count_stream(batches: Iterable[Batch], *, memory_mib: int | None = None, tmp_dir: str | os.PathLike[str],
                 run_postings: int | None = None, kernel: str = "auto") -> tuple[RawPostings, dict[str, int]]:
    """(raw postings, vocabulary) of the documents of ``batches``, in order, counted in
    runs of at most the memory budget (``memory_mib`` or RAGSPINE_BM25_BUILD_MEMORY_MIB).

    Spilled runs and the merged arrays live in ``tmp_dir``, which must outlive the
    returned arrays (they may be memory-mapped from it).
    """
    counter = StreamCounter(tmp_dir, memory_mib=memory_mib, run_postings=run_postings, kernel=kernel)
    return counter.consume(batches).finish()


# ----------------------------------------------------------------------------- buckets
def split_buckets(raw: RawPostings, bucket_of: np.ndarray, buckets: int, tmp_dir: str | os.PathLike[str], *,
                  kernel: str = "auto") -> Iterator[tuple[RawPostings, np.ndarray]]:
    """(postings, corpus positions) of each hash bucket, bucket 0 first.

    Each bucket's postings keep only its documents (local positions, in corpus order) and
    the terms they hold, with the corpus's N, summed length and per-term df
    (``corpus_*``), so every segment scores exactly as the corpus does. Two passes over the
    corpus postings (count, then scatter) into one bucket-major array set in ``tmp_dir``.
    """
    k = kernels(kernel)
    bucket_of = np.asarray(bucket_of, np.int64)
    if len(bucket_of) != raw.n_docs:
        raise ValueError(f"{len(bucket_of)} buckets for {raw.n_docs} documents")
    n_terms = raw.n_terms
    counts = np.zeros((buckets, n_terms), np.int64)
    indices = np.asarray(raw.indices)
    if raw.n_postings:
        k["bucket_counts"](raw.indptr, indices, bucket_of, counts)
    seg_total = counts.sum(axis=1)
    bstart = np.zeros(buckets + 1, np.int64)
    np.cumsum(seg_total, out=bstart[1:])
    cursor = np.zeros((buckets, n_terms), np.int64)
    if n_terms > 1:
        np.cumsum(counts[:, :-1], axis=1, out=cursor[:, 1:])
    cursor += bstart[:-1, None]
    local_of = np.zeros(raw.n_docs, np.int32)
    positions = [np.flatnonzero(bucket_of == bk) for bk in range(buckets)]
    for pos in positions:
        local_of[pos] = np.arange(len(pos), dtype=np.int32)
    total = int(bstart[-1])
    tmp = Path(tmp_dir)
    tmp.mkdir(parents=True, exist_ok=True)
    if total:
        out_idx = np.lib.format.open_memmap(tmp / "bucket-indices.npy", "w+", np.int32, (total,))
        out_tf = np.lib.format.open_memmap(tmp / "bucket-tf.npy", "w+", raw.tf.dtype, (total,))
        k["bucket_scatter"](raw.indptr, indices, np.asarray(raw.tf), bucket_of, local_of, cursor,
                            np.asarray(out_idx), np.asarray(out_tf))
    else:
        out_idx, out_tf = np.zeros(0, np.int32), np.zeros(0, raw.tf.dtype)
    del cursor, local_of
    corpus_df = np.diff(raw.indptr) if raw.corpus_df is None else np.asarray(raw.corpus_df, np.int64)
    corpus_len = int(raw.doc_len.sum(dtype=np.int64)) if raw.corpus_len is None else raw.corpus_len
    corpus_docs = raw.n_docs if raw.corpus_docs is None else raw.corpus_docs
    for bk, pos in enumerate(positions):
        held = np.flatnonzero(counts[bk])
        indptr = np.zeros(len(held) + 1, np.int64)
        np.cumsum(counts[bk, held], out=indptr[1:])
        lo, hi = int(bstart[bk]), int(bstart[bk + 1])
        part = RawPostings(indptr=indptr, indices=out_idx[lo:hi], tf=out_tf[lo:hi], doc_len=raw.doc_len[pos],
                           terms=[raw.terms[t] for t in held.tolist()], corpus_docs=corpus_docs,
                           corpus_len=corpus_len, corpus_df=corpus_df[held])
        yield part, pos


# ----------------------------------------------------------------------------- writing
def peak_rss_mib() -> float:
    """This process's peak resident set so far, in MiB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def build_index_file(batches: Iterable[Batch], path: str | os.PathLike[str], *, k1: float, b: float,
                     doc_ids: Sequence[str] | None = None, layout: str | None = None, memory_mib: int | None = None,
                     tmp_dir: str | os.PathLike[str] | None = None, kernel: str = "auto") -> BuildReport:
    """Count ``batches`` in bounded memory and publish them as one index file at ``path``.

    ``layout``: plain, packed or auto (``choose_layout``, by the corpus's postings count).
    Spill files go to ``tmp_dir`` (default: a temporary folder beside ``path``, removed
    after). The plain layout computes a float64 weight per posting (8 bytes a posting in
    memory while it is written: ~4 GB at 10M synthetic chunks); the packed one does not.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    with contextlib.ExitStack() as stack:
        if tmp_dir is None:
            tmp_dir = stack.enter_context(tempfile.TemporaryDirectory(prefix=".bm25-build-", dir=path.parent))
        counter = StreamCounter(tmp_dir, memory_mib=memory_mib, kernel=kernel)
        raw, _vocab = counter.consume(batches).finish(mapped=False)
        # The writer takes the terms from raw.terms: the vocabulary's dict and its encoder
        # tables (~0.25 GB at 2M terms) go before it runs.
        del _vocab
        counter.vocab = TermIds()
        t_count = time.perf_counter() - t0
        if doc_ids is not None and len(doc_ids) != raw.n_docs:
            raise ValueError(f"{len(doc_ids)} doc ids for {raw.n_docs} documents")
        chosen = choose_layout(raw.n_postings, layout)
        if chosen != PACKED:  # the plain writer computes on whole arrays: it gets the memory maps
            raw = replace(raw, indices=np.asarray(raw.indices), tf=np.asarray(raw.tf))
        write_layout(raw, path, layout=chosen, k1=k1, b=b, doc_ids=doc_ids)
        report = BuildReport(docs=raw.n_docs, postings=raw.n_postings, terms=raw.n_terms, layout=chosen,
                             bytes=path.stat().st_size, seconds=round(time.perf_counter() - t0, 3),
                             count_seconds=round(t_count, 3), runs=len(counter.runs), peak_rss_mib=round(peak_rss_mib(), 1),
                             paths=(str(path),))
        del raw
    return report
