"""A version's dense vectors as one immutable, checksummed, memory-mapped file (issue 47).

Why: serving held every library's vectors as a float32 matrix in each process (1.5 GB at
1M x 384, copied again per process) and read them from Parquet at every open. The
embeddings step now publishes ``VECTOR_FILE`` beside its tables; a serving process maps
it (``open_vectors``: header, TOC and checksum tables only, milliseconds) and every
process serving the version shares the same page-cache pages.

What a query touches: the int8 codes, scales and bounds (``published_scan``: 384 MB +
8 MB at 1M x 384) are scanned, a slice at a time whose pages are unmapped again after it
(``PublishedVectors._scan``: they stay in the page cache), to pre-select the rows that may
be in the top ``depth``; only those rows' float32 bytes are read (positional reads:
``PublishedVectors.unit_rows`` says why not through the mapping) and rescored exactly as
the in-memory path scores (``dense_topk.exact_cosines``, float64). So ``top`` returns the
same positions and the same cosine bits as ``dense_topk.dense_top`` over the float32
matrix, in the same order (cosine desc, position asc), and a serving process holds ~70
MiB for it at 1M x 384 instead of 1.5 GB (``benchmarks/results/vector_file.md``).

Layout (little-endian), the BM25 file's conventions (``lexical/format/file.py``)::

    [0, 64)         header: magic b"RSPVEC\\0\\0", u32 version, u32 header size, u64 file
                    size, u64 TOC offset, u64 TOC size, u32 TOC crc32, u32 page size,
                    u64 crc tables offset, u32 reserved, u32 crc32 of bytes [0, 60)
    [4096, crc_off) arrays, each at a page boundary: ``codes`` int8 (n, d), ``scale``
                    float32 (n), ``bound`` float32 (n), ``id_off`` int64 (n+1), ``id_blob``
                    uint8, ``id_digest`` uint8 (32), ``rows`` float32 (n, d) last
    [crc_off, toc)  per array, the crc32 of each of its blocks (``crc_block`` bytes:
                    one page for ``rows``, so a candidate's check reads only its own
                    pages; 1 MiB for the others)
    [toc, -32)      TOC: UTF-8 JSON: n, dim, quantization, metadata, and per array its
                    dtype, shape, offset, size, crc block, crc table offset/count/crc32
    [-32, end)      footer: magic b"RSPVECE\\0", u64 file size, u64 TOC offset, u32 TOC
                    crc32, u32 crc32 of footer bytes [0, 28)

Integrity: opening checks header, footer, size, version, TOC and every crc table (their
own crc32s: 1.5 MB at 1M rows). The scanned arrays are verified whole by the first query
(they are all read anyway); a ``rows`` page the first time a candidate on it is
rescored; the ids when read. Publishing writes a temp file beside the target, verifies it
whole, renames it into place and fsyncs the folder: a reader sees the whole file or none.
"""

from __future__ import annotations

import contextlib
import json
import mmap
import os
import struct
import threading
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..hybrid.dense_topk import exact_cosines
from ..lexical.format.file import CorruptIndexError, IndexFormatError, id_digest
from ..lexical.index.topk import ScoredDocs, empty_scored
from .published_scan import approx_scores, candidates, numba_start, query_norm

VECTOR_FILE = "vectors.rsvec"
MAGIC, FOOTER_MAGIC = b"RSPVEC\0\0", b"RSPVECE\0"
FORMAT_VERSION = 1
READABLE_VERSIONS = (1,)
QUANTIZATION = "int8-row-scale"
HEADER_BYTES, FOOTER_BYTES, PAGE = 64, 32, 4096
BULK_BLOCK = 1 << 20
WRITE_BATCH = 16384  # rows quantized at a time (float64 temporaries of ~50 MB at d=384)
SCAN_ROWS = 1 << 17  # rows scanned between two releases of their pages (48 MiB of codes at d=384)
_HEADER = struct.Struct("<8sIIQQQIIQI")
_FOOTER = struct.Struct("<8sQQI")
_SCANNED = ("codes", "scale", "bound")


class VectorFileVersionError(IndexFormatError):
    """A vector file format version this code does not read."""

    def __init__(self, path: str | os.PathLike[str], found: int) -> None:
        self.found = found
        super().__init__(path, f"vector file format version {found}; this ragspine reads "
                               f"{', '.join(map(str, READABLE_VERSIONS))} (republish, or upgrade ragspine)")


