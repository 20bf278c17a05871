"""Incremental BM25 refresh: the new corpus's postings merged from the previous published
index and the counted new documents (#27 item 1).

Why: a refresh that changes 1% of a library should not re-count the other 99%. Counting
tokens is most of a build (~21 of ~26 s at 1M synthetic chunks, ``index.postings.md``); the
previous version's published file already holds every kept document's counts. Here the
previous postings are decoded (plain: read; packed: unpacked with the query kernels'
decoder), the documents that left are dropped, the kept ones renumbered, and each term's
list is merged with the new documents' postings (counted by ``refresh.stream_build``'s
``StreamCounter``, bounded memory). Both renumberings are monotone (positions are chunk-id
order in both corpora), so every term is one linear merge, never a sort.

What comes out is a ``RawPostings`` equal, term by term, to what a fresh count of the new
corpus gives (the term ids differ: kept terms keep their previous order, new terms follow);
it is published by the same ``refresh.publish.write_layout`` with the same layout rule, so
weights, bounds, bitsets, scores, top-k and ties are the fresh build's, bit for bit. Only
counts are read from the previous file, so its k1/b and layout need not be the new ones.

This is "rewrite only what changed" at the level of counting, not Lucene-style segments:
the published file is still one immutable file per version, written whole (packing and
verifying it is the remaining cost), so serving never pays a segment merge policy.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..format.file import HEADER_BYTES, CorruptIndexError
from ..format.raw import RawPostings, build_memory_budget, choose_layout
from ..index.mapped import MappedBM25Index, strings_ok, term_strings, vocab_ok
from ..index.packed import block_pointers, check_offsets
from ..index.packed_index import PackedBM25Index
from ..index.postings import tf_dtype
from .merge_kernels import kernels
from .publish import write_layout
from .stream_build import Batch, BuildReport, StreamCounter, peak_rss_mib

SLICE_POSTINGS = 1 << 22  # postings per numpy merge call (bounds its temporaries, ~200 MB)
Previous = MappedBM25Index | PackedBM25Index


@dataclass(frozen=True)
class MergePlan:
    """Where the previous index's documents go, and where the added ones land.

    ``old_new[d]``: previous document d's position in the new corpus, or -1 when it left
    (deleted, hidden, or its tokens changed: it comes back as an added document).
    ``added_pos``: new positions of the documents to count, ascending (their tokens are fed
    in this order).
    """

    old_new: np.ndarray  # int64 [previous docs]
    added_pos: np.ndarray  # int64 [added docs]
    n_docs: int

    @property
    def kept(self) -> int:
        return int(np.count_nonzero(self.old_new >= 0))

    @property
    def removed(self) -> int:
        return int(len(self.old_new)) - self.kept

    @property
    def added(self) -> int:
        return int(len(self.added_pos))


@dataclass(frozen=True)
class MergeReport(BuildReport):
    """A build's report, with what the merge kept, added and removed. ``count_seconds`` and
    ``runs`` are the added documents' count; ``merge_seconds``: decoding and merging the
    previous postings."""

    kept: int = 0
    added: int = 0
    removed: int = 0
    merge_seconds: float = 0.0


def _binary(off: np.ndarray, blob: np.ndarray) -> pa.Array:
    """A (offsets, bytes) pair of a published file as an Arrow large_binary array (no copy)."""
    return pa.LargeBinaryArray.from_buffers(pa.large_binary(), len(off) - 1,
                                            [None, pa.py_buffer(np.ascontiguousarray(off, np.int64)),
                                             pa.py_buffer(np.ascontiguousarray(blob, np.uint8))])


def as_binary(ids: Sequence[str] | pa.Array | pa.ChunkedArray) -> pa.Array:
    """Ids (Python strings or Arrow) as one large_binary array: what the plans compare."""
    if isinstance(ids, pa.ChunkedArray):
        ids = ids.combine_chunks()
    if not isinstance(ids, pa.Array):
        ids = pa.array([s.encode("utf-8", "surrogatepass") for s in ids], pa.large_binary())
    return ids.cast(pa.large_binary())


def index_in(values: pa.Array, value_set: pa.Array) -> np.ndarray:
    """``pc.index_in(values, value_set)`` as int64 with -1 for a miss, both large_binary.

    Why not always the hash look-up: a refresh compares two lists of ids that are both in
    chunk_id order, and a linear merge walk of them (compiled) costs ~0.1 s at 10M ids where
    the hash look-up takes 1.5-2.5 s. The walk runs only when numba is there, neither list
    has nulls, and both are strictly ascending (it checks); otherwise the hash look-up."""
    if kernels()["compiled"] and not values.null_count and not value_set.null_count:
        # lazy: numba kernels (~6 ms of import), loaded only where numba is there
        from ..kernels.merge import sorted_join

        out = np.empty(len(values), np.int64)
        if sorted_join(*id_buffers(values), *id_buffers(value_set), out):
            return out
    return pc.index_in(values, value_set=value_set).fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)


def id_buffers(ids: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(offsets, bytes) of a large_binary array as they lie in its buffers, no copy (a
    slice's offsets start where it does, into the whole data buffer): what the compiled
    walk reads, and what ``lexical_stack.id_blob`` rebases from 0."""
    bufs = ids.buffers()
    off = np.frombuffer(bufs[1], np.int64)[ids.offset: ids.offset + len(ids) + 1] if bufs[1] is not None else None
    if off is None or not len(off):
        return np.zeros(1, np.int64), np.zeros(0, np.uint8)
    return off, (np.frombuffer(bufs[2], np.uint8) if bufs[2] is not None else np.zeros(0, np.uint8))


