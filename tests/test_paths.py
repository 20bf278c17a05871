"""ragspine_pipeline.paths: the packaged demo corpus and the one default-warehouse rule
(checkout: data/warehouse; install: ./ragspine-warehouse; RAGSPINE_WAREHOUSE wins), shared by
the CLI and the WarehouseResource; and `ragspine config` through the console script."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ragspine_pipeline import corpus, paths, settings
from ragspine_pipeline.cli import build_parser, main

ROOT = Path(__file__).resolve().parents[1]


def _installed_layout(tmp_path: Path) -> Path:
    """A package folder as a wheel lays it out: site-packages/ragspine_pipeline, with no
    pyproject.toml or definitions.py beside it."""
    pkg = tmp_path / "venv" / "lib" / "python3.11" / "site-packages" / "ragspine_pipeline"
    pkg.mkdir(parents=True)
    return pkg


# ----------------------------------------------------------------- the demo corpus
def test_demo_corpus_is_package_data_with_its_libraries_and_question_files():
    assert paths.DEMO_ROOT == ROOT / "ragspine_pipeline" / "demo_corpus"
    assert corpus.DEMO_ROOT == paths.DEMO_ROOT  # the spec's import path keeps working
    assert corpus.list_libraries() == ["acme_policies", "acme_reports"]
    for f in (paths.DEMO_GLOSSARY, paths.DEMO_GOLDEN, paths.DEMO_QUALITY_FLOOR):
        assert f.parent == paths.DEMO_ROOT and json.loads(f.read_text(encoding="utf-8"))
    golden = corpus.load_golden(paths.DEMO_GOLDEN)
    assert golden and all(g["query"] for g in golden)


# ------------------------------------------------------------ the default warehouse
def test_checkout_is_recognised_and_keeps_data_warehouse(monkeypatch):
    monkeypatch.delenv("RAGSPINE_WAREHOUSE", raising=False)
    assert paths.checkout_root() == ROOT
    assert paths.default_warehouse() == ROOT / "data" / "warehouse"
    assert paths.definitions_file() == ROOT / "definitions.py"


def test_outside_a_checkout_the_warehouse_is_in_the_current_directory(tmp_path, monkeypatch):
    monkeypatch.delenv("RAGSPINE_WAREHOUSE", raising=False)
    pkg = _installed_layout(tmp_path)
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    assert paths.checkout_root(pkg) is None
    got = paths.default_warehouse(pkg)
    assert got == work / paths.INSTALLED_WAREHOUSE_DIR and got.is_absolute()
    assert pkg.parent not in got.parents  # never inside site-packages


def test_only_a_folder_with_both_markers_counts_as_a_checkout(tmp_path):
    pkg = _installed_layout(tmp_path)
    (pkg.parent / "pyproject.toml").write_text("[project]\n")  # some other project's file
    assert paths.checkout_root(pkg) is None
    (pkg.parent / "definitions.py").write_text("")
    assert paths.checkout_root(pkg) == pkg.parent


def test_ragspine_warehouse_wins_in_and_out_of_a_checkout(tmp_path, monkeypatch):
    monkeypatch.setenv("RAGSPINE_WAREHOUSE", str(tmp_path / "mine"))
    assert paths.default_warehouse() == tmp_path / "mine"
    assert paths.default_warehouse(_installed_layout(tmp_path)) == tmp_path / "mine"
    monkeypatch.setenv("RAGSPINE_WAREHOUSE", "  ")  # blank counts as unset (the registry's rule)
    assert paths.default_warehouse() == ROOT / "data" / "warehouse"


def test_cli_and_resource_share_the_one_definition(tmp_path, monkeypatch):
    pytest.importorskip("dagster")
    monkeypatch.syspath_prepend(str(ROOT))  # the code location's resources/
    from resources import WarehouseResource
    from resources.warehouse import default_corpus_root, default_warehouse_root

    monkeypatch.delenv("RAGSPINE_WAREHOUSE", raising=False)
    monkeypatch.delenv("RAGSPINE_CORPUS_ROOT", raising=False)
    cli_default = build_parser().parse_args(["query", "x"]).warehouse
    assert cli_default == default_warehouse_root() == str(paths.default_warehouse())
    assert WarehouseResource().root_path() == paths.default_warehouse()
    assert WarehouseResource().corpus_path() == paths.DEMO_ROOT
    assert default_corpus_root() == str(paths.DEMO_ROOT)
    assert WarehouseResource().libraries_on_disk() == ["acme_policies", "acme_reports"]
    # Read at call time: a variable set after import is seen by both.
    monkeypatch.setenv("RAGSPINE_WAREHOUSE", str(tmp_path / "wh"))
    monkeypatch.setenv("RAGSPINE_CORPUS_ROOT", str(tmp_path / "corpus"))
    assert build_parser().parse_args(["query", "x"]).warehouse == str(tmp_path / "wh")
    assert WarehouseResource().root_path() == tmp_path / "wh"
    assert WarehouseResource().corpus_path() == tmp_path / "corpus"


# --------------------------------------------------------------------- ragspine config
def test_ragspine_config_prints_effective_settings_and_sources(monkeypatch, capsys):
    monkeypatch.setenv("RAGSPINE_RERANKER", "colbert")
    monkeypatch.setenv("RAGSPINE_LLM_API_KEY", "sk-live-abcdef123456")
    monkeypatch.delenv("RAGSPINE_ROUTER", raising=False)
    assert main(["config", "--set", "RAGSPINE_RETRIEVAL_MODE=bm25"]) == 0
    cap = capsys.readouterr()
    assert cap.err == ""
    assert all(f"  {name}" in cap.out for name in settings.REGISTRY)  # every variable, one row each
    lines = {ln.split()[0]: ln.split() for ln in cap.out.splitlines() if ln.startswith("  RAGSPINE_")}
    assert lines["RAGSPINE_RERANKER"][1:] == ["colbert", "(environment)"]
    assert lines["RAGSPINE_RETRIEVAL_MODE"][1:] == ["bm25", "(argument)"]
    assert lines["RAGSPINE_ROUTER"][1:] == ["rules", "(default)"]
    assert lines["RAGSPINE_LLM_API_KEY"][1:] == [settings.MASK, "(environment)"]
    assert "sk-live" not in cap.out and "123456" not in cap.out

    assert main(["config", "--json", "--group", "llm"]) == 0
    rows = {d["name"]: d for d in json.loads(capsys.readouterr().out)}
    assert rows["RAGSPINE_LLM_API_KEY"] == {"name": "RAGSPINE_LLM_API_KEY", "value": settings.MASK,
                                            "source": "environment", "secret": True}


def test_ragspine_config_bad_value_is_exit_2_and_one_clear_line(monkeypatch, capsys):
    monkeypatch.setenv("RAGSPINE_RETRIEVAL_MODE", "turbo")
    assert main(["config"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1
    assert err[0].startswith("ragspine: error: config: RAGSPINE_RETRIEVAL_MODE='turbo'")
    assert "auto, hybrid, vector, economy, bm25, lexical" in err[0]
    # The same variable read by a serving command is the same one-line error, exit 2.
    assert main(["query", "x", "--warehouse", "/nonexistent"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "RAGSPINE_RETRIEVAL_MODE='turbo'" in err[0]


def test_ragspine_config_options_and_help(capsys):
    assert main(["config", "--group", "nonsense"]) == 2  # argparse's own exit code
    assert "--group" in capsys.readouterr().err
    assert main(["config", "--help"]) == 0
    assert "--changed" in capsys.readouterr().out
    assert main(["--help"]) == 0
    assert "config" in capsys.readouterr().out


def test_ragspine_config_as_a_program_masks_secrets(tmp_path):
    env = {"PATH": "/usr/bin:/bin", "RAGSPINE_LLM_API_KEY": "sk-program-secret-987", "RAGSPINE_ROUTER": "none",
           "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-m", "ragspine_pipeline.cli", "config", "--changed"], cwd=tmp_path,
                       env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "sk-program-secret" not in r.stdout and settings.MASK in r.stdout
    assert "RAGSPINE_ROUTER" in r.stdout and "(environment)" in r.stdout
