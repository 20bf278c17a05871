"""The on-disk layout of a built BM25 index (format version 4), its writer and its checks.

Why: a serving process should map the published index, not rebuild it from token lists
(#27). One immutable file holds one index segment; every array a query reads is stored
exactly as ``index.postings.Postings`` holds it, so the memory-mapped index (``index.mapped``)
feeds the same kernels the same bytes and returns the same scores, bit for bit.

Layout (little-endian; every array starts at a multiple of 64 bytes)::

    [0, 64)            header
        0   8s   magic b"RSPBM25\\0"
        8   u32  format version (FORMAT_VERSION)
        12  u32  header size (64)
        16  u64  file size in bytes (footer included): a shorter file is truncated
        24  u64  TOC offset          32  u64  TOC size
        40  u32  crc32 of the TOC    44  u32  checksum block size (BLOCK_BYTES)
        48  u64  crc table offset (= end of the data region)
        56  u32  reserved (0)        60  u32  crc32 of header bytes [0, 60)
    [64, crc_off)      data region: the arrays (``ARRAY_NAMES`` + the vocabulary + doc ids)
    [crc_off, toc_off) crc table: one uint32 crc32 per BLOCK_BYTES of the data region
    [toc_off, -32)     TOC: UTF-8 JSON (``Toc``): parameters, counts, and per array its
                       dtype, shape, offset and size; the crc32 of the crc table
    [-32, end)         footer: magic b"RSPBM25E", u64 file size, u64 TOC offset,
                       u32 TOC crc32, u32 crc32 of footer bytes [0, 28)

Versions and layouts: version 2 records the postings ``layout`` in the TOC: ``plain``
(the arrays below; byte for byte version 1 apart from the version and that TOC field) or
``packed`` (``index.packed``: block-packed doc-id deltas and term frequencies, no per-posting
weight). A version 1 file is plain. Version 3 (#47, bytes) changes only the packed
layout's per-term tables (``index.packed_tables``: idf per distinct df, the bit-set terms
as a sorted list, no document lengths beside their codes); a plain file of version 3 is
version 2's. Readers accept versions 1 to 3 (a packed file of version 2 is read through
the version 3 shapes, with the same answers). Version 4 (#47, bytes T3) adds the
front-coded vocabulary (``format.vocab_fc``; the TOC's ``vocab_block`` > 0): term ids are
the terms' lexicographic order (``format.raw_order``), which every writer of counted
postings (``refresh.publish.write_plain``/``write_packed``) now gives; a writer whose
ids are in another order (``write_index`` of an index built in memory) still writes the
hash table below (``vocab_block`` 0). Readers accept versions 1 to 4 (formats 1-3 read
their hash table as before); any other version, or a layout this code does not know, is
an ``IndexVersionError`` naming what was found and what is supported.

Arrays (plain): the ``Postings`` arrays (postings ``indptr``/``indices``/``tf``/``w``, per-term
``df``/``idf``/``w_max``, block-max ``bptr``/``bmax``, ``bit_row``/``bits``, ``doc_len``);
the vocabulary as a hash table (``vocab_hash``: sorted 64-bit blake2b of each term's UTF-8,
``vocab_tid``: the term id of each hash, ``vocab_off``/``vocab_blob``: term id t's UTF-8 is
``blob[off[t]:off[t+1]]``, compared on lookup so a hash collision never maps a token to
the wrong term); and, optionally, the doc ids in position order (``doc_id_off``/
``doc_id_blob``), which is the order of ties, with their ``id_digest`` (``doc_id_digest``,
32 bytes; checked against the ids at publish): an open compares it with the served records'
digest instead of reading both id columns.

Integrity: the header, footer, sizes, version, TOC and crc table are checked at open;
each data block's crc32 the first time a query reads it; every block and the structure
(monotone pointers, positions below N) when the file is written, before it is renamed
into place (temp file + fsync + rename + fsync of the folder: a reader sees the whole
file or none).

Segments (``refresh.segments``): the TOC records ``bucket`` / ``buckets``. A corpus published
as B segments puts each doc in segment ``doc_bucket(doc_id, B)``; each segment file holds
its documents' postings with ``w`` and ``idf`` computed from the corpus-wide N, df and
avgdl (``corpus_docs`` / ``corpus_len`` in the TOC), and ``global_pos``: each local
document's position in the corpus order. A shard maps only its segments and its
unfiltered scores are the corpus's own, so merging the shards' top-k by (score, global
position) is the corpus top-k. A filtered query needs the survivors' N, df and length
over the whole corpus: the segments each count theirs and the counts are summed first.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from .vocab_fc import VOCAB_BLOCK, front_code

MAGIC = b"RSPBM25\0"
FOOTER_MAGIC = b"RSPBM25E"
FORMAT_VERSION = 4
READABLE_VERSIONS = (1, 2, 3, 4)
LAYOUTS = ("plain", "packed")  # bm25_raw.PLAIN / PACKED; the TOC's "layout" field
HEADER_BYTES = 64
FOOTER_BYTES = 32
BLOCK_BYTES = 1 << 16  # checksum block: 64 KiB, a few pages, cheap to verify on first read
ALIGN = 64
_HEADER = struct.Struct("<8sIIQQQIIQI")  # without the trailing header crc
_FOOTER = struct.Struct("<8sQQI")  # without the trailing footer crc


class IndexFormatError(ValueError):
    """A BM25 index file that cannot be served; the message names the file."""

    def __init__(self, path: str | os.PathLike[str], problem: str) -> None:
        self.path = str(path)
        super().__init__(f"{self.path}: {problem}")


class CorruptIndexError(IndexFormatError):
    """A truncated file, a bad magic, or a checksum that does not match."""


class IndexVersionError(IndexFormatError):
    """A format version this code does not read (newer, or unknown)."""

    def __init__(self, path: str | os.PathLike[str], found: int, supported: int = FORMAT_VERSION,
                 layout: str | None = None) -> None:
        self.found, self.supported, self.layout = found, supported, layout
        if layout is None:
            what = f"BM25 index format version {found}; this ragspine reads format version {supported}"
            if supported > 1:
                what += f" and older ({', '.join(map(str, READABLE_VERSIONS))})"
        else:
            what = (f"BM25 postings layout {layout!r} (format version {found}); this ragspine reads layouts "
                    f"{', '.join(LAYOUTS)} up to format version {supported}")
        super().__init__(path, what + " (rebuild the index, or upgrade ragspine)")


@dataclass(frozen=True)
class ArraySpec:
    """Where one array lives in the file."""

    dtype: str  # numpy dtype string, e.g. "<i8"
    shape: tuple[int, ...]
    offset: int  # absolute byte offset
    nbytes: int


@dataclass(frozen=True)
class Toc:
    """The table of contents: what a reader needs besides the arrays' bytes."""

    k1: float
    b: float
    n_docs: int
    n_terms: int
    total_len: int
    bucket: int
    buckets: int
    arrays: dict[str, ArraySpec]
    crc_offset: int
    crc_count: int
    crc_crc32: int
    # A segment of a larger corpus (``refresh.segments``): the corpus's document count and
    # summed length, which its w and idf were computed with (0: the file is the corpus).
    corpus_docs: int = 0
    corpus_len: int = 0
    layout: str = "plain"  # version 2: which postings layout the arrays are (LAYOUTS)
    vocab_block: int = 0  # version 4: terms per head of the front-coded vocabulary (0: hash table)
    version: int = FORMAT_VERSION  # the file's format version (from the header; not written)

    def to_json(self) -> bytes:
        d: dict[str, Any] = {k: getattr(self, k) for k in self.__dataclass_fields__ if k not in ("arrays", "version")}
        d["format_version"] = self.version
        d["arrays"] = {n: {"dtype": a.dtype, "shape": list(a.shape), "offset": a.offset, "nbytes": a.nbytes}
                       for n, a in self.arrays.items()}
        return json.dumps(d, sort_keys=True).encode()

    @classmethod
    def from_json(cls, raw: bytes, version: int = FORMAT_VERSION) -> Toc:
        d = json.loads(raw)
        arrays = {n: ArraySpec(a["dtype"], tuple(a["shape"]), a["offset"], a["nbytes"])
                  for n, a in d.pop("arrays").items()}
        d.pop("format_version", None)
        return cls(arrays=arrays, version=version, **d)


