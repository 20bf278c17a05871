"""Immutable, versioned Parquet tables published by atomic manifest rename.

Layout: ``<root>/<asset>/<library>/<version>/<table>.parquet`` plus
``<root>/<asset>/<library>/_manifest.json``, which names the published version. A write
goes to a temporary folder, is fsynced and renamed to its version folder; only then is
the manifest replaced (``os.replace``, atomic on POSIX). A crash at any point before the
manifest swap leaves the previous version published and readable; a half-written folder
is never referenced and is removed by ``prune``.

Versions are zero-padded integers (``v000001``), monotonic per (asset, library).
"""

from __future__ import annotations

import json
import os
import shutil
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

MANIFEST = "_manifest.json"
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

    def table_path(self, name: str) -> Path:
        return self.path / f"{name}.parquet"


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
        return sorted(p.name for p in d.iterdir() if p.is_dir() and p.name.startswith("v")
                      and p.name[1:].isdigit())

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
        meta = vdir / "_version.json"
        if not meta.exists():
            raise WarehouseError(f"{asset}/{library} has no version {version!r}")
        return Published(asset, library, version, vdir, json.loads(meta.read_text(encoding="utf-8")))

    def read(self, asset: str, library: str, table: str, version: str | None = None) -> pa.Table:
        pub = self.get(asset, library, version) if version else self.latest(asset, library)
        if pub is None:
            raise WarehouseError(f"nothing published yet for {asset}/{library}")
        path = pub.table_path(table)
        if not path.exists():
            raise WarehouseError(f"{asset}/{library}@{pub.version} has no table {table!r}")
        return pq.read_table(path)

    def write(self, asset: str, library: str, tables: Mapping[str, pa.Table],
              metadata: Mapping[str, Any] | None = None, *, publish: bool = True) -> Published:
        """Write a new immutable version; publish it (manifest swap) unless told not to."""
        d = self._dir(asset, library)
        d.mkdir(parents=True, exist_ok=True)
        existing = self.versions(asset, library)
        n = int(existing[-1][1:]) + 1 if existing else 1
        version = f"v{n:06d}"
        tmp = d / f".tmp-{version}-{uuid.uuid4().hex[:8]}"
        tmp.mkdir()
        manifest = {"asset": asset, "library": library, "version": version,
                    "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                    "tables": {}, "metadata": dict(metadata or {})}
        try:
            for name, table in tables.items():
                path = tmp / f"{name}.parquet"
                pq.write_table(table, path)
                with open(path, "rb") as fh:
                    os.fsync(fh.fileno())
                manifest["tables"][name] = {"rows": table.num_rows, "file": f"{name}.parquet"}
            write_json_atomic(tmp / "_version.json", manifest)
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
        """Delete all but the newest ``keep`` versions (never the published one nor ``protect``)."""
        if keep < 1:
            raise WarehouseError("keep must be >= 1")
        d = self._dir(asset, library)
        cur = self.latest(asset, library)
        protected = set(protect or ()) | ({cur.version} if cur else set())
        versions = self.versions(asset, library)
        doomed = [v for v in versions[:-keep] if v not in protected]
        for v in doomed:
            shutil.rmtree(d / v, ignore_errors=True)
        for p in d.glob(".tmp-*"):  # abandoned half-written versions
            shutil.rmtree(p, ignore_errors=True)
        return doomed
