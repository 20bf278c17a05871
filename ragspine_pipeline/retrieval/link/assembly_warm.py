"""Ready before ready: what a served index's first query would pay, paid at start (#47 item 4).

Why: opening a published BM25 file loads its kernels (``open_index`` warms them for the
file's dtypes), but the first query still paid everything else that is checked or built
lazily, measured at 1M documents with a ~2M-term vocabulary (packed layout, 2 shared
cores): the vocabulary's hash table checksummed whole (~9-25 ms), the document lengths
checksummed and summed (~7-20 ms), the weight tables, and the query terms' posting
pages read from disk when the page cache is cold (~90 ms for one query's terms): ~30 ms
with the file in the page cache, ~120 ms without. A dense channel adds the published
vectors' scan arrays (checksums, ~1 s at 1M x 384) and the query embedder's model load.

``warm_retriever`` pays all of it for every ``HybridRetriever`` a served retriever wraps
(``hybrid_retrievers``), before a serving process says it is ready:

* the BM25 file is read once through the page cache (``prefetch``: positional reads, so
  nothing is mapped into the process and a second serving process's own memory does not
  grow), when it fits in half the memory available; a first query then never waits on
  the disk for its terms;
* the terms with the most postings (``HEAVY_TERM_POSTINGS`` or more) resolved through the
  vocabulary, which checks each on first use: at 1M documents with a ~2M-term vocabulary
  a first query holding one of them paid 100-400 ms for that alone (396 terms, a third of
  the postings: 1.8-5.7 s at start on 2 busy cores, packed layout);
* one probe query, unfiltered and then filtered by a mask, through the retriever's own
  search (analyzer, BM25 kernels on their real arguments, vocabulary and length checks,
  the dense channel and its embedder where there is one, fusion);
* the served chunk records read once per record batch: a batch's checksums are checked
  the first time one of its rows is built, and the first query at 1M SciFact chunks built
  240 rows across that many batches: 73 of its ~100 ms were those checksums (~0.7 s for
  all 883 MB at start);
* ``PublishedVectors.warm`` where vectors are published;
* the label and document codes every answer's exits read.

Measured (``bench_bm25_lucene_vocab.py --first-query``, ``bench_served_first_query.py``):
the first query after open at 1M documents went from 30-290 ms (p50; 895 ms worst) to
1-10 ms (14 ms worst) on a bare index, and from 122 ms (224 ms, cold page cache) to 22 ms
through the serving door at 1M SciFact chunks.

No answer is returned, counted or cached for a caller, and no reranker or LLM runs: the
probe stops at the hybrid retriever. Every long-lived door warms before it answers: the
service (each library before its generation is swapped in, so ``/readyz`` waits), the Ray
replica (through its shards' front, after ``ShardedAssembly.prepare``) and each Ray shard
(``warm_index`` per segment, before it listens), the Dagster ``RetrievalResource`` (when it
opens a library) and ``open_published_retriever(warm=True)``. The CLI's one-shot query does
not warm: the warm-up (0.7-5.7 s at 1M) costs more than the 0.1-0.3 s its one query would save.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...sensitivity import is_restricted
from ..hybrid.retriever import HybridRetriever
from ..hybrid.unwrap import hybrid_retrievers

log = logging.getLogger("ragspine.serving")

READ_BYTES = 1 << 20  # one positional read of the prefetch
# A mapped term's first use checks its postings (checksums, then block structure): ~0.15-0.2
# us a posting on 2 shared cores, 215 ms for the most frequent term at 1M documents. Terms
# with at least this many postings are checked at start; a query of five lighter terms then
# pays at most ~15 ms for their checks.
HEAVY_TERM_POSTINGS = 16_384
PROBE_CHUNKS = 16  # chunks looked at for a probe text
PROBE_CHARS = 200


@dataclass
class WarmReport:
    """What one warm-up did, in seconds per part (logged; tests read it)."""

    indexes: int = 0
    prefetched_bytes: int = 0
    skipped_prefetch: list[str] = field(default_factory=list)
    prefetched: set[str] = field(default_factory=set)  # files read (or tried) once per warm-up
    checked: set[int] = field(default_factory=set)  # ids of the indexes whose heavy terms were checked
    heavy_terms: int = 0
    record_batches: int = 0
    seconds: dict[str, float] = field(default_factory=dict)

    def add(self, part: str, seconds: float) -> None:
        self.seconds[part] = self.seconds.get(part, 0.0) + seconds

    def describe(self) -> str:
        parts = ", ".join(f"{k} {v:.3f} s" for k, v in self.seconds.items())
        return (f"{self.indexes} index(es), {self.prefetched_bytes / 2**20:.1f} MiB prefetched, "
                f"{self.heavy_terms} heavy terms and {self.record_batches} record batches checked; {parts}")


def available_bytes() -> int | None:
    """MemAvailable of ``/proc/meminfo`` (None where there is none)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def prefetch(path: str | os.PathLike[str], *, limit: int | None = None) -> int:
    """Read a file once through the page cache (positional reads into one small buffer:
    the pages land in the shared page cache, none in this process's memory). Returns the
    bytes read, 0 when the file is larger than ``limit`` (default: half of MemAvailable)
    or cannot be read: a file that does not fit is left to the queries, never allowed to
    evict the rest of the page cache."""
    try:
        size = os.path.getsize(path)
        if limit is None:
            avail = available_bytes()
            limit = size if avail is None else avail // 2
        if size > limit:
            return 0
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return 0
    try:
        buf = memoryview(bytearray(READ_BYTES))
        done = 0
        while done < size:
            n = os.preadv(fd, [buf], done)
            if n <= 0:
                break
            done += n
        return done
    except OSError:
        return 0
    finally:
        os.close(fd)


