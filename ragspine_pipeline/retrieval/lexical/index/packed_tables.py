"""Format 3's compact per-term tables of a packed file, and how every version reads as them.

Why (#47 item 4, bytes): at a 2M-term vocabulary a float64 idf per term (16 MB) and an
int32 bit-set row per term (8 MB) were a tenth of the packed file, yet idf is a function
of df (a few thousand distinct values) and only a few dozen terms have a bit-set row.
Format 3 stores instead:

* ``idf_df`` (int64, ascending) / ``idf_val`` (float64): one idf per distinct df. The
  values are picked from the build's own per-term idf array, never recomputed, so every
  score stays the same float. A segment (``refresh.segments``) computes idf from the
  corpus's df, not its own, and keeps the per-term ``idf`` array as before.
* ``bit_terms`` (int32, ascending): the terms that have a row of ``bits``; term
  ``bit_terms[r]``'s row is r (``bitsets`` numbers rows in term order).
* no ``doc_len`` when the file has length codes: a length is ``code_len[doc_code[d]]``.

The kernels receive ``idf`` as (keys, values) (``kernels.weight.stored_idf``: empty keys
mean one value per term) and the bit-set terms (``kernels.packed.bit_row_of``); both are
read once per query term. A file of format 1/2 is read through the same shapes, built at
open without a copy of anything per term except the bit-set terms (a pass over its
``bit_row``), so published snapshots keep answering identically.

``pk_tuple`` / ``wmax_tuple`` hand these tables (every version's, in this version's shapes)
to the kernels in the order ``kernels.packed`` fixes.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..format.file import CorruptIndexError
from .packed_narrow import (
    last_counts,
    narrow_maxtf,
    narrow_minlen,
    quantize_bmax,
    term_dfs,
    to_u32,
    wmax_table,
)


def readonly(a: np.ndarray) -> np.ndarray:
    """``a`` made read-only: a mapped file's arrays are, and numba compiles a kernel once
    per array type (a writable one would cost a cold compile at the first query)."""
    a.setflags(write=False)
    return a


def idf_table(df: np.ndarray, idf: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(distinct df ascending, the idf of each) from per-term ``df`` and ``idf``; the values
    are ``idf``'s own floats (the first term of each df), so lookups give them back exactly."""
    keys, first = np.unique(np.asarray(df, np.int64), return_index=True)
    vals = np.asarray(idf, np.float64)[first]
    if not np.array_equal(vals[np.searchsorted(keys, df)], idf):
        raise ValueError("idf is not a function of df: store it per term (a segment's corpus idf)")
    return keys, vals


