"""A BM25 corpus published as hash-bucket segments, so a shard maps only its part.

Why: one machine (or one Ray actor) should serve a part of a large corpus without
rebuilding anything. ``write_segments`` puts each document in segment
``doc_bucket(doc_id, B)`` (``format.file``) and writes every segment with corpus-wide
statistics (idf from the corpus df, ``w`` from the corpus avgdl). A segment's scores are
therefore the corpus's own: ``open_segments(folder, buckets)`` maps any subset of the
segments and its unfiltered top-k is exactly the corpus top-k restricted to those
documents; merged by (score, corpus position), the shards' top-k lists give the corpus
top-k, ties by position as in one index.

Filtered queries follow the spec: N, df and avgdl over the survivors of the whole corpus.
With every segment mapped, ``search(..., candidates=...)`` counts each segment's survivors
and sums them before scoring (numpy, exact). A shard holding only some segments cannot
know the other survivors' statistics and says so (``ValueError``); a distributed caller
runs the same two steps (``survivor_stats`` on every shard, sum, then ``search`` with
``stats=``).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..format.file import CorruptIndexError, doc_bucket, strings_to_blob
from ..format.raw import choose_layout
from ..index.bm25 import candidate_mask
from ..index.mapped import MappedBM25Index, open_index
from ..index.reference import DEFAULT_B, DEFAULT_K1, bm25_idf
from ..index.topk import ScoredDocs, empty_scored, merge_top_k, top_k
from .publish import write_layout
from .stream_build import Batch, BuildReport, StreamCounter, peak_rss_mib, split_buckets


def segment_name(bucket: int, buckets: int) -> str:
    return f"bm25-{bucket:04d}-of-{buckets:04d}.rsbm25"


def write_segments(folder: str | os.PathLike[str], docs_tokens: Sequence[Sequence[str]], doc_ids: Sequence[str],
                   *, buckets: int, k1: float = DEFAULT_K1, b: float = DEFAULT_B,
                   layout: str | None = None) -> list[Path]:
    """Publish token lists held in memory as ``buckets`` segment files in ``folder``
    (``write_segments_stream`` with one batch)."""
    if len(doc_ids) != len(docs_tokens):
        raise ValueError(f"{len(doc_ids)} doc ids for {len(docs_tokens)} documents")
    report = write_segments_stream(folder, [docs_tokens], doc_ids, buckets=buckets, k1=k1, b=b, layout=layout)
    return [Path(p) for p in report.paths]


def write_segments_stream(folder: str | os.PathLike[str], batches: Iterable[Batch], doc_ids: Sequence[str], *,
                          buckets: int, k1: float = DEFAULT_K1, b: float = DEFAULT_B, layout: str | None = None,
                          memory_mib: int | None = None, tmp_dir: str | os.PathLike[str] | None = None,
                          kernel: str = "auto") -> BuildReport:
    """Publish the documents of ``batches`` (corpus order; ``doc_ids`` one per document) as
    ``buckets`` segment files in ``folder``, each atomic and verified; a segment may be empty.

    One streaming count of the whole corpus (bounded memory, ``refresh.stream_build``), then
    one split into hash buckets (``doc_bucket``) with the corpus's N, length and df, so
    each segment's scores are the corpus's. Every segment has the layout ``choose_layout``
    picks for the whole corpus (``layout`` forces one). Returns the build's report (its
    ``bytes`` summed over the segments, ``paths`` bucket 0 first).
    """
    if buckets < 1:
        raise ValueError(f"buckets must be >= 1 (got {buckets})")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    with contextlib.ExitStack() as stack:
        if tmp_dir is None:
            tmp_dir = stack.enter_context(tempfile.TemporaryDirectory(prefix=".bm25-build-", dir=folder))
        counter = StreamCounter(tmp_dir, memory_mib=memory_mib, kernel=kernel)
        raw, _vocab = counter.consume(batches).finish()
        t_count = time.perf_counter() - t0
        if len(doc_ids) != raw.n_docs:
            raise ValueError(f"{len(doc_ids)} doc ids for {raw.n_docs} documents")
        bucket_of = np.fromiter((doc_bucket(d, buckets) for d in doc_ids), np.int64, len(doc_ids))
        chosen = choose_layout(raw.n_postings, layout)
        paths = []
        for bk, (part, pos) in enumerate(split_buckets(raw, bucket_of, buckets, tmp_dir, kernel=kernel)):
            paths.append(write_layout(part, folder / segment_name(bk, buckets), layout=chosen, k1=float(k1), b=float(b),
                                   doc_ids=[doc_ids[i] for i in pos.tolist()], bucket=bk, buckets=buckets,
                                   global_pos=pos))
            del part
        report = BuildReport(docs=raw.n_docs, postings=raw.n_postings, terms=raw.n_terms, layout=chosen,
                             bytes=sum(p.stat().st_size for p in paths), seconds=round(time.perf_counter() - t0, 3),
                             count_seconds=round(t_count, 3), runs=len(counter.runs),
                             peak_rss_mib=round(peak_rss_mib(), 1), paths=tuple(str(p) for p in paths))
        del raw
    return report


@dataclass(frozen=True)
class SurvivorStats:
    """A filter's survivors in some segments: count, summed length, df per query token."""

    n: int
    total_len: int
    df: np.ndarray  # int64, one per query token

    def __add__(self, other: Any) -> SurvivorStats:
        other = SurvivorStats.of(other)
        return SurvivorStats(self.n + other.n, self.total_len + other.total_len, self.df + other.df)

    @property
    def total(self) -> int:
        """``CorpusStats``'s name for the summed length (a ranking across libraries reads either)."""
        return self.total_len

    @staticmethod
    def of(stats: Any) -> SurvivorStats:
        """Statistics of either kind (``CorpusStats`` names the summed length ``total``)."""
        return stats if isinstance(stats, SurvivorStats) else SurvivorStats(int(stats.n), int(stats.total),
                                                                           np.asarray(stats.df, np.int64))