def term_hash(token: str) -> int:
    """Stable 64-bit hash of a term (Python's ``hash`` changes per process)."""
    return bytes_hash(token.encode("utf-8", "surrogatepass"))


def bytes_hash(data: bytes) -> int:
    """``term_hash`` of a term's UTF-8 bytes."""
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


def doc_bucket(doc_id: str, buckets: int) -> int:
    """The segment of a document when a library is published as ``buckets`` segments."""
    return term_hash(doc_id) % buckets


def pack_header(file_bytes: int, toc_off: int, toc_len: int, toc_crc: int, crc_off: int,
                version: int = FORMAT_VERSION) -> bytes:
    head = _HEADER.pack(MAGIC, version, HEADER_BYTES, file_bytes, toc_off, toc_len, toc_crc, BLOCK_BYTES,
                        crc_off, 0)
    return head + struct.pack("<I", zlib.crc32(head))


def pack_footer(file_bytes: int, toc_off: int, toc_crc: int) -> bytes:
    foot = _FOOTER.pack(FOOTER_MAGIC, file_bytes, toc_off, toc_crc)
    return foot + struct.pack("<I", zlib.crc32(foot))


def read_toc(path: str | os.PathLike[str], buf: np.ndarray) -> Toc:
    """Check header, version, size, footer, TOC and crc table of a file mapped as ``buf``
    (uint8); return the TOC. Every failure is a typed error naming the file."""
    size = len(buf)
    if size < HEADER_BYTES or bytes(buf[:8]) != MAGIC:
        raise CorruptIndexError(path, "not a RAGSpine BM25 index file (bad magic or too short)")
    head = bytes(buf[:HEADER_BYTES])
    (_m, version, hsize, file_bytes, toc_off, toc_len, toc_crc, block, crc_off, _r) = _HEADER.unpack(head[:60])
    if version not in READABLE_VERSIONS:  # before the checksum: a newer layout may differ past here
        raise IndexVersionError(path, version)
    if zlib.crc32(head[:60]) != struct.unpack("<I", head[60:])[0]:
        raise CorruptIndexError(path, "header checksum mismatch")
    if size != file_bytes:
        raise CorruptIndexError(path, f"truncated or extended: {size} bytes on disk, header says {file_bytes}")
    if hsize != HEADER_BYTES or block != BLOCK_BYTES or not (
            HEADER_BYTES <= crc_off <= toc_off and toc_off + toc_len + FOOTER_BYTES == size):
        raise CorruptIndexError(path, "header sizes are inconsistent")
    foot = bytes(buf[size - FOOTER_BYTES:])
    magic, f_bytes, f_toc, f_crc = _FOOTER.unpack(foot[:28])
    if (magic != FOOTER_MAGIC or zlib.crc32(foot[:28]) != struct.unpack("<I", foot[28:])[0]
            or (f_bytes, f_toc, f_crc) != (file_bytes, toc_off, toc_crc)):
        raise CorruptIndexError(path, "footer missing or does not match the header (truncated write?)")
    raw = bytes(buf[toc_off:toc_off + toc_len])
    if zlib.crc32(raw) != toc_crc:
        raise CorruptIndexError(path, "table of contents checksum mismatch")
    try:
        toc = Toc.from_json(raw, version)
    except (ValueError, KeyError, TypeError) as exc:
        raise CorruptIndexError(path, f"table of contents unreadable: {exc}") from exc
    if toc.layout not in LAYOUTS or (version == 1 and toc.layout != "plain"):
        raise IndexVersionError(path, version, layout=str(toc.layout))
    n_blocks = (crc_off - HEADER_BYTES + BLOCK_BYTES - 1) // BLOCK_BYTES
    if toc.crc_offset != crc_off or toc.crc_count != n_blocks or crc_off + 4 * n_blocks > toc_off:
        raise CorruptIndexError(path, "checksum table does not cover the data region")
    if zlib.crc32(buf[crc_off:crc_off + 4 * n_blocks]) != toc.crc_crc32:
        raise CorruptIndexError(path, "checksum table checksum mismatch")
    for name, a in toc.arrays.items():
        want = int(np.prod(a.shape, dtype=np.int64)) * np.dtype(a.dtype).itemsize
        if a.nbytes != want or a.offset % ALIGN or not (a.offset >= HEADER_BYTES and a.offset + a.nbytes <= crc_off):
            raise CorruptIndexError(path, f"array {name!r} lies outside the data region or has a bad size")
    return toc


