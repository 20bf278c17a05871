"""The packed postings layout: block-packed doc-id gaps and term frequencies (#27 item 3).

Why: the plain layout stores 13 bytes a posting (int32 doc, uint8 tf, float64 weight);
at 10M documents (~500M postings) that is 6.5 GB against Lucene's ~1 GB. Here a posting is
its doc-id gap and its tf, bit-packed per block of ``BLOCK_SIZE`` postings at the block's
own widths (most tf blocks need 0 bits), about 1.2-1.6 bytes a posting on a Zipf corpus.
The weight ``w = tf / (tf + norm(doc))`` is not stored: the kernels recompute it from the
document length with exactly the operations ``index.postings.postings_from_raw`` uses
(``w_of``), so every score is bit for bit the plain layout's.

Arrays (names are the file's; ``B`` blocks, term t's blocks are ``bptr[t]:bptr[t+1]``)::

    bptr        uint32 [n_terms+1] first block of each term
    last_count  uint8 [n_terms]    postings in the term's last block (0 for no block): df is
                                   128 (blocks - 1) + last_count (no ``indptr``: a reader
                                   that needs it rebuilds it, ``postings_pointers``)
    wmax_terms, wmax_q uint32/uint16 [multi-block terms] the terms of more than one block,
                                   ascending, and their max w as a block bound (below); a
                                   one-block term's max w is its block's bound
    idf_df, idf_val int64/float64 [distinct df]  full-corpus idf per df (format 3; a
                                   segment, and formats 1/2: ``idf`` float64 [n_terms])
    data        uint32 [words+2]   the packed blocks (two zero words of read-ahead pad)
    blk_off     uint32 [B+1]       word offset of each block in ``data`` (and the end;
                                   a file of 2^32 words or more is refused: more buckets)
    blk_last    int32 [B]          last doc position of the block (skip data)
    blk_dbits, blk_tbits uint8 [B] bit widths of the gap and tf fields
    blk_bmax    uint16 [B]         the block's max w as the least q with q x BMAX_STEP >= w
                                   (block-max skipping: a bound at most 1/65535 looser)
    blk_maxtf   uint8 [B]          max tf of the block, MAXTF_SAT meaning "255 or more"
    blk_minlen  uint16 [B]         length code of the block's shortest document (codes are
                                   sorted by length); uint32 lengths in a file without codes
                                   (both filtered bounds: they bound w for any survivor avgdl)
    bit_terms   int32 [rows]       the longest lists' terms, ascending: ``bit_terms[r]``'s
                                   postings are row r of ``bits`` (formats 1/2: ``bit_row``
                                   int32 [n_terms], each term's row or -1)
    bits        uint64 [rows, ceil(N/64)] their postings as bitsets (filtered survivor df)
    doc_code    uint8/uint16 [n_docs], code_len uint32 [codes]: each document's length as
                                   an index into the distinct lengths; without codes (more
                                   distinct lengths than uint16 holds) ``doc_len`` uint32
                                   [n_docs] (formats 1/2 store both)

``index.packed_tables`` explains format 3's tables and reads the older ones as them.

Narrowed per-term and per-block arrays (#47 item 4, step T2; 1M documents, 2M terms: 36 B a
term and 30 B a block before, 7 and 15 after). The rule that tells them apart: a file that
holds ``last_count`` has every array above as listed; one without it (formats 1-3:
``indptr`` int64, ``bptr`` int64, ``w_max`` float64, ``blk_off`` int64, ``blk_bmax``
float64, ``blk_maxtf``/``blk_minlen`` uint32 lengths) is read through these shapes, built
at open (``packed_tables.narrowed``), so one set of kernels serves both. Bounds may only get
looser, never tighter, so every answer stays exact.

A block of n postings holds n gap fields then n tf fields, each field run starting on a
word boundary; value i of a run of width W starts at bit i*W, little-endian across words.
A gap field is ``doc - prev - 1`` (prev: the previous posting of the term, -1 before the
first), so a term's doc positions are ``cumsum(gap + 1) - 1`` and a dense run of docs
packs to 0 bits; a tf field is ``tf - 1``.

The encoder consumes a ``RawPostings`` (possibly ``numpy.memmap`` of many GB) a slice of
blocks at a time: nothing per posting is held for the whole corpus. The numpy decoder
here serves verification and the numpy query path; the compiled kernels
(``kernels.packed``) decode the same bits.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from types import ModuleType

import numpy as np

from ..format.raw import RawPostings
from .packed_narrow import (
    last_counts,
    narrow_maxtf,
    narrow_minlen,
    quantize_bmax,
    term_wmax,
    to_u32,
    wmax_table,
)
from .postings import BLOCK_SIZE
from .reference import bm25_idf

# Filtered queries: lists with df >= N / PACKED_BITSET_FRACTION (corpora from
# bm25.BITSET_MIN_DOCS documents) also get a bitset row, so their survivor df is a popcount
# instead of unpacking the list. Rows cost N/8 bytes each: a coarser cut than the plain
# layout's N/16 keeps them to a few percent of a packed corpus.
PACKED_BITSET_FRACTION = 8
SLICE_BLOCKS = 1 << 14  # blocks encoded per slice (<= 2M postings, ~250 MB of temporaries)
ENCODE_THREADS = 2  # slices encoded at once (compiled encoder; the machine this targets has 2 cores)
PAD_WORDS = 2  # zero words after the last block: a field read may touch the next word
BLOCK_ARRAYS = ("blk_off", "blk_last", "blk_dbits", "blk_tbits", "blk_bmax", "blk_maxtf", "blk_minlen")
TERM_ARRAYS = ("bptr", "last_count", "wmax_terms", "wmax_q")  # what this version writes
OLD_TERM_ARRAYS = ("indptr", "bptr", "w_max")  # formats 1-3 (read through TERM_ARRAYS' shapes)
PACKED_ARRAYS = ("data", *BLOCK_ARRAYS, "bptr", "bits")  # in every version
# Per version (index.packed_tables): one of each group is present.
OPTIONAL_ARRAYS = ("indptr", "w_max", "last_count", "wmax_terms", "wmax_q", "idf", "idf_df", "idf_val",
                   "bit_row", "bit_terms", "doc_len", "doc_code", "code_len")


def norm_of(doc_len: np.ndarray, k1: float, b: float, avgdl: float) -> np.ndarray:
    """``k1 (1 - b + b len / avgdl)`` per document, written as ``postings_from_raw`` writes it
    (same operations in the same order: the floats are identical)."""
    safe = avgdl if avgdl > 0 else 1.0
    lens = np.asarray(doc_len).astype(np.int64)
    return k1 * (1.0 - b + b * lens / safe)


def w_of(tf: np.ndarray, norm: np.ndarray) -> np.ndarray:
    """The plain layout's ``w = tf / (norm + tf)`` for postings with these tf and doc norms."""
    f = np.asarray(tf).astype(np.float64)
    denom = norm + f
    return np.divide(f, denom, out=denom)


