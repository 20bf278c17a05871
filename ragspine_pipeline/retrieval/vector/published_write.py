"""Publishing a version's vector file (the layout ``published`` documents and reads).

Why a module of its own: the reader (``published.open_vectors``) is what every serving
process imports; the writer is what the embeddings step runs once per version. It writes a
temp file beside the target (arrays by positional writes, a batch of rows quantized at a
time, checksums, TOC, header and footer), verifies it whole with the reader, renames it
into place and fsyncs the folder, so a reader sees the whole file or none. The arrow
points one way: this module imports the reader, never the reverse.
"""

from __future__ import annotations

import contextlib
import json
import os
import struct
import threading
import zlib
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..lexical.format.file import id_digest, strings_to_blob
from .published import (
    _FOOTER,
    _HEADER,
    BULK_BLOCK,
    FOOTER_BYTES,
    FOOTER_MAGIC,
    FORMAT_VERSION,
    HEADER_BYTES,
    MAGIC,
    PAGE,
    QUANTIZATION,
    WRITE_BATCH,
    Array,
    open_vectors,
)
from .published_scan import quantize


def _layout(n: int, dim: int, id_off: np.ndarray, id_blob: np.ndarray) -> tuple[dict[str, Array], int]:
    """Offsets of every array (page-aligned, ``rows`` last) and where the data ends."""
    specs: dict[str, tuple[str, tuple[int, ...], int]] = {
        "codes": ("|i1", (n, dim), BULK_BLOCK), "scale": ("<f4", (n,), BULK_BLOCK),
        "bound": ("<f4", (n,), BULK_BLOCK), "id_off": ("<i8", (len(id_off),), BULK_BLOCK),
        "id_blob": ("|u1", (len(id_blob),), BULK_BLOCK), "id_digest": ("|u1", (32,), BULK_BLOCK),
        "rows": ("<f4", (n, dim), PAGE)}
    out, at = {}, PAGE
    for name, (dt, shape, block) in specs.items():
        nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dt).itemsize
        out[name] = Array(dt, shape, at, nbytes, block)
        at += -(-nbytes // PAGE) * PAGE
    return out, at


def write_vectors(path: str | os.PathLike[str], batches: Iterable[np.ndarray], n: int, dim: int,
                  ids: Sequence[str] | tuple[np.ndarray, np.ndarray], *,
                  metadata: dict[str, Any] | None = None) -> Path:
    """Publish ``n`` float32 rows of ``dim`` (fed as ``batches`` of rows, in position order:
    already ``unit_rows``) with their ids (strings, or ``strings_to_blob``'s (offsets,
    bytes)), atomically and verified whole. ``metadata`` (JSON) goes into the TOC."""
    path = Path(path)
    off, blob = ids if isinstance(ids, tuple) else strings_to_blob(ids)
    off, blob = np.asarray(off, np.int64), np.asarray(blob, np.uint8)
    if len(off) != n + 1:
        raise ValueError(f"{len(off) - 1} ids for {n} vectors")
    arrays, data_end = _layout(n, dim, off, blob)
    with _replacing(path) as tmp:
        with open(tmp, "wb+") as fh:
            fh.truncate(data_end)
            fd = fh.fileno()
            done = 0
            for batch in batches:
                done = _write_rows(fd, arrays, np.asarray(batch, np.float32).reshape(-1, dim), done, n)
            if done != n:
                raise ValueError(f"{done} vectors fed for {n} announced")
            for name, arr in (("id_off", off), ("id_blob", blob),
                              ("id_digest", np.frombuffer(id_digest(off, blob), np.uint8))):
                _pwrite(fd, arr, arrays[name].offset)
            _finish(fh, arrays, data_end, {"n": n, "dim": dim, "quantization": QUANTIZATION,
                                           "metadata": metadata or {}})
        open_vectors(tmp).verify()
    return path


@contextlib.contextmanager
def _replacing(path: Path) -> Iterator[Path]:
    """A temp file beside ``path`` to write and check: renamed over ``path`` when the block
    ends cleanly (then the folder is fsynced where POSIX allows), removed when it raises. A
    reader sees the old file or the whole new one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{threading.get_ident()}")
    renamed = False
    try:
        yield tmp
        os.replace(tmp, path)
        renamed = True
    finally:
        if not renamed:
            tmp.unlink(missing_ok=True)
    with contextlib.suppress(OSError):  # POSIX: the rename made durable
        folder = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(folder)
        finally:
            os.close(folder)


def _write_rows(fd: int, arrays: dict[str, Array], rows: np.ndarray, at: int, n: int) -> int:
    if at + len(rows) > n:
        raise ValueError(f"more than the {n} announced vectors fed")
    for lo in range(0, len(rows), WRITE_BATCH):
        part = np.ascontiguousarray(rows[lo:lo + WRITE_BATCH])
        codes, scale, bound = quantize(part)
        r = at + lo
        for name, arr in (("codes", codes), ("scale", scale), ("bound", bound), ("rows", part)):
            a = arrays[name]
            _pwrite(fd, arr, a.offset + r * (a.nbytes // max(n, 1)))
    return at + len(rows)


def _pwrite(fd: int, arr: np.ndarray, offset: int) -> None:
    view = memoryview(np.ascontiguousarray(arr)).cast("B")
    while len(view):
        wrote = os.pwrite(fd, view, offset)
        view, offset = view[wrote:], offset + wrote


def _finish(fh: Any, arrays: dict[str, Array], data_end: int, toc: dict[str, Any]) -> None:
    """Checksum tables, TOC, footer and header of a file whose data region is written."""
    fh.flush()
    buf = np.memmap(fh.name, np.uint8, mode="r", shape=(data_end,))
    tables, at = [], data_end
    for name, a in list(arrays.items()):
        crcs = np.fromiter((zlib.crc32(buf[o:min(o + a.crc_block, a.offset + a.nbytes)])
                            for o in range(a.offset, a.offset + a.nbytes, a.crc_block)), np.uint32)
        raw = crcs.astype("<u4").tobytes()
        arrays[name] = Array(a.dtype, a.shape, a.offset, a.nbytes, a.crc_block, at, len(crcs), zlib.crc32(raw))
        tables.append(raw)
        at += len(raw)
    del buf
    toc_raw = json.dumps({**toc, "format_version": FORMAT_VERSION,
                          "arrays": {k: v.to_dict() for k, v in arrays.items()}}, sort_keys=True).encode()
    toc_crc, size = zlib.crc32(toc_raw), at + len(toc_raw) + FOOTER_BYTES
    fh.seek(data_end)
    fh.write(b"".join(tables) + toc_raw)
    foot = _FOOTER.pack(FOOTER_MAGIC, size, at, toc_crc)
    fh.write(foot + struct.pack("<I", zlib.crc32(foot)))
    head = _HEADER.pack(MAGIC, FORMAT_VERSION, HEADER_BYTES, size, at, len(toc_raw), toc_crc, PAGE, data_end, 0)
    fh.seek(0)
    fh.write(head + struct.pack("<I", zlib.crc32(head)))
    fh.flush()
    os.fsync(fh.fileno())


__all__ = ["write_vectors"]
