"""API keys: a key file of hashes, each key scoped to libraries.

The file holds only ``sha256`` digests. A key is 256 random bits (``secrets``), so a fast
hash is enough: no dictionary or brute force can reach it, and a slow KDF would cost every
request milliseconds for nothing. A key reads ``rsk_<id>_<secret>``: the id picks the one
entry to compare (in constant time), and appears in access logs where the key never does.

``KeyRing`` re-reads the file when its size or mtime changes, so ``keys revoke`` /
``rotate`` take effect on the next request without a restart. ``keys create`` never checks
that a library exists: it would reveal which ones do.
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import json
import logging
import os
import secrets
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import settings
from ..errors_format import OneLineParser, fail

log = logging.getLogger("ragspine.service")

KEYS_FILE_ENV = "RAGSPINE_KEYS_FILE"
PREFIX = "rsk_"
FORMAT = 1


class KeyFileError(ValueError):
    """The key file cannot be read or written, or names no such key id."""


@dataclass(frozen=True)
class Principal:
    """Who is asking: a key id (``local`` without a key file) and the libraries it may read
    (None: every published library)."""

    key_id: str
    libraries: frozenset[str] | None

    def may_read(self, library: str) -> bool:
        return self.libraries is None or library in self.libraries


LOCAL = Principal("local", None)


@dataclass
class KeyEntry:
    id: str
    hash: str
    libraries: list[str]
    created: float
    revoked: bool = False

    def public(self) -> dict[str, Any]:
        """What ``keys list`` shows: never the hash."""
        return {"id": self.id, "libraries": list(self.libraries), "created": self.created, "revoked": self.revoked}


def digest(key: str) -> str:
    return "sha256:" + hashlib.sha256(key.encode("utf-8")).hexdigest()


def new_key() -> tuple[str, str]:
    """(key id, full key)."""
    kid = secrets.token_hex(6)
    return kid, f"{PREFIX}{kid}_{secrets.token_urlsafe(32)}"


def key_id_of(key: str) -> str | None:
    if not key.startswith(PREFIX):
        return None
    kid, sep, secret = key[len(PREFIX):].partition("_")
    return kid if sep and kid and secret else None


def read_entries(path: Path) -> list[KeyEntry]:
    if not path.exists():
        return []
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return [KeyEntry(id=str(e["id"]), hash=str(e["hash"]), libraries=[str(x) for x in e["libraries"]],
                         created=float(e.get("created", 0)), revoked=bool(e.get("revoked", False)))
                for e in data["keys"]]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise KeyFileError(f"key file {path}: unreadable ({type(exc).__name__}: {exc})") from None


def write_entries(path: Path, entries: list[KeyEntry]) -> None:
    """Atomic (temp file + rename), owner-only: a reader sees the old file or the new one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {"format": FORMAT, "keys": [{**e.public(), "hash": e.hash} for e in entries]}
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        json.dump(payload, fh, indent=2)
        fh.write("\n")
    os.replace(tmp, path)


def create_key(path: Path, libraries: list[str]) -> tuple[str, str]:
    """A new key scoped to ``libraries`` appended to the file: (id, key). The key is not stored."""
    if not libraries:
        raise KeyFileError("a key needs at least one --library")
    entries = read_entries(path)
    kid, key = new_key()
    entries.append(KeyEntry(kid, digest(key), sorted(set(libraries)), time.time()))
    write_entries(path, entries)
    return kid, key


def _find(entries: list[KeyEntry], kid: str) -> KeyEntry:
    for e in entries:
        if e.id == kid:
            return e
    raise KeyFileError(f"no key with id {kid!r}")


def revoke_key(path: Path, kid: str) -> None:
    entries = read_entries(path)
    _find(entries, kid).revoked = True
    write_entries(path, entries)


def rotate_key(path: Path, kid: str) -> tuple[str, str]:
    """Revoke ``kid`` and create a key with the same scope: (new id, new key)."""
    entries = read_entries(path)
    old = _find(entries, kid)
    if old.revoked:
        raise KeyFileError(f"key {kid!r} is revoked; create a new one")
    old.revoked = True
    new_id, key = new_key()
    entries.append(KeyEntry(new_id, digest(key), list(old.libraries), time.time()))
    write_entries(path, entries)
    return new_id, key


