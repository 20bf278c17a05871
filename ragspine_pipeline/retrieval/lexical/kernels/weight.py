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

import warnings

import numpy as np
from numba import njit, types
from numba.core.errors import NumbaIRAssumptionWarning
from numba.extending import overload

# Inlining an ``inline="always"`` overload whose body holds a call or a branch into a loop
# makes numba's SSA pass warn "variable ... is not in scope" on Python 3.11 (numba issues
# #7802, #9489: the inliner does not move the variable's scope; the IR and the machine code
# are right, the check is pedantic). The weighers below are such overloads; the warning
# would greet every cold compile, so it is silenced for that message only.
warnings.filterwarnings("ignore", message=r"variable '.*' is not in scope", category=NumbaIRAssumptionWarning)

TF_BOUND_GROW = 1.05  # filtered block bounds add the tf bound only when the stored max grows more
# A packed file's narrowed skip data (``index.packed``, #47 item 4): a block max w is stored
# as q = a uint16 with q x BMAX_STEP >= w (an upper bound, never tighter), a block max tf as
# a uint8 where MAXTF_SAT means "at least 255" (bounded by MAXTF_LOOSE: tf / (tf + norm) < 1).
BMAX_STEP = 1.0 / 65535
MAXTF_SAT = 255
MAXTF_LOOSE = 4294967296.0
_BLOCK = 128  # format.raw.BLOCK_SIZE (postings per block; not imported: weight has no deps)


@njit(cache=True, nogil=True, inline="always")
def idf(n, df):
    """A term's idf among ``n`` documents of which ``df`` hold it (never negative)."""
    return np.log1p((n - df + 0.5) / (df + 0.5))


@njit(cache=True, nogil=True, inline="always")
def stored_idf(idf, indptr, t):
    """Term t's idf as a packed file stores it: ``idf`` is (df keys, values). Format 3 keeps
    one value per distinct df (a few thousand, not one per term: 16 MB less at 2M terms),
    found by the term's df from ``indptr``; empty keys mean one value per term (a segment,
    whose idf is the corpus's df's, or a file of format 1/2). Read once per query term,
    never per posting; the values are the build's own floats, so scores do not change."""
    keys = idf[0]
    vals = idf[1]
    if keys.shape[0] == 0:
        return vals[t]
    return vals[np.searchsorted(keys, term_df(indptr, t))]


def term_df(ptrs, t):
    """Term t's df from ``ptrs``: a plain ``indptr`` (int64 [T+1]), or a packed file's
    (bptr uint32 [T+1], count of each term's last block uint8 [T]) whose df is
    128 (blocks - 1) + last count (``index.packed``: 5 bytes a term instead of 16). Read
    once per query term (never per posting). Callable from numba code only."""
    raise NotImplementedError("numba only")


@overload(term_df, inline="always")
def _term_df(ptrs, t):
    if isinstance(ptrs, types.Array):
        return lambda ptrs, t: np.int64(ptrs[t + 1] - ptrs[t])

    def packed(ptrs, t):
        nb = np.int64(ptrs[0][t + 1]) - np.int64(ptrs[0][t])
        return (nb - 1) * _BLOCK + np.int64(ptrs[1][t]) if nb > 0 else np.int64(0)

    return packed


def term_wmax(wmax, t):
    """Term t's largest w (its MaxScore bound): a plain ``w_max[t]``, or from a packed
    file's (bptr, blk_bmax, wmax_terms, wmax_q): a one-block term's block bound, else the
    bound of the sorted multi-block-term table (a binary search of a few percent of the
    terms; once per query term). Callable from numba code only."""
    raise NotImplementedError("numba only")


@overload(term_wmax, inline="always")
def _term_wmax(wmax, t):
    if isinstance(wmax, types.Array):
        return lambda wmax, t: wmax[t]

    def packed(wmax, t):
        b0 = np.int64(wmax[0][t])
        nb = np.int64(wmax[0][t + 1]) - b0
        if nb == 0:
            return 0.0
        if nb == 1:
            return np.float64(wmax[1][b0]) * BMAX_STEP
        return np.float64(wmax[3][np.searchsorted(wmax[2], np.uint32(t))]) * BMAX_STEP

    return packed


@njit(cache=True, nogil=True, inline="always")
def blk_bmax(bmax, b):
    """Block b's max w as stored (uint16 q): q x BMAX_STEP, never below the exact one."""
    return np.float64(bmax[b]) * BMAX_STEP


@njit(cache=True, nogil=True, inline="always")
def blk_maxtf(maxtf, b):
    """Block b's max tf bound (a float): the stored uint8, or MAXTF_LOOSE when saturated."""
    m = np.int64(maxtf[b])
    return MAXTF_LOOSE if m == MAXTF_SAT else np.float64(m)


def blk_minlen(minlen, b):
    """Block b's shortest document length: ``minlen`` is (uint16 length codes, length of
    each code) in a file with codes, else the lengths (uint32). Numba code only."""
    raise NotImplementedError("numba only")