def recorded_ids(ix: Previous) -> pa.Array:
    """The doc ids a published file recorded, as large_binary (mapped, no copy)."""
    f = ix._file
    f.whole("doc_id_off")
    f.whole("doc_id_blob")
    return _binary(f.arrays["doc_id_off"], f.arrays["doc_id_blob"])


def plan_merge(prev: Previous, new_ids: Sequence[str] | pa.Array | pa.ChunkedArray,
               changed: Sequence[str] | pa.Array | pa.ChunkedArray | None = None) -> MergePlan:
    """The plan that turns ``prev`` (its recorded doc ids) into the corpus ``new_ids`` (in
    its position order). ``changed``: ids whose tokens are new although the id was indexed
    before (they are removed and counted again).

    Raises ``ValueError`` when ``prev`` has no doc ids, or when the kept documents are not
    in the same relative order in both corpora (the merge needs monotone renumbering)."""
    if not prev.has_doc_ids:
        raise ValueError(f"{prev.path}: no doc ids recorded, cannot tell which documents stay")
    old = recorded_ids(prev)
    new = as_binary(new_ids)
    old_new = index_in(old, new)
    if changed is not None and len(changed):
        old_new[pc.is_in(old, value_set=as_binary(changed)).to_numpy(zero_copy_only=False)] = -1
    kept = old_new[old_new >= 0]
    if len(kept) > 1 and not bool((np.diff(kept) > 0).all()):
        raise ValueError("the kept documents are not in the same order in both corpora (or ids repeat)")
    fresh = np.ones(len(new), np.bool_)
    fresh[kept] = False
    return MergePlan(old_new=old_new, added_pos=np.flatnonzero(fresh).astype(np.int64), n_docs=len(new))


def check_previous(prev: Previous) -> None:
    """What the merge needs of the previous file before it reads it unchecked: every data
    block's checksum (the bytes are the ones its publish verified whole), and the pointers
    the merge loops follow (per term and per block, not per posting; a doc position out of
    range is caught by the loops). ``IndexFormatError`` naming the file otherwise.

    Why not ``verify()``: that re-decodes every block and recomputes every bound, which
    publishing already did for these bytes; at 1M packed documents it costs ~2 s, more
    than the merge itself, where the checksums cost ~0.05 s."""
    f = prev._file
    f.blocks.check(HEADER_BYTES, f.blocks.end)
    a, n_terms = f.arrays, prev.n_terms
    ip = np.asarray(prev.indptr, np.int64)  # a packed file's: rebuilt from bptr and last_count
    ok = len(ip) == n_terms + 1 and (n_terms == 0 or (ip[0] == 0 and bool((np.diff(ip) >= 0).all())))
    lengths = a["doc_len"] if "doc_len" in a else a.get("doc_code")  # format 3: codes, no lengths
    ok = ok and lengths is not None and len(lengths) == prev.n_docs and vocab_ok(f)
    ok = ok and strings_ok(a["doc_id_off"], len(a["doc_id_blob"]), prev.n_docs) if prev.has_doc_ids else ok
    if ok and isinstance(prev, PackedBM25Index):
        bp, off = np.asarray(a["bptr"], np.int64), np.asarray(a["blk_off"], np.int64)
        lc, nb = a["last_count"], np.diff(bp)
        ok = np.array_equal(bp, block_pointers(ip)) and len(off) == int(bp[-1]) + 1
        ok = ok and bool(((lc >= 1) & (lc <= 128) | (nb == 0) & (lc == 0)).all())
        ok = ok and (len(off) == 1 or (int(off[0]) == 0
                                       and check_offsets(f.packed(), 0, len(off) - 1, len(a["data"])) is None))
    elif ok:
        ok = int(ip[-1]) == len(a["indices"]) == len(a["tf"])
    if not ok:
        raise CorruptIndexError(prev.path, "index structure is inconsistent")


