"""A relabel purges: older versions' derived files of a now-hidden document become owner-only (#42 item 7).

Why: the index steps keep RESTRICTED and withheld chunks out of every version they write
from now on, and a refresh where a document became hidden rewrites (merges, compacts) the
current tables without it. But the versions written while it was open keep its text or
tokens — RAPTOR nodes, graph nodes and community summaries, the BM25 file and its stacked
segments, ``tokens.parquet``, the served records, vectors — and retention must keep them
for a while: a notebook holding the previous catalog open reads through them, and the
newest snapshot of another chunking is still served from its own versions.

Rewriting those versions would break the promise that a version never changes under a
reader, and deleting them would break the readers retention is for. So at the publish
that hides the document (``publish_snapshot``), every older version of a derived asset
that may hold it is *narrowed*: its files mode 0600 and its folder 0700, exactly like the
owner-only raw and chunk tables. Readers running as the warehouse owner (the catalog's
notebooks, an older chunking served by the owner's service: both already read the
owner-only chunk tables) keep reading; nobody else can, and ``prune`` deletes the
versions when retention ends, as before. The current snapshot's versions are never
narrowed (they hold no hidden document: the steps purge them), so serving never breaks.

Which versions: one built from a chunks version whose history holds an open (not
RESTRICTED under today's rules) row of a document hidden now — RESTRICTED, withheld or
with a label problem. The whole history counts, not only the active rows: a stacked BM25
segment keeps dead copies of a deleted document until a merge. A version whose chunks
version is gone is judged by the document ids its own Parquet files name, and narrowed
when it names none it can read (fail closed). Files shared by hard link (the BM25 stack
links segments into newer versions) are one inode: a file of a narrowed version that the
current snapshot also uses is left open and counted in ``current_shared`` (it must be 0:
the steps never link a hidden document's segment into a current version).

The ``rerank_vectors`` DuckDB store is one file per library, rewritten in place by its
refresh: a store that holds a row of a hidden document is made owner-only too.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from .catalog import raw_hidden_doc_ids
from .chunk_tables import unserved_docs
from .common import CHUNKS, LEXICAL, SNAPSHOT, restricted_mask
from .rerank_vectors import STORE_DIR, store_path
from .versioned import (
    OWNER_ONLY_ASSETS,
    Published,
    VersionedTables,
    WarehouseError,
    _version_dirs,
    read_segments,
)

# Asset folders that never hold document text or tokens: version ids only.
NO_TEXT_ASSETS = frozenset({SNAPSHOT})
# Snapshot metadata key -> asset, for the versions the current snapshot serves.
SNAPSHOT_KEYS = {"lexical_index": LEXICAL, "embeddings": "embeddings", "raptor_tree": "raptor_tree",
                 "relation_graph": "relation_graph"}

__all__ = ["PurgeReport", "hidden_now", "narrow_hidden_versions", "open_doc_history"]


@dataclass
class PurgeReport:
    """What one purge did: versions narrowed per asset, files made owner-only."""

    hidden: int = 0
    narrowed: dict[str, list[str]] = field(default_factory=dict)
    files: int = 0
    current_shared: int = 0
    stores: int = 0

    def metadata(self) -> dict[str, Any]:
        """Counts only (no document id: Dagster metadata names no hidden document)."""
        return {"purge_hidden_documents": self.hidden, "purge_versions_narrowed": sum(map(len, self.narrowed.values())),
                "purge_files_narrowed": self.files, "purge_current_shared": self.current_shared,
                "purge_stores_narrowed": self.stores}


def hidden_now(wh: VersionedTables, library: str, meta: dict[str, Any]) -> set[str]:
    """Documents the snapshot described by ``meta`` does not serve although they exist: an
    active RESTRICTED or withheld document of its chunks version, and a current raw row
    that is RESTRICTED, does not parse or has a label problem (fail closed)."""
    hidden = unserved_docs(wh, library, meta["chunks"]) | raw_hidden_doc_ids(wh, library, meta)
    hidden.discard(None)  # type: ignore[arg-type]
    return hidden


def open_doc_history(wh: VersionedTables, library: str, chunks_version: str, among: set[str]) -> set[str] | None:
    """Documents of ``among`` with at least one open row anywhere in the chunks history of
    ``chunks_version`` (None: that version is gone)."""
    try:
        pub = wh.get(CHUNKS, library, chunks_version)
        t = read_segments(pub, "chunks", columns=["doc_id", "sensitivity"])
    except (WarehouseError, OSError):
        return None
    t = t.filter(pc.is_in(t.column("doc_id"), value_set=pa.array(sorted(among), pa.string())))
    t = t.filter(pc.invert(restricted_mask(t.column("sensitivity").fill_null("INTERNAL"))))
    return set(pc.unique(t.column("doc_id")).to_pylist())


def narrow_hidden_versions(wh: VersionedTables, library: str, meta: dict[str, Any]) -> PurgeReport:
    """Make every older derived version that may hold a document hidden by the snapshot
    ``meta`` describes owner-only.

    Call it under the library's writer lock, just before that snapshot is published (a
    crash before the publish leaves the work to the next run, which repeats it);
    idempotent (a folder already owner-only is not read again)."""
    hidden = hidden_now(wh, library, meta)
    report = PurgeReport(hidden=len(hidden))
    if not hidden:
        return report
    current = _current_versions(wh, library, meta)
    history: dict[str, set[str] | None] = {}
    for asset_dir in sorted(p for p in wh.root.iterdir() if p.is_dir()):
        asset = asset_dir.name
        if asset.startswith(".") or asset in OWNER_ONLY_ASSETS or asset in NO_TEXT_ASSETS or asset == STORE_DIR:
            continue
        lib_dir = asset_dir / library
        if not lib_dir.is_dir():
            continue
        _narrow_asset(wh, asset, library, lib_dir, hidden, current.get(asset, set()), history, report)
    report.stores = _narrow_rerank_store(wh.root, library, hidden)
    return report


def _current_versions(wh: VersionedTables, library: str, meta: dict[str, Any]) -> dict[str, set[str]]:
    """asset -> versions never narrowed: those the snapshot serves, and the latest lexical
    version (the parent whose BM25 segments the next refresh links). Any other latest
    version (page images, a stale embeddings version) holding a hidden document is
    narrowed too: the next build writes its table whole or purges it, so no version to
    come references its files (and one that did would be owner-only: fail closed)."""
    out: dict[str, set[str]] = {}
    for key, asset in SNAPSHOT_KEYS.items():
        if meta.get(key) not in (None, "None"):
            out.setdefault(asset, set()).add(str(meta[key]))
    latest = wh.latest(LEXICAL, library)
    if latest is not None:
        out.setdefault(LEXICAL, set()).add(latest.version)
    return out


def _narrow_asset(wh: VersionedTables, asset: str, library: str, lib_dir: Path, hidden: set[str],
                  current: set[str], history: dict[str, set[str] | None], report: PurgeReport) -> None:
    keep_open: set[Path] = set()  # files the current versions use (by name)
    for v in current:
        keep_open |= _version_files(wh, asset, library, lib_dir, v)
    keep_inodes = {_inode(p) for p in keep_open if p.exists()}
    complete = set(wh.versions(asset, library))
    for vdir in sorted(_version_dirs(lib_dir)):
        v = vdir.name
        if v in current or _owner_only(vdir):
            continue
        if v in complete:
            pub = wh.get(asset, library, v)
            if not _may_hold(wh, library, pub, hidden, history):
                continue
            files = _version_files(wh, asset, library, lib_dir, v)
        elif _dangling_may_hold(vdir, hidden):  # a pruned version's segments, still referenced
            files = _own_files(vdir)
        else:
            continue
        narrowed = 0
        for f in sorted(files):
            if not f.exists():
                continue
            if f in keep_open or _inode(f) in keep_inodes:
                report.current_shared += 1
                continue
            if stat.S_IMODE(f.stat().st_mode) & 0o077:
                os.chmod(f, 0o600)
                narrowed += 1
        report.files += narrowed
        if not any((f in keep_open or _inode(f) in keep_inodes) for f in _own_files(vdir)):
            for d in [vdir, *(p for p in vdir.rglob("*") if p.is_dir())]:  # a segments folder too
                os.chmod(d, 0o700)
        report.narrowed.setdefault(asset, []).append(v)


def _version_files(wh: VersionedTables, asset: str, library: str, lib_dir: Path, version: str) -> set[Path]:
    """Every file of a version: its own folder's files and the segments its manifest names."""
    files = _own_files(lib_dir / version)
    try:
        pub = wh.get(asset, library, version)
    except WarehouseError:
        return files
    for name in pub.manifest.get("tables", {}):
        files.update(lib_dir / s for s in pub.segments(name))
    return files


