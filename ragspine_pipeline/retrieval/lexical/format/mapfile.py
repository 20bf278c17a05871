"""The memory mapping of a published BM25 file, shared by both postings layouts.

Why a module of its own: the plain reader (``index.mapped``) and the packed one
(``index.packed_index``) both map a file, verify its data blocks lazily and read its doc
ids; ``index.mapped.open_index`` dispatches to the packed reader, so what both need lives
below both (no import cycle).
"""

from __future__ import annotations

import threading
import zlib
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from .file import BLOCK_BYTES, HEADER_BYTES, ArraySpec, CorruptIndexError, Toc, strings_to_blob
from .raw import BLOCK_SIZE


class _Blocks:
    """Lazy crc32 verification of the data region, one BLOCK_BYTES block at a time."""

    def __init__(self, path: Path, buf: np.ndarray, toc: Toc) -> None:
        self.path, self.buf, self.end = path, buf, toc.crc_offset
        self.crcs = buf[toc.crc_offset:toc.crc_offset + 4 * toc.crc_count].view("<u4")
        self.ok = np.zeros(toc.crc_count, np.bool_)

    def check(self, lo: int, hi: int) -> None:
        """Verify every block overlapping bytes [lo, hi) of the file (once each)."""
        if hi <= lo:
            return
        b0, b1 = (lo - HEADER_BYTES) // BLOCK_BYTES, (hi - 1 - HEADER_BYTES) // BLOCK_BYTES + 1
        if self.ok[b0:b1].all():
            return
        for blk in range(b0, b1):
            if not self.ok[blk]:
                start = HEADER_BYTES + blk * BLOCK_BYTES
                if zlib.crc32(self.buf[start:min(start + BLOCK_BYTES, self.end)]) != int(self.crcs[blk]):
                    raise CorruptIndexError(self.path, f"checksum mismatch in data block {blk} "
                                                       f"(bytes {start}..{start + BLOCK_BYTES})")
                self.ok[blk] = True

    def elems(self, spec: ArraySpec, lo: int, hi: int) -> None:
        """Verify elements [lo, hi) of an array (flat element numbers)."""
        size = np.dtype(spec.dtype).itemsize
        self.check(spec.offset + lo * size, spec.offset + hi * size)

    def whole(self, spec: ArraySpec) -> None:
        self.check(spec.offset, spec.offset + spec.nbytes)