@overload(blk_minlen, inline="always")
def _blk_minlen(minlen, b):
    if isinstance(minlen, types.Array):
        return lambda minlen, b: np.int64(minlen[b])
    return lambda minlen, b: np.int64(minlen[1][minlen[0][b]])


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
def filtered_max(wmax, grow, maxtf, minlen, k1, kb, bavg):
    """The largest w of a list or block (``wmax``, stored at the corpus avgdl) under the
    survivors' avgdl: the stored max grown by avgdl' / avgdl (``grow``), or, when smaller,
    its largest tf over its shortest document (``tf_bound``). Times the scale: its bound."""
    return min(wmax * grow, tf_bound(np.float64(maxtf), np.float64(minlen), k1, kb, bavg))


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


@njit(cache=True, nogil=True, inline="always")
def den_of(den, ln, k1, kb, bavg):
    """k1 (kb + bavg len) of a document of length code ``ln``: the per-code table, or from
    the length itself when the file has no codes (``den`` empty); the same floats."""
    if den.shape[0] > 0:
        return den[ln]
    return length_norm(k1, kb, bavg, ln)


@njit(cache=True, nogil=True, inline="always")
def block_bound(bmax, maxtf, minlen, b, s, grow, k1, kb, bavg):
    """Block b's bound under the survivors' avgdl, times the scale s (``kernels.packed_filtered_windows``' docstring).
    Both bounds hold for any survivor avgdl; the tf bound (a division per block, on every
    block the walk passes) is taken only when the stored max grows (``grow`` over
    ``TF_BOUND_GROW``): at about the corpus avgdl the stored max is the exact one."""
    if grow <= TF_BOUND_GROW:
        return blk_bmax(bmax, b) * grow * s
    return filtered_max(blk_bmax(bmax, b), grow, blk_maxtf(maxtf, b), blk_minlen(minlen, b), k1, kb, bavg) * s


# Weighers: a kernel written once for both packed weightings takes a weigher ``wg``, either
# the unfiltered ``wt`` (norm by code, w of tf 1 by code, k1, b, avgdl; ``plain_w``) or the
# filtered ``(den, k1, kb, bavg, grow)`` (survivor statistics; ``den_of``, ``block_bound``).
# The three functions below are resolved at compile time by the weigher's type (numba
# ``overload``, inlined), so each caller compiles to the written-out expression of its
# weighting, with no branch left at run time.


def weigh(wg, s, tf, code):
    """A packed posting's scored part: tf ``tf`` at a document of length code ``code``,
    term scale ``s``, under the weigher ``wg``. Callable from numba code only."""
    raise NotImplementedError("numba only")


def posting_bound(wg, bmax, maxtf, minlen, b, s):
    """Block b's bound (its postings' largest part) under the weigher ``wg``, scale ``s``."""
    raise NotImplementedError("numba only")


def weigh_coded(wg, tab, j, s, tf, code):
    """Term j's part (scale ``s``) for tf ``tf`` at a document of length code ``code`` under the
    weigher ``wg``, tf 1 read from row j of the filtered window kernel's table ``tab``
    (``part_by_code``; the unfiltered weigher reads its own w-of-tf-1 table and ignores
    ``tab``). Callable from numba code only."""
    raise NotImplementedError("numba only")


def kept(bits, d):
    """Whether document d passes the filter ``bits`` (packed words; None: no filter)."""
    raise NotImplementedError("numba only")


def _unfiltered(wg) -> bool:
    return isinstance(wg, types.BaseTuple) and isinstance(wg.types[1], types.Array)


@overload(weigh, inline="always")
def _weigh(wg, s, tf, code):
    if _unfiltered(wg):
        return lambda wg, s, tf, code: plain_w(tf, code, wg) * s

    def filtered(wg, s, tf, code):
        f = np.float64(tf)
        return part(s, f, den_of(wg[0], code, wg[1], wg[2], wg[3]))

    return filtered


@overload(posting_bound, inline="always")
def _posting_bound(wg, bmax, maxtf, minlen, b, s):
    if _unfiltered(wg):
        return lambda wg, bmax, maxtf, minlen, b, s: blk_bmax(bmax, b) * s
    return lambda wg, bmax, maxtf, minlen, b, s: block_bound(bmax, maxtf, minlen, b, s, wg[4], wg[1], wg[2], wg[3])


@njit(cache=True, nogil=True, inline="always")
def part_by_code(s, tf, code, tab, j, den, k1, kb, bavg):
    """Term j's part for tf ``tf`` at a document of length code ``code``: s x tf / (tf +
    ``den_of``), tf 1 read from row j of ``packed_filter_weights.window_tables``' table when
    it has columns (the same floats)."""
    if tf == 1 and tab.shape[1] > 0:
        return tab[j, code]
    f = np.float64(tf)
    return part(s, f, den_of(den, code, k1, kb, bavg))


@overload(weigh_coded, inline="always")
def _weigh_coded(wg, tab, j, s, tf, code):
    if _unfiltered(wg):
        return lambda wg, tab, j, s, tf, code: plain_w(tf, code, wg) * s
    return lambda wg, tab, j, s, tf, code: part_by_code(s, tf, code, tab, j, wg[0], wg[1], wg[2], wg[3])


@overload(kept, inline="always")
def _kept(bits, d):
    if isinstance(bits, types.NoneType):
        return lambda bits, d: True
    return lambda bits, d: (bits[d >> 6] >> np.uint64(d & 63)) & np.uint64(1) != np.uint64(0)
