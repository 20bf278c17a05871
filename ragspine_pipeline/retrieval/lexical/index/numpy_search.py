"""The vectorized numpy scoring path of ``BM25Index`` (no numba, or ``kernel="numpy"``).

Pure functions over an index's arrays: ``accumulate`` scores every matching candidate
(the full-corpus ``w`` when unfiltered; N, df and avgdl re-derived over the survivors from
the raw tf when filtered, as the reference does), ``maxscore`` is the exact MaxScore-pruned
top-k for unfiltered queries over long postings. Selection is ``index.topk``'s.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from .reference import bm25_idf
from .topk import DENSE, ScoredDocs, top_k


class ScoringArrays(Protocol):
    """What the numpy path reads: plain postings (``indptr``/``indices``/``tf``, the
    full-corpus weights ``w``), per term ``df``, ``idf`` and ``w_max``, the document
    lengths and the corpus shape: a ``BM25Index``, or a packed index's decoded query terms
    (``index.packed_views.QueryPostings``)."""

    indptr: np.ndarray
    indices: Any
    tf: Any
    w: np.ndarray
    df: np.ndarray
    doc_len: np.ndarray
    n_docs: int
    avgdl: float
    k1: float
    b: float

    @property
    def idf(self) -> np.ndarray: ...

    @property
    def w_max(self) -> np.ndarray: ...


def accumulate(ix: ScoringArrays, term_ids: list[int], mask: np.ndarray | None,
               stack: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(doc positions, scores) of every candidate that matches a query term.

    ``stack`` (with a mask): a stack's N, summed length and df per ``term_ids`` entry
    (``index.stats_query.stack_args``), scored with in place of the survivors' own; ValueError when
    they cannot include these survivors.

    All query-term postings are concatenated first, so the arithmetic is a handful of
    vectorized passes over the touched postings whatever the query length:
    ``w = idf*(k1+1) * tf / (tf + norm[doc])``; per-document sums then run in query term
    order, as in the reference. Returns ``(DENSE, scores over every doc)`` when the touched
    postings cover a quarter of the corpus or more.
    """
    empty = (np.zeros(0, np.int64), np.zeros(0, np.float64))
    if not term_ids:
        return empty
    indptr, k1, b = ix.indptr, ix.k1, ix.b
    if mask is None:
        n, avgdl = ix.n_docs, ix.avgdl
    else:
        n = int(np.count_nonzero(mask))
        if n == 0:
            return empty
        total = int(ix.doc_len[mask].sum(dtype=np.int64))
        avgdl = float(total) / n
    if avgdl == 0:
        return empty
    tids = np.asarray(term_ids)
    sl = [slice(indptr[t], indptr[t + 1]) for t in term_ids]
    lengths = np.array([x.stop - x.start for x in sl])
    if mask is None:
        scale = ix.idf[tids] * (k1 + 1.0)
        if len(sl) == 1:
            all_i = ix.indices[sl[0]]
            w = ix.w[sl[0]] * scale[0]
        else:
            all_i = np.concatenate([ix.indices[x] for x in sl])
            w = np.concatenate([ix.w[x] for x in sl])
            w *= np.repeat(scale, lengths)
    else:
        all_i = np.concatenate([ix.indices[x] for x in sl])
        all_f = np.concatenate([ix.tf[x] for x in sl]).astype(np.float64)
        keep = mask[all_i]
        term_of = np.repeat(np.arange(len(tids)), lengths)[keep]
        all_i, all_f = all_i[keep], all_f[keep]
        lengths = np.bincount(term_of, minlength=len(tids))
        # Statistics over the surviving candidates only, as the reference computes them.
        if stack is not None and len(stack):
            n, avgdl, dfs = _stack_stats(n, total, lengths, stack)
        else:
            dfs = lengths
        scale = bm25_idf(n, dfs.astype(np.float64)) * (k1 + 1.0)
        w = k1 * (1.0 - b + b * ix.doc_len[all_i] / avgdl)
        w += all_f
        np.divide(all_f, w, out=w)
        w *= np.repeat(scale, lengths)
    if len(all_i) == 0:
        return empty
    if np.count_nonzero(lengths) == 1:
        return all_i.astype(np.int64), w
    if len(all_i) * 4 >= ix.n_docs:
        # Dense accumulate: one pass over a corpus-sized buffer; returned whole so top-k
        # can select on it directly (zeros are non-matches: idf, tf > 0).
        return DENSE, np.bincount(all_i, weights=w, minlength=ix.n_docs)
    # Sparse accumulate: sort-merge the touched postings only (stable: term order).
    order = np.argsort(all_i, kind="stable")
    si = all_i[order]
    starts = np.flatnonzero(np.r_[True, si[1:] != si[:-1]])
    return si[starts].astype(np.int64), np.add.reduceat(w[order], starts)


def _stack_stats(n: int, total: int, dfs: np.ndarray, stack: np.ndarray) -> tuple[int, float, np.ndarray]:
    """(N, avgdl, df per query term) of a stack holding these survivors (``n`` of summed
    length ``total``, their df ``dfs``); raises ValueError for statistics that cannot hold them."""
    g_n, g_total, g_df = int(stack[0]), int(stack[1]), stack[2:]
    if g_n < n or g_total < total or bool((g_df < dfs).any()):
        raise ValueError("stack statistics do not include this index's survivors")
    return g_n, g_total / g_n, g_df


def maxscore(ix: ScoringArrays, term_ids: list[int], k: int, min_docs: int) -> ScoredDocs | None:
    """Exact top-k with MaxScore pruning (unfiltered queries over long postings).

    Terms are scanned rarest first. Once the summed upper bounds of the terms not yet
    scanned fall below the current k-th partial score, no untouched document can reach
    the top k; the remaining terms are then only looked up (binary search in their sorted
    postings) for the touched candidates. Returns None when pruning would not pay (a
    corpus under ``min_docs``, short postings), so the plain path runs.
    """
    if ix.n_docs < min_docs or len(term_ids) < 2:
        return None
    uniq, mult = np.unique(np.asarray(term_ids), return_counts=True)
    df = ix.df[uniq]
    if int(df.sum()) * 4 < ix.n_docs or len(uniq) < 2:
        return None
    order = np.argsort(df, kind="stable")
    uniq, mult = uniq[order], mult[order]
    scale = ix.idf[uniq] * (ix.k1 + 1.0) * mult
    ub = scale * ix.w_max[uniq]
    rest = np.concatenate((np.cumsum(ub[::-1])[::-1][1:], [0.0]))  # bound of terms after j
    # theta_j <= prefix bound, so stopping after j needs prefix(j) > rest(j). If that first
    # happens only after most postings, pruning cannot pay: use the plain path.
    df_sorted = df[order]
    ok = np.flatnonzero(np.cumsum(ub) > rest)
    budget = 0.3 * int(df_sorted.sum())
    if len(ok) == 0 or ok[0] == len(uniq) - 1 or df_sorted[: ok[0] + 1].sum() > budget:
        return None
    scanned = 0
    indptr, indices, w = ix.indptr, ix.indices, ix.w
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
            return top_k(cand, part, k)
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
    return top_k(cand, part, k)
