"""Immutable, versioned Parquet tables published by atomic manifest rename.

Layout: ``<root>/<asset>/<library>/<version>/<table>.parquet`` plus
``<root>/<asset>/<library>/_manifest.json``, which names the published version. A write
goes to a temporary folder, is fsynced and renamed to its version folder; only then is
the manifest replaced (``os.replace``, atomic on POSIX). A crash at any point before the
manifest swap leaves the previous version published and readable; a half-written folder
is never referenced and is removed by ``prune``.

Versions are zero-padded integers (``v000001``), monotonic per (asset, library).

One writer per library: every step that writes a library's tables holds
``VersionedTables.lock(library)`` (an ``flock`` on ``<root>/.locks/<library>.lock``), so
two refreshes of one library queue instead of racing; a second writer waits up to
``RAGSPINE_LOCK_TIMEOUT`` seconds, then fails with ``WarehouseBusy``. Readers take no
lock: they read immutable files named by a manifest.

Retention: ``prune`` keeps the newest ``keep`` versions and, whatever ``keep`` says,
every version that stopped being current less than ``retain_for`` seconds ago (default
one hour, as Delta Lake's VACUUM keeps files for a retention period), so a reader that
resolved a version — a notebook holding the catalog open — can finish reading it.

A table of a version is a list of Parquet *segments* (Iceberg/Delta-style): a version
may write a table whole (one new file), carry it from its parent unchanged
(``Inherit``), or add rows on top of the parent's segments (``Append``: only the new
rows are written; the parent's files are referenced, never copied or changed). So an
incremental refresh writes bytes in proportion to what changed, every version stays
immutable and readable on its own, and ``prune`` deletes a file only when no kept
version references it. Past ``max_segments`` an append compacts the table into one
file (optionally dropping rows that can no longer be read, e.g. tokens of withdrawn
chunks), which bounds read amplification at an amortized 1/max_segments rewrite.

Owner-only assets (``OWNER_ONLY_ASSETS``: raw documents and chunks) hold every
document's text, RESTRICTED ones included: they are the operator's source of truth.
Their folders are written mode 0700 and their files 0600 whatever the umask, and an
older, wider folder is narrowed on the next write (docs/security.md).
"""

from __future__ import annotations

import calendar
import fcntl
import functools
import inspect
import json
import os
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pyarrow as pa
import pyarrow.parquet as pq

from .. import settings

MANIFEST = "_manifest.json"
VERSION_META = "_version.json"
DEFAULT_MAX_SEGMENTS = 16
FAIL_ENV = "RAGSPINE_FAIL_BEFORE_PUBLISH"  # test hook: "<asset>" (or "catalog") or "*"
LOCK_TIMEOUT_ENV = "RAGSPINE_LOCK_TIMEOUT"
DEFAULT_LOCK_TIMEOUT_S = 600.0
DEFAULT_RETAIN_FOR_S = 3600.0
TMP_GRACE_S = 3600.0  # a temp folder younger than this may belong to a live writer
LOCKS_DIR = ".locks"
# Tables that hold restricted text (the raw and chunk tables): readable by the owner only.
OWNER_ONLY_ASSETS = frozenset({"raw_documents", "chunks"})


class WarehouseError(RuntimeError):
    """A table or version that was asked for does not exist, or a write was refused."""


class PublishInterrupted(WarehouseError):
    """Raised by the failure-injection hook after data files were written, before publish."""


class WarehouseBusy(WarehouseError):
    """Another writer holds the library's lock and did not release it in time."""


def fail_before_publish(asset: str, what: str) -> None:
    """The failure-injection hook (``RAGSPINE_FAIL_BEFORE_PUBLISH``), called just before a publish."""
    fail = settings.get(FAIL_ENV)
    if fail and fail in (asset, "*"):
        raise PublishInterrupted(f"injected failure before publishing {what}")


_held = threading.local()