@dataclass(frozen=True)
class ChunkedArray:
    """A one-dimensional array handed to ``write_file`` in consecutive parts (e.g. packed
    postings encoded a slice at a time), so the writer never holds it whole."""

    dtype: str
    chunks: Iterable[np.ndarray]


class _BlockWriter:
    """Writes the data region and the crc32 of every BLOCK_BYTES of it on the way."""

    def __init__(self, f: BinaryIO) -> None:
        self.f, self.pos, self.crcs, self._crc, self._fill = f, HEADER_BYTES, [], 0, 0

    def write(self, data: memoryview | bytes) -> None:
        mv = memoryview(data).cast("B")
        while len(mv):
            take = min(len(mv), BLOCK_BYTES - self._fill)
            self._crc = zlib.crc32(mv[:take], self._crc)
            self.f.write(mv[:take])
            self._fill += take
            self.pos += take
            mv = mv[take:]
            if self._fill == BLOCK_BYTES:
                self.crcs.append(self._crc)
                self._crc = self._fill = 0

    def array(self, arr: np.ndarray | ChunkedArray) -> ArraySpec:
        self.write(b"\0" * (-self.pos % ALIGN))
        if isinstance(arr, ChunkedArray):
            return self._chunked(arr)
        arr = np.ascontiguousarray(arr)
        spec = ArraySpec(arr.dtype.newbyteorder("<").str, tuple(int(x) for x in arr.shape), self.pos, arr.nbytes)
        if arr.nbytes:
            self.write(memoryview(arr.astype(arr.dtype.newbyteorder("<"), copy=False).reshape(-1)))
        return spec

    def _chunked(self, arr: ChunkedArray) -> ArraySpec:
        dtype = np.dtype(arr.dtype).newbyteorder("<")
        start, count = self.pos, 0
        for part in arr.chunks:
            part = np.ascontiguousarray(part, dtype=dtype).reshape(-1)
            count += len(part)
            if part.nbytes:
                self.write(memoryview(part))
        return ArraySpec(dtype.str, (count,), start, count * dtype.itemsize)

    def finish(self) -> np.ndarray:
        if self._fill:
            self.crcs.append(self._crc)
            self._crc = self._fill = 0
        return np.asarray(self.crcs, dtype="<u4")


