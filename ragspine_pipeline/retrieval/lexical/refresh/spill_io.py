"""The streaming build's spill files, written and read without memory maps (issue 47 item 4).

Why: every page of a memory map that a process has touched counts in its resident set
until the map goes (file-backed, but resident all the same: ``ru_maxrss`` and the OOM
killer see it). At 3M documents (250M postings) the merged postings are 1.5 GB: written
through one map by the merge, then read whole through another by the packed writer, they
were ~1.4 GB of the build's 4.5 GB peak. Written with ``write`` and read back a slice at a
time with ``pread`` (``NpyReader``), they sit in the page cache, which the kernel may
reclaim, and the process holds one slice at a time. The bytes are the same.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..format.raw_order import SliceReader

MERGE_POSTINGS = 1 << 23  # postings per merged range of terms (~50 MB of buffers)


class NpyReader(SliceReader):
    """A read-only 1-D ``.npy`` array read a slice at a time (``pread``).

    It offers what the packed writer asks of ``RawPostings.indices``/``tf``
    (``format.raw_order.SliceReader``). ``np.asarray`` of it is a read-only memory map of the
    whole array, what ``np.load(mmap_mode="r")`` gives: a consumer that wants every item at
    once still gets them without a copy in memory (``array_is_map``).
    """

    array_is_map = True

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        with open(self.path, "rb") as f:
            version = np.lib.format.read_magic(f)
            read_header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                           else np.lib.format.read_array_header_2_0)
            shape, fortran, dtype = read_header(f)
            self.offset = f.tell()
        if len(shape) != 1 or fortran or dtype.hasobject:
            raise ValueError(f"{self.path}: NpyReader reads 1-D numeric arrays (shape {shape}, {dtype})")
        self.dtype = dtype
        self.shape = (int(shape[0]),)
        self._fd = os.open(self.path, os.O_RDONLY)
        weakref.finalize(self, os.close, self._fd)

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        whole = np.load(self.path, mmap_mode="r")
        return whole if dtype is None and not copy else np.array(whole, dtype=dtype)

    def read(self, a: int, b: int) -> np.ndarray:
        """Items a..b-1, read from the file into a new array (thread-safe: positional reads)."""
        out = np.empty(b - a, self.dtype)
        buf = memoryview(out).cast("B")
        pos, got = self.offset + a * self.dtype.itemsize, 0
        while got < len(buf):
            n = os.preadv(self._fd, [buf[got:]], pos + got)
            if n <= 0:
                raise EOFError(f"{self.path}: {len(buf) - got} bytes missing at offset {pos + got}")
            got += n
        return out


def write_npy_header(f: Any, dtype: np.dtype[Any], n: int) -> None:
    """The ``.npy`` header of a 1-D array of ``n`` items (its data is written after it)."""
    np.lib.format.write_array_header_1_0(f, {"descr": np.lib.format.dtype_to_descr(dtype),
                                             "fortran_order": False, "shape": (n,)})


def term_ranges(indptr: np.ndarray, postings: int) -> Iterator[tuple[int, int]]:
    """Consecutive ranges [t0, t1) of the terms of ``indptr`` holding about ``postings``
    postings each (at least one term: a longer list is a range of its own)."""
    n_terms = len(indptr) - 1
    t0 = 0
    while t0 < n_terms and indptr[-1] > 0:
        t1 = int(np.searchsorted(indptr, indptr[t0] + postings, side="right")) - 1
        t1 = min(n_terms, max(t0 + 1, t1))
        yield t0, t1
        t0 = t1


def merge_runs(runs: Sequence[tuple[Path, Path, Path]], n_terms: int, out_dir: Path,
               merge_run: Callable[..., None], *, range_postings: int | None = None,
               order: np.ndarray | None = None) -> tuple[np.ndarray, Path, Path]:
    """(indptr, indices.npy, tf.npy in ``out_dir``) of the corpus from its spilled CSC runs
    (each (indptr, indices, tf) ``.npy`` paths, in document order).

    A term's postings are its runs' slices one after the other, so the merge goes a range
    of terms at a time (about ``range_postings`` postings, default ``MERGE_POSTINGS``; a
    term longer than that is a range of its own): each run's part of the range
    is one contiguous read, ``merge_run`` places it in the range's buffers, and the range
    is appended to the two output files. Nothing is mapped; the runs are removed at the
    end (the folder holds the runs and the merged arrays at once: ~2x the postings' bytes).

    ``order`` (the terms' final order: ``order[g]`` = id of output term g): a run that knew
    the terms of ids below k holds them in this order restricted to them (its rank g_r[j]
    among the output terms for its j-th term), so a range of output terms is still one
    contiguous slice of each run. None: runs and output in id order.
    """
    step = int(range_postings or MERGE_POSTINGS)
    df = np.zeros(n_terms, np.int64)
    tf_types = []
    ptrs, idxs, tfs, where = [], [], [], []
    for p_path, i_path, t_path in runs:
        r = np.load(p_path)
        known = len(r) - 1
        g = (np.flatnonzero(order < known) if order is not None else np.arange(known)).astype(np.int64)
        df[g] += np.diff(r)
        where.append(g)
        del r
        ptrs.append(NpyReader(p_path))
        idxs.append(NpyReader(i_path))
        tfs.append(NpyReader(t_path))
        tf_types.append(tfs[-1].dtype)
    indptr = np.zeros(n_terms + 1, np.int64)
    np.cumsum(df, out=indptr[1:])
    del df
    total = int(indptr[-1])
    dtype = np.result_type(*tf_types) if tf_types else np.dtype(np.uint8)
    paths = (out_dir / "indices.npy", out_dir / "tf.npy")
    with open(paths[0], "wb") as f_idx, open(paths[1], "wb") as f_tf:
        write_npy_header(f_idx, np.dtype(np.int32), total)
        write_npy_header(f_tf, dtype, total)
        for t0, t1 in term_ranges(indptr, step):
            p0 = int(indptr[t0])
            out_idx = np.empty(int(indptr[t1]) - p0, np.int32)
            out_tf = np.empty(len(out_idx), dtype)
            base = indptr[t0:t1] - p0
            for r_ptr, r_idx, r_tf, g in zip(ptrs, idxs, tfs, where, strict=True):
                # a run knows the terms seen before it was spilled: its j0..j1-1 are in range
                j0, j1 = int(np.searchsorted(g, t0)), int(np.searchsorted(g, t1))
                if j1 <= j0:
                    continue
                rp = r_ptr.read(j0, j1 + 1)
                a, b = int(rp[0]), int(rp[-1])
                if b <= a:
                    continue
                at = g[j0:j1] - t0
                if int(at[-1]) - int(at[0]) == j1 - j0 - 1:  # consecutive output terms
                    merge_run(rp - a, r_idx.read(a, b), r_tf.read(a, b), base[int(at[0]):], out_idx, out_tf)
                else:
                    sub = base[at]
                    merge_run(rp - a, r_idx.read(a, b), r_tf.read(a, b), sub, out_idx, out_tf)
                    base[at] = sub
            out_idx.tofile(f_idx)
            out_tf.tofile(f_tf)
    del ptrs, idxs, tfs, where
    for run in runs:
        for p in run:
            p.unlink()
    return indptr, paths[0], paths[1]
