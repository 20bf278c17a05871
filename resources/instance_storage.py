"""Dagster's run storage and compute logs, owner-only (#42 item 6).

Why: a Dagster instance under ``DAGSTER_HOME`` keeps every run's event log and the run,
index and schedule databases (SQLite) and the captured stdout/stderr of every run
(compute logs), written as the umask says: 0644 files under 0755 folders, readable by
every account on the machine. Nothing restricted is meant to reach them (messages name
files and kinds of problems, never content), but they are the operator's records, so
they get the treatment of the owner-only raw and chunk tables.

Dagster has no setting for these modes, and a umask around the run would also narrow
the published warehouse files that other accounts may read. So the storage folders are
narrowed where a run starts (the warehouse and retrieval resources' setup, for ``dagster
dev`` runs and in-process materializations alike; a folder Dagster would make only later,
such as the compute log folder on a first run, is made there at 0700) and again after an
in-process materialization (the files a run writes at its end): folders 0700, files 0600.
A folder at 0700 already makes every file in it unreachable by others, including the ones
Dagster writes later in the run. The instance's configuration files (``dagster.yaml``) are left as they are.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

# Folders of a local instance that hold run data (``$DAGSTER_HOME/<name>``).
STORAGE_DIRS = ("history", "storage", "schedules", "logs")

__all__ = ["STORAGE_DIRS", "instance_storage_paths", "secure_instance_storage"]


def instance_storage_paths(instance: Any) -> list[Path]:
    """The folders (and root-level databases) where ``instance`` keeps run data; empty for
    an instance with no local storage."""
    try:
        root = Path(instance.root_directory)
    except Exception:  # noqa: BLE001 - an instance without local artifact storage keeps nothing here
        return []
    paths = [root / name for name in STORAGE_DIRS]
    base = getattr(getattr(instance, "compute_log_manager", None), "_base_dir", None)
    if base:
        paths.append(Path(base))
    if root.is_dir():
        paths.extend(p for p in root.iterdir() if p.is_file() and p.suffix in (".db", ".db-wal", ".db-shm"))
    return list(dict.fromkeys(paths))


def secure_instance_storage(instance: Any) -> int:
    """Make ``instance``'s run storage and compute logs owner-only (folders 0700, files
    0600); returns how many modes it changed. Only paths this account owns are touched."""
    if instance is None:
        return 0
    changed = 0
    for top in instance_storage_paths(instance):
        if top.suffix not in (".db", ".db-wal", ".db-shm") and top.parent.is_dir():
            top.mkdir(mode=0o700, exist_ok=True)  # before Dagster makes it later in the run, as the umask says
        for path in _walk(top):
            changed += _narrow(path)
    return changed


def _walk(top: Path):
    if not top.exists() or top.is_symlink():
        return
    yield top
    if top.is_dir():
        for dirpath, dirnames, filenames in os.walk(top):
            for name in dirnames + filenames:
                p = Path(dirpath) / name
                if not p.is_symlink():
                    yield p


def _narrow(path: Path) -> int:
    try:
        st = path.lstat()
        if st.st_uid != os.getuid():
            return 0
        want = 0o700 if stat.S_ISDIR(st.st_mode) else 0o600
        if stat.S_IMODE(st.st_mode) == want:
            return 0
        os.chmod(path, want)
        return 1
    except FileNotFoundError:  # a file Dagster removed meanwhile
        return 0
