"""Compile the BM25 kernels once per test run, into a numba cache that outlives the clone.

Why (#46 item 4): numba caches each ``cache=True`` kernel next to its source
(``__pycache__``), so every fresh clone compiles every kernel again, and the README's two
xdist workers each compile the same kernels at the same time. Here:

- ``use_stamped_cache()`` points numba at ``~/.cache/ragspine/numba/<stamp>`` (or
  ``$SPINE_TEST_NUMBA_CACHE/<stamp>``), where ``<stamp>`` hashes every engine module that
  mentions numba: an edit to any kernel (or a function one inlines, #27) starts a new folder,
  an unchanged tree reuses the old one. numba's own index is keyed by a content hash of the
  source file (numba >= 0.61), not its mtime, so a checkout's new mtimes do not matter; the
  locator registered here also names the sub-folder by the module's path inside the
  package instead of numba's hash of the absolute folder, so a clone at another path finds
  the same files. Subprocesses inherit ``NUMBA_CACHE_DIR`` (same stamp folder, numba's own
  per-path sub-folder).
- ``warm()`` opens a tiny index of each layout and runs every kind of query, so the kernels
  (which warm their own signatures when loaded) are compiled and written to the cache
  before the workers start: ``.ci/run`` runs ``python -m tests.kernel_warmup`` first, and
  the session fixture in ``tests/conftest.py`` calls it when pytest runs alone.

Everything fails open: an unwritable home, an old numba or a warm that raises leaves
numba's default cache in place and the tests compile as before.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from pathlib import Path

from ragspine_pipeline.retrieval.lexical.kernels.kernel_cache import source_stamp

PACKAGE = Path(__file__).resolve().parents[1] / "ragspine_pipeline"
ENV_ROOT = "SPINE_TEST_NUMBA_CACHE"  # not RAGSPINE_*: the tests clear those

__all__ = ["kernel_stamp", "use_stamped_cache", "warm"]


def kernel_stamp(package: Path = PACKAGE) -> str:
    """A digest of the path and contents of every module under ``package`` that mentions
    numba (the kernels and what they inline), wherever a later layout puts them: the
    engine's own stamp (``kernel_cache.source_stamp``, which imports no numba) over the
    whole package, 10 bytes as the cache folders are named."""
    return source_stamp(package, digest_size=10)


def _cache_root() -> Path:
    base = os.environ.get(ENV_ROOT) or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "ragspine", "numba")
    return Path(base)


def _register_locator(package: Path) -> None:
    """Put a locator first in numba's list that names the cache sub-folder by the module's
    path inside the package (numba's hashes the absolute folder, which differs per clone)."""
    from numba.core import caching

    base = caching.UserProvidedCacheLocator
    impl = getattr(caching, "CacheImpl", None) or caching._CacheImpl  # renamed in numba 0.6x
    if any(getattr(c, "_ragspine", False) for c in impl._locator_classes):
        return

    class PackageRelativeLocator(base):  # type: ignore[misc, valid-type]
        _ragspine = True

        @classmethod
        def get_suitable_cache_subpath(cls, py_file: str) -> str:
            rel = Path(os.path.abspath(py_file)).parent.relative_to(package)
            return "_".join(("ragspine_pipeline", *rel.parts))

        @classmethod
        def from_function(cls, py_func, py_file):  # noqa: ANN001, ANN206 - numba's signature
            try:
                Path(os.path.abspath(py_file)).relative_to(package)
            except ValueError:
                return None  # not ours: numba's usual locators decide
            return super().from_function(py_func, py_file)

    impl._locator_classes = [PackageRelativeLocator, *impl._locator_classes]


def use_stamped_cache(package: Path = PACKAGE) -> Path | None:
    """Point numba's cache at the stamped folder for this process and its children. Call
    before the kernel modules are imported. Returns the folder, or None (numba's default
    cache stays) when it cannot be used."""
    if os.environ.get("NUMBA_CACHE_DIR") and not os.environ.get(ENV_ROOT + "_SET"):
        return None  # the developer chose a cache folder: keep it
    try:
        folder = _cache_root() / kernel_stamp(package)
        folder.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=folder).close()  # writable, or numba would not cache
        from numba.core import config

        _register_locator(package)
    except (OSError, ImportError, AttributeError):
        return None
    os.environ["NUMBA_CACHE_DIR"] = str(folder)
    os.environ[ENV_ROOT + "_SET"] = "1"  # ours: a child process may compute it again
    config.CACHE_DIR = str(folder)  # numba reads the variable once, at its import
    return folder


def _prune(stamp_dir: Path, keep: float, mine: set[str]) -> None:
    """Drop what other runs left: sub-folders numba made for other absolute paths (an
    installed wheel's temporary site-packages, an old clone) idle for an hour, and other
    stamps' folders idle for two weeks. A folder still in use is only compiled again."""
    import shutil

    old = [d for d in stamp_dir.iterdir() if d.is_dir() and not d.name.startswith("ragspine_pipeline_")
           and d.name not in mine and d.stat().st_mtime < keep]
    old += [d for d in stamp_dir.parent.iterdir() if d.is_dir() and d != stamp_dir
            and d.stat().st_mtime < keep - 14 * 86400]
    for d in old:
        shutil.rmtree(d, ignore_errors=True)


