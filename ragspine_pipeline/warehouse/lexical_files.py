"""The lexical index's published BM25 file: written into a version folder, opened mapped.

Why: a snapshot that publishes only tokens makes every serving process rebuild the BM25
index (seconds and gigabytes per process, #27). The ``lexical_index`` step writes the built
index once, as immutable verified files (``retrieval/lexical/format/file``) in its own
version folder; serving maps them (``open_bm25_file``) and hands the index to the
retriever (``HybridRetriever(..., bm25_index=...)``), which then tokenizes nothing.

The index is built by the streaming builder (``bm25_stream_build``: bounded memory, so a
10M-chunk library builds on one machine) from token lists or straight from the Arrow
``list<string>`` tokens column, and published as ``RAGSPINE_BM25_BUCKETS`` hash-bucket
segments: one bucket is the single file ``BM25_FILE``; more are the segment files of
``BM25_SEGMENTS`` (``bm25_segments``), which a shard maps part of. The postings layout is
``choose_layout``'s (``RAGSPINE_BM25_LAYOUT``).

A refresh writes only what changed (``merge_bm25_file``, ``lexical_stack``): the previous
version's segment files are linked into the new version and one new segment holds the
chunks added or re-analyzed, with fresh live rows per segment (``bm25_stack``, Lucene-style).
When the merge policy (``StackPolicy``) finds the stack too deep, its small segments fold
into the new one (the largest stays linked); when it is still too dead, the refresh
merges instead (``bm25_merge``): the largest segment's counts are kept, only the other
chunks are counted, and one file is written, the one a full build writes (same layout
rule, same answers bit for bit). It falls back to the full build, and says
why in the returned metadata (``bm25_build``: ``full``, ``bm25_full_reason``), when there
is no single previous file (none, or ``RAGSPINE_BM25_BUCKETS`` > 1: segments are built
whole) or the previous file does not open or pass its checksums (``IndexFormatError``).

The index's documents are the chunks it was built over, in chunk_id order (the
retriever's position order, so ties fall by chunk_id), with their chunk ids recorded. A
version without the files (a warehouse from before) or whose chunk ids are not exactly
the served ones (an older snapshot served less the documents hidden since) returns None
here: the caller serves from the tokens as before. A damaged file is an error naming it,
never a fallback that hides it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..retrieval.lexical.format import file as bm25_format
from ..retrieval.lexical.format.file import IndexFormatError
from ..retrieval.lexical.format.raw import publish_buckets
from ..retrieval.lexical.index.bm25 import DEFAULT_B, DEFAULT_K1
from ..retrieval.lexical.index.mapped import MappedBM25Index, open_index
from ..retrieval.lexical.refresh.merge import (
    as_binary,
    check_previous,
    merge_index_file,
    plan_merge,
)
from ..retrieval.lexical.refresh.segments import SegmentedBM25, open_segments, write_segments_stream
from ..retrieval.lexical.refresh.stack import STACK_FILE, StackedBM25, open_stack
from ..retrieval.lexical.refresh.stream_build import Batch, build_index_file
from .lexical_stack import (
    BM25_FILE,
    DEFAULT_POLICY,
    StackPolicy,
    open_previous,
    plan_stack,
    write_stacked,
)

BM25_SEGMENTS = "bm25-segments"  # folder of the segment files when the index has several buckets
BATCH_DOCS = 100_000  # documents per batch fed to the streaming build

__all__ = ["BM25_FILE", "BM25_SEGMENTS", "TokenLoader", "bm25_file", "merge_bm25_file", "open_bm25_file", "write_bm25_file"]

Ids = Sequence[str] | pa.Array | pa.ChunkedArray
# Token lists of the chunks at these positions of ``chunk_ids`` (in that order), or of
# every chunk (None): what a merge loads instead of the whole corpus's tokens.
TokenLoader = Callable[[np.ndarray | None], Batch]


def write_bm25_file(version_dir: str | Path, chunk_ids: Ids, docs_tokens: Batch, *, k1: float = DEFAULT_K1,
                    b: float = DEFAULT_B, buckets: int | None = None, layout: str | None = None) -> dict[str, Any]:
    """Build the BM25 index of these chunks (any order; unique ids) and publish it in
    ``version_dir`` (atomic, verified files). Returns the manifest metadata to record.

    ``chunk_ids`` and ``docs_tokens`` are Python sequences or Arrow arrays (the tokens a
    ``list<string>`` column); the documents are fed to the streaming build in chunk_id
    order, ``BATCH_DOCS`` at a time, never as one Python list of the whole corpus.
    ``buckets`` (default ``RAGSPINE_BM25_BUCKETS``): 1 writes ``BM25_FILE``, more write
    that many segments into ``BM25_SEGMENTS``.
    """
    t0 = time.perf_counter()
    order, sorted_ids, _arrow = _sorted_ids(chunk_ids, docs_tokens)
    batches = _batches(docs_tokens, order)
    n_buckets = publish_buckets(buckets)
    version_dir = Path(version_dir)
    if n_buckets == 1:
        report = build_index_file(batches, version_dir / BM25_FILE, k1=k1, b=b, doc_ids=sorted_ids, layout=layout)
        name = BM25_FILE
    else:
        report = write_segments_stream(version_dir / BM25_SEGMENTS, batches, sorted_ids, buckets=n_buckets,
                                       k1=k1, b=b, layout=layout)
        name = BM25_SEGMENTS
    return {"bm25_file": name, "bm25_format": bm25_format.FORMAT_VERSION, "bm25_docs": report.docs,
            "bm25_bytes": report.bytes, "bm25_k1": float(k1), "bm25_b": float(b), "bm25_layout": report.layout,
            "bm25_buckets": n_buckets, "bm25_build": "full", "bm25_seconds": round(time.perf_counter() - t0, 3)}


def merge_bm25_file(version_dir: str | Path, prev_version_dir: str | Path | None, chunk_ids: Ids,
                    docs_tokens: Batch | TokenLoader, *, changed: Ids | None = None, k1: float = DEFAULT_K1,
                    b: float = DEFAULT_B, buckets: int | None = None, layout: str | None = None,
                    stack: StackPolicy | None = DEFAULT_POLICY) -> dict[str, Any]:
    """``write_bm25_file``'s index, merged from ``prev_version_dir``'s BM25 file when it can.

    ``chunk_ids``/``docs_tokens`` are the whole new corpus (the served chunks; any order),
    as for ``write_bm25_file``; only the tokens of chunks the previous file lacks, or that
    are in ``changed`` (re-analyzed under a kept id), are read and counted. ``docs_tokens``
    may be a ``TokenLoader`` instead: then only those chunks' token lists are loaded (a 1%
    refresh reads 1% of the tokens), and all of them only for a full build. The previous
    file must hold the tokens of the same analysis (the caller's rule): its kept documents
    are taken as they are. Only counts are read from it, so its k1/b/layout may differ.

    ``stack`` (the default policy; None: always merge): the previous version's segments
    are linked and one segment of the counted chunks is added (``lexical_stack``), unless
    the policy says the stack is too deep or too dead; then the merge writes one file.

    Returns the manifest metadata: ``write_bm25_file``'s keys with ``bm25_build``
    ``stacked`` (segments, documents kept/added/removed, bytes written, churn), ``merged``
    (the documents kept/added/removed, the seconds counting the added ones and merging,
    ``bm25_merge_reason`` when a stack was folded) or ``full`` with ``bm25_full_reason``.
    """
    t0 = time.perf_counter()
    n_buckets = publish_buckets(buckets)
    prev_path = None if prev_version_dir is None else bm25_file(prev_version_dir)
    why = ("no previous version" if prev_version_dir is None else "the previous version has no BM25 file"
           if prev_path is None else f"{n_buckets} buckets: segments are built whole" if n_buckets != 1
           else "the previous index is segmented" if not prev_path.is_file() else None)
    merge_why = None
    if why is None:
        try:
            order, sorted_ids, arrow = _sorted_ids(chunk_ids, docs_tokens, as_list=False)
            new_ids = as_binary(arrow if arrow is not None else sorted_ids)
            prev = open_previous(prev_path)  # counts only: no query kernels to load
            if stack is not None and any((s.k1, s.b) != (float(k1), float(b)) for s in prev.segments):
                merge_why = "k1/b changed: the segments of one stack share them"
            elif stack is not None:
                splan = plan_stack(prev, new_ids, changed)
                segs, churn = splan.churn(len(new_ids))
                folded = segs > stack.max_segments > 1
                if folded:  # the small segments into the new one: base + one segment
                    splan = splan.folded()
                    segs, churn = splan.churn(len(new_ids))
                small = len(new_ids) < stack.min_docs and not splan.unchanged(len(new_ids))
                if not small and segs <= stack.max_segments and churn <= stack.max_churn:
                    def added_batches() -> Iterator[Batch]:
                        at = order[splan.added]
                        return (_batches(docs_tokens(at), np.arange(len(at))) if callable(docs_tokens)
                                else _batches(docs_tokens, at))
                    meta = write_stacked(Path(version_dir), prev, splan, new_ids, added_batches, k1=k1, b=b,
                                         layout=layout)
                    return {**meta, "bm25_churn": round(churn, 4), "bm25_stack_folded": folded,
                            "bm25_seconds": round(time.perf_counter() - t0, 3)}
                merge_why = (f"{len(new_ids)} chunks < {stack.min_docs}: merged, one file" if small
                             else f"{segs} segments > {stack.max_segments}" if segs > stack.max_segments
                             else f"churn {churn:.3f} > {stack.max_churn}")
            base = prev.base()
            base_ix = prev.segments[base]
            check_previous(base_ix)
            redo = changed
            if len(prev.segments) > 1 or not (prev.rows[base] >= 0).all():  # a stack: its dead copies too
                dead = prev.dead_ids(base)
                redo = dead if changed is None or not len(changed) else pa.concat_arrays(
                    [as_binary(changed), dead])
            plan = plan_merge(base_ix, sorted_ids if arrow is None else arrow, redo)
        except IndexFormatError as exc:
            why = f"the previous BM25 file does not open: {exc}"
        except ValueError as exc:  # no doc ids recorded, or not in chunk-id order
            why = f"the previous BM25 file cannot be merged: {exc}"
    if why is not None:
        every = docs_tokens(None) if callable(docs_tokens) else docs_tokens
        return {**write_bm25_file(version_dir, chunk_ids, every, k1=k1, b=b, buckets=buckets, layout=layout),
                "bm25_full_reason": why}
    added_at = order[plan.added_pos]
    added = (_batches(docs_tokens(added_at), np.arange(len(added_at))) if callable(docs_tokens)
             else _batches(docs_tokens, added_at))
    if sorted_ids is None:
        sorted_ids = arrow.to_pylist()
    report = merge_index_file(base_ix, Path(version_dir) / BM25_FILE, plan, added,
                              k1=k1, b=b, doc_ids=sorted_ids, layout=layout, verify_prev=False)
    return {"bm25_file": BM25_FILE, "bm25_format": bm25_format.FORMAT_VERSION, "bm25_docs": report.docs,
            "bm25_bytes": report.bytes, "bm25_k1": float(k1), "bm25_b": float(b), "bm25_layout": report.layout,
            "bm25_buckets": 1, "bm25_build": "merged", "bm25_docs_kept": report.kept, "bm25_docs_added": report.added,
            "bm25_docs_removed": report.removed, "bm25_count_seconds": report.count_seconds,
            "bm25_merge_seconds": report.merge_seconds, "bm25_seconds": round(time.perf_counter() - t0, 3),
            **({"bm25_merge_reason": merge_why} if merge_why else {})}


def _sorted_ids(chunk_ids: Ids, docs_tokens: Batch | TokenLoader, *,
                as_list: bool = True) -> tuple[np.ndarray, list[str] | None, pa.Array | None]:
    """(the order that sorts the chunks by id, the sorted ids, the same as Arrow when given
    as Arrow); the ids must be unique and as many as the token lists (a loader has one per id).
    ``as_list=False``: Arrow ids are not turned into a Python list (None; a stack needs none).

    Arrow ids are checked unique on the sorted array (no two neighbours equal: 0.06 s at 10M
    ids, where a distinct count hashes every id, ~3 s)."""
    n = len(chunk_ids)
    if not callable(docs_tokens) and n != len(docs_tokens):
        raise ValueError(f"{n} chunk ids for {len(docs_tokens)} token lists")
    if isinstance(chunk_ids, pa.Array | pa.ChunkedArray):
        order = pc.sort_indices(chunk_ids).to_numpy().astype(np.int64)
        arrow = chunk_ids.take(pa.array(order))
        if isinstance(arrow, pa.ChunkedArray):
            arrow = arrow.combine_chunks()
        if n > 1 and pc.any(pc.equal(arrow.slice(1), arrow.slice(0, n - 1))).as_py():
            raise ValueError("chunk ids must be unique")
        return order, arrow.to_pylist() if as_list else None, arrow
    if len(set(chunk_ids)) != n:
        raise ValueError("chunk ids must be unique")
    order = np.array(sorted(range(n), key=chunk_ids.__getitem__), np.int64)
    return order, [chunk_ids[i] for i in order.tolist()], None


def _batches(docs_tokens: Batch, order: np.ndarray) -> Iterator[Batch]:
    """The documents in ``order``, ``BATCH_DOCS`` at a time (Arrow slices when already in
    order, else Arrow takes or Python lists of the token lists)."""
    arrow = isinstance(docs_tokens, pa.Array | pa.ChunkedArray)
    in_order = bool((order == np.arange(len(order))).all())
    for lo in range(0, len(order), BATCH_DOCS):
        idx = order[lo:lo + BATCH_DOCS]
        if arrow:
            yield docs_tokens.slice(lo, len(idx)) if in_order else _take_rows(docs_tokens, idx)
        else:
            yield [docs_tokens[i] for i in idx.tolist()]


def _take_rows(tokens: pa.Array | pa.ChunkedArray, idx: np.ndarray) -> pa.Array:
    """Rows ``idx`` of ``tokens``, each chunk taking only its own rows (a ChunkedArray's
    own take may concatenate every chunk first: a copy of the whole column per batch)."""
    if isinstance(tokens, pa.Array):
        return tokens.take(pa.array(idx))
    starts = np.cumsum([0] + [len(c) for c in tokens.chunks])
    which = np.searchsorted(starts, idx, side="right") - 1
    order = np.argsort(which, kind="stable")
    rows, chunk = idx[order], which[order]
    cuts = np.searchsorted(chunk, np.arange(tokens.num_chunks + 1))
    parts = [tokens.chunk(c).take(pa.array(rows[cuts[c]:cuts[c + 1]] - starts[c]))
             for c in range(tokens.num_chunks) if cuts[c + 1] > cuts[c]]
    return pa.concat_arrays(parts).take(pa.array(np.argsort(order)))


def bm25_file(version_dir: str | Path) -> Path | None:
    """The version's BM25 file (or its folder of segments), or None for a version written
    before there was one."""
    stacked = Path(version_dir) / STACK_FILE
    if stacked.is_file():
        return stacked
    path = Path(version_dir) / BM25_FILE
    if path.is_file():
        return path
    folder = Path(version_dir) / BM25_SEGMENTS
    return folder if folder.is_dir() and any(folder.glob("bm25-*-of-*.rsbm25")) else None


def open_bm25_file(version_dir: str | Path, served_ids: Sequence[str] | None = None, *,
                   kernel: str = "auto") -> MappedBM25Index | SegmentedBM25 | StackedBM25 | None:
    """The version's BM25 index, memory-mapped (one file, or every segment of the folder);
    None when there is none, or when ``served_ids`` (sorted by chunk id) are not exactly
    the indexed chunks.

    Raises ``IndexFormatError`` (corrupt, truncated, newer format) naming the file, and
    ``FileNotFoundError`` naming a missing segment.
    """
    path = bm25_file(version_dir)
    if path is None:
        return None
    index = (open_stack(path.parent, kernel=kernel) if path.name == STACK_FILE else open_index(path, kernel=kernel)
             if path.is_file() else open_segments(path, kernel=kernel))
    if served_ids is not None and not index.same_doc_ids(served_ids):
        return None
    return index