def stored_idf_arrays(a: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """The kernels' ``idf`` of a mapped packed file: (keys, values), keys empty when the
    file stores one idf per term."""
    if "idf" in a:
        return readonly(np.zeros(0, np.int64)), a["idf"]
    return a["idf_df"], a["idf_val"]


def term_idf(idf: tuple[np.ndarray, np.ndarray], df: np.ndarray, tids: np.ndarray) -> np.ndarray:
    """``kernels.weight.stored_idf`` for many term ids at once (the numpy query path;
    ``df``: those terms' df)."""
    keys, vals = idf
    tids = np.asarray(tids, np.int64)
    if not len(keys):
        return np.asarray(vals[tids], np.float64)
    return np.asarray(vals[np.searchsorted(keys, df)], np.float64)


def narrowed(f: Any) -> dict[str, np.ndarray]:
    """A format 1-3 packed file's per-term and per-block arrays in this version's shapes
    (``index.packed_narrow``), built in memory at open from its arrays, checksummed whole
    first: one set of kernels then reads every version (a copy of ~9 bytes a block and 1
    a term, for files published before the narrowing). The bounds are the old exact ones
    rounded up, so the answers are the same."""
    a = f.arrays
    for name in ("indptr", "bptr", "w_max", "blk_off", "blk_bmax", "blk_maxtf", "blk_minlen"):
        f.whole(name)
    try:
        bptr = to_u32(a["bptr"], "postings blocks")
        bmax = quantize_bmax(a["blk_bmax"])
        out = {"bptr": bptr, "last_count": last_counts(a["indptr"], a["bptr"]),
               "blk_off": to_u32(a["blk_off"], "postings words"), "blk_bmax": bmax,
               "blk_maxtf": narrow_maxtf(a["blk_maxtf"]),
               "blk_minlen": narrow_minlen(a["blk_minlen"], a["code_len"] if "doc_code" in a else None)}
        out["wmax_terms"], out["wmax_q"] = wmax_table(bptr, bmax)
    except (ValueError, IndexError) as e:
        raise CorruptIndexError(f.path, f"index structure is inconsistent ({e})") from e
    return {name: readonly(arr) for name, arr in out.items()}


def bit_terms_of(f: Any) -> np.ndarray:
    """The sorted terms with a bit-set row of a mapped packed file (``f``: its ``MappedFile``),
    checksummed; from a format 1/2 file's ``bit_row`` (verified whole: its rows must be
    numbered in term order, as every writer numbered them)."""
    a = f.arrays
    if "bit_terms" in a:
        f.whole("bit_terms")
        return a["bit_terms"]
    f.whole("bit_row")
    row = a["bit_row"]
    terms = np.flatnonzero(row >= 0).astype(np.int32)
    if not np.array_equal(row[terms], np.arange(len(terms))):
        raise CorruptIndexError(f.path, "bit-set rows are not numbered in term order")
    return readonly(terms)


def bit_row(terms: np.ndarray, t: int) -> int:
    """Term t's row of the bit sets, or -1 (``kernels.packed.bit_row_of`` in Python)."""
    i = int(np.searchsorted(terms, t))
    return i if i < len(terms) and int(terms[i]) == t else -1


def lengths_by_code(a: dict[str, np.ndarray]) -> np.ndarray:
    """The kernels' ``pk[8]``: the length of each code, or the lengths themselves in a
    file without codes (whose codes are its lengths)."""
    return a["code_len"] if "doc_code" in a else a["doc_len"]


def check_tables(a: dict[str, np.ndarray], n_terms: int, rows: int, bit_terms: np.ndarray) -> bool:
    """Whether the idf table covers every term's df and the bit-set terms are sorted,
    distinct, in range and one per row (the structure check of ``verify``)."""
    ok = len(bit_terms) == rows and bool((np.diff(bit_terms) > 0).all()) and (
        not len(bit_terms) or (int(bit_terms[0]) >= 0 and int(bit_terms[-1]) < n_terms))
    if "idf" in a:
        return ok and len(a["idf"]) == n_terms
    keys, vals = a["idf_df"], a["idf_val"]
    ok = ok and len(keys) == len(vals) and bool((np.diff(keys) > 0).all())
    df = term_dfs(a["bptr"], a["last_count"])
    pos = np.searchsorted(keys, df)
    return ok and bool((pos < len(keys)).all()) and np.array_equal(keys[np.minimum(pos, len(keys) - 1)], df)


def pk_tuple(a: dict[str, np.ndarray], bit_terms: np.ndarray) -> tuple[np.ndarray, ...]:
    """The kernels' ``pk`` tuple (order fixed by ``kernels.packed``; ``bit_terms`` from
    ``packed_tables.bit_terms_of``, whatever the file's version; the arrays in this
    version's shapes, ``packed_tables.narrowed`` for an older file). Slot 0 is (bptr,
    last_count) (``kernels.weight.term_df``), slot 10 (block min codes, length of each
    code) in a file with codes, else the block min lengths (``kernels.weight.blk_minlen``)."""
    minlen = (a["blk_minlen"], a["code_len"]) if "doc_code" in a else a["blk_minlen"]
    return ((a["bptr"], a["last_count"]), a["bptr"], a["blk_last"], a["blk_off"], a["blk_dbits"], a["blk_tbits"],
            a["blk_bmax"], a["data"], lengths_by_code(a), a["blk_maxtf"], minlen, bit_terms, a["bits"],
            a.get("doc_code", a.get("doc_len")))


def wmax_tuple(a: dict[str, np.ndarray]) -> tuple[np.ndarray, ...]:
    """The kernels' ``wmax`` (``kernels.weight.term_wmax``): (bptr, blk_bmax, wmax_terms, wmax_q)."""
    return a["bptr"], a["blk_bmax"], a["wmax_terms"], a["wmax_q"]