def _slices(weight: np.ndarray, size: int) -> list[tuple[int, int]]:
    """Consecutive ranges of items whose summed ``weight`` stays near ``size`` (one item may exceed it)."""
    n = len(weight)
    if n == 0:
        return []
    cum = np.cumsum(weight)
    cuts = [0]
    while cuts[-1] < n:
        base = int(cum[cuts[-1] - 1]) if cuts[-1] else 0
        nxt = int(np.searchsorted(cum, base + size, side="right"))
        cuts.append(min(n, max(nxt, cuts[-1] + 1)))
    return list(zip(cuts[:-1], cuts[1:], strict=True))


def _terms(off: np.ndarray, blob: np.ndarray, tids: np.ndarray) -> list[str]:
    """Term strings of these term ids (UTF-8 through Arrow; surrogatepass where Arrow refuses)."""
    part = _binary(off, blob).take(pa.array(tids))
    try:
        return part.cast(pa.large_string()).to_pylist()
    except (pa.ArrowInvalid, UnicodeError):
        return [b.decode("utf-8", "surrogatepass") for b in part.to_pylist()]


def merge_postings(prev: Previous, plan: MergePlan, added: Iterable[Batch], *, tmp_dir: str | os.PathLike[str],
                   memory_mib: int | None = None, kernel: str = "auto") -> tuple[RawPostings, float, int]:
    """(the new corpus's raw postings, seconds spent counting the added documents, runs
    that count spilled).

    ``added``: token batches of the documents at ``plan.added_pos``, in that order. The
    postings are held in memory within the build's memory budget (``memory_mib`` or
    ``RAGSPINE_BM25_BUILD_MEMORY_MIB``), else written to memory maps in ``tmp_dir``, which
    must then outlive them. ``prev``
    must have been checked (``check_previous``): its pointers are followed unchecked.
    """
    tmp = Path(tmp_dir)
    tmp.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    counter = StreamCounter(tmp / "added", memory_mib=memory_mib, kernel=kernel)
    new, _vocab = counter.consume(added).finish()
    t_count = time.perf_counter() - t0
    if new.n_docs != plan.added:
        raise ValueError(f"{new.n_docs} added documents counted for {plan.added} planned")
    k = kernels(kernel)
    f = prev._file.arrays
    old_indptr = np.asarray(prev.indptr, np.int64)
    n_old = len(old_indptr) - 1
    # Term ids of the new documents' terms in the previous vocabulary (by the bytes, as stored).
    new_bin = pa.array([t.encode("utf-8", "surrogatepass") for t in new.terms], pa.large_binary())
    old_off, old_blob = term_strings(prev._file)  # either vocabulary form, every term by id
    new_to_old = pc.index_in(new_bin, value_set=_binary(old_off, old_blob))
    new_to_old = new_to_old.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
    lut = np.full(n_old, -1, np.int64)
    matched = np.flatnonzero(new_to_old >= 0)
    lut[new_to_old[matched]] = matched
    new_only = np.flatnonzero(new_to_old < 0)
    packed = isinstance(prev, PackedBM25Index)
    old_max = int(f["blk_maxtf"].max()) if packed and len(f["blk_maxtf"]) else (
        int(np.asarray(prev.tf).max()) if not packed and len(prev.tf) else 0)
    new_max = int(new.tf.max()) if new.n_postings else 0
    dtype = tf_dtype(np.array([old_max, new_max]))
    bound = int(old_indptr[-1]) + new.n_postings
    out_indptr = np.zeros(n_old + len(new_only) + 1, np.int64)
    if bound * (4 + np.dtype(dtype).itemsize) <= build_memory_budget(memory_mib):  # as the build: spill past it
        out_idx, out_tf = np.empty(bound, np.int32), np.empty(bound, dtype)
    else:
        out_idx = np.lib.format.open_memmap(tmp / "merged-indices.npy", "w+", np.int32, (bound,))
        out_tf = np.lib.format.open_memmap(tmp / "merged-tf.npy", "w+", dtype, (bound,))
    # int32 maps: half the cache lines of the per-posting lookup (positions are int32 anyway).
    old_new = np.asarray(plan.old_new, np.int32)
    new_pos = np.asarray(plan.added_pos, np.int32)
    n_df = np.diff(new.indptr)
    n_idx, n_tf = np.asarray(new.indices), np.asarray(new.tf)
    compiled = bool(k["compiled"])
    size = 1 << 62 if compiled else SLICE_POSTINGS
    old_df = np.diff(old_indptr)
    weight = old_df + np.where(lut >= 0, n_df[np.maximum(lut, 0)] if len(n_df) else 0, 0)
    p = 0
    for t0_, t1_ in _slices(weight, size):
        if p < 0:
            break
        if packed:
            p = k["merge_packed"](prev._pk, t0_, t1_, old_new, lut, new.indptr, n_idx, n_tf, new_pos, out_indptr,
                                  out_idx, out_tf, p)
        else:
            p = k["merge_plain"](old_indptr, prev.indices, prev.tf, t0_, t1_, old_new, lut, new.indptr, n_idx, n_tf,
                                 new_pos, out_indptr, out_idx, out_tf, p)
    if p < 0:
        raise CorruptIndexError(prev.path, "a posting holds a document position outside the index")
    # Terms only the added documents hold: a previous index with no postings for them.
    out_indptr[n_old + 1:] = p
    none = np.zeros(len(new_only) + 1, np.int64)
    for t0_, t1_ in _slices(n_df[new_only], size):
        p = k["merge_plain"](none, np.zeros(0, np.int32), np.zeros(0, dtype), t0_, t1_, old_new, new_only, new.indptr,
                             n_idx, n_tf, new_pos, out_indptr[n_old:], out_idx, out_tf, p)
    for out in (out_idx, out_tf):
        if isinstance(out, np.memmap):
            out.flush()
    df = np.diff(out_indptr)
    keep = np.flatnonzero(df)
    indptr = np.zeros(len(keep) + 1, np.int64)
    np.cumsum(df[keep], out=indptr[1:])
    old_keep = keep[keep < n_old]
    terms = _terms(old_off, old_blob, old_keep)
    terms += [new.terms[t] for t in new_only[keep[keep >= n_old] - n_old].tolist()]
    doc_len = np.zeros(plan.n_docs, np.uint32)
    stays = old_new >= 0
    doc_len[old_new[stays]] = np.asarray(prev.doc_len)[stays]
    doc_len[new_pos] = new.doc_len
    raw = RawPostings(indptr=indptr, indices=out_idx[:p], tf=out_tf[:p], doc_len=doc_len, terms=terms)
    return raw, t_count, len(counter.runs)


