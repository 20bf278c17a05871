"""The front-coded vocabulary of format 4 (issue 47 item 4, bytes T3): encode, check, decode.

Why: the hash-table vocabulary of formats 1-3 cost 31 bytes a term (a 64-bit hash, a term
id and an offset per term beside the UTF-8), 62 MB of a 325 MB file at 2M terms. When the
term ids are the terms' lexicographic order (of their UTF-8 bytes, ``format.raw_order``),
the vocabulary is a sorted list: each term is stored as the length of the prefix it shares
with the term before it and the bytes after that prefix, and every ``block``-th term (a
head) is stored whole, so any term is decoded from its head in at most ``block - 1``
steps and a token is found by a binary search over the heads. ~2.7 bytes a term here
(7.25 MB at 2M terms with a byte per length, 5.3 MB with both lengths in one byte).

Arrays (term id t = rank of the term's UTF-8 bytes, strictly ascending)::

    vocab_lens        u1 [T]         prefix << 4 | suffix length: the prefix = bytes shared with
                                     term t-1 (0 for every head t % block == 0), the suffix =
                                     bytes stored for term t; LONG (0xFF) when either is > 14
    vocab_long_tid    u4/i8 [L]      the terms whose lens are LONG, ascending
    vocab_long_prefix u1/u2/u4 [L]   their prefix lengths
    vocab_long_suffix u1/u2/u4 [L]   their suffix lengths
    vocab_suffixes    u1 [sum]       the stored bytes, term after term
    vocab_head_off    u4/i8 [H + 1]  offset in vocab_suffixes of each head's bytes, then the end

The block size is the TOC's ``vocab_block`` (0: the file holds the hash-table vocabulary).
"""

from __future__ import annotations

import numpy as np

VOCAB_BLOCK = 16  # a whole term every 16 (7.1 MB at 2M terms; 32 saves 0.6 MB, doubles decode steps)
FC_ARRAYS = ("vocab_lens", "vocab_long_tid", "vocab_long_prefix", "vocab_long_suffix", "vocab_suffixes",
             "vocab_head_off")
LONG = 0xFF  # vocab_lens of a term whose prefix or suffix length does not fit a nibble (<= 14)
HASH_ARRAYS = ("vocab_hash", "vocab_tid", "vocab_off", "vocab_blob")
_DECODE_TERMS = 1 << 18  # terms decoded per numpy pass (bounds the int64 temporaries)


def vocab_names(block: int) -> tuple[str, ...]:
    """The vocabulary arrays of a file whose TOC says ``vocab_block`` = ``block``."""
    return FC_ARRAYS if block else HASH_ARRAYS


def _narrow(values: np.ndarray) -> np.ndarray:
    top = int(values.max()) if len(values) else 0
    return values.astype(np.uint8 if top < 1 << 8 else np.uint16 if top < 1 << 16 else np.uint32)


def shared_prefix(off: np.ndarray, blob: np.ndarray) -> np.ndarray:
    """Bytes each string of (off, blob) shares with the one before it (0 for the first),
    one vectorized pass per byte position of the longest shared prefix."""
    n = len(off) - 1
    lcp = np.zeros(n, np.int64)
    if n < 2:
        return lcp
    lens = np.diff(off)
    room = np.minimum(lens[1:], lens[:-1])
    active = np.flatnonzero(room > 0) + 1  # pairs (i - 1, i) still equal so far
    k = 0
    while len(active):
        same = blob[off[active] + k] == blob[off[active - 1] + k]
        active = active[same]
        lcp[active] += 1
        k += 1
        active = active[room[active - 1] > k]
    return lcp


