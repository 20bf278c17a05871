"""Finding a document's sidecars and the other names of its file (hard links).

A label is tied to a *path* (its sidecar is named after the file), so every other way a
path can reach the same text or the same label must be found, not guessed:

- **Sidecars named almost right.** ``<stem>.meta.json`` is the sidecar. A file in the same
  folder whose name matches it in any case (``K8.meta.json``, ``k10.META.JSON``) or that
  follows the ``<file>.<ext>.meta.json`` form (``k9.md.meta.json``) is that document's
  sidecar too — read, and a label problem (the document is RESTRICTED and reported),
  since the user meant it and a reader that skipped it would drop its label. A file named
  like a sidecar that belongs to no document is an *orphan*, reported on its own.
- **Hard links.** Names that share an inode (``st_dev``, ``st_ino``) are one file: a
  document takes the strictest label of all its names in the corpus, and a name in another
  library is refused like a symlink leaving the library.

Folder listings are cached per folder while the folder's mtime and ctime stay the same —
and only once the folder has been still for ``_STILL_NS`` (as git treats a "racy" index
entry): an entry added within the filesystem's timestamp tick cannot hide behind a cache.
"""

from __future__ import annotations

import os
import stat
import time
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

SIDECAR_SUFFIX = ".meta.json"
_STILL_NS = 2_000_000_000


def fold_name(name: str) -> str:
    """How names are compared for sidecars: NFKC, casefolded."""
    return unicodedata.normalize("NFKC", name).casefold()


_SUFFIX_FOLD = fold_name(SIDECAR_SUFFIX)


def is_sidecar_name(name: str) -> bool:
    """Whether ``name`` reads as a sidecar's (``.meta.json`` in any case or width)."""
    return fold_name(name).endswith(_SUFFIX_FOLD) and not name.startswith(".")


def sidecar_index(names: Iterable[str]) -> dict[str, tuple[str, ...]]:
    """Folded name -> the names in a folder listing that read as a sidecar's."""
    index: dict[str, list[str]] = {}
    for n in names:
        if is_sidecar_name(n):
            index.setdefault(fold_name(n), []).append(n)
    return {k: tuple(sorted(v)) for k, v in index.items()}


@lru_cache(maxsize=64)
def _cached_index(folder: str, key: tuple[int, int, int]) -> dict[str, tuple[str, ...]]:
    del key  # part of the cache key only
    return sidecar_index(os.listdir(folder))


def folder_sidecars(folder: Path) -> dict[str, tuple[str, ...]]:
    """``sidecar_index`` of ``folder`` (cached while it is unchanged and has been still)."""
    st = os.stat(folder)
    key = (st.st_ino, st.st_mtime_ns, st.st_ctime_ns)
    if time.time_ns() - max(st.st_mtime_ns, st.st_ctime_ns) < _STILL_NS:
        return sidecar_index(os.listdir(folder))
    return _cached_index(str(folder), key)


def sidecar_bases(path: Path) -> tuple[str, str]:
    """The two folded names a sidecar of ``path`` may have: ``<stem>.meta.json`` and
    ``<name>.meta.json``."""
    return fold_name(path.stem + SIDECAR_SUFFIX), fold_name(path.name + SIDECAR_SUFFIX)


@dataclass(frozen=True)
class Sidecars:
    """``canonical``: the ``<stem>.meta.json`` path (whether or not it exists);
    ``odd``: files in the folder named as this document's sidecar some other way."""

    canonical: Path
    odd: tuple[Path, ...] = ()


def find_sidecars(path: Path, view: CorpusView | None = None) -> Sidecars:
    """The sidecar of document ``path`` and every other file named as its sidecar
    (``view``: the listings of this read of the library, taken once per folder)."""
    canonical = path.with_name(path.stem + SIDECAR_SUFFIX)
    try:
        index = view.sidecar_index(path.parent) if view is not None else folder_sidecars(path.parent)
    except OSError:
        return Sidecars(canonical)
    odd = {path.with_name(n) for base in sidecar_bases(path) for n in index.get(base, ()) if n != canonical.name}
    return Sidecars(canonical, tuple(sorted(odd)))


def orphan_sidecars(folder: Path, documents: Iterable[Path]) -> list[Path]:
    """Files under ``folder`` named like a sidecar that no document in ``documents`` owns."""
    owned: set[tuple[str, str]] = set()
    for doc in documents:
        for base in sidecar_bases(doc):
            owned.add((str(doc.parent), base))
    out: list[Path] = []
    for d, dirs, files in os.walk(folder):
        dirs[:] = sorted(x for x in dirs if not x.startswith("."))
        out.extend(Path(d) / n for n in sorted(files) if is_sidecar_name(n) and (d, fold_name(n)) not in owned)
    return out


def file_id(path: Path) -> tuple[int, int, int] | None:
    """(st_dev, st_ino, st_nlink) of a regular file ``path`` (not following a final link), or None."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_nlink) if stat.S_ISREG(st.st_mode) else None


class CorpusView:
    """What one read of a library needs to know beyond each file: the sidecar names of each
    folder (listed once) and every name of every multiply-linked regular file under the
    corpus root, by inode (walked once, and only if a file has several links; only files
    with ``st_nlink > 1`` are recorded).

    Built once per read of a library (``corpus.load_library``, ``raw_documents``); a
    document read on its own builds its own.
    """

    def __init__(self, root: Path, suffixes: Iterable[str]):
        self.root = Path(root)
        self._suffixes = tuple(s.lower() for s in suffixes)
        self._by_inode: dict[tuple[int, int], list[Path]] | None = None
        self._indexes: dict[Path, dict[str, tuple[str, ...]]] = {}

    def sidecar_index(self, folder: Path) -> dict[str, tuple[str, ...]]:
        if folder not in self._indexes:
            self._indexes[folder] = sidecar_index(os.listdir(folder))
        return self._indexes[folder]

    def _walk(self) -> dict[tuple[int, int], list[Path]]:
        by_inode: dict[tuple[int, int], list[Path]] = {}
        for d, dirs, files in os.walk(self.root):
            dirs[:] = [x for x in dirs if not x.startswith(".")]
            for n in files:
                if n.startswith(".") or not n.lower().endswith(self._suffixes):
                    continue
                fid = file_id(Path(d) / n)
                if fid is not None and fid[2] > 1:
                    by_inode.setdefault(fid[:2], []).append(Path(d) / n)
        return by_inode

    def names(self, path: Path) -> list[Path]:
        """Every other name under the root of the file ``path`` is (none for a single link)."""
        fid = file_id(path)
        if fid is None or fid[2] < 2:
            return []
        if self._by_inode is None:
            self._by_inode = self._walk()
        return sorted(p for p in self._by_inode.get(fid[:2], []) if p != path)
