"""The test run's numba cache (tests/kernel_warmup.py, #46 item 4): a folder keyed by the
kernel sources' stamp, found again by a clone at another path."""

from __future__ import annotations

import pytest

from tests import kernel_warmup as kw

pytest.importorskip("numba")


def test_the_stamp_follows_numba_modules_only(tmp_path):
    (tmp_path / "sub").mkdir()
    kernel, plain = tmp_path / "sub" / "k.py", tmp_path / "plain.py"
    kernel.write_text("import numba\n")
    plain.write_text("x = 1\n")
    first = kw.kernel_stamp(tmp_path)
    plain.write_text("x = 2\n")
    assert kw.kernel_stamp(tmp_path) == first  # not a kernel module: same cache
    kernel.write_text("import numba  # edited\n")
    assert kw.kernel_stamp(tmp_path) != first  # a kernel (or what it inlines) changed: new folder


def test_the_cache_folder_is_named_by_the_package_path_not_the_clone(tmp_path):
    from numba.core import caching

    impl = getattr(caching, "CacheImpl", None) or caching._CacheImpl
    kw.use_stamped_cache()  # conftest did it already; a second call adds nothing
    ours = [c for c in impl._locator_classes if getattr(c, "_ragspine", False)]
    assert len(ours) == 1 and impl._locator_classes[0] is ours[0]
    lexical = kw.PACKAGE / "retrieval" / "lexical" / "bm25.py"
    assert ours[0].get_suitable_cache_subpath(str(lexical)) == "ragspine_pipeline_retrieval_lexical"
    outside = tmp_path / "m.py"
    outside.write_text("def f():\n    return 1\n")
    assert ours[0].from_function(lambda: 1, str(outside)) is None  # others' code: numba decides


def test_a_developers_own_numba_cache_dir_is_kept(monkeypatch, tmp_path):
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv(kw.ENV_ROOT + "_SET", raising=False)
    assert kw.use_stamped_cache() is None


def test_an_unwritable_cache_root_fails_open(monkeypatch, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv(kw.ENV_ROOT, str(blocker / "below-a-file"))
    monkeypatch.setenv(kw.ENV_ROOT + "_SET", "1")
    assert kw.use_stamped_cache() is None  # numba's cache as configured before


def test_folders_other_runs_left_are_pruned_and_ours_kept(tmp_path):
    import os

    stamp = tmp_path / "stamp"
    for name in ("ragspine_pipeline_retrieval_lexical", "lexical_mine", "lexical_wheeltmp"):
        (stamp / name).mkdir(parents=True)
    (tmp_path / "old-stamp").mkdir()
    os.utime(tmp_path / "old-stamp", (0, 0))
    for name in ("lexical_wheeltmp", "lexical_mine", "ragspine_pipeline_retrieval_lexical"):
        os.utime(stamp / name, (0, 0))  # all idle: only the mirror of this clone and ours stay
    kw._prune(stamp, keep=1e9, mine={"lexical_mine"})
    assert sorted(p.name for p in stamp.iterdir()) == ["lexical_mine", "ragspine_pipeline_retrieval_lexical"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["stamp"]