@contextmanager
def writer_lock(path: Path, timeout: float | None = None) -> Iterator[None]:
    """An exclusive lock on ``path`` for this thread (re-entrant), waited for up to ``timeout`` s."""
    held: dict[str, int] = getattr(_held, "locks", None) or {}
    _held.locks = held
    key = str(path)
    if held.get(key):
        held[key] += 1
        try:
            yield
        finally:
            held[key] -= 1
        return
    timeout = settings.get(LOCK_TIMEOUT_ENV, timeout)  # the argument, else the variable, else 600 s
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        deadline = time.monotonic() + timeout
        delay = 0.005
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise WarehouseBusy(f"another writer holds {path.name} (waited {timeout:g} s; "
                                        f"{LOCK_TIMEOUT_ENV} sets the wait)") from None
                time.sleep(delay)
                delay = min(delay * 2, 0.2)
        held[key] = 1
        try:
            yield
        finally:
            held[key] = 0
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def library_step(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Run a pipeline step (a function of ``wh`` and ``library``) under the library's writer
    lock, so the state it reads is still the parent of what it writes."""
    sig = inspect.signature(fn)

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        bound = sig.bind(*args, **kwargs)
        with bound.arguments["wh"].lock(bound.arguments["library"]):
            return fn(*args, **kwargs)
    return wrapper


def lock_name(library: str) -> str:
    """The lock file name of a library (or of a cross-library step, e.g. ``.catalog``)."""
    return quote(library, safe="") + ".lock"


def created_epoch(manifest: Mapping[str, Any]) -> float:
    if "created_epoch" in manifest:
        return float(manifest["created_epoch"])
    return float(calendar.timegm(time.strptime(manifest["created_at"], "%Y-%m-%dT%H:%M:%SZ")))


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_json_atomic(path: Path, payload: Mapping[str, Any], *, private: bool = False) -> None:
    """Write ``payload`` as JSON to a temp file, fsync, rename over ``path``; ``private``:
    mode 0600 from the moment the file exists."""
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    with _create(tmp, private) as fh:
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
    compaction: it drops rows no reader of the new version can reach. ``now`` compacts
    whatever the segment count: rows that must not stay in any segment of the new
    version (an index row of a chunk turned RESTRICTED) leave at once.
    """

    table: pa.Table
    compact: Callable[[pa.Table], pa.Table] | None = None
    now: bool = False


@dataclass(frozen=True)
class Inherit:
    """The parent version's table, carried unchanged (its files are referenced)."""


class VersionedTables:
    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)

    def lock(self, library: str, timeout: float | None = None):
        """The one-writer lock of ``library`` (a context manager; re-entrant in one thread)."""
        return writer_lock(self.root / LOCKS_DIR / lock_name(library), timeout)

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
        (the version the caller read its state from). Holds the library's writer lock; a
        step that reads state and then writes holds it around both.
        """
        with self.lock(library):
            return self._write(asset, library, tables, metadata, publish=publish, parent=parent,
                               max_segments=max_segments)

    def _write(self, asset: str, library: str, tables: Mapping[str, pa.Table | Append | Inherit],
               metadata: Mapping[str, Any] | None, *, publish: bool, parent: Published | None,
               max_segments: int) -> Published:
        d = self._dir(asset, library)
        d.mkdir(parents=True, exist_ok=True)
        private = asset in OWNER_ONLY_ASSETS
        if private:  # the asset folder first: from here on nothing below is reachable by others
            for folder in (d.parent, d):
                os.chmod(folder, 0o700)
        version = self._next_version(d)
        tmp = d / f".tmp-{version}-{uuid.uuid4().hex[:8]}"
        tmp.mkdir(mode=0o700 if private else 0o777)
        now = time.time()
        manifest = {"asset": asset, "library": library, "version": version,
                    "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now)), "created_epoch": now,
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
                if isinstance(spec, Append) and (spec.now or spec.table.num_rows and len(files) + 1 > max_segments):
                    whole = pa.concat_tables([read_segments(parent, name), spec.table], promote_options="permissive")
                    spec = spec.compact(whole) if spec.compact else whole  # compaction: one file again
                    files, rows = [], 0
                if not (isinstance(spec, Inherit) or isinstance(spec, Append) and spec.table.num_rows == 0):
                    table = spec.table if isinstance(spec, Append) else spec
                    fname = f"{name}.parquet"
                    written += _write_parquet(table, tmp / fname, private=private)
                    files = files + [f"{version}/{fname}"]
                    rows += table.num_rows
                manifest["tables"][name] = {"rows": rows, "files": files}
            manifest["bytes_written"] = written
            write_json_atomic(tmp / VERSION_META, manifest, private=private)
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
        fail_before_publish(pub.asset, f"{pub.asset}/{pub.library}@{pub.version}")
        write_json_atomic(self._dir(pub.asset, pub.library) / MANIFEST, pub.manifest,
                          private=pub.asset in OWNER_ONLY_ASSETS)

    def prune(self, asset: str, library: str, keep: int, protect: set[str] | None = None,
              retain_for: float = DEFAULT_RETAIN_FOR_S) -> list[str]:
        """Delete all but the newest ``keep`` versions (never the published one nor ``protect``,
        nor one that stopped being current less than ``retain_for`` seconds ago).

        A pruned version disappears (its ``_version.json`` goes first); its data files are
        deleted only when no kept version references them as segments. Runs under the
        library's writer lock.
        """
        if keep < 1:
            raise WarehouseError("keep must be >= 1")
        with self.lock(library):
            return self._prune(asset, library, keep, protect, retain_for)

    def _prune(self, asset: str, library: str, keep: int, protect: set[str] | None, retain_for: float) -> list[str]:
        d = self._dir(asset, library)
        if not d.is_dir():
            return []
        cur = self.latest(asset, library)
        protected = set(protect or ()) | ({cur.version} if cur else set())
        versions = self.versions(asset, library)
        # A version stopped being current when the next one was written.
        cutoff = time.time() - retain_for
        superseded = {v: created_epoch(self.get(asset, library, nxt).manifest)
                      for v, nxt in zip(versions, versions[1:], strict=False)}
        doomed = [v for v in versions[:-keep] if v not in protected and superseded.get(v, cutoff + 1) <= cutoff]
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
        stale = time.time() - TMP_GRACE_S
        for p in d.glob(".tmp-*"):  # half-written versions abandoned by a crashed writer
            try:
                if p.stat().st_mtime < stale:
                    shutil.rmtree(p, ignore_errors=True)
            except FileNotFoundError:
                pass
        return doomed


def _version_dirs(d: Path) -> list[Path]:
    """Every ``v<digits>`` folder, complete versions and pruned ones still holding segments."""
    return [p for p in d.iterdir() if p.is_dir() and p.name.startswith("v") and p.name[1:].isdigit()]


def _create(path: Path, private: bool):
    """A new text file opened for writing: mode 0600 when ``private``, else as the umask says."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if private else 0o666)
    if private:
        os.fchmod(fd, 0o600)  # O_CREAT's mode only applies to a file that did not exist
    return os.fdopen(fd, "w", encoding="utf-8")


def _write_parquet(table: pa.Table, path: Path, *, private: bool = False) -> int:
    if private:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600))
        os.chmod(path, 0o600)
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
    return parts[0] if len(parts) == 1 else pa.concat_tables(parts, promote_options="permissive")
