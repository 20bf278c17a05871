"""A refresh that writes only what changed: the BM25 stack and its merge policy (#27 item 1).

Why: the merge of ``bm25_merge`` counts only the changed chunks but still writes the whole
index file per version (0.6-0.9 of a full build's time at 1M-10M chunks). Here a refresh
publishes a ``bm25_stack``: the previous version's segment files linked into the new
version folder (hard links: versions stay self-contained and immutable, no bytes copied),
one new segment of the chunks added or re-analyzed, and fresh rows per segment (the rows
of chunks deleted, hidden or replaced become -1). The refresh therefore costs the changed
chunks' count plus O(N) small integers, whatever the library's size.

``StackPolicy`` is the merge policy, as Lucene's keeps its segment count and deleted
documents bounded. When the stack would hold more than ``max_segments`` segments, the small
segments fold into the new one (``StackPlan.folded``: every segment but the largest is
dropped and its live documents are counted again with the changed ones), so the stack is
the big base plus one segment, at a cost that grows with the churn, not the library. When
the churn (dead documents plus live documents outside the largest segment, over the live
documents) would still pass ``max_churn``, the refresh merges instead: the largest segment
is the previous file of ``bm25_merge``, everything not live in it is counted again, and
one whole file is written (``lexical_files.merge_bm25_file``). So a stack stays shallow,
queries pay at most ``max_segments`` segment passes, and the dead postings they skip stay
a bounded share.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..retrieval.lexical.format import file as bm25_format
from ..retrieval.lexical.index.mapped import open_index
from ..retrieval.lexical.refresh.merge import as_binary, id_buffers, index_in, recorded_ids
from ..retrieval.lexical.refresh.stack import STACK_FILE, open_stack, rows_file_name, write_stack
from ..retrieval.lexical.refresh.stream_build import Batch, build_index_file

BM25_FILE = "bm25.rsbm25"  # a version's one index file (``lexical_files`` re-exports it)


@dataclass(frozen=True)
class StackPolicy:
    """When a refresh stacks a new segment and when it merges back into one file.

    The defaults come from ``benchmarks/bench_bm25_stack_depth.py`` (1M chunks, 1%
    refreshes): each segment past the first adds a near-constant ~0.03-0.06 ms to every
    query (p50 1.3x one file at 2 segments, 3.1x at 8), so a stack is the base plus one
    segment (past that the small ones fold), and the churn that grows that segment is held
    to 10% before a merge. Below ``min_docs`` live chunks a refresh merges: the merge costs
    a few seconds at most there (~3.5 s at 1M) while the fixed per-segment cost is a larger
    share of a smaller index's query."""

    max_segments: int = 2
    max_churn: float = 0.10
    min_docs: int = 1_000_000


DEFAULT_POLICY = StackPolicy()


@dataclass
class PreviousStack:
    """The previous version's index as segments with rows (a single file: one segment)."""

    folder: Path
    files: list[Path]
    segments: list[Any]
    rows: list[np.ndarray]
    ids: pa.Array  # large_binary, the previous version's ids in row order

    def base(self) -> int:
        """The segment with the most live documents (what a merge keeps)."""
        return int(np.argmax([np.count_nonzero(r >= 0) for r in self.rows]))

    def dead_ids(self, s: int) -> pa.Array:
        """Ids recorded in segment ``s`` whose copy there is no longer live."""
        return recorded_ids(self.segments[s]).filter(pa.array(self.rows[s] < 0))


