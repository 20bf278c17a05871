"""Okapi BM25: the plain reference scorer and the precomputed postings index.

``bm25_scores`` is the readable reference: statistics (N, df, avgdl) are taken over
exactly the candidate documents it is given, ``idf = ln(1 + (N - df + 0.5)/(df + 0.5))``
and every query token counts (a repeated query token counts twice, as in Lucene's
boolean sum and rank-bm25).

``BM25Index`` tokenizes the corpus once and keeps CSC postings (term -> sorted doc ids)
with, per posting, the exact float64 saturation factor ``tf / (tf + norm(doc))`` of the
full corpus and the raw term frequency (smallest unsigned int that fits). An unfiltered
query is then slices, one multiply and one scatter-add; a filtered query re-derives N,
df and avgdl over the surviving candidates from the raw tf. Both equal the reference to
1e-9. Per posting that is 13 bytes (int32 id + float64 + uint8 tf) against bm25s's 8.

Top-k queries run the compiled kernels (``bm25_kernel``, numba: MaxScore-pruned when
unfiltered, survivor-statistics when filtered, ``search_batch`` in parallel) when numba
imports; otherwise, or with ``kernel="numpy"``, the vectorized numpy path with MaxScore
pruning. Both are tested against the reference.
"""

from __future__ import annotations

import math
import os
import threading
from array import array
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from itertools import chain, repeat

import numpy as np

from ...cpus import usable_cpus
from . import bm25_kernel

MAXSCORE_MIN_DOCS = 50_000
# Compiled kernel: corpora up to this size score every posting of a broad query in one
# scatter + one sequential selection pass instead of MaxScore (measured: ~3x faster on
# Cranfield / CMRC-sized corpora, where pruning bookkeeping costs more than it saves).
EXHAUSTIVE_MAX_DOCS = 32_768
DEFAULT_BM25_K1 = 1.5
DEFAULT_BM25_B = 0.75
# Short names used inside the package: the same objects.
DEFAULT_K1 = DEFAULT_BM25_K1
DEFAULT_B = DEFAULT_BM25_B
KERNELS = ("auto", "numba", "numpy")
# Filtered queries: postings lists with df >= N / BITSET_DF_FRACTION get a bitset (corpora
# of BITSET_MIN_DOCS documents or more), so their survivor df is a popcount.
BITSET_DF_FRACTION = 16
BITSET_MIN_DOCS = 65_536
BLOCK_SIZE = 128  # postings per block-max bound (bm25_numba._BLOCK)
_POSTINGS_PER_THREAD = 50_000  # batch work (postings of its terms) per extra thread
_POOL: ThreadPoolExecutor | None = None
_POOL_LOCK = threading.Lock()


_usable_cpus = usable_cpus  # the kernels' thread count (tests patch it)


def _batch_pool() -> ThreadPoolExecutor:
    """One process-wide pool for ``search_batch`` (starting threads per call cost ~3 ms
    on a loaded 2-core machine, more than a small batch's whole search)."""
    global _POOL
    if _POOL is None:
        with _POOL_LOCK:
            if _POOL is None:
                _POOL = ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 1),
                                           thread_name_prefix="bm25-batch")
    return _POOL


def bm25_idf(n_docs: int, df: int | np.ndarray) -> float | np.ndarray:
    """Non-negative BM25 idf: ln(1 + (N - df + 0.5) / (df + 0.5))."""
    if isinstance(df, np.ndarray):
        return np.log1p((n_docs - df + 0.5) / (df + 0.5))
    return math.log1p((n_docs - df + 0.5) / (df + 0.5))


def bm25_scores(
    query_tokens: Sequence[str],
    docs_tokens: Sequence[Sequence[str]],
    k1: float = DEFAULT_K1,
    b: float = DEFAULT_B,
) -> list[float]:
    """Reference BM25 score of every doc in ``docs_tokens`` for ``query_tokens``."""
    n = len(docs_tokens)
    if n == 0:
        return []
    tfs = [Counter(d) for d in docs_tokens]
    lens = [len(d) for d in docs_tokens]
    avgdl = sum(lens) / n
    if avgdl == 0:
        return [0.0] * n
    df: Counter[str] = Counter()
    for tf in tfs:
        df.update(tf.keys())
    scores = [0.0] * n
    for q in query_tokens:
        dfq = df.get(q, 0)
        if dfq == 0:
            continue
        idf = bm25_idf(n, dfq)
        for i, tf in enumerate(tfs):
            f = tf.get(q, 0)
            if f:
                norm = k1 * (1.0 - b + b * lens[i] / avgdl)
                scores[i] += idf * (f * (k1 + 1.0)) / (f + norm)
    return scores