def _mirror_for_children(package: Path = PACKAGE) -> None:
    """Copy the warmed files to the sub-folder numba's own locator uses for this clone:
    subprocess tests inherit ``NUMBA_CACHE_DIR`` but not the locator, and find them there."""
    import shutil

    from numba.core import caching, config

    if not config.CACHE_DIR:
        return
    root = Path(config.CACHE_DIR)
    dirs = {p.parent for p in package.rglob("*.py") if b"numba" in p.read_bytes()}
    mine = {caching.UserProvidedCacheLocator.get_suitable_cache_subpath(str(d / "x.py")) for d in dirs}
    mine.add(caching.UserProvidedCacheLocator.get_suitable_cache_subpath(__file__))  # tests' own
    _prune(root, keep=time.time() - 3600, mine=mine)
    for d in dirs:
        src = root / "_".join(("ragspine_pipeline", *d.relative_to(package).parts))
        dst = root / caching.UserProvidedCacheLocator.get_suitable_cache_subpath(str(d / "x.py"))
        if not src.is_dir():
            continue
        dst.mkdir(exist_ok=True)
        for f in src.iterdir():
            target = dst / f.name
            if not target.exists() or target.stat().st_size != f.stat().st_size:
                shutil.copy2(f, target)


def _warm_layouts(tmp: Path) -> None:
    import numpy as np

    from ragspine_pipeline.retrieval.lexical.index.filter import PackedFilter
    from ragspine_pipeline.retrieval.lexical.index.mapped import open_index
    from ragspine_pipeline.retrieval.lexical.index.postings import count_postings
    from ragspine_pipeline.retrieval.lexical.refresh.publish import write_layout

    rng = np.random.default_rng(0)
    vocab = [f"t{i}" for i in range(300)]
    docs = [[vocab[int(j)] for j in rng.zipf(1.3, 40) % 300] for _ in range(600)]
    queries = [docs[i][:3] for i in range(0, 600, 60)]
    raw, _ = count_postings(docs)
    mask = rng.random(len(docs)) < 0.5
    few = np.flatnonzero(rng.random(len(docs)) < 0.02)
    for layout in ("plain", "packed"):
        ix = open_index(write_layout(raw, str(tmp / f"{layout}.rsbm25"), layout=layout,
                                     k1=1.2, b=0.75))
        for q in queries:
            for cand in (None, mask, few, PackedFilter.from_mask(mask)):
                ix.search(q, k=10, candidates=cand)
        ix.search_batch(queries, k=10, threads=1)


def _warm_in_memory() -> None:
    from ragspine_pipeline.corpus import DEMO_ROOT, list_libraries
    from ragspine_pipeline.retrieval.vector.embedding_backends import DeterministicHashBackend
    from ragspine_pipeline.warehouse import pipeline as P
    from ragspine_pipeline.warehouse.versioned import VersionedTables

    with tempfile.TemporaryDirectory() as d:
        wh = VersionedTables(Path(d))
        lib = list_libraries()[0]
        P.build_raw_documents(wh, DEMO_ROOT, lib)
        P.build_chunks(wh, lib)
        P.build_lexical_index(wh, lib)
        P.build_embeddings(wh, lib, DeterministicHashBackend(), "deterministic")
        P.publish_snapshot(wh, lib)


def _warm_merge_and_stream(tmp: Path) -> None:
    """The merge and streamed-build kernels, by the very test bodies whose first call
    compiled them in CI (480 s, 390 s and 310 s at load ~15): the same dtypes and flags."""
    from tests import test_bm25_merge as M
    from tests import test_bm25_stream_build as S

    for i, (prev, layout) in enumerate((("plain", "packed"), ("packed", "plain"))):
        (tmp / f"m{i}").mkdir()
        M.test_a_merged_file_answers_exactly_as_a_fresh_build(tmp / f"m{i}", "auto", layout, prev)
    for grow in (True, False):
        (tmp / f"g{grow}").mkdir()
        M.test_length_code_widths_and_tf_widths_follow_the_new_corpus(tmp / f"g{grow}", grow)
    for layout in ("plain", "packed"):
        (tmp / f"s{layout}").mkdir()
        S.test_published_file_answers_as_bm25index(tmp / f"s{layout}", layout)


def warm() -> dict[str, float | str]:
    """Compile (or load) the kernels the suite's first queries need, each step on its own:
    one that fails is reported and the rest still run."""
    out: dict[str, float | str] = {}
    for name, step in (("layouts", lambda: _warm_layouts(Path(tmp))),
                       ("demo_publish", _warm_in_memory),
                       ("merge_stream", lambda: _warm_merge_and_stream(Path(tmp))),
                       ("mirror", _mirror_for_children)):
        t0 = time.perf_counter()
        with tempfile.TemporaryDirectory() as tmp:
            try:
                step()
                out[name] = round(time.perf_counter() - t0, 2)
            except Exception as err:  # noqa: BLE001 - a warm never fails the run
                out[name] = f"failed: {type(err).__name__}: {err}"[:200]
    return out


if __name__ == "__main__":
    folder = use_stamped_cache()
    with contextlib.suppress(Exception):
        print(f"numba cache: {folder or 'numba default'}; warm: {warm()}", flush=True)
