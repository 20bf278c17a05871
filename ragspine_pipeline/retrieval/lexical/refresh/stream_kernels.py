"""The three loops of the streaming BM25 build, compiled (numba) or numpy.

Why a module of its own: numba caches machine code on disk only for module-level
functions, and the numpy versions beside them are both the fallback when numba cannot
be imported and the oracle the tests compare the compiled loops with.

* ``fill``: count the (term, tf) postings of consecutive documents, doc by doc, into the
  run buffer, stopping before a document that might not fit. O(1) per token: a
  corpus-sized ``last`` marker per term says whether the term was seen in this document.
* ``to_csc``: a stable counting sort of the run's doc-major postings by term: term-major
  (CSC) postings with ascending doc positions, in O(postings).
* ``term_counts`` / ``csc_range``: a run's postings per term, then ``to_csc`` of one range
  of terms into a buffer of that range (a run is spilled a range at a time).
* ``merge_run``: copy one spilled run's term slices to their place in the corpus arrays
  (a term's postings are its runs' slices one after the other: runs are in doc order).
* ``bucket_counts`` / ``bucket_scatter``: split corpus postings into hash-bucket segments
  (bucket-major, then term-major, local doc positions ascending) in two passes.
* ``encode`` / ``rehash`` (compiled only): token bytes to term ids through an open-addressing
  table over the vocabulary's bytes, new terms numbered in order of first appearance. One
  pass per token, no lock held: it replaces Arrow's dictionary encoding + a lookup of the
  batch's distinct terms + a gather (3 passes, ~3x the time). Without numba the build keeps
  the Arrow path (``refresh.term_ids``).
"""

from __future__ import annotations

from typing import Any

import numpy as np


def fill_py(tids: np.ndarray, offs: np.ndarray, d0: int, d1: int, gdoc0: int, last: np.ndarray,
            slot: np.ndarray, out_term: np.ndarray, out_tf: np.ndarray, pos: int, cap: int,
            npost: np.ndarray) -> tuple[int, int]:
    """Count documents d0.. of a batch (token term ids ``tids``, token offsets ``offs``) into
    ``out_term``/``out_tf`` from ``pos``; ``npost[d - d0]`` = postings of document d.

    Stops before the first document whose tokens could overflow ``cap``; returns (first
    document not counted, new pos). ``gdoc0`` is the batch's first corpus position (the
    ``last`` marker). ``slot`` is scratch. Terms of a document come in first-seen order.
    """
    d = d0
    while d < d1:
        s, e = offs[d], offs[d + 1]
        if pos + (e - s) > cap:
            break
        start = pos
        gd = gdoc0 + d
        for i in range(s, e):
            t = tids[i]
            if last[t] != gd:
                last[t] = gd
                slot[t] = pos
                out_term[pos] = t
                out_tf[pos] = 1
                pos += 1
            else:
                out_tf[slot[t]] += 1
        npost[d - d0] = pos - start
        d += 1
    return d, pos


def to_csc_py(out_term: np.ndarray, out_tf: np.ndarray, n: int, npost: np.ndarray, doc0: int,
              indptr: np.ndarray, indices: np.ndarray, tf: np.ndarray) -> None:
    """Term-major postings of the run's first ``n`` doc-major postings (``indptr`` zeroed,
    n_terms + 1 long; documents ``doc0 + j`` hold ``npost[j]`` postings each)."""
    for i in range(n):
        indptr[out_term[i] + 1] += 1
    for t in range(len(indptr) - 1):
        indptr[t + 1] += indptr[t]
    cursor = indptr[:-1].copy()
    p = 0
    for j in range(len(npost)):
        d = doc0 + j
        for _ in range(npost[j]):
            t = out_term[p]
            q = cursor[t]
            indices[q] = d
            tf[q] = out_tf[p]
            cursor[t] = q + 1
            p += 1


def term_counts_py(out_term: np.ndarray, n: int, counts: np.ndarray) -> None:
    """``counts[t]`` += postings of term t among the run's first ``n`` (no int64 copy of
    the run's terms, as ``np.bincount`` makes: 512 MB at a 1 GiB budget)."""
    for i in range(n):
        counts[out_term[i]] += 1


