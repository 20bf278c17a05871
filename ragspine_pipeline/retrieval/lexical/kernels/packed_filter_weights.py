"""A surviving posting's weight part under a filter, with tf-1 parts tabled per length code.

Why: the filtered kernels compute each posting's part as sc x tf / (tf + k1 (kb + bavg
len)) with the survivors' avgdl, a division per posting, where the unfiltered kernels read
a tf-1 weight from a per-code table (``kernels.packed._w``). Most postings have tf 1,
and under one query and one filter sc, k1, kb and bavg are fixed, so a term's tf-1 part
depends on the document's length code alone: ``tf1_tables`` computes it once per code for
the terms whose lists are long against the codes, with the very operations the kernels
use (1.0 for tf, the code's length for len), so every float is the same. Measured with
the look-up phase's re-pruning (``kernels.packed_filtered``), in one process against the code
before, answers asserted equal, on the 200 synthetic Zipf queries: the term-at-a-time
route's median fell from 0.21 to 0.14 ms at 1M documents under a filter keeping all, and
from 1.74 to 0.97 ms at 10M under one keeping half.
"""

import numpy as np
from numba import njit

from .weight import length_norm, part

TAB_MIN = 4  # a term's tf-1 parts are tabled when its list holds this many postings per code
TAB_CODES = 1024  # the window kernel tables every term's tf-1 parts up to this many codes


@njit(cache=True, nogil=True)
def code_dens(clen, k1, kb, bavg):
    """k1 (kb + bavg len) of each length code (``clen``: the file's length of each code;
    empty when the file has none): the denominators ``den_of`` reads."""
    den = np.empty(clen.shape[0], np.float64)
    for c in range(clen.shape[0]):
        den[c] = length_norm(k1, kb, bavg, clen[c])
    return den


@njit(cache=True, nogil=True, inline="always")
def _fill_row(tab, r, sc, den):
    """Row r: a term's part at tf 1 for each code, ``sc`` x 1.0 / (1.0 + ``den``[code]), the
    kernels' per-posting expression with tf 1.0, so every entry is the float they compute."""
    for c in range(den.shape[0]):
        tab[r, c] = part(sc, 1.0, den[c])


@njit(cache=True, nogil=True)
def tf1_tables(postings, dfs, scale, den):
    """Per term y (``postings[y]``: its list's length, ``dfs[y]``: its survivors), its part
    at tf 1 for each length code, ``scale[y]`` x 1.0 / (1.0 + ``den``[code]) (``code_dens``),
    for the terms with survivors whose list holds at least ``TAB_MIN`` postings per code:
    (table, row) with term y's parts in table[row[y]], row[y] = -1 for a term without one.
    Only those rows exist, so the table never holds more than a quarter of an entry per
    posting the query's lists hold (a long query on a file of many codes stays small)."""
    nu = scale.shape[0]
    nc = den.shape[0]
    row = np.full(nu, -1, np.int64)
    m = 0
    for y in range(nu):
        if dfs[y] > 0 and nc > 0 and postings[y] >= TAB_MIN * nc:
            row[y] = m
            m += 1
    tab = np.empty((m, nc), np.float64)
    for y in range(nu):
        if row[y] >= 0:
            _fill_row(tab, row[y], scale[y], den)
    return tab, row


@njit(cache=True, nogil=True)
def window_tables(scale, den):
    """Every term's tf-1 parts per code (``tf1_tables``' rows) for the window kernel, whose
    terms are few (at most ``MAX_TERMS``) and whose lists are long; no columns when the file
    has no codes or more than ``TAB_CODES`` (a division per code and term would then cost
    more than it saves)."""
    nu = scale.shape[0]
    nc = den.shape[0] if den.shape[0] <= TAB_CODES else 0
    tab = np.empty((nu, nc), np.float64)
    if nc > 0:
        for j in range(nu):
            _fill_row(tab, j, scale[j], den)
    return tab