def front_code(off: np.ndarray, blob: np.ndarray, block: int = VOCAB_BLOCK) -> dict[str, np.ndarray]:
    """The ``FC_ARRAYS`` of strictly ascending strings given as (offsets, UTF-8 bytes)."""
    off = np.asarray(off, np.int64)
    n = len(off) - 1
    lcp = shared_prefix(off, blob)
    lcp[::block] = 0
    lens = np.diff(off)
    slen = lens - lcp
    soff = np.zeros(n + 1, np.int64)
    np.cumsum(slen, out=soff[1:])
    keep = np.ones(len(blob), np.bool_)
    for t0 in range(0, n, _DECODE_TERMS):  # drop each term's shared prefix from the bytes
        t1 = min(n, t0 + _DECODE_TERMS)
        cnt = lcp[t0:t1]
        within = np.arange(int(cnt.sum()), dtype=np.int64) - np.repeat(np.cumsum(cnt) - cnt, cnt)
        keep[np.repeat(off[t0:t1], cnt) + within] = False
    heads = np.append(soff[:-1][::block], soff[-1])
    long = np.flatnonzero((lcp > 14) | (slen > 14))
    lens = ((np.minimum(lcp, 15) << 4) | np.minimum(slen, 15)).astype(np.uint8)
    lens[long] = LONG
    return {"vocab_lens": lens, "vocab_long_tid": long.astype(np.uint32 if n < 1 << 32 else np.int64),
            "vocab_long_prefix": _narrow(lcp[long]), "vocab_long_suffix": _narrow(slen[long]),
            "vocab_suffixes": np.ascontiguousarray(blob[keep], np.uint8),
            "vocab_head_off": heads.astype(np.uint32 if soff[-1] < 1 << 32 else np.int64)}


