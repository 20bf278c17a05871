"""Open a published BM25 index file memory-mapped: no rebuild, no Python token lists.

``open_index(path)`` maps the file (``format.file`` describes it) read-only with
``numpy.memmap`` and returns a ``MappedBM25Index``: a ``BM25Index`` whose arrays are views
of the mapping, so every process serving the same snapshot shares the same page-cache
pages and the kernels read exactly the bytes the build wrote (identical scores).

Opening checks the header, version, size, footer, TOC and checksum table only (a few
kilobytes). A data block's crc32 is checked the first time a query needs it: a query
term's postings, per-term entries, block maxima and bitset row when the vocabulary first
resolves that term; all document lengths on the first filtered query; the vocabulary's
vocabulary on the first lookup. Each first check also bounds-checks what the compiled
kernels will index with (positions < N, pointer ranges), so a damaged file is a
``CorruptIndexError`` naming it, never a wrong answer or a crash.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from ..format.file import (
    HEADER_BYTES,
    ArraySpec,
    CorruptIndexError,
    bytes_hash,
    id_digest,
    read_toc,
    term_hash,
    terms_ascending,
)
from ..format.mapfile import MappedDocIds, MappedFile
from ..format.raw import PACKED
from ..format.vocab_fc import (
    FC_ARRAYS,
    decode_all,
    decode_block,
    fc_problem,
    head_keys,
    lengths,
    token_key,
    vocab_names,
)
from ..kernels import loader as bm25_kernel
from .bm25 import BM25Index
from .packed_index import PackedBM25Index, PackedFile, open_packed
from .postings import ARRAY_NAMES, BLOCK_SIZE, Postings

_CACHE_MAX = 1 << 16  # resolved tokens kept per index (cleared when full)
_MISS = object()


class MappedVocabulary:
    """Token -> term id over the mapped vocabulary (``get`` like a dict's).

    Two forms (``format.file``): the front-coded sorted terms of format 4 (the TOC's
    ``vocab_block`` > 0; ``format.vocab_fc``): one ``numpy.searchsorted`` of the token's
    first 8 bytes among the heads' (equal keys compared whole), then at most a block's
    terms decoded and compared; or the hash table of formats 1-3 (a hash collision is
    resolved by comparing the strings). A term id is handed out only after its postings
    are verified; resolved tokens, known or not, are cached so repeated query tokens cost
    a dict lookup.
    """

    def __init__(self, file: MappedFile) -> None:
        self._f = file
        self._cache: dict[str, int] = {}
        self._table_ok = False
        self._block = int(file.toc.vocab_block)
        self._keys: np.ndarray | None = None
        self._last: tuple[int, list[bytes]] = (-1, [])  # the block ``term`` decoded last

    def __len__(self) -> int:
        return self._f.toc.n_terms

    def __contains__(self, token: object) -> bool:
        return isinstance(token, str) and self.get(token) is not None

    def get(self, token: str, default: int | None = None) -> int | None:
        t = self._cache.get(token, _MISS)
        if t is _MISS:
            t = self._fc_lookup(token) if self._block else self._lookup(token)
            if len(self._cache) >= _CACHE_MAX:
                self._cache.clear()
            self._cache[token] = t
        return default if t < 0 else t  # type: ignore[operator,return-value]

    def term(self, tid: int) -> str:
        """The term string of a term id."""
        if not self._block:
            return self._f.string("vocab", tid)
        if not 0 <= tid < len(self):
            raise IndexError(f"term id {tid} outside 0..{len(self) - 1}")
        self._fc_ready()
        h, last = tid // self._block, self._last
        if last[0] != h:  # terms read in id order decode each block once
            last = self._last = (h, decode_block(self._f.arrays, self._block, h))
        return last[1][tid % self._block].decode("utf-8", "surrogatepass")

    def terms(self) -> tuple[np.ndarray, np.ndarray]:
        """Every term, by id, as (offsets int64 [T + 1], UTF-8 bytes): vectorized, not one
        ``term`` call per term. The vocabulary's checksums and shape are checked first
        (``term_strings`` reads them unchecked), so a damaged file is a ``CorruptIndexError``."""
        f = self._f
        for name in FC_ARRAYS if self._block else ("vocab_off", "vocab_blob"):
            f.whole(name)
        if not vocab_ok(f):
            raise CorruptIndexError(f.path, "vocabulary arrays are malformed")
        return term_strings(f)

    def _fc_ready(self) -> None:
        """First use of the front-coded vocabulary: its checksums (5 MB at 2M terms, where the
        hash table was 32 MB) and its sizes; the bytes are then the ones ``verify`` checked
        whole at publish (``fc_problem``, sorted terms), and a lookup only slices them."""
        if self._keys is not None:
            return
        f, a = self._f, self._f.arrays
        if not self._table_ok:
            for name in FC_ARRAYS:
                f.whole(name)
            heads = a["vocab_head_off"]
            if (len(a["vocab_lens"]) != len(self) or len(heads) != -(-len(self) // self._block) + 1
                    or int(heads[-1]) != len(a["vocab_suffixes"])):
                raise CorruptIndexError(f.path, "vocabulary arrays do not match the term count")
            self._table_ok = True
        self._keys = head_keys(a, self._block)

    def _head(self, h: int) -> bytes:
        a, lo = self._f.arrays, int(self._f.arrays["vocab_head_off"][h])
        size = int(lengths(a, h * self._block, h * self._block + 1)[1][0])
        return a["vocab_suffixes"][lo:lo + size].tobytes()

    def _fc_lookup(self, token: str) -> int:
        self._fc_ready()
        keys, data = self._keys, token.encode("utf-8", "surrogatepass")
        assert keys is not None
        k = token_key(data)
        # Heads below lo are below the token, from hi on above it; equal keys: compare whole.
        lo, hi = int(np.searchsorted(keys, k, side="left")), int(np.searchsorted(keys, k, side="right"))
        while lo < hi:
            mid = (lo + hi) // 2
            if self._head(mid) <= data:
                lo = mid + 1
            else:
                hi = mid
        if lo == 0:
            return -1
        h = lo - 1
        for i, term in enumerate(decode_block(self._f.arrays, self._block, h)):
            if term >= data:
                if term != data:
                    return -1
                tid = h * self._block + i
                self._f.verify_term(tid)
                return tid
        return -1

    def _lookup(self, token: str) -> int:
        f = self._f
        if not self._table_ok:
            f.whole("vocab_hash")
            f.whole("vocab_tid")
            self._table_ok = True
        hashes, tids, h = f.arrays["vocab_hash"], f.arrays["vocab_tid"], np.uint64(term_hash(token))
        i = int(np.searchsorted(hashes, h))
        while i < len(hashes) and hashes[i] == h:  # equal hashes: compare the strings
            tid = int(tids[i])
            if not 0 <= tid < f.toc.n_terms:
                raise CorruptIndexError(f.path, f"vocabulary entry {i} has term id {tid} out of range")
            if self.term(tid) == token:
                f.verify_term(tid)
                return tid
            i += 1
        return -1


class MappedBM25Index(MappedDocIds, BM25Index):
    """A ``BM25Index`` over a published file (``open_index``); same search API and results."""

    path: Path
    n_terms: int

    def _spec(self, name: str) -> ArraySpec:
        return self._toc.arrays[name]

    def _doc_lengths_read(self) -> None:
        if not self._lengths_ok:
            self._file.whole("doc_len")
            if int(self._doc_len32.sum(dtype=np.int64)) != self.total_len:
                raise CorruptIndexError(self.path, "document lengths do not add up to the recorded total")
            self._lengths_ok = True

    # ------------------------------------------------------------ full check
    def verify(self) -> None:
        """Every checksum and the whole structure (what publishing runs before the rename)."""
        self._blocks.check(HEADER_BYTES, self._blocks.end)
        self._lengths_ok = False
        self._doc_lengths_read()
        a, n, nt = self.indptr, self.n_docs, self.n_terms
        p = len(self.indices)
        nblk = -(-np.diff(a) // BLOCK_SIZE) if nt else np.zeros(0, np.int64)
        ok = (len(a) == nt + 1 and a[0] == 0 and a[-1] == p and (np.diff(a) >= 0).all()
              and len(self.tf) == p and len(self.w) == p and (p == 0 or (int(self.indices.min()) >= 0
                                                                         and int(self.indices.max()) < n))
              and np.array_equal(self.df, np.diff(a)) and len(self._bptr) == nt + 1 and self._bptr[0] == 0
              and np.array_equal(np.diff(self._bptr), nblk) and self._bptr[-1] <= len(self._bmax)
              and len(self._idf_full) == nt and len(self._w_max) == nt and len(self._bit_row) == nt
              and (self._bit_row >= -1).all() and (self._bit_row < self._bits.shape[0]).all()
              and self._bits.shape[1] == (n + 63) // 64)
        ok = ok and tables_ok(self._file)
        if not ok:
            raise CorruptIndexError(self.path, "index structure is inconsistent")
        self._file.term_ok[:] = True
        self.vocab._table_ok = True


def tables_ok(f: MappedFile) -> bool:
    """The vocabulary, doc ids and corpus positions of a file are well formed (either layout)."""
    a, n, nt = f.arrays, f.toc.n_docs, f.toc.n_terms
    if f.toc.vocab_block:  # format 4: well formed, and every term above the one before it
        ok = vocab_ok(f) and terms_ascending(*decode_all(a, f.toc.vocab_block))
    else:
        ok = (strings_ok(a["vocab_off"], len(a["vocab_blob"]), nt)
              and np.array_equal(np.sort(a["vocab_tid"]), np.arange(nt)) and _hashes_ok(f))
    if "doc_id_off" in a:
        ok = ok and strings_ok(a["doc_id_off"], len(a["doc_id_blob"]), n)
        if "doc_id_digest" in a:  # what an open compares instead of the ids (id_digest)
            ok = ok and a["doc_id_digest"].tobytes() == id_digest(a["doc_id_off"], a["doc_id_blob"])
    if "global_pos" in a:  # a segment: its documents' corpus positions
        g = a["global_pos"]
        ok = ok and len(g) == n and (n == 0 or (int(g[0]) >= 0 and int(g[-1]) < f.toc.corpus_docs
                                                and bool((np.diff(g) > 0).all())))
    return bool(ok)


def _hashes_ok(f: MappedFile) -> bool:
    """The hash table is sorted and each entry is its term's hash (lookups depend on both)."""
    a = f.arrays
    hashes, off, raw = a["vocab_hash"], a["vocab_off"].tolist(), a["vocab_blob"].tobytes()
    want = np.fromiter((bytes_hash(raw[off[t]:off[t + 1]]) for t in a["vocab_tid"].tolist()), np.uint64,
                       len(hashes))
    return bool((hashes[1:] >= hashes[:-1]).all() and np.array_equal(hashes, want))


def vocab_ok(f: MappedFile) -> bool:
    """The vocabulary's shape (offsets, sizes; not the hash table's contents nor the terms'
    order, which ``tables_ok`` checks): what a reader of every term relies on."""
    a, nt, block = f.arrays, f.toc.n_terms, f.toc.vocab_block
    if block:
        return fc_problem(a, nt, block) is None
    return strings_ok(a["vocab_off"], len(a["vocab_blob"]), nt)


def term_strings(f: MappedFile) -> tuple[np.ndarray, np.ndarray]:
    """Every term of a file by id as (offsets int64 [T + 1], UTF-8 bytes), either form;
    the caller has checked the vocabulary's checksums and ``vocab_ok``."""
    if f.toc.vocab_block:
        return decode_all(f.arrays, f.toc.vocab_block)
    return np.asarray(f.arrays["vocab_off"], np.int64), f.arrays["vocab_blob"]


def strings_ok(off: np.ndarray, blob_len: int, n: int) -> bool:
    """n strings as (offsets, blob): n + 1 offsets from 0 to the blob's end, never decreasing."""
    return bool(len(off) == n + 1 and off[0] == 0 and off[-1] == blob_len and (np.diff(off) >= 0).all())


def open_index(path: str | os.PathLike[str], *, kernel: str = "auto") -> MappedBM25Index | PackedBM25Index:
    """Map a published BM25 index file; raises ``IndexFormatError`` subclasses naming it.

    The file's layout decides the class: a ``MappedBM25Index`` for plain postings, a
    ``index.packed_index.PackedBM25Index`` (same query API) for packed ones. k1 and b are
    the ones the file was built with (its weights depend on them).
    """
    path = Path(path)
    try:
        buf = np.memmap(path, dtype=np.uint8, mode="r")
    except (OSError, ValueError) as exc:  # missing, unreadable, or empty (mmap of 0 bytes)
        raise CorruptIndexError(path, f"cannot map the file: {exc}") from exc
    toc = read_toc(path, buf)
    if toc.layout == PACKED:
        # The vocabulary and the table checks are this module's (one implementation).
        packed = PackedFile(path, buf, toc)
        return open_packed(packed, MappedVocabulary(packed), tables_ok, kernel=kernel)
    f = MappedFile(path, buf, toc)
    postings = Postings(**{name: f.array(name) for name in ARRAY_NAMES})
    if len(postings.doc_len) != toc.n_docs or len(postings.df) != toc.n_terms:
        raise CorruptIndexError(path, "array sizes do not match the recorded counts")
    ix = MappedBM25Index.__new__(MappedBM25Index)
    ix.path, ix._toc, ix.n_terms, ix._file, ix._blocks = path, toc, toc.n_terms, f, f.blocks
    ix._lengths_ok = False
    for name in vocab_names(toc.vocab_block):
        setattr(ix, f"_{name}", f.array(name))
    for name in ("doc_id_off", "doc_id_blob", "global_pos"):
        if name in f.arrays:
            setattr(ix, f"_{name}", f.arrays[name])
    # The kernels come warmed for the mapping's own arrays (read-only), not for an index
    # built in memory (writable): those are other numba signatures, which the first query
    # would otherwise load, or compile on a cold cache (bm25_kernel.flavour).
    ix._adopt(postings, MappedVocabulary(f), toc.k1, toc.b, "numpy", total_len=toc.total_len)
    if toc.corpus_docs:  # a segment: its weights (and their maxima) use the corpus's avgdl
        ix._w_avgdl = toc.corpus_len / toc.corpus_docs
    if kernel != "numpy":
        ix._kernels = bm25_kernel.load_kernels(postings)
        bm25_kernel.require(kernel, ix._kernels)
        ix._scratch = bm25_kernel.Scratch(ix.n_docs) if ix._kernels is not None else None
    return ix