def weight_avgdl(raw: RawPostings) -> float:
    """The avgdl the weights use: the corpus's when ``raw`` is a segment (as the plain layout)."""
    if raw.corpus_docs is None:
        return float(np.asarray(raw.doc_len).astype(np.int64).sum()) / raw.n_docs if raw.n_docs else 0.0
    return int(raw.corpus_len or 0) / raw.corpus_docs if raw.corpus_docs else 0.0


def term_idf(raw: RawPostings) -> np.ndarray:
    """Full-corpus idf per term (the corpus's df when ``raw`` is a segment)."""
    if raw.n_terms == 0:
        return np.zeros(0)
    if raw.corpus_docs is None:
        return np.asarray(bm25_idf(raw.n_docs, np.diff(raw.indptr).astype(np.float64)), np.float64)
    return np.asarray(bm25_idf(raw.corpus_docs, np.asarray(raw.corpus_df, np.float64)), np.float64)


def block_pointers(indptr: np.ndarray) -> np.ndarray:
    """``bptr``: term t's blocks are bptr[t]:bptr[t+1] (ceil(df / BLOCK_SIZE) each)."""
    df = np.diff(np.asarray(indptr, np.int64))
    bptr = np.zeros(len(df) + 1, np.int64)
    np.cumsum((df + BLOCK_SIZE - 1) // BLOCK_SIZE, out=bptr[1:])
    return bptr


def length_codes(doc_len: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """(per document the index of its length among the distinct lengths, those lengths),
    uint8 codes for up to 256 distinct lengths, uint16 up to 65,536, else None.

    Why: a query reads each matched document's length to recompute its weight; a byte
    per document (1 MB at 1M documents) stays in cache where 4-byte lengths do not, and
    the weight tables are then indexed by code (as Lucene reads a norm byte per doc)."""
    lengths, codes = np.unique(np.asarray(doc_len), return_inverse=True)
    if len(lengths) > 1 << 16:
        return None
    return codes.astype(np.uint8 if len(lengths) <= 1 << 8 else np.uint16), lengths.astype(np.uint32)


def bit_width(x: np.ndarray) -> np.ndarray:
    """Bits needed for each non-negative integer (0 for 0); exact through frexp."""
    return np.frexp(np.asarray(x, np.float64))[1].astype(np.int64)


@dataclass
class PackedEncoding:
    """The packed arrays of one corpus: ``data`` is produced slice by slice by ``words()``,
    which fills the per-block arrays as it goes (they and ``term_arrays()`` are complete
    once it is exhausted: write ``data`` first)."""

    raw: RawPostings
    norm: np.ndarray  # float64 [n_docs]: per-document norm of the weights
    bptr: np.ndarray  # int64 [n_terms + 1] (the file's is uint32: term_arrays)
    idf: np.ndarray
    blocks: dict[str, np.ndarray]
    terms: dict[str, np.ndarray]  # TERM_ARRAYS (wmax_q filled by words())
    code_len: np.ndarray | None  # the sorted distinct lengths (codes), None without codes
    n_words: int = 0

    def term_arrays(self) -> dict[str, np.ndarray]:
        """The per-term arrays of the file (``TERM_ARRAYS``), complete once ``words()`` is exhausted."""
        return self.terms

    @property
    def w_max(self) -> np.ndarray:
        """Each term's max w as the file bounds it (float64; tests and the kernels' warm-up)."""
        t = self.term_arrays()
        return term_wmax(t["bptr"], self.blocks["blk_bmax"], t["wmax_terms"], t["wmax_q"],
                         np.arange(self.raw.n_terms))

    def words(self) -> Iterator[np.ndarray]:
        """The ``data`` words, one slice of blocks at a time, then the pad."""
        n_blocks = int(self.bptr[-1])
        starts = range(0, n_blocks, SLICE_BLOCKS)
        base = 0
        for b0, part in zip(starts, self._slices(starts, n_blocks), strict=True):
            to_u32(np.array([base + len(part)], np.int64), "postings words")
            self.blocks["blk_off"][b0:min(b0 + SLICE_BLOCKS, n_blocks)] += np.uint32(base)  # encoded from 0
            base += len(part)
            yield part
        self.blocks["blk_off"][n_blocks] = base
        self.n_words = base + PAD_WORDS
        self.terms["wmax_q"][:] = wmax_table(self.bptr, self.blocks["blk_bmax"])[1]
        yield np.zeros(PAD_WORDS, np.uint32)

    def _slices(self, starts: range, n_blocks: int) -> Iterator[np.ndarray]:
        """Each slice's words, block offsets counted from 0 (``words`` shifts them).

        Why threads: slices are independent once their offsets are relative, and the
        compiled encoder releases the GIL, so two slices are encoded at once while the
        caller writes the one before (the encode was ~half of a 10M-document publish)."""
        def one(b0: int) -> np.ndarray:
            return _encode_slice(self, b0, min(b0 + SLICE_BLOCKS, n_blocks), 0)

        if compiled() is None or len(starts) < 2:
            yield from map(one, starts)
            return
        with ThreadPoolExecutor(ENCODE_THREADS, thread_name_prefix="bm25-encode") as pool:
            pending: deque[Future[np.ndarray]] = deque()
            for b0 in starts:
                pending.append(pool.submit(one, b0))
                if len(pending) > ENCODE_THREADS:
                    yield pending.popleft().result()
            while pending:
                yield pending.popleft().result()


def encode(raw: RawPostings, k1: float, b: float) -> PackedEncoding:
    """Prepare the packed encoding of ``raw`` (``PackedEncoding.words`` does the work)."""
    bptr = block_pointers(raw.indptr)
    n_blocks = int(bptr[-1])
    codes = length_codes(raw.doc_len) if raw.n_docs else None
    code_len = None if codes is None else codes[1]
    blocks = {
        "blk_off": np.zeros(n_blocks + 1, np.uint32), "blk_last": np.zeros(n_blocks, np.int32),
        "blk_dbits": np.zeros(n_blocks, np.uint8), "blk_tbits": np.zeros(n_blocks, np.uint8),
        "blk_bmax": np.zeros(n_blocks, np.uint16), "blk_maxtf": np.zeros(n_blocks, np.uint8),
        "blk_minlen": np.zeros(n_blocks, np.uint16 if code_len is not None else np.uint32),
    }
    norm = norm_of(raw.doc_len, k1, b, weight_avgdl(raw))
    wmax_terms = wmax_table(bptr, np.zeros(n_blocks, np.uint16))[0]
    terms = {"bptr": to_u32(bptr, "postings blocks"), "last_count": last_counts(raw.indptr, bptr),
             "wmax_terms": wmax_terms, "wmax_q": np.zeros(len(wmax_terms), np.uint16)}
    return PackedEncoding(raw=raw, norm=norm, bptr=bptr, idf=term_idf(raw), blocks=blocks, terms=terms,
                          code_len=code_len)


_WIDE = {"blk_off": np.int64, "blk_last": np.int32, "blk_dbits": np.uint8, "blk_tbits": np.uint8,
         "blk_bmax": np.float64, "blk_maxtf": np.uint32, "blk_minlen": np.uint32}


def _narrow_into(enc: PackedEncoding, wide: dict[str, np.ndarray], b0: int, b1: int) -> None:
    """A slice's exact block entries (``_WIDE``) stored narrowed (``BLOCK_ARRAYS``' dtypes)."""
    out, sl = enc.blocks, slice(b0, b1)
    out["blk_off"][sl] = to_u32(wide["blk_off"], "postings words")
    out["blk_last"][sl] = wide["blk_last"]
    out["blk_dbits"][sl] = wide["blk_dbits"]
    out["blk_tbits"][sl] = wide["blk_tbits"]
    out["blk_bmax"][sl] = quantize_bmax(wide["blk_bmax"])
    out["blk_maxtf"][sl] = narrow_maxtf(wide["blk_maxtf"])
    out["blk_minlen"][sl] = narrow_minlen(wide["blk_minlen"], enc.code_len)


def _block_layout(indptr: np.ndarray, bptr: np.ndarray, b0: int,
                  b1: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(first posting, posting count, whether it opens its term) of blocks b0..b1-1."""
    blk = np.arange(b0, b1, dtype=np.int64)
    term = np.searchsorted(bptr, blk, side="right") - 1
    nth = blk - bptr[term]
    start = indptr[term] + nth * BLOCK_SIZE
    count = np.minimum(BLOCK_SIZE, indptr[term + 1] - start)
    return start, count, nth == 0


def compiled() -> ModuleType | None:
    """``kernels.packed`` when numba imports (encoding and checking then run compiled)."""
    try:
        # lazy: the numba kernels (~15 ms of import; without numba the numpy path runs)
        from ..kernels import packed as bm25_packed_kernels
    except ImportError:
        return None
    return bm25_packed_kernels


def _encode_slice(enc: PackedEncoding, b0: int, b1: int, base: int) -> np.ndarray:
    """Encode blocks b0..b1-1 (their postings are contiguous); returns their words and
    fills their block entries (word offsets from ``base``)."""
    raw = enc.raw
    out = {name: np.zeros(b1 - b0, dt) for name, dt in _WIDE.items()}
    indptr = np.asarray(raw.indptr, np.int64)
    start, count, term_first = _block_layout(indptr, enc.bptr, b0, b1)
    p0, p1 = int(start[0]), int(start[-1] + count[-1])
    kernels = compiled()
    if kernels is not None:
        words = np.empty(2 * (p1 - p0) + len(count), np.uint32)
        blocks = tuple(out[name] for name in BLOCK_ARRAYS)
        used = kernels.encode_slice(np.asarray(raw.indices[p0:p1]), np.asarray(raw.tf[p0:p1]), enc.norm,
                                    np.asarray(raw.doc_len), count, term_first,
                                    int(raw.indices[p0 - 1]) if p0 > 0 else -1, words, blocks, base)
        if used < 0:
            raise ValueError("RawPostings doc positions must ascend strictly within each term")
        _narrow_into(enc, out, b0, b1)
        return words[:used]
    docs = np.asarray(raw.indices[p0:p1]).astype(np.int64)
    tfs = np.asarray(raw.tf[p0:p1]).astype(np.int64)
    local = start - p0  # first posting of each block within the slice
    # Gaps: to the previous posting of the same term; -1 before a term's first posting.
    prev = np.empty_like(docs)
    prev[1:] = docs[:-1]
    prev[0] = int(raw.indices[p0 - 1]) if p0 > 0 else -1
    prev[local[term_first]] = -1
    gaps = docs - prev - 1
    if len(gaps) and int(gaps.min()) < 0:
        raise ValueError("RawPostings doc positions must ascend strictly within each term")
    dbits = bit_width(np.maximum.reduceat(gaps, local))
    tbits = bit_width(np.maximum.reduceat(tfs, local) - 1)
    dwords = (count * dbits + 31) >> 5
    twords = (count * tbits + 31) >> 5
    size = dwords + twords
    off = np.zeros(len(count) + 1, np.int64)
    np.cumsum(size, out=off[1:])
    total = int(off[-1])
    # Bit position of each field: its block's run start + index within the block x width.
    blk_of = np.repeat(np.arange(len(count), dtype=np.int64), count)
    within = np.arange(len(docs), dtype=np.int64) - local[blk_of]
    d_pos = off[blk_of] * 32 + within * dbits[blk_of]
    t_pos = (off[blk_of] + dwords[blk_of]) * 32 + within * tbits[blk_of]
    words = _scatter_bits(np.concatenate((d_pos, t_pos)), np.concatenate((gaps, tfs - 1)), total)
    out["blk_off"][:] = off[:-1] + base
    out["blk_last"][:] = docs[local + count - 1]
    out["blk_dbits"][:] = dbits
    out["blk_tbits"][:] = tbits
    lens = np.asarray(raw.doc_len)[docs]
    out["blk_bmax"][:] = np.maximum.reduceat(w_of(tfs, enc.norm[docs]), local)
    out["blk_maxtf"][:] = np.maximum.reduceat(tfs, local)
    out["blk_minlen"][:] = np.minimum.reduceat(lens, local)
    _narrow_into(enc, out, b0, b1)
    return words


def _scatter_bits(pos: np.ndarray, values: np.ndarray, n_words: int) -> np.ndarray:
    """Words with each value's bits at its bit position. Fields never overlap, so summing
    the parts that land in a word is OR-ing them; each sum is below 2**32, exact in float64."""
    shifted = values.astype(np.uint64) << (pos & 31).astype(np.uint64)
    word = pos >> 5
    lo = (shifted & np.uint64(0xFFFFFFFF)).astype(np.float64)
    hi = (shifted >> np.uint64(32)).astype(np.float64)
    acc = np.bincount(word, weights=lo, minlength=n_words + 1)
    acc[1:] += np.bincount(word, weights=hi, minlength=n_words)[:n_words]
    return acc[:n_words].astype(np.uint32)


# ----------------------------------------------------------------- numpy decoding
@dataclass(frozen=True)
class PackedArrays:
    """The packed arrays a reader holds (views of the mapping, or of an encoding)."""

    data: np.ndarray
    blk_off: np.ndarray
    blk_last: np.ndarray
    blk_dbits: np.ndarray
    blk_tbits: np.ndarray
    blk_bmax: np.ndarray
    blk_maxtf: np.ndarray
    blk_minlen: np.ndarray
    bptr: np.ndarray
    last_count: np.ndarray
    code_len: np.ndarray | None = None  # the length of each code when blk_minlen holds codes


def _read_fields(data: np.ndarray, pos: np.ndarray, width: np.ndarray) -> np.ndarray:
    """The fields of ``width`` bits at bit positions ``pos`` (int64)."""
    word = pos >> 5
    both = data[word].astype(np.uint64) | (data[word + 1].astype(np.uint64) << np.uint64(32))
    mask = (np.uint64(1) << width.astype(np.uint64)) - np.uint64(1)
    return ((both >> (pos & 31).astype(np.uint64)) & mask).astype(np.int64)


def _counts(pk: PackedArrays, b0: int, b1: int) -> tuple[np.ndarray, np.ndarray]:
    """(postings per block, whether the block opens its term) of blocks b0..b1-1."""
    blk = np.arange(b0, b1, dtype=np.int64)
    bptr = np.asarray(pk.bptr).astype(np.int64)
    term = np.searchsorted(bptr, blk, side="right") - 1
    last = blk == bptr[term + 1] - 1
    count = np.where(last, pk.last_count[term].astype(np.int64), BLOCK_SIZE)
    return count, blk == bptr[term]


def decode_blocks(pk: PackedArrays, b0: int, b1: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(doc positions int64, tf int64, postings per block) of blocks b0..b1-1, with numpy.

    A block's first gap is taken from the previous block's ``blk_last`` unless the block
    opens its term; ``check_blocks`` confirms that chain when it matters.
    """
    if b1 <= b0:
        z = np.zeros(0, np.int64)
        return z, z, z
    count, first = _counts(pk, b0, b1)
    local = np.zeros(len(count), np.int64)
    np.cumsum(count[:-1], out=local[1:])
    blk_of = np.repeat(np.arange(len(count), dtype=np.int64), count)
    within = np.arange(int(count.sum()), dtype=np.int64) - local[blk_of]
    dbits = pk.blk_dbits[b0:b1].astype(np.int64)
    tbits = pk.blk_tbits[b0:b1].astype(np.int64)
    off = pk.blk_off[b0:b1].astype(np.int64)
    dwords = (count * dbits + 31) >> 5
    gaps = _read_fields(pk.data, off[blk_of] * 32 + within * dbits[blk_of], dbits[blk_of])
    tfs = _read_fields(pk.data, (off + dwords)[blk_of] * 32 + within * tbits[blk_of], tbits[blk_of]) + 1
    prev = np.where(first, -1, pk.blk_last[np.maximum(np.arange(b0, b1) - 1, 0)].astype(np.int64))
    steps = np.cumsum(gaps + 1)
    before = np.zeros(len(count), np.int64)
    before[1:] = steps[local[1:] - 1]
    docs = steps - before[blk_of] + prev[blk_of]
    return docs, tfs, count


def decode_term(pk: PackedArrays, t: int) -> tuple[np.ndarray, np.ndarray]:
    """(doc positions int64, tf int64) of term t, decoded with numpy."""
    docs, tfs, _count = decode_blocks(pk, int(pk.bptr[t]), int(pk.bptr[t + 1]))
    return docs, tfs


def check_offsets(pk: PackedArrays, b0: int, b1: int, n_words: int) -> str | None:
    """What is wrong with the layout of blocks b0..b1-1, without decoding them (None: sound):
    widths of at most 32 bits, and offsets that match their sizes inside ``data`` of
    ``n_words`` words. ``check_blocks`` runs it first."""
    return None if b1 <= b0 else _layout_problem(pk, b0, b1, _counts(pk, b0, b1)[0], n_words)


def _layout_problem(pk: PackedArrays, b0: int, b1: int, count: np.ndarray, n_words: int) -> str | None:
    dbits, tbits = pk.blk_dbits[b0:b1].astype(np.int64), pk.blk_tbits[b0:b1].astype(np.int64)
    if int(dbits.max()) > 32 or int(tbits.max()) > 32:
        return "a block has a field wider than 32 bits"
    off = pk.blk_off[b0:b1 + 1].astype(np.int64)
    size = ((count * dbits + 31) >> 5) + ((count * tbits + 31) >> 5)
    if int(count.min()) < 1 or int(count.max()) > BLOCK_SIZE:
        return "a block holds no postings or more than a block's"
    if int(off[0]) < 0 or not np.array_equal(np.diff(off), size) or int(off[-1]) > n_words - PAD_WORDS:
        return "block offsets do not match the block sizes"
    return None


def check_blocks(pk: PackedArrays, b0: int, b1: int, n_docs: int, n_words: int,
                 norm: np.ndarray | None = None, doc_len: np.ndarray | None = None) -> str | None:
    """What is wrong with blocks b0..b1-1 (None: sound). They must have widths of at most
    32 bits, offsets that match their sizes inside ``data``, and decode to positions below
    N that ascend within each term and match their skip data (last doc, max tf). With
    ``norm`` and ``doc_len`` (per document) the block maxima of w and min lengths are
    recomputed and compared too (the full check at publish)."""
    if b1 <= b0:
        return None
    count, _first = _counts(pk, b0, b1)
    problem = _layout_problem(pk, b0, b1, count, n_words)
    if problem is not None:
        return problem
    docs, tfs, _ = decode_blocks(pk, b0, b1)
    ends = np.cumsum(count) - 1
    starts = ends - count + 1
    # Gaps are >= 0, so positions ascend within a block; across blocks they ascend when
    # each block's recorded last doc is its decoded one (the next block continues from it).
    if int(docs.max()) >= n_docs or not np.array_equal(docs[ends], pk.blk_last[b0:b1]):
        return "doc positions outside the index or skip data that does not match them"
    if not np.array_equal(narrow_maxtf(np.maximum.reduceat(tfs, starts)), pk.blk_maxtf[b0:b1]):
        return "block max tf does not match the postings"
    if norm is not None and not np.array_equal(quantize_bmax(np.maximum.reduceat(w_of(tfs, norm[docs]), starts)),
                                               pk.blk_bmax[b0:b1]):
        return "block max weights do not match the postings"
    stored = pk.blk_minlen[b0:b1] if pk.code_len is None else pk.code_len[pk.blk_minlen[b0:b1]]
    if doc_len is not None and not np.array_equal(np.minimum.reduceat(doc_len[docs], starts), stored):
        return "block min lengths do not match the postings"
    return None