class SegmentedBM25:
    """Some (or all) segments of a published corpus; positions are corpus positions."""

    def __init__(self, segments: list[MappedBM25Index]) -> None:
        if not segments:
            raise ValueError("no segments to serve")
        first = segments[0]._toc
        self.buckets_total = first.buckets
        self.n_docs = first.corpus_docs
        self.k1, self.b = first.k1, first.b
        for seg in segments:
            t = seg._toc
            if (t.buckets, t.corpus_docs, t.corpus_len, t.k1, t.b) != (
                    first.buckets, first.corpus_docs, first.corpus_len, first.k1, first.b) or not hasattr(
                    seg, "_global_pos"):
                raise CorruptIndexError(seg.path, "not a segment of the same corpus as " + str(segments[0].path))
            seg._file.whole("global_pos")
            g = seg._global_pos
            if len(g) and (int(g[0]) < 0 or int(g[-1]) >= self.n_docs or (np.diff(g) <= 0).any()):
                raise CorruptIndexError(seg.path, "corpus positions out of range or out of order")
        self.segments = sorted(segments, key=lambda s: s._toc.bucket)
        self.buckets = [s._toc.bucket for s in self.segments]
        self.path = self.segments[0].path.parent

    def verify(self) -> None:
        """Every checksum and the structure of every mapped segment (``CorruptIndexError``
        naming the damaged file)."""
        for seg in self.segments:
            seg.verify()

    # ------------------------------------------------------------ doc ids
    @property
    def has_doc_ids(self) -> bool:
        return all(seg.has_doc_ids for seg in self.segments)

    def doc_ids(self, positions: Iterable[int]) -> list[str]:
        """The doc ids recorded at publish for these corpus positions (mapped segments only)."""
        out = []
        for p in positions:
            p = int(p)
            for seg in self.segments:
                g = seg._global_pos
                i = int(np.searchsorted(g, p))
                if i < len(g) and int(g[i]) == p:
                    out.append(seg.doc_ids([i])[0])
                    break
            else:
                raise IndexError(f"corpus position {p} is in no mapped segment of {self.path}")
        return out

    def same_doc_ids(self, ids: Sequence[str]) -> bool:
        """Whether the segments' recorded doc ids are exactly ``ids`` at their corpus positions."""
        return len(ids) == self.n_docs and self.same_doc_id_blob(*strings_to_blob(ids))

    def same_doc_id_blob(self, off: np.ndarray, blob: np.ndarray) -> bool:
        """``same_doc_ids`` for ids encoded as ``strings_to_blob`` encodes them: every mapped
        segment's ids equal the corpus ids at its positions, and together the segments
        hold every position (when all are mapped)."""
        if not self.has_doc_ids or len(off) != self.n_docs + 1:
            return False
        if len(self.segments) == self.buckets_total and sum(s.n_docs for s in self.segments) != self.n_docs:
            return False
        off, blob = np.asarray(off, np.int64), np.asarray(blob)
        for seg in self.segments:
            g = np.asarray(seg._global_pos, np.int64)
            lens = off[g + 1] - off[g]
            sub_off = np.zeros(len(g) + 1, np.int64)
            np.cumsum(lens, out=sub_off[1:])
            gather = np.repeat(off[g] - sub_off[:-1], lens) + np.arange(int(sub_off[-1]), dtype=np.int64)
            if not seg.same_doc_id_blob(sub_off, blob[gather]):
                return False
        return True

    def search(self, query_tokens: Sequence[str], k: int = 10, candidates: np.ndarray | None = None, *,
               stats: SurvivorStats | None = None) -> ScoredDocs:
        """Top-k over the mapped segments by (score desc, corpus position asc).

        ``candidates``: a bool mask over the corpus positions, or corpus positions; then
        the survivors' statistics are the corpus's (summed over all segments, or ``stats``).
        ``stats`` without candidates: every document scored with them (a ranking across
        libraries passes the union's; ``CorpusStats`` or ``SurvivorStats``).
        """
        if k <= 0:
            return empty_scored()
        if candidates is None and stats is None:
            parts = [seg.search(query_tokens, k) for seg in self.segments]
            ids = np.concatenate([seg._global_pos[p.ids] for seg, p in zip(self.segments, parts, strict=True)])
            return merge_top_k(ids, np.concatenate([p.scores for p in parts]), k)
        mask = self._mask(candidates)
        if stats is not None:
            stats = SurvivorStats.of(stats)
        else:
            if len(self.segments) != self.buckets_total:
                missing = sorted(set(range(self.buckets_total)) - set(self.buckets))
                raise ValueError(f"a filtered query needs every segment's survivor statistics; this shard lacks "
                                 f"buckets {missing}: pass stats= (the sum of survivor_stats over all shards)")
            stats = self.survivor_stats(query_tokens, mask)
        return self._filtered(query_tokens, k, mask, stats)

    def survivor_stats(self, query_tokens: Sequence[str], candidates: np.ndarray | None = None) -> SurvivorStats:
        """This shard's part of a filter's statistics (summed across shards by the caller;
        None: every document, as ``BM25Index.survivor_stats``)."""
        mask = self._mask(candidates)
        total = SurvivorStats(0, 0, np.zeros(len(query_tokens), np.int64))
        for seg in self.segments:
            local = mask[seg._global_pos]
            seg._doc_lengths_read()
            df = np.zeros(len(query_tokens), np.int64)
            for x, q in enumerate(query_tokens):
                t = seg.vocab.get(q)
                if t is not None:
                    df[x] = int(np.count_nonzero(local[seg.indices[seg.indptr[t]:seg.indptr[t + 1]]]))
            total = total + SurvivorStats(int(np.count_nonzero(local)),
                                          int(seg._doc_len32[local].sum(dtype=np.int64)), df)
        return total

    def _filtered(self, query_tokens: Sequence[str], k: int, mask: np.ndarray, stats: SurvivorStats) -> ScoredDocs:
        """The reference formula over the survivors, per posting (numpy), in query order."""
        if stats.n == 0 or stats.total_len == 0:
            return empty_scored()
        avgdl = stats.total_len / stats.n
        k1, b = self.k1, self.b
        ids, contrib = [], []
        for seg in self.segments:
            local = mask[seg._global_pos]
            seg._doc_lengths_read()
            for x, q in enumerate(query_tokens):
                t = seg.vocab.get(q)
                if t is None or stats.df[x] == 0:
                    continue
                sl = slice(seg.indptr[t], seg.indptr[t + 1])
                keep = local[seg.indices[sl]]
                d = seg.indices[sl][keep]
                f = seg.tf[sl][keep].astype(np.float64)
                idf = bm25_idf(stats.n, float(stats.df[x]))
                norm = k1 * (1.0 - b + b * seg._doc_len32[d] / avgdl)
                ids.append(seg._global_pos[d])
                contrib.append((x, idf * (f * (k1 + 1.0)) / (f + norm)))
        all_ids = np.concatenate(ids) if ids else np.zeros(0, np.int64)
        if not len(all_ids):  # no survivor holds a query term (in this shard)
            return empty_scored()
        order = np.lexsort((np.concatenate([np.full(len(c), x) for x, c in contrib]), all_ids))
        si = all_ids[order]
        starts = np.flatnonzero(np.r_[True, si[1:] != si[:-1]])
        vals = np.concatenate([c for _, c in contrib])[order]
        return top_k(si[starts], np.add.reduceat(vals, starts), k)

    def _mask(self, candidates: np.ndarray | None) -> np.ndarray:
        """None: every document (as ``BM25Index.survivor_stats`` reads it)."""
        return np.ones(self.n_docs, bool) if candidates is None else candidate_mask(candidates, self.n_docs)


def open_segments(folder: str | os.PathLike[str], buckets: Iterable[int] | None = None, *,
                  kernel: str = "auto") -> SegmentedBM25:
    """Map the segments of ``folder`` (all, or only ``buckets``) without rebuilding."""
    files = sorted(Path(folder).glob("bm25-*-of-*.rsbm25"))
    if not files:
        raise FileNotFoundError(f"{folder}: no BM25 segment files")
    total = int(files[0].name.rsplit("-of-", 1)[1].split(".")[0])
    wanted = range(total) if buckets is None else sorted(set(buckets))
    paths = [Path(folder) / segment_name(bk, total) for bk in wanted]
    for p in paths:
        if not p.is_file():
            raise FileNotFoundError(f"{p}: segment missing")
    return SegmentedBM25([open_index(p, kernel=kernel) for p in paths])