def csc_range_py(out_term: np.ndarray, out_tf: np.ndarray, n: int, npost: np.ndarray, doc0: int,
                 cursor: np.ndarray, t_lo: int, t_hi: int, p0: int, indices: np.ndarray, tf: np.ndarray) -> None:
    """``to_csc`` of the terms t_lo..t_hi-1 only: each of their postings to ``cursor[t] - p0``
    (``cursor`` = the run's ``indptr[:-1]``, advanced), one pass over the run's postings.

    Why: a run spilled a range of terms at a time needs a buffer of the range, not a CSC
    copy of the whole run beside it (384-512 MB of a 1 GiB budget)."""
    p = 0
    for j in range(len(npost)):
        d = doc0 + j
        for _ in range(npost[j]):
            t = out_term[p]
            if t_lo <= t < t_hi:
                q = cursor[t]
                indices[q - p0] = d
                tf[q - p0] = out_tf[p]
                cursor[t] = q + 1
            p += 1


def merge_run_py(r_indptr: np.ndarray, r_indices: np.ndarray, r_tf: np.ndarray, base: np.ndarray,
                 out_indices: np.ndarray, out_tf: np.ndarray) -> None:
    """Append run r's postings of every term at ``base[t]`` (advanced past them)."""
    for t in range(len(r_indptr) - 1):
        s, e = r_indptr[t], r_indptr[t + 1]
        b = base[t]
        for i in range(s, e):
            out_indices[b + i - s] = r_indices[i]
            out_tf[b + i - s] = r_tf[i]
        base[t] = b + (e - s)


def bucket_counts_py(indptr: np.ndarray, indices: np.ndarray, bucket_of: np.ndarray,
                     counts: np.ndarray) -> None:
    """``counts[bk, t]`` += postings of term t on documents of bucket bk."""
    for t in range(len(indptr) - 1):
        for i in range(indptr[t], indptr[t + 1]):
            counts[bucket_of[indices[i]], t] += 1


def bucket_scatter_py(indptr: np.ndarray, indices: np.ndarray, tf: np.ndarray, bucket_of: np.ndarray,
                      local_of: np.ndarray, cursor: np.ndarray, out_indices: np.ndarray, out_tf: np.ndarray) -> None:
    """Each posting to ``cursor[bucket, term]`` (advanced), its doc as the bucket's local position."""
    for t in range(len(indptr) - 1):
        for i in range(indptr[t], indptr[t + 1]):
            d = indices[i]
            bk = bucket_of[d]
            q = cursor[bk, t]
            out_indices[q] = local_of[d]
            out_tf[q] = tf[i]
            cursor[bk, t] = q + 1