def id_blob(ids: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(offsets from 0, bytes) of a large_binary array, as ``strings_to_blob`` gives them."""
    off, blob = id_buffers(ids)
    return off - off[0], blob[int(off[0]): int(off[-1])]


def open_previous(prev_path: Path) -> PreviousStack:
    """The previous version's index (``bm25_file``'s path) with its rows and ids, counts
    only (no query kernels)."""
    if prev_path.name == STACK_FILE:
        st = open_stack(prev_path.parent, kernel="numpy")
        man_files = [s.path for s in st.segments]
        parts = [recorded_ids(s).filter(pa.array(r >= 0)) for s, r in zip(st.segments, st.rows, strict=True)]
        live_rows = np.concatenate([r[r >= 0] for r in st.rows])
        ids = pa.concat_arrays(parts).take(pa.array(np.argsort(live_rows, kind="stable")))
        return PreviousStack(prev_path.parent, man_files, st.segments, st.rows, ids)
    seg = open_index(prev_path, kernel="numpy")
    if not seg.has_doc_ids:
        raise ValueError(f"{prev_path}: no doc ids recorded, cannot tell which documents stay")
    return PreviousStack(prev_path.parent, [prev_path], [seg], [np.arange(seg.n_docs, dtype=np.int64)], recorded_ids(seg))


@dataclass(frozen=True)
class StackPlan:
    """The new version's rows of every previous segment, and the new rows to count."""

    rows: list[np.ndarray]
    added: np.ndarray  # new rows (ascending) of the chunks the new segment holds
    kept: int
    removed: int

    def folded(self) -> StackPlan:
        """The same refresh with every segment but the one keeping the most live documents
        (the base) folded into the new segment: their live documents are counted again with
        the changed ones, so the stack becomes base + one segment (Lucene's merge of the
        small segments, which leaves the big one alone)."""
        live = [int(np.count_nonzero(r >= 0)) for r in self.rows]
        base = int(np.argmax(live)) if live else 0
        moved = [r[r >= 0] for s, r in enumerate(self.rows) if s != base]
        added = np.union1d(self.added, np.concatenate(moved)) if moved else self.added
        rows = [r if s == base else np.full(len(r), -1, np.int64) for s, r in enumerate(self.rows)]
        kept = live[base] if live else 0
        return StackPlan(rows, added.astype(np.int64), kept, self.removed + self.kept - kept)

    def unchanged(self, n_new: int) -> bool:
        """Nothing changed for BM25: one previous file whose documents are the new rows as they were."""
        return (not len(self.added) and len(self.rows) == 1 and len(self.rows[0]) == n_new
                and bool((self.rows[0] == np.arange(n_new)).all()))

    def churn(self, n_new: int) -> tuple[int, float]:
        """(segments after the refresh, churn as ``StackPolicy`` reads it)."""
        live = [int(np.count_nonzero(r >= 0)) for r in self.rows]
        segs = sum(1 for x in live if x) + (1 if len(self.added) else 0)
        files = sum(len(r) for r, x in zip(self.rows, live, strict=True) if x) + len(self.added)
        biggest = max(live + [len(self.added)])
        return segs, ((files - n_new) + (n_new - biggest)) / max(n_new, 1)


def plan_stack(prev: PreviousStack, new_ids: pa.Array, changed: Any) -> StackPlan:
    """Where each previous live document goes in the new rows (``new_ids`` sorted), and
    which new rows are counted into the new segment (new ids, and ``changed`` ones)."""
    at = index_in(new_ids, prev.ids)
    if changed is not None and len(changed):
        at[pc.is_in(new_ids, value_set=as_binary(changed)).to_numpy(zero_copy_only=False)] = -1
    kept = np.flatnonzero(at >= 0)
    if len(kept) > 1 and not bool((np.diff(at[kept]) > 0).all()):
        raise ValueError("the kept documents are not in the same order in both versions (or ids repeat)")
    new_of_old = np.full(len(prev.ids), -1, np.int64)
    new_of_old[at[kept]] = kept
    rows = [np.where(r >= 0, new_of_old[np.maximum(r, 0)], -1) for r in prev.rows]
    return StackPlan(rows, np.flatnonzero(at < 0).astype(np.int64), len(kept), len(prev.ids) - len(kept))


def link_or_copy(src: Path, dst: Path) -> None:
    """A previous version's immutable segment in the new folder: a hard link, else a copy."""
    try:
        os.link(src, dst)
    except OSError:
        tmp = dst.with_name(f".{dst.name}.tmp{os.getpid()}")
        shutil.copyfile(src, tmp)
        os.replace(tmp, dst)