class MappedFile:
    """The mapping, its table of contents and what has been verified so far.

    Shared by the index and its vocabulary, and holding neither, so dropping the index
    unmaps the file at once (no reference cycle waiting for the garbage collector).
    """

    def __init__(self, path: Path, buf: np.ndarray, toc: Toc) -> None:
        self.path, self.toc, self.blocks = path, toc, _Blocks(path, buf, toc)
        self.arrays: dict[str, np.ndarray] = {}
        for name, a in toc.arrays.items():
            # A plain ndarray view of the mapping (not the memmap subclass): the kernels see
            # an ordinary read-only array.
            self.arrays[name] = np.asarray(buf[a.offset:a.offset + a.nbytes]).view(a.dtype).reshape(a.shape)
        self.term_ok = np.zeros(toc.n_terms, np.bool_)
        self.lock = threading.Lock()

    def array(self, name: str) -> np.ndarray:
        a = self.arrays.get(name)
        if a is None:
            raise CorruptIndexError(self.path, f"array {name!r} missing from the table of contents")
        return a

    def elems(self, name: str, lo: int, hi: int) -> None:
        self.blocks.elems(self.toc.arrays[name], lo, hi)

    def whole(self, name: str) -> None:
        self.blocks.whole(self.toc.arrays[name])

    # One element per term, checked at a term's first use where the file holds them (every
    # plain file holds all four; a packed file of format 3 keeps no per-term idf nor bit_row).
    PER_TERM: tuple[str, ...] = ("df", "idf", "w_max", "bit_row")

    def verify_term(self, t: int) -> None:
        """First use of term t: checksums and bounds of everything a query reads for it,
        once per term (``_check_term``: the layout's part)."""
        with self.lock:
            if self.term_ok[t]:
                return
            self._check_term(t)
            self.term_ok[t] = True

    def _term_pointers(self, t: int) -> tuple[int, int, int, int, int]:
        """Term t's postings and block pointers and bit-set row, their checksums verified
        (both layouts): (start, end, first block, end block, row)."""
        a = self.arrays
        for name in ("indptr", "bptr"):
            self.elems(name, t, t + 2)
        for name in self.PER_TERM:
            if name in a:
                self.elems(name, t, t + 1)
        return (int(a["indptr"][t]), int(a["indptr"][t + 1]), int(a["bptr"][t]), int(a["bptr"][t + 1]),
                self._bit_row(t))

    def _bit_row(self, t: int) -> int:
        """Term t's row of the bit sets, or -1 (stored per term; a layout may keep it otherwise)."""
        return int(self.arrays["bit_row"][t])

    def _bits_row(self, row: int) -> None:
        """A term's row of the bit sets (-1: it has none), verified."""
        if row >= 0:
            words = self.arrays["bits"].shape[1]
            self.elems("bits", row * words, (row + 1) * words)

    def _check_term(self, t: int) -> None:
        """The plain layout: pointers in range, the df they imply, postings and block maxes
        verified, every posting's position inside the index."""
        a = self.arrays
        s, e, b0, b1, row = self._term_pointers(t)
        if not (0 <= s <= e <= len(a["indices"]) and int(a["df"][t]) == e - s
                and b0 >= 0 and b1 - b0 == -(-(e - s) // BLOCK_SIZE) and b1 <= len(a["bmax"])
                and -1 <= row < a["bits"].shape[0]):
            raise CorruptIndexError(self.path, f"postings pointers of term {t} are out of range")
        for name in ("indices", "tf", "w"):
            self.elems(name, s, e)
        self.elems("bmax", b0, b1)
        self._bits_row(row)
        if e > s:
            post = a["indices"][s:e]
            if int(post.min()) < 0 or int(post.max()) >= self.toc.n_docs:
                raise CorruptIndexError(self.path, f"postings of term {t} hold positions outside the index")

    def string(self, prefix: str, i: int) -> str:
        """String i of a (``{prefix}_off``, ``{prefix}_blob``) pair, verified."""
        off, blob = self.arrays[f"{prefix}_off"], self.arrays[f"{prefix}_blob"]
        self.elems(f"{prefix}_off", i, i + 2)
        lo, hi = int(off[i]), int(off[i + 1])
        if not (0 <= lo <= hi <= len(blob)):
            raise CorruptIndexError(self.path, f"{prefix} offsets of entry {i} out of range")
        self.elems(f"{prefix}_blob", lo, hi)
        return blob[lo:hi].tobytes().decode("utf-8", "surrogatepass")


class MappedDocIds:
    """The doc ids recorded in a published file (shared by both postings layouts).

    Needs ``path``, ``n_docs``, ``_toc``, ``_file`` and, when the file has them, the
    ``_doc_id_off`` / ``_doc_id_blob`` arrays.
    """

    path: Path
    n_docs: int
    _toc: Toc
    _file: MappedFile
    _doc_id_off: np.ndarray
    _doc_id_blob: np.ndarray

    # ------------------------------------------------------------ doc ids
    @property
    def has_doc_ids(self) -> bool:
        return "doc_id_off" in self._toc.arrays

    def doc_ids(self, positions: Iterable[int]) -> list[str]:
        """The doc ids recorded at publish for these positions (their tie order)."""
        if not self.has_doc_ids:
            raise KeyError(f"{self.path}: no doc ids were written with this index")
        out = []
        for p in positions:
            p = int(p)
            if not 0 <= p < self.n_docs:
                raise IndexError(f"doc position {p} outside 0..{self.n_docs - 1}")
            out.append(self._file.string("doc_id", p))
        return out

    def doc_id_digest(self) -> bytes | None:
        """The ``format.file.id_digest`` of the doc ids recorded at publish (checksummed
        before it is read), or None for a file written without one."""
        if "doc_id_digest" not in self._toc.arrays:
            return None
        self._file.whole("doc_id_digest")
        digest = self._file.array("doc_id_digest")
        if digest.shape != (32,):
            raise CorruptIndexError(self.path, f"doc_id_digest holds {digest.size} bytes, not 32")
        return digest.tobytes()

    def same_doc_ids(self, ids: Sequence[str]) -> bool:
        """Whether the recorded doc ids are exactly ``ids``, in order (one vectorized compare)."""
        if not self.has_doc_ids or len(ids) != self.n_docs:
            return False
        return self.same_doc_id_blob(*strings_to_blob(ids))

    def same_doc_id_blob(self, off: np.ndarray, blob: np.ndarray) -> bool:
        """``same_doc_ids`` for ids already encoded as ``strings_to_blob`` encodes them
        (int64 offsets from 0, UTF-8 bytes), e.g. read from an Arrow column without a
        Python string per id."""
        if not self.has_doc_ids or len(off) != self.n_docs + 1:
            return False
        self._file.whole("doc_id_off")
        self._file.whole("doc_id_blob")
        return bool(np.array_equal(off, self._doc_id_off) and np.array_equal(blob, self._doc_id_blob))
