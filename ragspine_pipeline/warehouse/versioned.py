"""Immutable, versioned Parquet tables published by atomic manifest rename.

Layout: ``<root>/<asset>/<library>/<version>/<table>.parquet`` plus
``<root>/<asset>/<library>/_manifest.json``, which names the published version. A write
goes to a temporary folder, is fsynced and renamed to its version folder; only then is
the manifest replaced (``os.replace``, atomic on POSIX). A crash at any point before the
manifest swap leaves the previous version published and readable; a half-written folder
is never referenced and is removed by ``prune``.

Versions are zero-padded integers (``v000001``), monotonic per (asset, library).

A table of a version is a list of Parquet *segments* (Iceberg/Delta-style): a version
may write a table whole (one new file), carry it from its parent unchanged
(``Inherit``), or add rows on top of the parent's segments (``Append``: only the new
rows are written; the parent's files are referenced, never copied or changed). So an
incremental refresh writes bytes in proportion to what changed, every version stays
immutable and readable on its own, and ``prune`` deletes a file only when no kept
version references it. Past ``max_segments`` an append compacts the table into one
file (optionally dropping rows that can no longer be read, e.g. tokens of withdrawn
chunks), which bounds read amplification at an amortized 1/max_segments rewrite.
"""

from __future__ import annotations

import json
import os
import shutil
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

MANIFEST = "_manifest.json"
VERSION_META = "_version.json"
DEFAULT_MAX_SEGMENTS = 16
FAIL_ENV = "RAGSPINE_FAIL_BEFORE_PUBLISH"  # test hook: "<asset>" or "*"


class WarehouseError(RuntimeError):
    """A table or version that was asked for does not exist, or a write was refused."""