@dataclass(frozen=True)
class ScoredDocs:
    """Top documents of one query: internal doc positions and their scores (desc)."""

    ids: np.ndarray  # int64 doc positions
    scores: np.ndarray  # float64


class BM25Index:
    """Postings index whose scores equal ``bm25_scores`` over the same candidates.

    Doc positions are the order of ``docs_tokens``; ties are broken by ascending
    position, so callers that sort their documents by id get id-ascending ties.
    """

    def __init__(
        self,
        docs_tokens: Sequence[Sequence[str]],
        *,
        k1: float = DEFAULT_K1,
        b: float = DEFAULT_B,
        kernel: str = "auto",
    ) -> None:
        if k1 < 0 or not (0.0 <= b <= 1.0):
            raise ValueError(f"BM25 needs k1 >= 0 and 0 <= b <= 1 (got k1={k1}, b={b})")
        if kernel not in KERNELS:
            raise ValueError(f"unknown BM25 kernel {kernel!r}; available: {', '.join(KERNELS)}")
        self.k1 = float(k1)
        self.b = float(b)
        self._build(docs_tokens)
        compiled = None if kernel == "numpy" else bm25_kernel.load_kernels()
        if kernel == "numba" and compiled is None:
            raise RuntimeError("kernel='numba' needs numba, which could not be imported or compiled "
                               "(pip install 'numba>=0.60')")
        self._kernels = compiled
        self._exhaustive_docs = EXHAUSTIVE_MAX_DOCS
        self._scratch = bm25_kernel.Scratch(self.n_docs) if compiled is not None else None

    @property
    def kernel(self) -> str:
        """Which top-k path queries take: "numba" (compiled) or "numpy"."""
        return "numba" if self._kernels is not None else "numpy"

    # ------------------------------------------------------------------ build
    def _build(self, docs_tokens: Sequence[Sequence[str]]) -> None:
        """Vocabulary, then CSC postings by one in-place sort of (term, doc) keys.

        Term ids go into a compact ``array('i')`` (4 bytes each) rather than a list of
        Python ints (~36 bytes each), which bounds peak build memory.
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
        self.indices = (uniq - post_terms * stride).astype(np.int32)
        del uniq
        max_tf = int(counts.max()) if len(counts) else 0
        tf_dtype = np.uint8 if max_tf < 2**8 else np.uint16 if max_tf < 2**16 else np.uint32
        self.tf = counts.astype(tf_dtype)
        self.indptr = np.zeros(n_terms + 1, dtype=np.int64)
        np.cumsum(np.bincount(post_terms, minlength=n_terms), out=self.indptr[1:])
        self.vocab = vocab
        self.doc_len = lens
        # The filtered kernel reads a length per survivor: half the bytes of int64.
        self._doc_len32 = lens.astype(np.uint32)
        self.n_docs = n_docs
        self.total_len = int(lens.sum())
        self.df = np.diff(self.indptr)
        avgdl = self.total_len / n_docs if n_docs else 0.0
        self.avgdl = avgdl
        # Full-corpus query-time constants (the unfiltered fast path).
        self._idf_full = bm25_idf(n_docs, self.df.astype(np.float64)) if n_terms else np.zeros(0)
        safe = avgdl if avgdl > 0 else 1.0
        self._norm_full = self.k1 * (1.0 - self.b + self.b * lens / safe)
        # Exact float64 tf-saturation factor per posting for the unfiltered path:
        # score = sum_t idf_t * (k1 + 1) * w[t, d]. Filtered queries recompute from tf.
        w = counts.astype(np.float64)
        denom = self._norm_full[self.indices]
        denom += w
        np.divide(w, denom, out=w)
        self.w = w
        del counts, denom
        self._build_bitsets()
        self._build_block_max()
        # Per-term maximum of w: the MaxScore upper bound of a term's contribution.
        self._w_max = np.zeros(n_terms, dtype=np.float64)
        nonempty = np.flatnonzero(self.df)
        if len(nonempty):
            self._w_max[nonempty] = np.maximum.reduceat(w, self.indptr[nonempty])

    def _build_block_max(self) -> None:
        """Max w per block of BLOCK_SIZE postings of each term (``_bptr[t]``: the term's
        first block), so the compiled kernel can skip whole blocks of a long list that
        cannot reach the top k."""
        n_blocks = (self.df + BLOCK_SIZE - 1) // BLOCK_SIZE
        self._bptr = np.zeros(len(self.df) + 1, np.int64)
        np.cumsum(n_blocks, out=self._bptr[1:])
        total = int(self._bptr[-1])
        if total == 0:
            self._bmax = np.zeros(1, np.float64)
            return
        first = np.repeat(self.indptr[:-1], n_blocks)
        nth = np.arange(total, dtype=np.int64) - np.repeat(self._bptr[:-1], n_blocks)
        self._bmax = np.maximum.reduceat(self.w, first + nth * BLOCK_SIZE)

    def _build_bitsets(self) -> None:
        """Bitsets of the longest postings lists (df >= N/16) of a large corpus.

        A filtered query needs each query term's df over the filter survivors. For a
        long list that is a popcount of (list bits & filter bits) over N/64 words instead
        of a pass over df postings; at df >= N/16 the bitset is at most half the size of
        the list's int32 ids, and such terms are few.
        """
        n, n_terms = self.n_docs, len(self.vocab)
        self._bit_row = np.full(n_terms, -1, np.int32)
        dense = (np.flatnonzero(self.df * BITSET_DF_FRACTION >= n) if n >= BITSET_MIN_DOCS
                 else np.zeros(0, np.int64))
        words = (n + 63) // 64
        self._bits = np.zeros((len(dense), words), np.uint64)
        if not len(dense):
            return
        row = np.zeros(words * 64, np.bool_)
        for r, t in enumerate(dense.tolist()):
            row[:] = False
            row[self.indices[self.indptr[t]:self.indptr[t + 1]]] = True
            self._bits[r] = np.packbits(row, bitorder="little").view(np.uint64)
        self._bit_row[dense] = np.arange(len(dense), dtype=np.int32)

    def _survivor_df(self, tids: np.ndarray, mbits: np.ndarray) -> np.ndarray:
        """Per query token: its df over the survivors (``mbits``: the packed mask as
        uint64 words) when its list has a bitset, else -1 (the kernel counts those from
        the postings)."""
        out = np.full(len(tids), -1, np.int64)
        rows = self._bit_row[tids]
        if (rows < 0).all():
            return out
        seen: dict[int, int] = {}
        for x, r in enumerate(rows.tolist()):
            if r >= 0:
                if r not in seen:
                    seen[r] = int(np.bitwise_count(self._bits[r] & mbits).sum())
                out[x] = seen[r]
        return out

    @property
    def nbytes(self) -> int:
        return int(
            self.indices.nbytes + self.tf.nbytes + self.w.nbytes + self.indptr.nbytes + self.doc_len.nbytes
            + self._norm_full.nbytes + self._idf_full.nbytes + self.df.nbytes + self._w_max.nbytes
            + self._bits.nbytes + self._bit_row.nbytes + self._doc_len32.nbytes
            + self._bptr.nbytes + self._bmax.nbytes
        )

    # ----------------------------------------------------------------- scoring
    def _query_term_ids(self, query_tokens: Sequence[str]) -> list[int]:
        get = self.vocab.get
        return [t for t in (get(q) for q in query_tokens) if t is not None]

    def _accumulate(
        self,
        query_tokens: Sequence[str],
        mask: np.ndarray | None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """(doc positions, scores) of every candidate that matches a query term.

        All query-term postings are concatenated first, so the arithmetic is a handful of
        vectorized passes over the touched postings whatever the query length:
        ``w = idf*(k1+1) * tf / (tf + norm[doc])``; per-document sums then run in query
        term order, as in the reference.
        """
        empty = (np.zeros(0, np.int64), np.zeros(0, np.float64))
        term_ids = self._query_term_ids(query_tokens)
        if not term_ids:
            return empty
        indptr, k1, b = self.indptr, self.k1, self.b
        if mask is None:
            n, avgdl = self.n_docs, self.avgdl
        else:
            n = int(np.count_nonzero(mask))
            if n == 0:
                return empty
            avgdl = float(self.doc_len[mask].sum()) / n
        if avgdl == 0:
            return empty
        tids = np.asarray(term_ids)
        sl = [slice(indptr[t], indptr[t + 1]) for t in term_ids]
        lengths = np.array([x.stop - x.start for x in sl])
        if mask is None:
            scale = self._idf_full[tids] * (k1 + 1.0)
            if len(sl) == 1:
                all_i = self.indices[sl[0]]
                w = self.w[sl[0]] * scale[0]
            else:
                all_i = np.concatenate([self.indices[x] for x in sl])
                w = np.concatenate([self.w[x] for x in sl])
                w *= np.repeat(scale, lengths)
        else:
            all_i = np.concatenate([self.indices[x] for x in sl])
            all_f = np.concatenate([self.tf[x] for x in sl]).astype(np.float64)
            keep = mask[all_i]
            term_of = np.repeat(np.arange(len(tids)), lengths)[keep]
            all_i, all_f = all_i[keep], all_f[keep]
            lengths = np.bincount(term_of, minlength=len(tids))
            # Statistics over the surviving candidates only, as the reference computes them.
            scale = bm25_idf(n, lengths.astype(np.float64)) * (k1 + 1.0)
            w = k1 * (1.0 - b + b * self.doc_len[all_i] / avgdl)
            w += all_f
            np.divide(all_f, w, out=w)
            w *= np.repeat(scale, lengths)
        if len(all_i) == 0:
            return empty
        if np.count_nonzero(lengths) == 1:
            return all_i.astype(np.int64), w
        if len(all_i) * 4 >= self.n_docs:
            # Dense accumulate: one pass over a corpus-sized buffer; returned whole so
            # top-k can select on it directly (zeros are non-matches: idf, tf > 0).
            return _DENSE, np.bincount(all_i, weights=w, minlength=self.n_docs)
        # Sparse accumulate: sort-merge the touched postings only (stable: term order).
        order = np.argsort(all_i, kind="stable")
        si = all_i[order]
        starts = np.flatnonzero(np.r_[True, si[1:] != si[:-1]])
        return si[starts].astype(np.int64), np.add.reduceat(w[order], starts)

    def get_scores(
        self, query_tokens: Sequence[str], candidates: np.ndarray | None = None
    ) -> np.ndarray:
        """Dense score vector over all docs (0 outside the candidate mask)."""
        mask = self._as_mask(candidates)
        ids, sc = self._accumulate(query_tokens, mask)
        if ids is _DENSE:
            return sc
        out = np.zeros(self.n_docs, dtype=np.float64)
        out[ids] = sc
        return out

    def search(
        self,
        query_tokens: Sequence[str],
        k: int = 10,
        candidates: np.ndarray | None = None,
    ) -> ScoredDocs:
        """Top-``k`` matching docs by (-score, position); only docs with score > 0."""
        mask = self._as_mask(candidates)
        if k > 0 and self._kernels is not None:
            return self._search_compiled(query_tokens, k, mask)
        if mask is None and k > 0:
            pruned = self._maxscore(query_tokens, k)
            if pruned is not None:
                return pruned
        ids, sc = self._accumulate(query_tokens, mask)
        if ids is _DENSE:
            return _top_k_dense(sc, k)
        return _top_k(ids, sc, k)

    def search_batch(self, queries: Sequence[Sequence[str]], k: int = 10, *,
                     threads: int | None = None) -> list[ScoredDocs]:
        """``search(q, k)`` for each unfiltered query, in one call; results equal ``search``'s.

        The compiled kernel runs the whole batch without the GIL and without per-query
        Python work (``search_batch_arrays``); ``threads`` (default: the CPUs this process
        may use) splits the batch into at most that many chunks run on Python threads.
        """
        if k <= 0 or not queries:
            return [ScoredDocs(np.zeros(0, np.int64), np.zeros(0, np.float64)) for _ in queries]
        if self._kernels is None or self.avgdl == 0:
            return [self.search(q, k) for q in queries]
        ids, sc, cnt = self.search_batch_arrays(queries, k, threads=threads)
        return [ScoredDocs(ids[i, :c], sc[i, :c]) for i, c in enumerate(cnt.tolist())]

    def search_batch_arrays(self, queries: Sequence[Sequence[str]], k: int = 10, *,
                            threads: int | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The batch as arrays, for vectorized consumers: (ids[nq, k] padded with -1,
        scores[nq, k] padded with 0, counts[nq]); row i equals ``search(queries[i], k)``.

        Token -> term id for the whole batch runs in C-level loops (tokens outside the
        vocabulary become -1 and the kernel skips them). Extra threads start only when the
        batch's postings pay for them; the first chunk runs on the calling thread, the rest
        on one process-wide pool.
        """
        nq = len(queries)
        kk = max(int(k), 0)
        if kk == 0 or nq == 0 or self.avgdl == 0:
            return np.full((nq, kk), -1, np.int64), np.zeros((nq, kk)), np.zeros(nq, np.int64)
        if self._kernels is None:
            ids, sc, cnt = np.full((nq, kk), -1, np.int64), np.zeros((nq, kk)), np.zeros(nq, np.int64)
            for i, q in enumerate(queries):
                r = self.search(q, kk)
                cnt[i] = n = len(r.ids)
                ids[i, :n], sc[i, :n] = r.ids, r.scores
            return ids, sc, cnt
        flat = np.fromiter(map(self.vocab.get, chain.from_iterable(queries), repeat(-1)), np.int64)
        ptr = np.zeros(nq + 1, np.int64)
        np.cumsum(np.fromiter(map(len, queries), np.int64, nq), out=ptr[1:])
        work = int(self.df[flat[flat >= 0]].sum()) if len(flat) else 0
        wanted = int(threads or _usable_cpus())
        n_thr = max(1, min(wanted, nq, work // _POSTINGS_PER_THREAD + 1))
        bounds = np.linspace(0, nq, n_thr + 1).astype(int)
        chunks = [(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:], strict=True) if b > a]
        run = self._kernels.search_batch

        def one(span: tuple[int, int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
            a, b = span
            return run(self.indptr, self.indices, self.w, self._idf_full, self._w_max,
                       flat[ptr[a]:ptr[b]], ptr[a:b + 1] - ptr[a], self.k1 + 1.0, kk, self.n_docs,
                       self._exhaustive_docs, self._bptr, self._bmax)

        if len(chunks) == 1:
            return one(chunks[0])
        rest = [_batch_pool().submit(one, c) for c in chunks[1:]]
        parts = [one(chunks[0])] + [f.result() for f in rest]
        return tuple(np.concatenate([p[x] for p in parts]) for x in range(3))  # type: ignore[return-value]

    def _search_compiled(self, query_tokens: Sequence[str], k: int, mask: np.ndarray | None) -> ScoredDocs:
        """Top-k through the compiled kernels (pruned unfiltered, or survivor statistics)."""
        get = self.vocab.get
        tids = np.array([t for t in (get(q) for q in query_tokens) if t is not None], np.int64)
        if not len(tids) or self.avgdl == 0:
            return ScoredDocs(np.zeros(0, np.int64), np.zeros(0, np.float64))
        sc = self._scratch
        if mask is None:
            ids, scores = self._kernels.search_one(self.indptr, self.indices, self.w, self._idf_full,
                                                   self._w_max, tids, self.k1 + 1.0, int(k),
                                                   sc.acc, sc.touched, self._exhaustive_docs,
                                                   self._bptr, self._bmax)
        else:
            # One pass over the mask: survivor count and length, packed bits (padded to
            # whole uint64 words for the bitset popcounts) and, when few, their positions.
            n_docs = self.n_docs
            bits = np.zeros(((n_docs + 63) // 64) * 8, np.uint8)
            cap = n_docs // 64
            surv = np.empty(cap + 1, np.int32)
            n, total = self._kernels.mask_prepare(mask[: n_docs // 8 * 8].view(np.uint64), mask,
                                                  self._doc_len32, bits, surv)
            if 0 < n <= cap:
                # Few survivors: long lists are galloped at their positions instead of scanned.
                surv = surv[:n]
                pre_df = np.full(len(tids), -1, np.int64)  # galloping the few is cheaper
            else:
                surv = surv[:0]
                pre_df = self._survivor_df(tids, bits.view(np.uint64))
            ids, scores = self._kernels.search_filtered(self.indptr, self.indices, self.tf, self._doc_len32,
                                                        bits, surv, n, total, tids, pre_df, self.k1, self.b,
                                                        int(k), sc.acc, sc.touched, self._w_max,
                                                        self.avgdl)
        return ScoredDocs(ids, scores)

    def _maxscore(self, query_tokens: Sequence[str], k: int) -> ScoredDocs | None:
        """Exact top-k with MaxScore pruning (unfiltered queries over long postings).

        Terms are scanned rarest first. Once the summed upper bounds of the terms not yet
        scanned fall below the current k-th partial score, no untouched document can
        reach the top k; the remaining terms are then only looked up (binary search in
        their sorted postings) for the touched candidates. Returns None when pruning
        would not pay (short postings), so the plain path runs.
        """
        if self.n_docs < MAXSCORE_MIN_DOCS:
            return None  # small corpora: one pass is cheaper than pruning bookkeeping
        term_ids = self._query_term_ids(query_tokens)
        if len(term_ids) < 2:
            return None
        uniq, mult = np.unique(np.asarray(term_ids), return_counts=True)
        df = self.df[uniq]
        if int(df.sum()) * 4 < self.n_docs or len(uniq) < 2:
            return None
        order = np.argsort(df, kind="stable")
        uniq, mult = uniq[order], mult[order]
        scale = self._idf_full[uniq] * (self.k1 + 1.0) * mult
        ub = scale * self._w_max[uniq]
        rest = np.concatenate((np.cumsum(ub[::-1])[::-1][1:], [0.0]))  # bound of terms after j
        # theta_j <= prefix bound, so stopping after j needs prefix(j) > rest(j). If that
        # first happens only after most postings, pruning cannot pay: use the plain path.
        df_sorted = df[order]
        ok = np.flatnonzero(np.cumsum(ub) > rest)
        total = int(df_sorted.sum())
        budget = 0.3 * total
        if len(ok) == 0 or ok[0] == len(uniq) - 1 or df_sorted[: ok[0] + 1].sum() > budget:
            return None
        scanned = 0
        indptr, indices, w = self.indptr, self.indices, self.w
        cand = np.zeros(0, np.int64)
        part = np.zeros(0, np.float64)
        for j, t in enumerate(uniq):
            sl = slice(indptr[t], indptr[t + 1])
            ids = np.concatenate((cand, indices[sl].astype(np.int64)))
            vals = np.concatenate((part, w[sl] * scale[j]))
            o = np.argsort(ids, kind="stable")
            ids, vals = ids[o], vals[o]
            starts = np.flatnonzero(np.r_[True, ids[1:] != ids[:-1]])
            cand, part = ids[starts], np.add.reduceat(vals, starts)
            if j + 1 == len(uniq):
                return _top_k(cand, part, k)
            scanned += int(df_sorted[j])
            if len(cand) >= k:
                theta = np.partition(part, len(part) - k)[len(part) - k]
                if rest[j] < theta:
                    break
            if scanned + int(df_sorted[j + 1]) > budget:
                return None  # not pruning early enough to pay for itself
        for jj in range(j + 1, len(uniq)):
            t = uniq[jj]
            s0, e0 = indptr[t], indptr[t + 1]
            post = indices[s0:e0]
            pos = np.searchsorted(post, cand)
            pos_c = np.minimum(pos, len(post) - 1)
            hit = post[pos_c] == cand
            part[hit] += w[s0 + pos_c[hit]] * scale[jj]
        return _top_k(cand, part, k)

    def _as_mask(self, candidates: np.ndarray | None) -> np.ndarray | None:
        if candidates is None:
            return None
        cand = np.asarray(candidates)
        if cand.dtype == bool:
            if cand.shape != (self.n_docs,):
                raise ValueError("candidate mask must have one entry per indexed document")
            return cand
        mask = np.zeros(self.n_docs, dtype=bool)
        mask[cand.astype(np.int64)] = True
        return mask


_DENSE = np.zeros(0, np.int64)  # sentinel: _accumulate returned a corpus-sized score vector


def _top_k_dense(acc: np.ndarray, k: int) -> ScoredDocs:
    """Top-k straight on a corpus-sized score vector (no gather of the matches first)."""
    n = len(acc)
    if k <= 0 or n == 0:
        return ScoredDocs(np.zeros(0, np.int64), np.zeros(0, np.float64))
    if k < n:
        kth = acc[np.argpartition(acc, n - k)[n - k:]].min()
        sel = np.flatnonzero(acc >= kth) if kth > 0 else np.flatnonzero(acc)
    else:
        sel = np.flatnonzero(acc)
    return _top_k(sel, acc[sel], k)


def _top_k(ids: np.ndarray, scores: np.ndarray, k: int) -> ScoredDocs:
    """Deterministic top-k: score descending, then doc position ascending.

    argpartition alone picks arbitrarily among ties at the cut; here every doc whose
    score equals the k-th score is kept before the exact (score, id) sort.
    """
    pos = scores > 0
    if not pos.all():
        ids, scores = ids[pos], scores[pos]
    if k <= 0 or len(ids) == 0:
        return ScoredDocs(np.zeros(0, np.int64), np.zeros(0, np.float64))
    if len(ids) > max(k, 512):
        part = np.argpartition(-scores, k - 1)[:k]
        kth = scores[part].min()
        sel = np.flatnonzero(scores >= kth)
        ids, scores = ids[sel], scores[sel]
    order = np.lexsort((ids, -scores))[:k]
    return ScoredDocs(ids[order].astype(np.int64), scores[order])