def lengths(a: dict[str, np.ndarray], t0: int = 0, t1: int | None = None,
            step: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """(prefix, suffix) lengths (int64) of terms t0, t0 + step, .. below t1: the nibbles of
    ``vocab_lens``, the LONG ones from the long-term arrays."""
    lens = np.asarray(a["vocab_lens"][t0:t1:step], np.int64)
    pre, suf = lens >> 4, lens & 15
    long = np.flatnonzero(lens == LONG)
    if len(long):
        tids, want = a["vocab_long_tid"], long * step + t0
        at = np.searchsorted(tids, want)
        ok = at < len(tids)
        ok[ok] = np.asarray(tids[at[ok]], np.int64) == want[ok]
        if not ok.all():
            raise ValueError("a LONG vocabulary length without its entry")
        pre[long] = a["vocab_long_prefix"][at]
        suf[long] = a["vocab_long_suffix"][at]
    return pre, suf


def fc_problem(a: dict[str, np.ndarray], n: int, block: int) -> str | None:
    """What is malformed in a front-coded vocabulary of ``n`` terms (None: well formed):
    sizes, the LONG entries, heads whole, each prefix no longer than the term before it,
    head offsets equal to the suffix lengths' running sum. Sortedness is ``decode_all``'s
    caller's check."""
    if block < 1:
        return f"vocabulary block size {block}"
    heads, suf, tids = a["vocab_head_off"], a["vocab_suffixes"], np.asarray(a["vocab_long_tid"], np.int64)
    if (len(a["vocab_lens"]) != n or len(heads) != -(-n // block) + 1
            or not len(tids) == len(a["vocab_long_prefix"]) == len(a["vocab_long_suffix"])):
        return "vocabulary arrays do not match the term count"
    long = np.flatnonzero(np.asarray(a["vocab_lens"]) == LONG)
    if not np.array_equal(long, tids):
        return "vocabulary LONG lengths do not match their entries"
    pre, slen = lengths(a)
    soff = np.zeros(n + 1, np.int64)
    np.cumsum(slen, out=soff[1:])
    if int(soff[-1]) != len(suf) or not np.array_equal(np.asarray(heads, np.int64), np.append(soff[:-1][::block],
                                                                                            soff[-1])):
        return "vocabulary head offsets do not match the suffix lengths"
    if n and (pre[::block].any() or (pre[1:] > pre[:-1] + slen[:-1]).any()):
        return "vocabulary prefixes reach past the term before them"
    return None


def decode_all(a: dict[str, np.ndarray], block: int) -> tuple[np.ndarray, np.ndarray]:
    """(offsets int64 [T + 1], UTF-8 bytes) of every term of a well-formed (``fc_problem``)
    front-coded vocabulary, vectorized: each term's stored bytes land first, then the
    shared prefixes are copied from the term before, one position of the block at a time."""
    pre64, slen = lengths(a)
    suf = np.asarray(a["vocab_suffixes"])
    n = len(pre64)
    full = pre64 + slen
    off = np.zeros(n + 1, np.int64)
    np.cumsum(full, out=off[1:])
    soff = np.zeros(n + 1, np.int64)
    np.cumsum(slen, out=soff[1:])
    out = np.empty(int(off[-1]), np.uint8)
    step = max(block, _DECODE_TERMS // block * block)
    for t0 in range(0, n, step):  # a chunk starts at a head: independent of the ones before
        t1 = min(n, t0 + step)
        sl = slen[t0:t1]
        s0, s1 = int(soff[t0]), int(soff[t1])
        dst = np.repeat(off[t0:t1] + pre64[t0:t1] - soff[t0:t1], sl) + np.arange(s0, s1, dtype=np.int64)
        out[dst] = suf[s0:s1]
        for r in range(1, block):
            i = np.arange(t0 + r, t1, block, dtype=np.int64)
            i = i[pre64[i] > 0]
            if not len(i):
                continue
            cnt = pre64[i]
            within = np.arange(int(cnt.sum()), dtype=np.int64) - np.repeat(np.cumsum(cnt) - cnt, cnt)
            out[np.repeat(off[i], cnt) + within] = out[np.repeat(off[i - 1], cnt) + within]
    return off, out


def decode_block(a: dict[str, np.ndarray], block: int, h: int, upto: int | None = None) -> list[bytes]:
    """The terms of block ``h`` (its head first), or its first ``upto`` terms; Python
    bytes, one slice each: what a lookup or ``term`` reads (at most ``block`` terms). Plain
    Python over the block's few bytes: a handful of numpy calls would cost more."""
    n = len(a["vocab_lens"])
    t0 = h * block
    t1 = min(n, t0 + block) if upto is None else min(n, t0 + upto)
    heads = a["vocab_head_off"]
    raw = a["vocab_suffixes"][int(heads[h]):int(heads[h + 1])].tobytes()
    out: list[bytes] = []
    prev, p = b"", 0
    for i, x in enumerate(a["vocab_lens"][t0:t1].tobytes()):
        if x == LONG:
            pre, suf = lengths(a, t0 + i, t0 + i + 1)
            k, ln = int(pre[0]), int(suf[0])
        else:
            k, ln = x >> 4, x & 15
        prev = prev[:k] + raw[p:p + ln]
        p += ln
        out.append(prev)
    return out


def head_keys(a: dict[str, np.ndarray], block: int) -> np.ndarray:
    """The first 8 bytes of each head as a big-endian uint64 (zero-padded): ``numpy.searchsorted``
    on them places a token among the heads (equal keys are compared whole)."""
    heads, suf = np.asarray(a["vocab_head_off"], np.int64), a["vocab_suffixes"]
    hl = np.minimum(lengths(a, 0, None, block)[1], 8)
    keys = np.zeros(len(hl), np.uint64)
    if not len(suf):
        return keys
    for j in range(8):
        byte = suf[np.minimum(heads[:-1] + j, len(suf) - 1)].astype(np.uint64)
        keys |= np.where(hl > j, byte, 0).astype(np.uint64) << np.uint64(56 - 8 * j)
    return keys


def token_key(data: bytes) -> np.uint64:
    """``head_keys`` of one token's UTF-8 bytes."""
    return np.uint64(int.from_bytes(data[:8].ljust(8, b"\0"), "big"))