class PublishInterrupted(WarehouseError):
    """Raised by the failure-injection hook after data files were written, before publish."""


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_json_atomic(path: Path, payload: Mapping[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(payload, fh, ensure_ascii=False, indent=2, default=str)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


@dataclass(frozen=True)
class Published:
    asset: str
    library: str
    version: str
    path: Path
    manifest: dict[str, Any]

    def segments(self, name: str) -> list[str]:
        """The table's files, relative to the asset/library folder, oldest first."""
        entry = self.manifest["tables"].get(name)
        if entry is None:
            raise WarehouseError(f"{self.asset}/{self.library}@{self.version} has no table {name!r}")
        if "files" in entry:
            return list(entry["files"])
        return [f"{self.version}/{entry.get('file', name + '.parquet')}"]  # single-file manifests

    def table_paths(self, name: str) -> list[Path]:
        base = self.path.parent
        return [base / f for f in self.segments(name)]

    def table_path(self, name: str) -> Path:
        """The one file of a single-segment table (compacted or written whole)."""
        paths = self.table_paths(name)
        if len(paths) != 1:
            raise WarehouseError(f"{self.asset}/{self.library}@{self.version}: table {name!r} has "
                                 f"{len(paths)} segments; use table_paths()")
        return paths[0]

    def rows(self, name: str) -> int:
        return int(self.manifest["tables"][name]["rows"])


@dataclass(frozen=True)
class Append:
    """Rows added on top of the parent version's segments of the same table.

    ``compact`` (optional) filters the whole table when the segment count forces a
    compaction: it drops rows no reader of the new version can reach.
    """

    table: pa.Table
    compact: Callable[[pa.Table], pa.Table] | None = None


@dataclass(frozen=True)
class Inherit:
    """The parent version's table, carried unchanged (its files are referenced)."""


class VersionedTables:
    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)

    def _dir(self, asset: str, library: str) -> Path:
        if not asset or not library or "/" in asset or "/" in library or library.startswith("."):
            raise WarehouseError(f"invalid asset/library name: {asset!r}/{library!r}")
        return self.root / asset / library

    def versions(self, asset: str, library: str) -> list[str]:
        d = self._dir(asset, library)
        if not d.is_dir():
            return []
        return sorted(p.name for p in _version_dirs(d) if (p / VERSION_META).exists())

    def _next_version(self, d: Path) -> str:
        # Every version folder counts, pruned ones that still hold referenced segments too.
        nums = [int(p.name[1:]) for p in _version_dirs(d)]
        return f"v{(max(nums) + 1 if nums else 1):06d}"

    def latest(self, asset: str, library: str) -> Published | None:
        d = self._dir(asset, library)
        mpath = d / MANIFEST
        if not mpath.exists():
            return None
        manifest = json.loads(mpath.read_text(encoding="utf-8"))
        return Published(asset, library, manifest["version"], d / manifest["version"], manifest)

    def get(self, asset: str, library: str, version: str) -> Published:
        d = self._dir(asset, library)
        vdir = d / version
        meta = vdir / VERSION_META
        if not meta.exists():
            raise WarehouseError(f"{asset}/{library} has no version {version!r}")
        return Published(asset, library, version, vdir, json.loads(meta.read_text(encoding="utf-8")))

    def read(self, asset: str, library: str, table: str, version: str | None = None, *,
             columns: list[str] | None = None) -> pa.Table:
        """The whole table of a version (its segments concatenated, oldest first)."""
        pub = self.get(asset, library, version) if version else self.latest(asset, library)
        if pub is None:
            raise WarehouseError(f"nothing published yet for {asset}/{library}")
        return read_segments(pub, table, columns=columns)

    def write(self, asset: str, library: str, tables: Mapping[str, pa.Table | Append | Inherit],
              metadata: Mapping[str, Any] | None = None, *, publish: bool = True,
              parent: Published | None = None, max_segments: int = DEFAULT_MAX_SEGMENTS) -> Published:
        """Write a new immutable version; publish it (manifest swap) unless told not to.

        A plain Arrow table is written whole; ``Append``/``Inherit`` build on ``parent``
        (the version the caller read its state from).
        """
        d = self._dir(asset, library)
        d.mkdir(parents=True, exist_ok=True)
        version = self._next_version(d)
        tmp = d / f".tmp-{version}-{uuid.uuid4().hex[:8]}"
        tmp.mkdir()
        manifest = {"asset": asset, "library": library, "version": version,
                    "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                    "parent": parent.version if parent else None,
                    "tables": {}, "metadata": dict(metadata or {})}
        written = 0
        try:
            for name, spec in tables.items():
                files: list[str] = []
                rows = 0
                if isinstance(spec, Inherit | Append):
                    if parent is None:
                        raise WarehouseError(f"{asset}/{library}: {type(spec).__name__} of {name!r} needs a parent")
                    files, rows = parent.segments(name), parent.rows(name)
                if isinstance(spec, Append) and spec.table.num_rows and len(files) + 1 > max_segments:
                    whole = pa.concat_tables([read_segments(parent, name), spec.table], promote_options="default")
                    spec = spec.compact(whole) if spec.compact else whole  # compaction: one file again
                    files, rows = [], 0
                if not (isinstance(spec, Inherit) or isinstance(spec, Append) and spec.table.num_rows == 0):
                    table = spec.table if isinstance(spec, Append) else spec
                    fname = f"{name}.parquet"
                    written += _write_parquet(table, tmp / fname)
                    files = files + [f"{version}/{fname}"]
                    rows += table.num_rows
                manifest["tables"][name] = {"rows": rows, "files": files}
            manifest["bytes_written"] = written
            write_json_atomic(tmp / VERSION_META, manifest)
            os.rename(tmp, d / version)
            _fsync_dir(d)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        pub = Published(asset, library, version, d / version, manifest)
        if publish:
            self.publish(pub)
        return pub

    def publish(self, pub: Published) -> None:
        fail = os.environ.get(FAIL_ENV, "")
        if fail and fail in (pub.asset, "*"):
            raise PublishInterrupted(f"injected failure before publishing {pub.asset}/{pub.library}@{pub.version}")
        write_json_atomic(self._dir(pub.asset, pub.library) / MANIFEST, pub.manifest)

    def prune(self, asset: str, library: str, keep: int, protect: set[str] | None = None) -> list[str]:
        """Delete all but the newest ``keep`` versions (never the published one nor ``protect``).

        A pruned version disappears (its ``_version.json`` goes first); its data files are
        deleted only when no kept version references them as segments.
        """
        if keep < 1:
            raise WarehouseError("keep must be >= 1")
        d = self._dir(asset, library)
        cur = self.latest(asset, library)
        protected = set(protect or ()) | ({cur.version} if cur else set())
        versions = self.versions(asset, library)
        doomed = [v for v in versions[:-keep] if v not in protected]
        referenced: set[str] = set()
        for v in versions:  # the kept versions (the published one among them)
            if v not in doomed:
                pub = self.get(asset, library, v)
                for name in pub.manifest["tables"]:
                    referenced.update(pub.segments(name))
        for v in doomed:
            (d / v / VERSION_META).unlink(missing_ok=True)
        for vdir in _version_dirs(d):
            if (vdir / VERSION_META).exists():
                continue
            for f in vdir.iterdir():
                if f"{vdir.name}/{f.name}" not in referenced:
                    f.unlink(missing_ok=True)
            if not any(vdir.iterdir()):
                vdir.rmdir()
        for p in d.glob(".tmp-*"):  # abandoned half-written versions
            shutil.rmtree(p, ignore_errors=True)
        return doomed


def _version_dirs(d: Path) -> list[Path]:
    """Every ``v<digits>`` folder, complete versions and pruned ones still holding segments."""
    return [p for p in d.iterdir() if p.is_dir() and p.name.startswith("v") and p.name[1:].isdigit()]


def _write_parquet(table: pa.Table, path: Path) -> int:
    pq.write_table(table, path)
    with open(path, "rb") as fh:
        os.fsync(fh.fileno())
    return path.stat().st_size


def read_segments(pub: Published, table: str, *, columns: list[str] | None = None) -> pa.Table:
    """Concatenate a table's segments (oldest first); ``columns`` reads only those."""
    paths = pub.table_paths(table)
    for p in paths:
        if not p.exists():
            raise WarehouseError(f"{pub.asset}/{pub.library}@{pub.version}: segment {p} of {table!r} is missing")
    parts = [pq.read_table(p, columns=columns) for p in paths]
    if not parts:
        raise WarehouseError(f"{pub.asset}/{pub.library}@{pub.version}: table {table!r} has no segments")
    return parts[0] if len(parts) == 1 else pa.concat_tables(parts, promote_options="default")