def write_stacked(version_dir: Path, prev: PreviousStack, plan: StackPlan, new_ids: pa.Array,
                  added: Callable[[], Iterable[Batch]], *, k1: float, b: float, layout: str | None) -> dict[str, Any]:
    """Publish the stack of ``plan`` in ``version_dir``; returns the manifest metadata.
    On any error the stack's files are removed again (the caller then writes one file)."""
    made: list[Path] = []
    try:
        return _write_stacked(version_dir, prev, plan, new_ids, added, k1=k1, b=b, layout=layout, made=made)
    except BaseException:
        for p in [version_dir / STACK_FILE, *made]:
            p.unlink(missing_ok=True)
        raise


def _write_stacked(version_dir: Path, prev: PreviousStack, plan: StackPlan, new_ids: pa.Array,
                   added: Callable[[], Iterable[Batch]], *, k1: float, b: float, layout: str | None,
                   made: list[Path]) -> dict[str, Any]:
    t0 = time.perf_counter()
    version_dir.mkdir(parents=True, exist_ok=True)
    if plan.unchanged(len(new_ids)):
        # Nothing changed for BM25: the previous file is this version's file, as it was.
        dst = version_dir / BM25_FILE
        made.append(dst)
        link_or_copy(prev.files[0], dst)
        return {"bm25_file": BM25_FILE, "bm25_format": bm25_format.FORMAT_VERSION, "bm25_docs": len(new_ids),
                "bm25_bytes": dst.stat().st_size, "bm25_bytes_written": 0, "bm25_k1": float(k1),
                "bm25_b": float(b), "bm25_buckets": 1, "bm25_build": "linked", "bm25_segments": 1,
                "bm25_docs_kept": plan.kept, "bm25_docs_added": 0, "bm25_docs_removed": 0,
                "bm25_seconds": round(time.perf_counter() - t0, 3)}
    files, rows, names = [], [], set()
    for path, r in zip(prev.files, plan.rows, strict=True):
        if not (r >= 0).any():
            continue  # nothing live: the segment leaves the stack
        made.append(version_dir / path.name)
        link_or_copy(path, version_dir / path.name)
        files.append(path.name)
        names.add(path.name)
        rows.append(r)
    written = 0
    if len(plan.added):
        name = f"bm25-seg-{version_dir.name}.rsbm25"
        while name in names:
            name = "x" + name
        made.append(version_dir / name)
        added_ids = new_ids.take(pa.array(plan.added)).to_pylist()
        report = build_index_file(added(), version_dir / name, k1=k1, b=b, layout=layout,
                                  doc_ids=[x.decode("utf-8", "surrogatepass") for x in added_ids])
        files.append(name)
        rows.append(plan.added)
        written += report.bytes
    made.extend(version_dir / rows_file_name(i) for i in range(len(files)))
    off, blob = id_blob(new_ids)
    write_stack(version_dir, files, rows, len(new_ids), off, blob)
    check_published(version_dir, new_ids)
    written += sum((version_dir / f).stat().st_size for f in os.listdir(version_dir)
                   if f.startswith("bm25-rows-") or f == STACK_FILE)
    segs_bytes = sum((version_dir / f).stat().st_size for f in files)
    return {"bm25_file": STACK_FILE, "bm25_format": bm25_format.FORMAT_VERSION, "bm25_docs": len(new_ids),
            "bm25_bytes": segs_bytes, "bm25_bytes_written": written, "bm25_k1": float(k1), "bm25_b": float(b),
            "bm25_buckets": 1, "bm25_build": "stacked", "bm25_segments": len(files),
            "bm25_docs_kept": plan.kept, "bm25_docs_added": int(len(plan.added)),
            "bm25_docs_removed": plan.removed, "bm25_seconds": round(time.perf_counter() - t0, 3)}


def check_published(version_dir: Path, new_ids: pa.Array) -> None:
    """Open the written stack and check every live document's recorded id at its row
    (publish verifies everything: a wrong row would serve another chunk's record)."""
    st = open_stack(version_dir, kernel="numpy")
    for seg, r in zip(st.segments, st.rows, strict=True):
        live = r >= 0
        if not recorded_ids(seg).filter(pa.array(live)).equals(new_ids.take(pa.array(r[live]))):
            raise bm25_format.CorruptIndexError(seg.path, "live document ids do not match the version's rows")