def probe_text(h: HybridRetriever) -> str | None:
    """A served chunk's own words (the first non-blank open chunk of the first
    ``PROBE_CHUNKS``): a probe that matches terms of the index, so the query path runs to its
    kernels. Never a RESTRICTED chunk's (an odd or unreadable label counts as one,
    ``is_restricted``): the probe is embedded as a query, and restricted text is never sent
    to the embedding model."""
    for i in range(min(len(h), PROBE_CHUNKS)):
        chunk = h.chunks[i]
        if is_restricted(getattr(chunk, "sensitivity", None)):
            continue
        text = (getattr(chunk, "text", "") or "").strip()
        if text:
            return text[:PROBE_CHARS]
    return None


def probe_tokens(index: Any) -> list[str] | None:
    """One indexed term of a bare BM25 index (a mapped file's term 0, else the first of an
    in-memory vocabulary), or None for an empty one."""
    vocab = getattr(index, "vocab", None)
    if vocab is None or not len(vocab):
        return None
    term = getattr(vocab, "term", None)
    return [term(0)] if callable(term) else [next(iter(vocab))]


def _prefetch_file(index: Any, report: WarmReport) -> None:
    """The published file a BM25 index maps (an index built in memory has none, and a
    sharded front's ``path`` names its shards' folder: their own processes read it) into
    the page cache, said in ``report``."""
    path = getattr(index, "path", None)
    if path is None or str(path) in report.prefetched or not os.path.isfile(path):
        return
    report.prefetched.add(str(path))
    t0 = time.perf_counter()
    got = prefetch(path)
    report.add("prefetch", time.perf_counter() - t0)
    report.prefetched_bytes += got
    if not got:
        report.skipped_prefetch.append(str(path))


def check_heavy_terms(index: Any, report: WarmReport, min_postings: int | None = None) -> None:
    """Resolve every term of a mapped index with at least ``min_postings`` postings
    (default ``HEAVY_TERM_POSTINGS``, read at call time), the longest first, so its first-use
    check (the vocabulary's ``get`` runs it) is paid now. An index built in memory checks
    nothing lazily and is left alone; an index already checked by this warm-up (one mapping
    shared by the retrievers of several modes) is not checked again."""
    vocab = getattr(index, "vocab", None)
    if not callable(getattr(vocab, "term", None)) or id(index) in report.checked:
        return
    report.checked.add(id(index))
    if min_postings is None:
        min_postings = HEAVY_TERM_POSTINGS
    t0 = time.perf_counter()
    df = np.asarray(index.df)
    heavy = np.flatnonzero(df >= min_postings)
    for t in heavy[np.argsort(-df[heavy], kind="stable")].tolist():
        vocab.get(vocab.term(t))
    report.heavy_terms += len(heavy)
    report.add("heavy terms", time.perf_counter() - t0)