# ----------------------------------------------------------------------------- numpy
def fill_np(tids: np.ndarray, offs: np.ndarray, d0: int, d1: int, gdoc0: int, last: np.ndarray,
            slot: np.ndarray, out_term: np.ndarray, out_tf: np.ndarray, pos: int, cap: int,
            npost: np.ndarray) -> tuple[int, int]:
    """``fill`` by one sort of (doc, term) keys (terms of a document ascending, not in
    first-seen order: ``to_csc`` gives the same CSC either way)."""
    fits = np.flatnonzero(offs[d0 + 1:d1 + 1] - offs[d0] > cap - pos)
    d = d1 if not len(fits) else d0 + int(fits[0])
    s, e = int(offs[d0]), int(offs[d])
    if e == s:
        npost[:d - d0] = 0
        return d, pos
    doc = np.repeat(np.arange(d - d0, dtype=np.int64), np.diff(offs[d0:d + 1]))
    width = int(tids[s:e].max()) + 1
    uniq, counts = np.unique(doc * width + tids[s:e], return_counts=True)
    m = len(uniq)
    out_term[pos:pos + m] = uniq % width
    out_tf[pos:pos + m] = counts
    npost[:d - d0] = np.bincount(uniq // width, minlength=d - d0)
    return d, pos + m


def to_csc_np(out_term: np.ndarray, out_tf: np.ndarray, n: int, npost: np.ndarray, doc0: int,
              indptr: np.ndarray, indices: np.ndarray, tf: np.ndarray) -> None:
    """``to_csc`` by a stable argsort of the term ids."""
    order = np.argsort(out_term[:n], kind="stable")
    docs = np.repeat(np.arange(doc0, doc0 + len(npost), dtype=np.int64), npost)
    indices[:n] = docs[order]
    tf[:n] = out_tf[:n][order]
    np.cumsum(np.bincount(out_term[:n], minlength=len(indptr) - 1), out=indptr[1:])


def term_counts_np(out_term: np.ndarray, n: int, counts: np.ndarray) -> None:
    """``term_counts`` by ``np.bincount``."""
    counts += np.bincount(out_term[:n], minlength=len(counts))


def csc_range_np(out_term: np.ndarray, out_tf: np.ndarray, n: int, npost: np.ndarray, doc0: int,
                 cursor: np.ndarray, t_lo: int, t_hi: int, p0: int, indices: np.ndarray, tf: np.ndarray) -> None:
    """``csc_range`` by a stable argsort of the range's postings (doc order kept per term)."""
    terms = out_term[:n]
    keep = np.flatnonzero((terms >= t_lo) & (terms < t_hi))
    order = keep[np.argsort(terms[keep], kind="stable")]
    docs = np.repeat(np.arange(doc0, doc0 + len(npost), dtype=np.int64), npost)
    dest = cursor[t_lo] - p0
    indices[dest:dest + len(order)] = docs[order]
    tf[dest:dest + len(order)] = out_tf[:n][order]
    cursor[t_lo:t_hi] += np.bincount(terms[keep] - t_lo, minlength=t_hi - t_lo)


def merge_run_np(r_indptr: np.ndarray, r_indices: np.ndarray, r_tf: np.ndarray, base: np.ndarray,
                 out_indices: np.ndarray, out_tf: np.ndarray) -> None:
    """``merge_run`` by one scatter of the run's postings."""
    df = np.diff(r_indptr)
    n = int(r_indptr[-1])
    dst = np.repeat(base[:len(df)] - r_indptr[:-1], df) + np.arange(n, dtype=np.int64)
    out_indices[dst] = r_indices[:n]
    out_tf[dst] = r_tf[:n]
    base[:len(df)] += df


def bucket_counts_np(indptr: np.ndarray, indices: np.ndarray, bucket_of: np.ndarray,
                     counts: np.ndarray) -> None:
    """``bucket_counts`` by one bincount of (bucket, term) keys."""
    n_terms = len(indptr) - 1
    term = np.repeat(np.arange(n_terms, dtype=np.int64), np.diff(indptr))
    keys = bucket_of[indices[:len(term)]] * n_terms + term
    counts += np.bincount(keys, minlength=counts.size).reshape(counts.shape)


def bucket_scatter_np(indptr: np.ndarray, indices: np.ndarray, tf: np.ndarray, bucket_of: np.ndarray,
                      local_of: np.ndarray, cursor: np.ndarray, out_indices: np.ndarray, out_tf: np.ndarray) -> None:
    """``bucket_scatter`` of the whole corpus in one call (its cursors start at 0) by a
    stable sort of (bucket, term) keys (doc order kept)."""
    n_terms = len(indptr) - 1
    term = np.repeat(np.arange(n_terms, dtype=np.int64), np.diff(indptr))
    docs = np.asarray(indices[:len(term)])
    order = np.argsort(bucket_of[docs] * n_terms + term, kind="stable")
    out_indices[:len(order)] = local_of[docs[order]]
    out_tf[:len(order)] = np.asarray(tf)[order]


# ----------------------------------------------------------------------------- term ids
_FNV_OFFSET = np.uint64(14695981039346656037)
_FNV_PRIME = np.uint64(1099511628211)


def encode(data: np.ndarray, offs: np.ndarray, i0: int, n_tok: int, table: np.ndarray, hashes: np.ndarray,
           vbytes: np.ndarray, voffs: np.ndarray, n_terms: int, out: np.ndarray) -> tuple[int, int]:
    """Term id of tokens i0..n_tok (token i: ``data[offs[i]:offs[i + 1]]``) into ``out[i]``.

    ``table`` (power-of-two slots, -1 empty) holds the ids of the ``n_terms`` known terms
    (bytes ``vbytes[voffs[t]:voffs[t + 1]]``, FNV-1a hash ``hashes[t]``), linear probing. A
    new term gets id ``n_terms`` and is appended. Stops before a new term that would fill
    the table past half or overflow ``hashes``/``voffs``/``vbytes``; returns (first token
    not encoded, terms known now): the caller grows the arrays and calls again from there.
    """
    mask = np.uint64(len(table) - 1)
    for i in range(i0, n_tok):
        s, e = offs[i], offs[i + 1]
        h = _FNV_OFFSET
        for j in range(s, e):
            h = (h ^ np.uint64(data[j])) * _FNV_PRIME
        slot = h & mask
        while True:
            t = table[slot]
            if t < 0:
                n = e - s
                b = voffs[n_terms]
                if 2 * (n_terms + 1) > len(table) or n_terms + 2 > len(voffs) or b + n > len(vbytes):
                    return i, n_terms
                for j in range(n):
                    vbytes[b + j] = data[s + j]
                voffs[n_terms + 1] = b + n
                hashes[n_terms] = h
                table[slot] = n_terms
                out[i] = n_terms
                n_terms += 1
                break
            if hashes[t] == h and voffs[t + 1] - voffs[t] == e - s:
                b = voffs[t]
                j = 0
                while j < e - s and vbytes[b + j] == data[s + j]:
                    j += 1
                if j == e - s:
                    out[i] = t
                    break
            slot = (slot + np.uint64(1)) & mask
    return n_tok, n_terms


def rehash(hashes: np.ndarray, n_terms: int, table: np.ndarray) -> None:
    """Insert terms 0..n_terms by their hashes into an empty (all -1) ``table``."""
    mask = np.uint64(len(table) - 1)
    for t in range(n_terms):
        slot = hashes[t] & mask
        while table[slot] >= 0:
            slot = (slot + np.uint64(1)) & mask
        table[slot] = t


_COMPILED: dict[str, Any] | None = None
NUMPY = {"fill": fill_np, "to_csc": to_csc_np, "term_counts": term_counts_np, "csc_range": csc_range_np,
         "merge_run": merge_run_np, "bucket_counts": bucket_counts_np, "bucket_scatter": bucket_scatter_np}
PYTHON = {"fill": fill_py, "to_csc": to_csc_py, "term_counts": term_counts_py, "csc_range": csc_range_py,
          "merge_run": merge_run_py, "bucket_counts": bucket_counts_py, "bucket_scatter": bucket_scatter_py}


def kernels(kernel: str = "auto") -> dict[str, Any]:
    """``fill``/``to_csc``/``merge_run``/...: compiled with numba (``auto``, ``numba``) or
    numpy (no ``encode``: the caller encodes tokens with Arrow instead).

    ``auto`` falls back to numpy when numba cannot be imported; ``numba`` then raises.
    """
    global _COMPILED
    if kernel == "numpy":
        return NUMPY
    if kernel not in ("auto", "numba"):
        raise ValueError(f"kernel must be auto, numba or numpy (got {kernel!r})")
    if _COMPILED is None:
        try:
            import numba  # lazy: numba, optional for this build: without it the numpy kernels run
        except ImportError as exc:
            if kernel == "numba":
                raise RuntimeError("kernel='numba' needs numba (pip install 'numba>=0.60')") from exc
            return NUMPY
        jit = numba.njit(cache=True, nogil=True)
        _COMPILED = {name: jit(fn) for name, fn in PYTHON.items()}
        _COMPILED.update(encode=jit(encode), rehash=jit(rehash))
    return _COMPILED