def merge_index_file(prev: Previous, path: str | os.PathLike[str], plan: MergePlan, added: Iterable[Batch], *,
                     k1: float, b: float, doc_ids: Sequence[str] | None = None, layout: str | None = None,
                     memory_mib: int | None = None, tmp_dir: str | os.PathLike[str] | None = None,
                     kernel: str = "auto", verify_prev: bool = True) -> MergeReport:
    """Merge ``prev`` with the added documents (``plan``) and publish the new corpus at
    ``path`` exactly as ``refresh.stream_build.build_index_file`` would (same layout rule,
    atomic and verified). ``prev`` is checked first (``check_previous``; pass
    ``verify_prev=False`` when the caller just did): a damaged previous file raises
    ``IndexFormatError`` naming it, never a wrong new index."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    if verify_prev:
        check_previous(prev)
    with _scratch(tmp_dir, path.parent) as tmp:
        raw, t_count, runs = merge_postings(prev, plan, added, tmp_dir=tmp, memory_mib=memory_mib, kernel=kernel)
        t_merge = time.perf_counter() - t0 - t_count
        chosen = choose_layout(raw.n_postings, layout)
        write_layout(raw, path, layout=chosen, k1=k1, b=b, doc_ids=doc_ids)  # checks doc_ids against N
        counts = {"docs": raw.n_docs, "postings": raw.n_postings, "terms": raw.n_terms}
        del raw
    return MergeReport(**counts, layout=chosen, bytes=path.stat().st_size, seconds=round(time.perf_counter() - t0, 3),
                       count_seconds=round(t_count, 3), runs=runs, peak_rss_mib=round(peak_rss_mib(), 1),
                       paths=(str(path),), kept=plan.kept, added=plan.added, removed=plan.removed,
                       merge_seconds=round(t_merge, 3))


@contextlib.contextmanager
def _scratch(tmp_dir: str | os.PathLike[str] | None, beside: Path) -> Iterator[Path]:
    """``tmp_dir``, or a temporary folder beside the output (same file system), removed after."""
    if tmp_dir is not None:
        yield Path(tmp_dir)
        return
    with tempfile.TemporaryDirectory(prefix=".bm25-merge-", dir=beside) as tmp:
        yield Path(tmp)


__all__ = ["MergePlan", "MergeReport", "check_previous", "merge_index_file", "merge_postings", "plan_merge"]