def check_records(chunks: Any, report: WarmReport) -> None:
    """Build one row of every record batch of published chunk records (``ChunkColumns``
    over a mapped file), which checks that batch's checksums, so no query's rows do later.
    Chunks held in memory check nothing and are left alone."""
    table = getattr(chunks, "table", None)
    if table is None or not table.num_columns or not len(chunks):
        return
    t0 = time.perf_counter()
    start = 0
    for batch in table.column(0).chunks:  # one Arrow chunk per record batch
        if len(batch):
            chunks[start]
            report.record_batches += 1
        start += len(batch)
    report.add("records", time.perf_counter() - t0)


def _half_mask(n: int) -> np.ndarray:
    mask = np.zeros(n, np.bool_)
    mask[::2] = True
    return mask


def warm_index(index: Any, tokens: Sequence[str] | None = None, report: WarmReport | None = None) -> WarmReport:
    """A bare BM25 index (``open_index``'s): its file prefetched, then one probe query
    (``tokens``, else ``probe_tokens``) unfiltered and filtered by a mask, so the lazy checks
    and every kernel call of a first query are done."""
    report = report or WarmReport()
    report.indexes += 1
    _prefetch_file(index, report)
    check_heavy_terms(index, report)
    toks = list(tokens) if tokens is not None else probe_tokens(index)
    if toks and getattr(index, "n_docs", 0):
        t0 = time.perf_counter()
        index.search(toks, k=1)
        index.search(toks, k=1, candidates=_half_mask(int(index.n_docs)))
        report.add("bm25 probe", time.perf_counter() - t0)
    return report


def ranks_dense_here(h: HybridRetriever) -> bool:
    """Whether ``h``'s own dense step scans its vector file. A retriever served from shards
    (``scale.front.attach``) has the shards' scatter-gather in its place: its process reads
    only the candidates' rows (``ensure_vectors``), so warming the scan arrays would page in
    a file that process never scans (~384 MB of codes at 1M x 384)."""
    step = getattr(h, "dense_top_vectors", None)
    return getattr(step, "__func__", None) is getattr(type(h), "dense_top_vectors", None)


def warm_hybrid(h: HybridRetriever, report: WarmReport | None = None) -> WarmReport:
    """One hybrid retriever: its BM25 file prefetched, published vectors warmed, one probe
    search unfiltered and one filtered by a mask (every channel it serves), its codes built."""
    report = report or WarmReport()
    report.indexes += 1
    if "bm25" in h.channels:  # a library published in hash buckets maps one file per segment
        for ix in getattr(h.index, "segments", None) or [h.index]:
            _prefetch_file(ix, report)
            check_heavy_terms(ix, report)
    # The published vector file install_vectors gave the retriever (it keeps it as its
    # vector cache's source; None for vectors held in memory or none at all).
    source = getattr(getattr(h, "_vectors", None), "source", None)
    if source is not None and callable(getattr(source, "warm", None)) and ranks_dense_here(h):
        t0 = time.perf_counter()
        source.warm()
        report.add("vectors", time.perf_counter() - t0)
    check_records(h.chunks, report)
    text = probe_text(h)
    if text is not None:
        t0 = time.perf_counter()
        h.search(text, top_k=1)
        h.search(text, top_k=1, mask=_half_mask(len(h)))
        report.add("probe", time.perf_counter() - t0)
    t0 = time.perf_counter()
    _ = h.label_codes, h.doc_codes  # what every answer's exits read
    report.add("codes", time.perf_counter() - t0)
    return report


def warm_retriever(*retrievers: Any, name: str = "served retrievers") -> WarmReport:
    """Every hybrid retriever the served retrievers wrap (one library's, or a multi-library
    one's), each warmed once, each published file read and each index's heavy terms checked
    once (the retrievers of a library's modes share one mapping: ``serving.library_retrievers``).
    One log line says what was warmed: ``name`` (e.g. ``library acme@v3``) and the report;
    the caller logs none of its own."""
    report = WarmReport()
    seen: set[int] = set()
    t0 = time.perf_counter()
    for h in (h for r in retrievers for h in hybrid_retrievers(r)):
        if id(h) not in seen:
            seen.add(id(h))
            warm_hybrid(h, report)
    log.info("%s warmed: %s (%.3f s)", name, report.describe(), time.perf_counter() - t0)
    return report


__all__ = ["HEAVY_TERM_POSTINGS", "WarmReport", "available_bytes", "check_heavy_terms", "check_records",
           "prefetch", "probe_text", "probe_tokens", "warm_hybrid", "warm_index",
           "warm_retriever"]
