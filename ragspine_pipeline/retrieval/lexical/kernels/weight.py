"""The one place a term's BM25 weight and upper bound are computed, for every kernel.

Why: the kernels of both layouts, filtered and not, term at a time and windowed, each
wrote the formula out (the length normalisation stood in ten files), so a change to it
(or a float-order slip in one copy) could make two routes disagree. Every kernel now calls
these; each is ``inline="always"``, so numba pastes the very operations into its caller
and the machine code is what the written-out expression gave (checked by the A/B of the
committed benchmarks: same speed, identical answers).

The formula (Lucene's BM25, as ``index.reference.bm25_scores``), per query term t and
document d of length ``len``:

    idf(t)   = log(1 + (N - df + 0.5) / (df + 0.5))
    scale(t) = idf(t) x (k1 + 1) x (times t stands in the query)
    part     = scale(t) x tf / (tf + k1 (1 - b + b len / avgdl))
    bound(t) = scale(t) x max over t's postings of tf / (tf + norm)   (``w_max``, per block ``bmax``)

The filtered kernels use N, df and avgdl over the filter's survivors and pass
``kb`` = 1 - b and ``bavg`` = b / avgdl, so the norm is k1 (kb + bavg len). The order of
the operations is part of the contract: the routes' scores must be equal float for float.
"""

import numpy as np
from numba import njit


@njit(cache=True, nogil=True, inline="always")
def idf(n, df):
    """A term's idf among ``n`` documents of which ``df`` hold it (never negative)."""
    return np.log1p((n - df + 0.5) / (df + 0.5))


@njit(cache=True, nogil=True, inline="always")
def term_scale(term_idf, k1p1, mult):
    """A distinct query term's scale: idf x (k1 + 1) x its multiplicity in the query."""
    return term_idf * k1p1 * mult


@njit(cache=True, nogil=True, inline="always")
def term_bound(scale, wmax):
    """A term's upper bound (max impact): its scale x its largest w (whole list or block).
    MaxScore, WAND, the window walk, the lead and the router all prune with it."""
    return scale * wmax


@njit(cache=True, nogil=True, inline="always")
def length_norm(k1, kb, bavg, ln):
    """k1 (1 - b + b len / avgdl), as k1 (kb + bavg len) (``kb`` = 1 - b, ``bavg`` = b / avgdl)."""
    return k1 * (kb + bavg * ln)


@njit(cache=True, nogil=True, inline="always")
def part(sc, f, den):
    """A posting's scored part: sc x tf / (tf + den), ``den`` its document's length norm."""
    return sc * f / (f + den)


@njit(cache=True, nogil=True, inline="always")
def filtered_part(sc, f, k1, kb, bavg, ln):
    """A posting's part at the survivors' avgdl: idf' (k1 + 1) tf / (tf + k1 (kb + bavg len))."""
    return part(sc, f, length_norm(k1, kb, bavg, ln))


@njit(cache=True, nogil=True, inline="always")
def tf_bound(f, ln, k1, kb, bavg):
    """tf / (tf + k1 (kb + bavg len)): grows with tf, shrinks with len, so a block's largest
    tf over its shortest document bounds every posting of the block."""
    return f / (f + length_norm(k1, kb, bavg, ln))


@njit(cache=True, nogil=True, inline="always")
def plain_w(f, ln, wt):
    """The plain layout's w = tf / (k1 (1 - b + b len / avgdl) + tf), same operations as its
    build, for the packed layout (which stores tf and a length code, not w).

    ``ln`` is the document's length code (``pk[13]``: an index into the file's distinct
    lengths, or the length itself). ``wt`` = (norm by code, w of tf 1 by code, k1, b,
    avgdl): codes inside the tables (``PackedBM25Index._weights``) read the norm, or for
    tf 1 the whole w, computed once per length with the same formula; a length past the
    tables (only without codes) computes it here."""
    ntab = wt[0]
    if ln < ntab.shape[0]:
        if f == 1:
            return wt[1][ln]
        ff = np.float64(f)
        return ff / (ntab[ln] + ff)
    ff = np.float64(f)
    return ff / (wt[2] * ((1.0 - wt[3]) + (wt[3] * np.float64(ln)) / wt[4]) + ff)
