"""Okapi BM25: the plain reference scorer and the precomputed postings index.

``bm25_scores`` is the readable reference: statistics (N, df, avgdl) are taken over
exactly the candidate documents it is given, ``idf = ln(1 + (N - df + 0.5)/(df + 0.5))``
and every query token counts (a repeated query token counts twice, as in Lucene's
boolean sum and rank-bm25).

``BM25Index`` tokenizes the corpus once and keeps CSC postings (term -> sorted doc ids
with term frequencies) plus document lengths. Per query it touches only the postings of
the query terms, so latency follows the posting-list size, not the corpus size. Scores
are computed in float64 from raw term frequencies at query time, which is what lets a
metadata filter re-derive N, df and avgdl over the surviving candidates and still equal
the reference to 1e-9 — the same memory per posting as a precomputed float32 score
matrix (int32 doc id + float32 tf).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

DEFAULT_K1 = 1.5
DEFAULT_B = 0.75


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
    ) -> None:
        if k1 < 0 or not (0.0 <= b <= 1.0):
            raise ValueError(f"BM25 needs k1 >= 0 and 0 <= b <= 1 (got k1={k1}, b={b})")
        self.k1 = float(k1)
        self.b = float(b)
        self._build(docs_tokens)

    # ------------------------------------------------------------------ build
    def _build(self, docs_tokens: Sequence[Sequence[str]]) -> None:
        vocab: dict[str, int] = {}
        setdefault = vocab.setdefault
        flat: list[int] = []
        extend = flat.extend
        lens = np.empty(len(docs_tokens), dtype=np.int64)
        for i, toks in enumerate(docs_tokens):
            lens[i] = len(toks)
            extend([setdefault(t, len(vocab)) for t in toks])
        n_docs = len(docs_tokens)
        n_terms = len(vocab)
        term_ids = np.asarray(flat, dtype=np.int64)
        doc_ids = np.repeat(np.arange(n_docs, dtype=np.int64), lens)
        # One key per (term, doc) pair, sorted term-major: unique() gives CSC order
        # directly and counts give the term frequencies.
        keys = term_ids * max(n_docs, 1) + doc_ids
        uniq, counts = np.unique(keys, return_counts=True)
        post_terms = uniq // max(n_docs, 1)
        self.indices = (uniq - post_terms * max(n_docs, 1)).astype(np.int32)
        self.tf = counts.astype(np.float32)
        self.indptr = np.zeros(n_terms + 1, dtype=np.int64)
        np.cumsum(np.bincount(post_terms, minlength=n_terms), out=self.indptr[1:])
        self.vocab = vocab
        self.doc_len = lens
        self.n_docs = n_docs
        self.total_len = int(lens.sum())
        self.df = np.diff(self.indptr)
        avgdl = self.total_len / n_docs if n_docs else 0.0
        self.avgdl = avgdl
        # Full-corpus query-time constants (the unfiltered fast path).
        self._idf_full = bm25_idf(n_docs, self.df.astype(np.float64)) if n_terms else np.zeros(0)
        safe = avgdl if avgdl > 0 else 1.0
        self._norm_full = self.k1 * (1.0 - self.b + self.b * lens / safe)

    @property
    def nbytes(self) -> int:
        return int(
            self.indices.nbytes + self.tf.nbytes + self.indptr.nbytes + self.doc_len.nbytes
            + self._norm_full.nbytes + self._idf_full.nbytes + self.df.nbytes
        )

    # ----------------------------------------------------------------- scoring
    def _query_term_ids(self, query_tokens: Sequence[str]) -> list[int]:
        get = self.vocab.get
        return [t for t in (get(q) for q in query_tokens) if t is not None]

    def _gather(
        self, term_ids: Sequence[int], mask: np.ndarray | None
    ) -> tuple[list[np.ndarray], list[np.ndarray], list[int]]:
        """Posting slices per query term (restricted to ``mask`` when given)."""
        idxs, tfs, dfs = [], [], []
        indptr, indices, tf = self.indptr, self.indices, self.tf
        for t in term_ids:
            s, e = indptr[t], indptr[t + 1]
            ind = indices[s:e]
            f = tf[s:e]
            if mask is not None:
                keep = mask[ind]
                ind = ind[keep]
                f = f[keep]
            idxs.append(ind)
            tfs.append(f)
            dfs.append(len(ind))
        return idxs, tfs, dfs

    def _accumulate(
        self,
        query_tokens: Sequence[str],
        mask: np.ndarray | None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """(doc positions, scores) of every candidate that matches a query term."""
        term_ids = self._query_term_ids(query_tokens)
        if not term_ids:
            return np.zeros(0, np.int64), np.zeros(0, np.float64)
        k1, b = self.k1, self.b
        if mask is None:
            n, avgdl = self.n_docs, self.avgdl
            norm_all = self._norm_full
        else:
            n = int(mask.sum())
            if n == 0:
                return np.zeros(0, np.int64), np.zeros(0, np.float64)
            avgdl = float(self.doc_len[mask].sum()) / n
            norm_all = None
        idxs, tfs, dfs = self._gather(term_ids, mask)
        if avgdl == 0:
            return np.zeros(0, np.int64), np.zeros(0, np.float64)
        parts_i, parts_w = [], []
        for t, ind, f, df in zip(term_ids, idxs, tfs, dfs, strict=True):
            if df == 0:
                continue
            idf = self._idf_full[t] if mask is None else bm25_idf(n, df)
            ff = f.astype(np.float64)
            if norm_all is not None:
                norm = norm_all[ind]
            else:
                norm = k1 * (1.0 - b + b * self.doc_len[ind] / avgdl)
            parts_i.append(ind)
            parts_w.append(idf * (ff * (k1 + 1.0)) / (ff + norm))
        if not parts_i:
            return np.zeros(0, np.int64), np.zeros(0, np.float64)
        if len(parts_i) == 1:
            return parts_i[0].astype(np.int64), parts_w[0]
        all_i = np.concatenate(parts_i)
        all_w = np.concatenate(parts_w)
        if len(all_i) * 4 >= self.n_docs:
            # Dense accumulate: one pass over a corpus-sized buffer.
            acc = np.bincount(all_i, weights=all_w, minlength=self.n_docs)
            hit = np.zeros(self.n_docs, dtype=bool)
            hit[all_i] = True
            ids = np.flatnonzero(hit)
            return ids, acc[ids]
        # Sparse accumulate: sort-merge the touched postings only. Summation is
        # sequential in term order per document, like the reference.
        order = np.argsort(all_i, kind="stable")
        si = all_i[order]
        sw = all_w[order]
        starts = np.flatnonzero(np.r_[True, si[1:] != si[:-1]])
        return si[starts].astype(np.int64), np.add.reduceat(sw, starts)

    def get_scores(
        self, query_tokens: Sequence[str], candidates: np.ndarray | None = None
    ) -> np.ndarray:
        """Dense score vector over all docs (0 outside the candidate mask)."""
        mask = self._as_mask(candidates)
        ids, sc = self._accumulate(query_tokens, mask)
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
        ids, sc = self._accumulate(query_tokens, mask)
        return _top_k(ids, sc, k)

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
    if len(ids) > k:
        part = np.argpartition(-scores, k - 1)[:k]
        kth = scores[part].min()
        sel = np.flatnonzero(scores >= kth)
        ids, scores = ids[sel], scores[sel]
    order = np.lexsort((ids, -scores))[:k]
    return ScoredDocs(ids[order].astype(np.int64), scores[order])
