"""numba's kernel cache is dropped when a kernel module (or one it inlines) changes (#27)."""

from __future__ import annotations

from pathlib import Path

import ragspine_pipeline.retrieval.lexical as lexical
from ragspine_pipeline.retrieval.lexical.kernels.kernel_cache import (
    STAMP,
    ensure_fresh,
    source_stamp,
)


def _cached(folder: Path) -> list[str]:
    return sorted(p.name for p in (folder / "__pycache__").glob("*.nb[ic]"))


def _fill(folder: Path) -> None:
    for name in ("k.search-10.py311.nbi", "k.search-10.py311.1.nbc"):
        (folder / "__pycache__" / name).write_bytes(b"x")


def test_cached_kernels_are_dropped_exactly_when_a_numba_module_changes(tmp_path):
    (tmp_path / "__pycache__").mkdir()
    kernel, callee, other = tmp_path / "k.py", tmp_path / "callee.py", tmp_path / "plain.py"
    kernel.write_text("import numba\n")
    callee.write_text("from numba import njit\n")
    other.write_text("x = 1\n")
    _fill(tmp_path)
    assert ensure_fresh(tmp_path) and _cached(tmp_path) == []  # no stamp yet: a fresh start
    assert (tmp_path / "__pycache__" / STAMP).read_text() == source_stamp(tmp_path)
    _fill(tmp_path)
    assert not ensure_fresh(tmp_path) and len(_cached(tmp_path)) == 2  # unchanged: kept
    other.write_text("x = 2\n")
    assert not ensure_fresh(tmp_path) and len(_cached(tmp_path)) == 2  # not a kernel module
    callee.write_text("from numba import njit  # edited\n")
    assert ensure_fresh(tmp_path) and _cached(tmp_path) == []  # the callee changed: all dropped


def test_the_package_stamps_its_own_cache_when_imported():
    folder = Path(lexical.__file__).parent
    stamp = folder / "__pycache__" / STAMP
    assert stamp.read_text() == source_stamp(folder)  # importing the package wrote it