def _own_files(vdir: Path) -> set[Path]:
    """The files in a version folder, those of a nested folder (``bm25-segments/``) included."""
    return {p for p in vdir.rglob("*") if p.is_file()} if vdir.is_dir() else set()


def _may_hold(wh: VersionedTables, library: str, pub: Published, hidden: set[str],
              history: dict[str, set[str] | None]) -> bool:
    """Whether a complete version may hold text or tokens of a ``hidden`` document."""
    chunks_version = pub.manifest.get("metadata", {}).get("chunks_version")
    if chunks_version:
        key = str(chunks_version)
        if key not in history:
            history[key] = open_doc_history(wh, library, key, hidden)
        if history[key] is not None:
            return bool(history[key])
    return _dangling_may_hold(pub.path, hidden, [pub.table_paths(n) for n in pub.manifest.get("tables", {})])


def _dangling_may_hold(vdir: Path, hidden: set[str], extra: Iterable[list[Path]] = ()) -> bool:
    """Judged by the document ids its Parquet files name (fail closed: True when none names any)."""
    paths = {p for p in vdir.iterdir() if p.suffix == ".parquet"} if vdir.is_dir() else set()
    for group in extra:
        paths.update(group)
    seen_ids = False
    for p in sorted(paths):
        try:
            names = pq.read_schema(p).names
            col = "doc_id" if "doc_id" in names else "chunk_id" if "chunk_id" in names else None
            if col is None:
                continue
            ids = pq.read_table(p, columns=[col]).column(col).to_pylist()
        except (OSError, pa.ArrowException):
            return True
        seen_ids = True
        docs = {str(x).split("#", 1)[0] for x in ids if x is not None} if col == "chunk_id" else set(ids)
        if docs & hidden:
            return True
    return not seen_ids


def _narrow_rerank_store(root: Path, library: str, hidden: set[str]) -> int:
    """The library's reranker vector store, owner-only when it holds a row of a hidden document."""
    try:
        path = store_path(root, library)
    except ValueError:
        return 0
    if not path.is_file() or not stat.S_IMODE(path.stat().st_mode) & 0o077:
        return 0
    try:
        con = duckdb.connect(str(path), read_only=True)
        try:
            ids = [r[0] for r in con.execute("SELECT DISTINCT chunk_id FROM rerank_vectors").fetchall()]
        finally:
            con.close()
    except duckdb.Error:
        ids = None  # unreadable (busy, damaged): fail closed
    if ids is not None and not {str(x).split("#", 1)[0] for x in ids} & hidden:
        return 0
    os.chmod(path, 0o600)
    return 1


def _owner_only(path: Path) -> bool:
    return not stat.S_IMODE(path.stat().st_mode) & 0o077


def _inode(path: Path) -> tuple[int, int]:
    st = path.stat()
    return st.st_dev, st.st_ino