@dataclass(frozen=True)
class Array:
    """Where one array and its checksums live."""

    dtype: str
    shape: tuple[int, ...]
    offset: int
    nbytes: int
    crc_block: int
    crc_offset: int = 0
    crc_count: int = 0
    crc_crc32: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "shape": list(self.shape)}


def unit_rows(vectors: np.ndarray) -> np.ndarray:
    """float32 unit rows exactly as ``HybridRetriever.preload_vectors`` makes them (zero
    rows stay zero): the bits the exact path scores, so the file must hold these."""
    vectors = np.asarray(vectors, np.float32)
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return (vectors / np.where(norms == 0, 1, norms)).astype(np.float32)


def _read_toc(path: Path, buf: np.ndarray) -> dict[str, Any]:
    """Header, version, size, footer, TOC: the checks of an open (typed errors naming the file)."""
    size = len(buf)
    if size < HEADER_BYTES + FOOTER_BYTES or bytes(buf[:8]) != MAGIC:
        raise CorruptIndexError(path, "not a RAGSpine vector file (bad magic or too short)")
    head = bytes(buf[:HEADER_BYTES])
    (_m, version, hsize, file_bytes, toc_off, toc_len, toc_crc, _page, crc_off, _r) = _HEADER.unpack(head[:60])
    if version not in READABLE_VERSIONS:
        raise VectorFileVersionError(path, version)
    if zlib.crc32(head[:60]) != struct.unpack("<I", head[60:])[0]:
        raise CorruptIndexError(path, "header checksum mismatch")
    if file_bytes != size:
        raise CorruptIndexError(path, f"file is {size} bytes, header says {file_bytes} (truncated?)")
    foot = bytes(buf[size - FOOTER_BYTES:])
    (fm, f_size, f_toc, f_crc) = _FOOTER.unpack(foot[:28])
    if (fm != FOOTER_MAGIC or zlib.crc32(foot[:28]) != struct.unpack("<I", foot[28:])[0]
            or (f_size, f_toc, f_crc) != (file_bytes, toc_off, toc_crc)):
        raise CorruptIndexError(path, "footer does not match the header")
    if not (HEADER_BYTES <= crc_off <= toc_off and toc_off + toc_len + FOOTER_BYTES == size):
        raise CorruptIndexError(path, "header offsets out of range")
    raw = bytes(buf[toc_off:toc_off + toc_len])
    if zlib.crc32(raw) != toc_crc:
        raise CorruptIndexError(path, "table of contents checksum mismatch")
    toc = json.loads(raw)
    toc["arrays"] = {k: Array(v["dtype"], tuple(v["shape"]), v["offset"], v["nbytes"], v["crc_block"],
                              v["crc_offset"], v["crc_count"], v["crc_crc32"]) for k, v in toc["arrays"].items()}
    n, dim = int(toc["n"]), int(toc["dim"])
    want = {"codes": (n, dim), "scale": (n,), "bound": (n,), "rows": (n, dim), "id_off": (n + 1,), "id_digest": (32,)}
    for name, shape in want.items():
        a = toc["arrays"].get(name)
        if a is None or a.shape != shape:
            raise CorruptIndexError(path, f"array {name!r} missing or of the wrong shape")
    for name, a in toc["arrays"].items():
        if not (a.offset >= PAGE and a.offset + a.nbytes <= crc_off and a.crc_block > 0
                and a.crc_count == -(-a.nbytes // a.crc_block)
                and crc_off <= a.crc_offset and a.crc_offset + 4 * a.crc_count <= toc_off
                and a.nbytes == int(np.prod(a.shape, dtype=np.int64)) * np.dtype(a.dtype).itemsize):
            raise CorruptIndexError(path, f"array {name!r} out of range")
        if zlib.crc32(buf[a.crc_offset:a.crc_offset + 4 * a.crc_count]) != a.crc_crc32:
            raise CorruptIndexError(path, f"checksum table of {name!r} does not match its checksum")
    return toc


class PublishedVectors:
    """A mapped vector file (``open_vectors``): exact top-k by cosine, rows on demand."""

    def __init__(self, path: Path, buf: np.ndarray, toc: dict[str, Any]) -> None:
        self.path, self._buf, self.toc = path, buf, toc
        self.n, self.dim = int(toc["n"]), int(toc["dim"])
        self.metadata: dict[str, Any] = toc.get("metadata", {})
        self._a: dict[str, np.ndarray] = {}
        self._ok: dict[str, np.ndarray] = {}
        for name, a in toc["arrays"].items():
            self._a[name] = np.asarray(buf[a.offset:a.offset + a.nbytes]).view(a.dtype).reshape(a.shape)
            self._ok[name] = np.zeros(a.crc_count, np.bool_)
        self._lock = threading.Lock()
        self._fd = os.open(path, os.O_RDONLY)
        with contextlib.suppress(AttributeError, OSError):  # no readahead around a candidate row
            os.posix_fadvise(self._fd, 0, 0, os.POSIX_FADV_RANDOM)
        self._scan_ok = False
        self.release = True  # unmap the scanned codes after each slice (``_scan``)
        self.last_pool: list[int] = []  # candidates rescored per query of the last ``top``
        self.ann: Any = None  # an ``ann.AnnIndex`` over the same rows (``attach_ann``), else None

    def __len__(self) -> int:
        return self.n

    def __reduce__(self) -> tuple[Any, tuple[Path]]:
        """Pickled as its path: a copy in another process maps the same file (never the bytes)."""
        return open_vectors, (self.path,)

    # ------------------------------------------------------------ checks
    def _check_blocks(self, name: str, blocks: np.ndarray) -> None:
        a, ok = self.toc["arrays"][name], self._ok[name]
        todo = blocks[~ok[blocks]]
        if not len(todo):
            return
        crcs = self._buf[a.crc_offset:a.crc_offset + 4 * a.crc_count].view("<u4")
        with self._lock:
            for b in todo.tolist():
                lo = a.offset + b * a.crc_block
                if zlib.crc32(self._buf[lo:min(lo + a.crc_block, a.offset + a.nbytes)]) != int(crcs[b]):
                    raise CorruptIndexError(self.path, f"checksum mismatch in {name!r} block {b}")
                ok[b] = True

    def _whole(self, name: str) -> None:
        a = self.toc["arrays"][name]
        step = max(1, (SCAN_ROWS * max(self.dim, 1)) // a.crc_block)  # ~48 MiB mapped at a time
        for b in range(0, a.crc_count, step):
            if not self._ok[name][b:b + step].all():
                self._check_blocks(name, np.arange(b, min(b + step, a.crc_count)))
                lo = a.offset + b * a.crc_block  # checked through the mapping: unmap again
                self._release(lo, min(step * a.crc_block, a.offset + a.nbytes - lo))

    def _release(self, offset: int, nbytes: int) -> None:
        """Unmap file bytes [offset, offset + nbytes) from this process (page cache kept)."""
        mm = getattr(self._buf, "_mmap", None)
        if self.release and mm is not None and nbytes > 0:
            first = offset // PAGE * PAGE
            with contextlib.suppress(OSError, ValueError):
                mm.madvise(mmap.MADV_DONTNEED, first, min(offset + nbytes, len(self._buf)) - first)

    def _scan_arrays(self) -> None:
        """First query: the scanned arrays whole, and the values the bound relies on."""
        if self._scan_ok:
            return
        numba_start()  # numba's first refresh without the BLAS probe's scipy import
        for name in _SCANNED:
            self._whole(name)
        scale, bound = self._a["scale"], self._a["bound"]
        if not (np.isfinite(scale).all() and (scale > 0).all() and np.isfinite(bound).all() and (bound >= 0).all()):
            raise CorruptIndexError(self.path, "scales or bounds are not finite and positive")
        self._scan_ok = True

    def warm(self) -> None:
        """What the first query would pay (the scanned arrays' checksums, the scan kernel's
        load: ~1 s at 1M x 384), paid now: for a serving process at start, not a user."""
        self._scan_arrays()
        approx_scores(self._a["codes"], self._a["scale"], np.zeros(min(self.n, 1), np.int64),
                      np.zeros((1, self.dim), np.float32))

    def verify(self) -> None:
        """Every checksum and the id table (what publishing runs before the rename)."""
        for name in self.toc["arrays"]:
            self._whole(name)
        self._scan_arrays()
        off = self._a["id_off"]
        if not (off[0] == 0 and off[-1] == len(self._a["id_blob"]) and (np.diff(off) >= 0).all()
                and self._a["id_digest"].tobytes() == id_digest(off, self._a["id_blob"])):
            raise CorruptIndexError(self.path, "id table is inconsistent")

    # ------------------------------------------------------------ ids
    def ids_digest(self) -> bytes:
        """``format.file.id_digest`` of the ids in position order (checksummed first)."""
        self._whole("id_digest")
        return self._a["id_digest"].tobytes()

    def chunk_ids(self) -> list[str]:
        """Every id, in position order."""
        return self.ids_at(np.arange(self.n))

    def ids_at(self, positions: np.ndarray) -> list[str]:
        """The ids at ``positions`` (the id table verified whole first: 40 MB at 1M)."""
        self._whole("id_off")
        self._whole("id_blob")
        off, raw = self._a["id_off"].tolist(), self._a["id_blob"].tobytes()
        return [raw[off[p]:off[p + 1]].decode("utf-8", "surrogatepass") for p in self._positions(positions).tolist()]

    # ------------------------------------------------------------ rows and scores
    def unit_rows(self, positions: np.ndarray) -> np.ndarray:
        """A float32 copy of the rows at ``positions``, their pages verified.

        Read with positional reads of the page cache, not through the mapping: a fault in
        a file mapping makes the kernel map up to 64 KiB of cached neighbours too (fault-
        around), so at 100k x 384 the candidates of 400 queries made the whole rows region
        resident in the process; a read copies only the candidate's bytes, and the page
        cache holds one copy per machine, shared by every serving process. A request for
        most rows (a whole matrix) copies through the mapping."""
        pos = self._positions(positions)
        if len(pos) * 8 > max(self.n, 1):
            self._whole("rows")
            return self._a["rows"][pos]  # a fancy index: one copy
        rb, base, ok = 4 * self.dim, self.toc["arrays"]["rows"].offset, self._ok["rows"]
        out = np.empty((len(pos), self.dim), np.float32)
        flat = out.view(np.uint8).reshape(len(pos), rb)
        first, last = pos * rb // PAGE, ((pos + 1) * rb - 1) // PAGE
        # A row's pages checked already: one read straight into its output row (no copy, no
        # per-row numpy call: the ANN path rescores ~110 rows per query). Whether every page
        # of the row was checked is decided for all rows at once (a row spans few pages).
        checked = np.ones(len(pos), np.bool_)
        for extra in range(int((last - first).max(initial=0)) + 1):
            checked &= ok[np.minimum(first + extra, last)]
        raw = memoryview(flat.reshape(-1))  # one flat byte view: a row is raw[i * rb:(i + 1) * rb]
        for i, (p, b0, b1, done) in enumerate(zip(pos.tolist(), first.tolist(), last.tolist(), checked.tolist(),
                                                  strict=True)):
            if done:
                if os.preadv(self._fd, [raw[i * rb:(i + 1) * rb]], base + p * rb) != rb:
                    raise CorruptIndexError(self.path, f"row {p} is past the end of the file")
            else:
                lo = p * rb - b0 * PAGE
                flat[i] = self._read_pages(b0, b1)[lo:lo + rb]
        return out

    def matrix(self) -> np.ndarray:
        """Every row, verified, as a read-only view of the mapping (no copy): for a consumer
        of the whole matrix (an ANN build). Serving uses ``top``/``unit_rows``."""
        self._whole("rows")
        return self._a["rows"]

    def _read_pages(self, b0: int, b1: int) -> np.ndarray:
        """``rows`` blocks b0..b1 (one page each) read and checked against their crc32s."""
        a = self.toc["arrays"]["rows"]
        start, end = a.offset + b0 * PAGE, min(a.offset + (b1 + 1) * PAGE, a.offset + a.nbytes)
        raw = os.pread(self._fd, end - start, start)
        if len(raw) != end - start:
            raise CorruptIndexError(self.path, f"'rows' block {b0} is past the end of the file")
        crcs = self._buf[a.crc_offset:a.crc_offset + 4 * a.crc_count].view("<u4")
        with self._lock:
            for b in range(b0, b1 + 1):
                if zlib.crc32(raw[(b - b0) * PAGE:(b - b0 + 1) * PAGE]) != int(crcs[b]):
                    raise CorruptIndexError(self.path, f"checksum mismatch in 'rows' block {b}")
                self._ok["rows"][b] = True
        return np.frombuffer(raw, np.uint8)

    def close(self) -> None:
        """Close the file descriptor the row reads use (the mapping goes with the object)."""
        fd, self._fd = self._fd, -1
        if fd >= 0:
            os.close(fd)

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()

    def _positions(self, positions: np.ndarray) -> np.ndarray:
        pos = np.asarray(positions, np.int64)
        if len(pos) and (int(pos.min()) < 0 or int(pos.max()) >= self.n):
            raise IndexError(f"{self.path}: positions outside 0..{self.n - 1}")
        return pos

    def _scan(self, pos: np.ndarray, qv: np.ndarray) -> np.ndarray:
        """``approx_scores`` of the rows ``pos``, ``SCAN_ROWS`` at a time; after each slice its
        codes' pages are unmapped from this process again (``MADV_DONTNEED``: they stay in
        the page cache, shared by every process, and the next scan maps them back at a
        cost not measurable beside the scan). So a serving process holds a slice of the
        codes, not all of them (375 MiB at 1M x 384). Concurrent scans only re-map."""
        out = np.empty((len(qv), len(pos)), np.float32)
        codes, scale, base = self._a["codes"], self._a["scale"], self.toc["arrays"]["codes"].offset
        for lo in range(0, len(pos), SCAN_ROWS):
            part = pos[lo:lo + SCAN_ROWS]
            out[:, lo:lo + len(part)] = approx_scores(codes, scale, part, qv)
            first, last = int(part.min()), int(part.max())
            self._release(base + first * self.dim, (last + 1 - first) * self.dim)
        return out

    def attach_ann(self, index: Any) -> bool:
        """Let ``top`` take its candidates from an ANN index over the same rows (written
        beside the file at publish, ``retrieval/vector/ann``). Refused (False) when its size
        or dimension differs: a stale index must never pick rows of another version."""
        if int(getattr(index, "size", -1)) != self.n or int(getattr(index, "dim", -1)) != self.dim:
            return False
        self.ann = index
        return True

    def top(self, qv: np.ndarray, positions: np.ndarray, depth: int) -> list[ScoredDocs]:
        """Per unit query vector (a row of ``qv``): ``dense_topk.dense_top`` over these rows
        (the top ``depth`` of ``positions`` by (cosine desc, position asc), exact float64
        cosines), without the float32 matrix: int8 pre-selection, exact rescoring.

        With an ANN index attached (a version of at least ``RAGSPINE_ANN_MIN_VECTORS``
        vectors, ``RAGSPINE_ANN=auto``) the candidates come from the graph instead, searched
        over the survivors only (``positions``), and are rescored exactly the same way: the
        scores stay exact, the set is approximate (recall@10 >= 0.95 in bench_ann). Where the
        index hands a query back (few survivors) the exact pre-selection runs as without it."""
        qv = np.atleast_2d(np.asarray(qv, np.float32))
        every = self.ann is not None and len(positions) == self.n  # distinct positions: all rows, no filter
        pos = np.asarray(positions, np.int64) if every else self._positions(positions)  # the graph reads none
        if not len(pos) or depth <= 0:
            self.last_pool = [0] * len(qv)
            return [empty_scored() for _ in qv]
        picked: list[np.ndarray | None] = [None] * len(qv)
        if self.ann is not None and len(pos) > 4 * depth:
            allowed = None  # positions are distinct: all n = no filter
            if len(pos) < self.n:  # the survivors' mask, built once for every query row
                allowed = np.zeros(self.n, np.bool_)
                allowed[pos] = True
            for j, row in enumerate(qv):
                picked[j] = self.ann.search(row, depth, allowed)
        todo = [j for j, p in enumerate(picked) if p is None]
        if todo and every:
            pos = self._positions(pos)  # the exact pre-selection reads them: checked after all
        if todo and len(pos) <= 4 * depth:  # as dense_top: every row is rescored
            for j in todo:
                picked[j] = pos
        elif todo:
            self._scan_arrays()
            approx = self._scan(pos, qv[todo])
            bound = self._a["bound"][pos]
            for i, j in enumerate(todo):
                picked[j] = pos[candidates(approx[i], bound, query_norm(qv[j]), depth)]
        ranked = [p for p in picked if p is not None]  # every row has its candidates by now
        self.last_pool = [len(p) for p in ranked]
        out = []
        for row, at in zip(qv, ranked, strict=True):
            sims = exact_cosines(self.unit_rows(at), np.asarray(row, np.float64))
            order = np.lexsort((at, -sims))[:depth]
            out.append(ScoredDocs(at[order], sims[order]))
        return out


def open_vectors(path: str | os.PathLike[str]) -> PublishedVectors:
    """Map a published vector file read-only (shared pages); ``IndexFormatError`` naming it."""
    path = Path(path)
    try:
        buf = np.memmap(path, dtype=np.uint8, mode="r")
    except (OSError, ValueError) as exc:
        raise CorruptIndexError(path, f"cannot map the file: {exc}") from exc
    return PublishedVectors(path, buf, _read_toc(path, buf))


__all__ = ["FORMAT_VERSION", "VECTOR_FILE", "PublishedVectors", "VectorFileVersionError", "open_vectors",
           "unit_rows"]
