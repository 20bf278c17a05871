"""No restricted byte in Dagster's run storage, compute logs or the CLI output, and that
storage is owner-only (#42 item 6, the Dagster part).

A persistent instance (``DAGSTER_HOME`` with the project's ``dagster.yaml``: SQLite run
and event storage, local compute logs) records a materialization over a library holding
a RESTRICTED document and one file per parser error (an invalid ``language`` value, a
broken DOCX, a broken PDF whose parser logs raw bytes), each with a canary word. Every
byte of every file the instance wrote — the SQLite databases, the captured stdout and
stderr — every event record, and what ``ragspine index`` printed are searched for it;
every folder of the storage must be 0700 and every file 0600.
"""

from __future__ import annotations

import os
import shutil
import stat
import sys
from pathlib import Path

import pytest
from test_labels_round4 import _canary_corpus, noisy_pypdf  # noqa: F401 - the fixture is used by name
from test_security import meta, write_lib
from test_security_labels_round3 import CANARY, LIB, SECRET_TEXT
from test_security_pipeline import _all_event_text

dg = pytest.importorskip("dagster")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import definitions  # noqa: E402
from resources import WarehouseResource  # noqa: E402
from resources.instance_storage import STORAGE_DIRS, instance_storage_paths  # noqa: E402


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A fresh DAGSTER_HOME with the project's instance settings, BM25 only, umask 022."""
    path = tmp_path / "dagster_home"
    path.mkdir()
    shutil.copy(ROOT / ".dagster_home" / "dagster.yaml", path / "dagster.yaml")
    for name in ("RAGSPINE_GLOSSARY", "RAGSPINE_GRAPH_DIMENSIONS", "RAGSPINE_CORPUS_ROOT", "RAGSPINE_WAREHOUSE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("DAGSTER_HOME", str(path))
    monkeypatch.setenv("RAGSPINE_EMBEDDING", "none")
    monkeypatch.setenv("RAGSPINE_EMBEDDING_BACKEND", "none")
    monkeypatch.setenv("RAGSPINE_RETRIEVAL_MODE", "bm25")
    old = os.umask(0o022)
    yield path
    os.umask(old)


def _corpus(root: Path) -> Path:
    """The parser-error canaries plus a RESTRICTED document whose text holds the canary."""
    _canary_corpus(root)
    write_lib(root, {"secret.md": SECRET_TEXT, "secret.meta.json": meta(sensitivity="RESTRICTED", topic=CANARY)})
    return root


def _storage_files(home: Path) -> list[Path]:
    return [p for p in sorted(home.rglob("*")) if p.name != "dagster.yaml"]


def _open_to_others(home: Path) -> list[str]:
    """Storage paths that are not owner-only (folders 0700, files 0600)."""
    return [f"{p.relative_to(home)} {oct(stat.S_IMODE(p.stat().st_mode))}" for p in _storage_files(home)
            if stat.S_IMODE(p.stat().st_mode) != (0o700 if p.is_dir() else 0o600)]


def _bytes_holding_canary(home: Path) -> list[str]:
    needle = CANARY.lower().encode()
    return [str(p.relative_to(home)) for p in _storage_files(home) if p.is_file() and needle in p.read_bytes().lower()]


def test_a_run_started_by_dagster_narrows_the_storage_where_it_starts(home, tmp_path):
    """A run the library assets take part in (here ``dg.materialize``, as a ``dagster dev``
    run worker would run it) narrows the instance's storage at its start: the folders
    are 0700, so nothing it writes later is reachable by others."""
    corpus = tmp_path / "corpus"
    write_lib(corpus, {"open.md": "open words", "open.meta.json": meta(sensitivity="PUBLIC")})
    instance = dg.DagsterInstance.get()
    instance.add_dynamic_partitions(definitions.library_partitions.name, [LIB])
    res = WarehouseResource(root=str(tmp_path / "wh"), corpus_root=str(corpus))
    assert dg.materialize(definitions.LIBRARY_ASSETS, partition_key=LIB, instance=instance,
                          resources={"warehouse": res}).success
    made = [p for p in instance_storage_paths(instance) if p.exists()]
    assert {p.name for p in made} >= {"history", "storage"}
    assert any(home.glob("storage/*/compute_logs/*"))  # the run's captured output, inside
    for top in made:  # what the run wrote after its start lies inside these: unreachable by others
        assert stat.S_IMODE(top.stat().st_mode) == (0o700 if top.is_dir() else 0o600), top
    # Published warehouse files keep the umask's mode: other accounts may read them.
    lex = next((tmp_path / "wh" / "lexical_index").rglob("tokens.parquet"))
    assert stat.S_IMODE(lex.stat().st_mode) == 0o644


def test_parser_errors_leave_no_canary_in_run_storage_or_compute_logs(home, tmp_path, noisy_pypdf, capfd):  # noqa: F811
    corpus = _corpus(tmp_path / "corpus")
    instance = dg.DagsterInstance.get()
    res = WarehouseResource(root=str(tmp_path / "wh"), corpus_root=str(corpus))
    result = definitions.materialize_library(LIB, instance, res)
    assert result.success
    failing = result.get_asset_check_evaluations()
    assert any(not c.passed for c in failing)  # the parse errors are reported ...
    logs = [p for p in home.rglob("compute_logs/*") if p.is_file()]
    assert logs and any(p.suffix in (".out", ".err") for p in logs)  # compute logs were captured
    assert not _bytes_holding_canary(home)  # ... and no file of the instance holds the canary
    assert CANARY not in _all_event_text(instance)
    out, err = capfd.readouterr()
    assert CANARY not in out + err
    assert not _open_to_others(home), _open_to_others(home)
    assert {p.name for p in home.iterdir()} >= {"history", "storage", "schedules"} and set(STORAGE_DIRS)


def test_the_cli_through_the_code_location_prints_and_records_no_canary(home, tmp_path, noisy_pypdf, capfd):  # noqa: F811
    from ragspine_pipeline import cli

    corpus = _corpus(tmp_path / "corpus")
    rc = cli.main(["index", str(corpus), "--warehouse", str(tmp_path / "wh")])
    out, err = capfd.readouterr()
    assert "through the Dagster code location" in out, out + err
    assert rc != 0 and ("lang.md" in out + err or "broken.docx" in out + err)  # failures named ...
    assert CANARY not in out + err  # ... never what they hold
    assert not _bytes_holding_canary(home)
    assert CANARY not in _all_event_text(dg.DagsterInstance.get())
    assert not _open_to_others(home), _open_to_others(home)