def strings_to_blob(strings: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """(offsets int64 [n + 1], UTF-8 bytes uint8): string i is blob[off[i]:off[i+1]]."""
    encoded = [s.encode("utf-8", "surrogatepass") for s in strings]
    off = np.zeros(len(encoded) + 1, np.int64)
    np.cumsum(np.fromiter(map(len, encoded), np.int64, len(encoded)), out=off[1:])
    return off, np.frombuffer(b"".join(encoded), np.uint8)


def id_digest(off: np.ndarray, blob: np.ndarray) -> bytes:
    """BLAKE2b-256 of an id list encoded as ``strings_to_blob`` encodes it (offsets from 0).

    Why: publish records it beside the ids (the BM25 file's ``doc_id_digest``, the served
    records' sidecar), so opening a snapshot checks that both files hold the same ids in
    the same order by comparing 32 bytes, not by reading both id columns whole (~160 MiB
    and a copy at 1M chunks, #27). The count and every offset are hashed, so two lists
    whose concatenated bytes agree still differ.
    """
    h = hashlib.blake2b(digest_size=32)
    h.update(struct.pack("<q", len(off) - 1))
    h.update(memoryview(np.ascontiguousarray(off, dtype="<i8")).cast("B"))
    h.update(memoryview(np.ascontiguousarray(blob, dtype=np.uint8)))
    return h.digest()


def vocab_arrays(vocab: dict[str, int] | Sequence[str]) -> dict[str, np.ndarray]:
    """The vocabulary's arrays (term -> id, or the terms by id): front-coded
    (``format.vocab_fc``, format 4) when the ids are the terms' lexicographic order of
    their UTF-8 bytes, else the hash table of formats 1-3. ``vocab_block`` says which."""
    if isinstance(vocab, dict):
        terms = [""] * len(vocab)
        for term, tid in vocab.items():
            terms[tid] = term
    else:
        terms = list(vocab)
    off, blob = strings_to_blob(terms)
    if terms_ascending(off, blob):
        return front_code(off, blob, VOCAB_BLOCK)
    return hash_vocab_arrays(off, blob, np.fromiter((term_hash(t) for t in terms), np.uint64, len(terms)))


def hash_vocab_arrays(off: np.ndarray, blob: np.ndarray, hashes: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """The hash-table vocabulary of formats 1-3 of the terms (offsets, UTF-8 bytes) by id:
    what ``vocab_arrays`` writes for ids in another order (``hashes``: their ``term_hash``),
    and what a test writing an older format's file gives it."""
    if hashes is None:
        raw, cuts = blob.tobytes(), np.asarray(off).tolist()
        hashes = np.fromiter((bytes_hash(raw[cuts[t]:cuts[t + 1]]) for t in range(len(cuts) - 1)), np.uint64,
                             len(cuts) - 1)
    order = np.argsort(hashes, kind="stable")
    return {"vocab_hash": hashes[order], "vocab_tid": order.astype(np.int64),
            "vocab_off": np.asarray(off, np.int64), "vocab_blob": np.asarray(blob, np.uint8)}


def vocab_block(arrays: dict[str, Any]) -> int:
    """The TOC's ``vocab_block`` for a file holding these arrays."""
    return VOCAB_BLOCK if "vocab_lens" in arrays else 0


def terms_ascending(off: np.ndarray, blob: np.ndarray) -> bool:
    """Whether the strings (offsets, bytes) strictly ascend by their bytes (Arrow's compare:
    unsigned bytes, a prefix first)."""
    if len(off) <= 2:
        return True
    # lazy: Arrow's compute module (~0.1 s of import) is for writers, not for a reader's open
    import pyarrow as pa
    import pyarrow.compute as pc

    arr = pa.LargeBinaryArray.from_buffers(pa.large_binary(), len(off) - 1,
                                           [None, pa.py_buffer(np.ascontiguousarray(off, np.int64)),
                                            pa.py_buffer(np.ascontiguousarray(blob, np.uint8))])
    return bool(pc.all(pc.less(arr[:-1], arr[1:])).as_py())


def write_file(path: Path, arrays: dict[str, np.ndarray | ChunkedArray], scalars: dict[str, Any],
               version: int = FORMAT_VERSION) -> None:
    """Write ``arrays`` (in this order; a ``ChunkedArray`` is consumed as it is written)
    and ``scalars`` (the TOC's other fields) to ``path`` (a temp file the
    caller renames): data region, crc table, TOC, then header and footer; fsync.
    ``version``: the format version recorded (tests write older layouts with it)."""
    with open(path, "wb") as f:
        f.write(b"\0" * HEADER_BYTES)
        bw = _BlockWriter(f)
        specs = {name: bw.array(arr) for name, arr in arrays.items()}
        crcs = bw.finish()
        crc_off = bw.pos
        f.write(crcs.tobytes())
        toc = Toc(arrays=specs, crc_offset=crc_off, crc_count=len(crcs), crc_crc32=zlib.crc32(crcs.tobytes()),
                  version=version, **scalars)
        raw = toc.to_json()
        toc_off = crc_off + crcs.nbytes
        f.write(raw)
        size = toc_off + len(raw) + FOOTER_BYTES
        toc_crc = zlib.crc32(raw)
        f.write(pack_footer(size, toc_off, toc_crc))
        f.seek(0)
        f.write(pack_header(size, toc_off, len(raw), toc_crc, crc_off, version))
        f.flush()
        os.fsync(f.fileno())
