"""numba kernels that turn a filter into survivor statistics without a per-document loop.

A filtered BM25 query needs, before any scoring, the survivors' count N', their summed
length (for avgdl') and a packed bitset the scoring kernel tests postings against. Done
document by document over a 1M-entry bool mask that cost ~0.5 ms, more than a whole
unfiltered query. Here:

* ``pack_mask``: eight bools become eight bits with one multiply (64 documents per output
  word, no branch), and the survivor count is a popcount of the packed words.
  The survivors' summed length is sum_b 2^b x popcount(mask & slice_b), where slice_b is
  the bitset of the documents whose length has bit b set (``length_slices``, built once
  per index): a few AND+popcounts per 64 documents replace 64 length reads.
* Sorted positions (a selective filter given as positions) never touch N: their count
  is their number, their length a gather, and their bits are set in a per-thread zeroed
  buffer and cleared again afterwards (``set_positions`` / ``clear_bits``).
* ``rank_directory`` / ``rank``: a document's place in a bitset term's postings list in
  O(1) (one directory entry and one cache line of the row), where galloping would take
  a dozen scattered probes.
* ``term_block_bounds``: per block of postings the largest tf and the smallest document
  length, from which a bound valid for any survivor avgdl follows (``index.filter``).
"""

import numpy as np
from numba import njit

from .weight import idf, term_scale

# Bitset words per rank-directory entry of a filtered query's bitset rows: one 64-byte cache line
# (``index.filter`` builds the directory, ``rank_directory`` fills it, the kernels read it).
RANK_WORDS = 8

_PACK = np.uint64(0x0102040810204080)  # 8 bool bytes x this >> 56 = their 8 bits (little order)
_SHIFT = np.uint64(56)
_M1 = np.uint64(0x5555555555555555)
_M2 = np.uint64(0x3333333333333333)
_M4 = np.uint64(0x0F0F0F0F0F0F0F0F)
_H01 = np.uint64(0x0101010101010101)


@njit(cache=True, nogil=True, inline="always")
def known_df(known, t):
    """Term t's survivor df in a reused filter's df cache (``index.filter.df_cache``), or -1.

    A slot holds (t + 1) << 32 | df in one int64, so a reader sees a whole entry or the
    slot's previous one, never a term with another term's df (one aligned 8-byte store)."""
    if known.shape[0] == 0:
        return -1
    e = known[t & (known.shape[0] - 1)]
    if (e >> 32) == t + 1:
        return e & 0xFFFFFFFF
    return -1


@njit(cache=True, nogil=True, inline="always")
def remember_df(known, t, df):
    """Store term t's survivor df in its slot (replacing whichever term held it)."""
    if known.shape[0] > 0:
        known[t & (known.shape[0] - 1)] = ((t + 1) << 32) | df


@njit(cache=True, nogil=True, inline="always")
def popcount64(x):
    """Set bits of a uint64 (LLVM turns this idiom into the popcnt instruction)."""
    x = x - ((x >> np.uint64(1)) & _M1)
    x = (x & _M2) + ((x >> np.uint64(2)) & _M2)
    x = (x + (x >> np.uint64(4))) & _M4
    return np.int64((x * _H01) >> _SHIFT)


@njit(cache=True, nogil=True)
def pack_mask(words, mask, slices, bits):
    """Pack a bool mask into ``bits`` (uint64, little bit order, every word written);
    returns (survivors, their summed length).

    ``words`` is the mask's first N//8 bytes as uint64. ``slices[s]`` is the bitset of the
    documents whose length has bit s set (``index.filter.length_slices``), so the summed
    length is sum_s 2^s popcount(bits & slices[s]): no document length is read. Two
    passes (pack, then one AND+popcount pass per slice) measured faster than one fused
    pass: each inner loop stays branch-free and vectorizes.
    """
    nfull = words.shape[0] // 8  # output words made of eight whole mask words
    n = 0
    for w in range(nfull):
        x = np.uint64(0)
        base = w * 8
        for j in range(8):
            x |= ((words[base + j] * _PACK) >> _SHIFT) << np.uint64(8 * j)
        bits[w] = x
        n += popcount64(x)
    for w in range(nfull, bits.shape[0]):  # the tail: fewer than 64 documents
        x = np.uint64(0)
        for d in range(w * 64, min(w * 64 + 64, mask.shape[0])):
            if mask[d]:
                x |= np.uint64(1) << np.uint64(d - w * 64)
        bits[w] = x
        n += popcount64(x)
    return n, sliced_total(bits, slices)


@njit(cache=True, nogil=True)
def count_bits(bits):
    """Set bits of a packed filter: its survivors."""
    n = 0
    for w in range(bits.shape[0]):
        n += popcount64(bits[w])
    return n


@njit(cache=True, nogil=True)
def sliced_total(bits, slices):
    """Summed length of the documents set in ``bits``: sum_s 2^s popcount(bits & slices[s])."""
    total = 0
    for s in range(slices.shape[0]):
        row = slices[s]
        c = 0
        for w in range(bits.shape[0]):
            c += popcount64(bits[w] & row[w])
        total += c << s
    return total


