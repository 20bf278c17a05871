"""The built wheel works on its own (#26 item 5).

The wheel is built offline from a copy of the source (``pip wheel --no-deps
--no-build-isolation --no-index``: a stale ``build/`` folder of the checkout cannot leak old
modules into it), checked to hold every data file of the package, and installed with
``pip install --no-deps --no-index`` into a fresh ``--system-site-packages`` venv in a
temporary folder. The dependencies come from the test's own environment (a ``.pth`` line
naming its site-packages, added *after* the new venv's own, so the wheel's copy of
``ragspine_pipeline`` wins and the checkout's editable install is never imported). The
installed ``ragspine`` then runs ``demo --engine-only`` and ``query`` from a folder outside
the repository: cited snippets are printed, the warehouse is ``./ragspine-warehouse`` in
that folder, and nothing under the venv's site-packages is written.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import site
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "ragspine_pipeline"
SOURCE_FILES = ("pyproject.toml", "README.md")
TIMEOUT = 600


def _run(cmd: list[str], *, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=TIMEOUT)
    assert r.returncode == 0, f"{' '.join(cmd)} exited {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r


def _package_files() -> set[str]:
    """Every file of the package source (wheel-relative names), caches left out."""
    return {p.relative_to(ROOT).as_posix() for p in PACKAGE.rglob("*")
            if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"}


def _clean_env(**extra: str) -> dict[str, str]:
    """The test's environment without anything that points at the checkout or picks a
    warehouse: no PYTHONPATH, no RAGSPINE_* variable; bytecode not written (so the
    "nothing inside site-packages was written" check is exact)."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("RAGSPINE_") and k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    return {**env, "PYTHONDONTWRITEBYTECODE": "1", **extra}


def _tree(folder: Path) -> dict[str, tuple[int, int]]:
    return {p.relative_to(folder).as_posix(): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in folder.rglob("*") if p.is_file() or p.is_dir()}


COMPILER_CACHES = (".pyc", ".nbi", ".nbc")  # bytecode; numba's cache=True kernels (bm25_kernel)


def _assert_only_compiler_caches_changed(before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]]
                                         ) -> None:
    """No file of the package, and no user data (a warehouse, a store, a vector cache), is
    written under site-packages. Compiler caches in ``__pycache__`` are Python's own
    convention (numba, like the bytecode compiler, writes its cache beside the source when
    that folder is writable, else in the user cache), so they may appear."""
    changed = {k for k in set(before) | set(after) if before.get(k) != after.get(k)}
    written = sorted(k for k in changed if not (k.endswith("/__pycache__")
                                                or ("/__pycache__/" in k and k.endswith(COMPILER_CACHES))))
    assert not written, f"written inside site-packages: {written}"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    if importlib.util.find_spec("setuptools") is None:
        pytest.fail("setuptools is not installed: the [dev] extra provides the offline build backend")
    work = tmp_path_factory.mktemp("wheel_build")
    src = work / "src"
    src.mkdir()
    for name in SOURCE_FILES:
        shutil.copy2(ROOT / name, src / name)
    shutil.copytree(PACKAGE, src / PACKAGE.name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    dist = work / "dist"
    # An absolute path, and --no-index: pip never reads a bare name as a package to download.
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q",
          "-w", str(dist), str(src.resolve())], cwd=work, env=_clean_env())
    (whl,) = dist.glob("ragspine_pipeline-*.whl")
    return whl


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory) -> dict[str, Path]:
    venv = tmp_path_factory.mktemp("wheel_venv") / "venv"
    _run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)], cwd=venv.parent)
    python = venv / "bin" / "python"
    purelib = Path(_run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                        cwd=venv.parent, env=_clean_env()).stdout.strip())
    # The test environment's packages (numpy, duckdb, pip, the [embed-onnx] models …) after the
    # venv's own: plain path lines, so the checkout's editable-install .pth is not processed.
    parents = [p for p in site.getsitepackages() if Path(p).resolve() != purelib.resolve()]
    (purelib / "_ragspine_test_environment.pth").write_text("\n".join(parents) + "\n", encoding="utf-8")
    # --ignore-installed: the editable install seen through the .pth is never uninstalled.
    _run([str(python), "-m", "pip", "install", "--no-deps", "--no-index", "--ignore-installed", "-q", str(wheel)],
         cwd=venv.parent, env=_clean_env())
    return {"python": python, "ragspine": venv / "bin" / "ragspine", "purelib": purelib}