class KeyRing:
    """The key file as the service reads it: reloaded when it changes (size, mtime)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._stamp: tuple[int, int] | None = None
        self._by_id: dict[str, KeyEntry] = {}
        self.reload_if_changed()

    def _current_stamp(self) -> tuple[int, int] | None:
        try:
            st = self.path.stat()
        except FileNotFoundError:
            return None
        return (st.st_mtime_ns, st.st_size)

    def reload_if_changed(self) -> None:
        stamp = self._current_stamp()
        if stamp == self._stamp and self._stamp is not None:
            return
        with self._lock:
            try:
                entries = read_entries(self.path) if stamp is not None else []
            except KeyFileError as exc:  # fail closed: no key is valid until the file reads again
                log.error("%s; every request is refused until it is fixed", exc)
                entries = []
            self._by_id = {e.id: e for e in entries if not e.revoked}
            self._stamp = stamp

    def authenticate(self, key: str | None) -> Principal | None:
        """The key's principal, or None (absent, malformed, unknown, revoked)."""
        if not key:
            return None
        self.reload_if_changed()
        kid = key_id_of(key)
        entry = self._by_id.get(kid or "")
        # Compare a digest even for an unknown id, so both answers take the same time.
        expected = entry.hash if entry is not None else digest(PREFIX + "unknown")
        if not hmac.compare_digest(digest(key), expected) or entry is None:
            return None
        return Principal(entry.id, frozenset(entry.libraries))


def bearer_key(authorization: str | None) -> str | None:
    if not authorization:
        return None
    scheme, _, value = authorization.partition(" ")
    return value.strip() or None if scheme.lower() == "bearer" else None


# ------------------------------------------------------------------ ragspine keys
def _parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="ragspine keys", description="API keys of `ragspine serve`, scoped to libraries")
    sub = p.add_subparsers(dest="action", required=True)
    c = sub.add_parser("create", help="create a key; the key is printed once, alone on the last line")
    c.add_argument("--library", action="append", required=True, help="a library the key may read (repeatable)")
    sub.add_parser("list", help="key ids, scopes and states (never a key or a hash)")
    for name in ("revoke", "rotate"):
        sp = sub.add_parser(name, help=f"{name} a key by id")
        sp.add_argument("id")
    for sp in sub.choices.values():
        sp.add_argument("--keys-file", default=None, help=f"the key file (default: {KEYS_FILE_ENV})")
    return p


def keys_main(argv: list[str] | None = None) -> int:
    """``ragspine keys create|list|revoke|rotate``: exit 0, or 2 with one line on stderr."""
    try:
        args = _parser().parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    raw = args.keys_file or settings.get(KEYS_FILE_ENV)
    if not raw:
        return fail("keys", f"--keys-file: required (or {KEYS_FILE_ENV})")
    path = Path(raw)
    try:
        if args.action == "create":
            kid, key = create_key(path, args.library)
            print(f"created key {kid} for {', '.join(sorted(set(args.library)))} in {path}; it is shown only once:")
            print(key)
        elif args.action == "list":
            for e in read_entries(path):
                print(f"{e.id}\t{'revoked' if e.revoked else 'active'}\t{','.join(e.libraries)}")
        elif args.action == "revoke":
            revoke_key(path, args.id)
            print(f"revoked key {args.id}")
        else:
            kid, key = rotate_key(path, args.id)
            print(f"key {args.id} revoked; its replacement {kid} is shown only once:")
            print(key)
    except KeyFileError as exc:
        return fail("keys", f"--keys-file: {exc}" if str(exc).startswith("key file ") else f"{args.action}: {exc}")
    return 0


__all__ = ["KEYS_FILE_ENV", "LOCAL", "KeyEntry", "KeyFileError", "KeyRing", "Principal", "bearer_key", "create_key",
           "digest", "keys_main", "read_entries", "revoke_key", "rotate_key"]