@njit(cache=True, nogil=True)
def bits_to_positions(bits, out):
    """The set positions of ``bits`` in ascending order into ``out`` (sized to their count)."""
    m = 0
    for w in range(bits.shape[0]):
        x = bits[w]
        while x != 0:
            low = x & (~x + np.uint64(1))  # lowest set bit
            out[m] = w * 64 + popcount64(low - np.uint64(1))
            m += 1
            x ^= low
    return m


@njit(cache=True, nogil=True)
def set_positions(pos, doc_len, bits, gather):
    """Set the bits of positions in a zeroed buffer, in one pass that also checks them:
    (state, their summed length when ``gather``, else 0). state 0: strictly ascending, all
    set; 1: in range but not strictly ascending (the caller sorts, clears and sets again:
    a repeat would count twice); 2: a position outside the index (nothing past it is set;
    the caller clears). Gathering lengths reads a cache line per position; for many
    positions the caller sums them from the bits instead (``sliced_total``)."""
    n_docs = doc_len.shape[0]
    total = 0
    state = 0
    prev = -1
    for x in range(pos.shape[0]):
        d = pos[x]
        if d < 0 or d >= n_docs:
            return 2, total
        if d <= prev:
            state = 1
        prev = d
        bits[d >> 6] |= np.uint64(1) << np.uint64(d & 63)
        if gather:
            total += np.int64(doc_len[d])
    return state, total


@njit(cache=True, nogil=True)
def clear_bits(pos, bits):
    """Zero the words ``set_positions`` touched, so the buffer is clean for the next query."""
    n_words = bits.shape[0]
    for x in range(pos.shape[0]):
        w = pos[x] >> 6
        if 0 <= w < n_words:
            bits[w] = np.uint64(0)


@njit(cache=True, nogil=True)
def term_block_bounds(indptr, indices, tf, doc_len, bptr, t, block, blk_tf, blk_len):
    """Per block of term t's postings: the largest tf and the smallest document length.

    A position outside the corpus (a damaged file not yet verified) counts as length 0,
    which only loosens the bound; the term's own check rejects such a file before any
    of its postings are scored.
    """
    n_docs = doc_len.shape[0]
    s0 = indptr[t]
    e0 = indptr[t + 1]
    bk = bptr[t]
    for p0 in range(s0, e0, block):
        mt = np.uint32(0)
        ml = np.uint32(0xFFFFFFFF)
        for p in range(p0, min(p0 + block, e0)):
            f = np.uint32(tf[p])
            if f > mt:
                mt = f
            d = indices[p]
            ln = np.uint32(doc_len[d]) if 0 <= d < n_docs else np.uint32(0)
            if ln < ml:
                ml = ln
        blk_tf[bk] = mt
        blk_len[bk] = ml
        bk += 1


@njit(cache=True, nogil=True)
def rank_directory(row, out):
    """out[i] = set bits of ``row`` before word i * RANK_WORDS (``rank`` reads one entry and
    at most one cache line of the row), so a document's place in a bitset term's postings
    list is O(1) instead of a galloping search."""
    c = 0
    for w in range(row.shape[0]):
        if w % RANK_WORDS == 0:
            out[w // RANK_WORDS] = c
        c += popcount64(row[w])


@njit(cache=True, nogil=True, inline="always")
def rank(row, rdir, d):
    """How many documents before d are set in ``row`` (its directory ``rdir``)."""
    w = d >> 6
    c = np.int64(rdir[w // RANK_WORDS])
    for x in range(w - w % RANK_WORDS, w):
        c += popcount64(row[x])
    return c + popcount64(row[w] & ((np.uint64(1) << np.uint64(d & 63)) - np.uint64(1)))


@njit(cache=True, nogil=True, inline="always")
def stack_scale(n, avgdl, dfs, mult, first, k1p1, stack):
    """(idf x (k1 + 1) x multiplicity of each distinct query term with a surviving posting,
    the avgdl to score with): over the survivors' own n / ``dfs`` / avgdl, or, when
    ``stack`` is not empty, over a stack's (``index.stats_query.stack_args``: its N, summed
    length, then df per query position, read at each term's first position ``first``).
    One array, not three arguments: each argument costs the dispatcher per query. The
    filtered kernels share it so both layouts score a stack alike; the expression is
    theirs, float for float. A stack df below this index's survivor df breaks the caller's
    promise (the stack holds these survivors): ValueError, before anything is scored."""
    nu = dfs.shape[0]
    scale = np.zeros(nu, np.float64)
    stacked = stack.shape[0] > 0
    sn = stack[0] if stacked else n
    for y in range(nu):
        if dfs[y] > 0:
            dg = stack[2 + first[y]] if stacked else dfs[y]
            if dg < dfs[y]:
                raise ValueError("stack statistics: a query token's df is below this index's survivor df")
            scale[y] = term_scale(idf(sn, dg), k1p1, mult[y])
    return scale, (stack[1] / stack[0] if stacked else avgdl)
