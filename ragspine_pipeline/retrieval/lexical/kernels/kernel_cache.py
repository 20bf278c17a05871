"""Keep numba's on-disk kernel cache in step with this package's sources.

Why: the kernels are compiled with ``cache=True`` and numba keys each cached function by
its *own* module file only. A kernel that inlines a function of another module (the router
calls the window kernel, the window kernel the block cursors) keeps the old machine code
after that other module is edited, and may then crash ("NRT_adapt_ndarray_to_python: descr
is NULL") or answer with the old code (#27). ``ensure_fresh`` stamps the cache folder with
the contents of every module of the lexical package (its sub-packages included) that uses
numba; when the stamp differs, it deletes the cached kernels (``*.nbi`` / ``*.nbc``) of every
``__pycache__`` under it before anything loads them, so the next call
compiles from the sources as they are. A fresh install starts empty and writes the stamp
once. Where ``__pycache__`` cannot be written (numba then caches elsewhere, and an installed
package's sources do not change) it does nothing.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from pathlib import Path

STAMP = "ragspine-kernels.stamp"
_done = False

__all__ = ["ensure_fresh", "source_stamp"]


def source_stamp(folder: Path, digest_size: int = 16) -> str:
    """A digest of the path and contents of each module under the folder (sub-packages
    included: the kernels sit in ``kernels/``, what they inline may sit beside it) that
    mentions numba: an edit elsewhere keeps the cache, and so does a checkout that only
    touches the files. The one stamp of the kernel sources: the tests' stamped cache
    folder (``tests/kernel_warmup.kernel_stamp``) is this over the whole engine."""
    h = hashlib.blake2b(digest_size=digest_size)
    for path in sorted(folder.rglob("*.py")):
        raw = path.read_bytes()
        if b"numba" in raw:
            h.update(f"{path.relative_to(folder).as_posix()}\0{len(raw)}\0".encode())
            h.update(raw)
    return h.hexdigest()


def ensure_fresh(folder: Path | None = None) -> bool:
    """Drop the cached kernels under ``folder`` (default: the lexical package) when its sources
    changed since the stamp was written. Returns whether it deleted anything; runs once
    per process for the default folder."""
    global _done
    default = folder is None
    if default and _done:
        return False
    src = Path(__file__).parent.parent if folder is None else folder
    cache = src / "__pycache__"
    dropped = False
    with contextlib.suppress(OSError):
        stamp = source_stamp(src)
        stamp_file = cache / STAMP
        try:
            current = stamp_file.read_text(encoding="ascii")
        except OSError:
            current = ""
        if current != stamp:
            for f in [*src.glob("**/__pycache__/*.nbi"), *src.glob("**/__pycache__/*.nbc")]:
                with contextlib.suppress(FileNotFoundError):
                    f.unlink()
                    dropped = True
            cache.mkdir(exist_ok=True)
            tmp = cache / f".{STAMP}.{os.getpid()}"
            tmp.write_text(stamp, encoding="ascii")
            os.replace(tmp, stamp_file)
    if default:
        _done = True
    return dropped