def test_wheel_holds_every_file_of_the_package(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = _package_files() - names
    assert not missing, f"not in the wheel: {sorted(missing)}"
    for data in ("ragspine_pipeline/graph/dimensions.json", "ragspine_pipeline/retrieval/vector/auto_policy.json",
                 "ragspine_pipeline/demo_corpus/glossary.json", "ragspine_pipeline/demo_corpus/golden_queries.json",
                 "ragspine_pipeline/demo_corpus/quality_floor.json"):
        assert data in names
    assert {n.split("/")[2] for n in names if n.count("/") == 3 and "/demo_corpus/" in n} == {
        "acme_reports", "acme_policies"}
    dist_info = next(n.split("/")[0] for n in names if ".dist-info/" in n)
    assert {n.split("/")[0] for n in names} == {"ragspine_pipeline", dist_info}  # no data/, tests/ …
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    assert "ragspine = ragspine_pipeline.cli:main" in zipfile.ZipFile(wheel).read(entry_points).decode()


def test_installed_wheel_runs_the_demo_and_a_query_outside_the_checkout(installed, tmp_path):
    outside = tmp_path / "somewhere"
    outside.mkdir()
    assert ROOT not in outside.resolve().parents
    env = _clean_env()
    purelib = installed["purelib"]

    where = _run([str(installed["python"]), "-c", "import ragspine_pipeline as r; print(r.__file__)"],
                 cwd=outside, env=env).stdout.strip()
    assert Path(where).resolve().parent == (purelib / "ragspine_pipeline").resolve(), where
    # The data files the package reads load from the installed copy (dimensions + glossary, policy).
    probe = ("from ragspine_pipeline import paths\n"
             "from ragspine_pipeline.graph.step import resolve_dimensions\n"
             "from ragspine_pipeline.retrieval.vector.auto_policy import load_policy\n"
             "print(paths.checkout_root(), paths.DEMO_ROOT, len(resolve_dimensions().entities),\n"
             "      len(load_policy()['choices']), paths.default_warehouse(), sep='|')")
    checkout, demo_root, entities, choices, default_wh = _run(
        [str(installed["python"]), "-c", probe], cwd=outside, env=env).stdout.strip().split("|")
    assert checkout == "None" and Path(demo_root).resolve().is_relative_to(purelib.resolve())
    assert int(entities) > 0 and int(choices) > 0
    assert Path(default_wh) == outside / "ragspine-warehouse"

    before = _tree(purelib)
    demo = _run([str(installed["ragspine"]), "demo", "--engine-only", "--questions", "2", "--top-k", "2"],
                cwd=outside, env=env)
    assert f"ingesting {Path(demo_root)}" in demo.stdout
    assert demo.stdout.count("\nQ: ") == 2 and demo.stdout.count("    cite: acme_") >= 2, demo.stdout

    query = _run([str(installed["ragspine"]), "query", "why close the Lyon plant", "--top-k", "3"],
                 cwd=outside, env=env)
    assert "cite: acme_reports/pr_eu_lyon chars " in query.stdout, query.stdout
    as_json = _run([str(installed["ragspine"]), "query", "why close the Lyon plant", "--top-k", "3", "--json"],
                   cwd=outside, env=env)
    snippets = json.loads(as_json.stdout)
    assert snippets and all(s["doc_id"].startswith("acme_") and s["source_locator"]["end"] > 0 for s in snippets)

    warehouse = outside / "ragspine-warehouse"
    assert warehouse.is_dir() and any(warehouse.iterdir())
    assert sorted(p.name for p in outside.iterdir()) == ["ragspine-warehouse"]
    _assert_only_compiler_caches_changed(before, _tree(purelib))
    assert not [p for p in purelib.rglob("*") if p.name == "ragspine-warehouse" or p.suffix in (".duckdb", ".parquet")]


def test_installed_plain_demo_falls_back_to_the_engine_only_demo(installed, tmp_path):
    """No definitions.py in an install: ``ragspine demo`` says so and serves the engine-only
    demo, into $RAGSPINE_WAREHOUSE when it is set."""
    wh = tmp_path / "chosen"
    r = _run([str(installed["ragspine"]), "demo", "--questions", "1", "--top-k", "1"], cwd=tmp_path,
             env=_clean_env(RAGSPINE_WAREHOUSE=str(wh), RAGSPINE_RETRIEVAL_MODE="bm25"))
    assert "no Dagster code location" in r.stdout and "running the engine-only demo" in r.stdout
    assert "    cite: acme_" in r.stdout
    assert wh.is_dir() and any(wh.iterdir()) and not (tmp_path / "ragspine-warehouse").exists()


def test_installed_wheel_indexes_a_folder_in_process_and_says_so(installed, tmp_path):
    """``ragspine index`` from a plain install: no code location, so the same engine steps
    run in-process (and it says so); then ``ragspine query`` answers from that warehouse."""
    lib = tmp_path / "docs" / "notes"
    lib.mkdir(parents=True)
    (lib / "pelican.md").write_text("# Survey\n\nThe pelican survey counted forty birds.\n", encoding="utf-8")
    env = _clean_env(RAGSPINE_EMBEDDING_BACKEND="none", RAGSPINE_RETRIEVAL_MODE="bm25")
    before = _tree(installed["purelib"])
    r = _run([str(installed["ragspine"]), "index", str(tmp_path / "docs"), "--warehouse", str(tmp_path / "wh")],
             cwd=tmp_path, env=env)
    assert "running the same engine steps in-process (no Dagster code location" in r.stdout, r.stdout
    assert "notes: documents 1" in r.stdout and "summary: 1/1 library indexed" in r.stdout
    q = _run([str(installed["ragspine"]), "query", "pelican survey", "--warehouse", str(tmp_path / "wh"), "--json"],
             cwd=tmp_path, env=env)
    assert json.loads(q.stdout)[0]["doc_id"] == "notes/pelican"
    _assert_only_compiler_caches_changed(before, _tree(installed["purelib"]))
