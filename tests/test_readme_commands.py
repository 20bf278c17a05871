"""The README as a new user runs it: every fenced command that starts with ``ragspine``.

Each command line is parsed by bash itself (so an unquoted ``>=`` shows up as the
redirection it is) and then run in-process against one demo warehouse built once by
``ragspine demo`` (the Dagster path, BM25 only so it stays fast). The same build checks
the demo's own options: ``--warehouse``, ``--questions``, ``--top-k`` and ``DAGSTER_HOME``.
"""

import contextlib
import io
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

dg = pytest.importorskip("dagster")

from ragspine_pipeline.cli import main  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"


def fenced_ragspine_commands(text: str) -> list[str]:
    """Every ``ragspine …`` (or ``.venv/bin/ragspine …``) command of the fenced shell blocks."""
    cmds: list[str] = []
    for block in re.findall(r"```(?:bash|sh|shell|console)?\n(.*?)```", text, re.S):
        for line in block.splitlines():
            for part in line.split("&&"):
                part = part.strip()
                if re.match(r"^(\.venv/bin/)?ragspine\s", part + " "):
                    cmds.append(part)
    return cmds


def bash_argv(command: str, cwd: Path) -> list[str]:
    """argv exactly as bash would build it; a redirection (a file appearing) is a failure."""
    assert shutil.which("bash"), "bash is needed to parse README commands"
    before = set(cwd.iterdir())
    p = subprocess.run(["bash", "-c", "set -f; printf '%s\\0' " + command], cwd=cwd, capture_output=True,
                       timeout=30)
    created = set(cwd.iterdir()) - before
    assert not created, f"README command {command!r} redirects into {sorted(c.name for c in created)}: quote it"
    assert p.returncode == 0 and not p.stderr, p.stderr
    return p.stdout.decode().split("\0")[:-1]


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """``ragspine demo`` once, into a temporary warehouse and DAGSTER_HOME."""
    wh = tmp_path_factory.mktemp("wh")
    home = tmp_path_factory.mktemp("dagster_home")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RAGSPINE_EMBEDDING", "none")
        mp.setenv("DAGSTER_HOME", str(home))
        mp.delenv("RAGSPINE_WAREHOUSE", raising=False)
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            rc = main(["demo", "--warehouse", str(wh), "--questions", "1", "--top-k", "2"])
        instance = dg.DagsterInstance.get()
        records = {k: instance.get_latest_materialization_event(dg.AssetKey(k))
                   for k in ("raw_documents", "chunks", "retrieval_snapshot")}
        runs = len(instance.get_runs())
        instance.dispose()
    return {"wh": wh, "rc": rc, "out": out.getvalue(), "records": records, "runs": runs}


def test_dagster_demo_honours_warehouse_questions_and_top_k(demo):
    assert demo["rc"] == 0, demo["out"]
    assert (demo["wh"] / "retrieval_snapshot").is_dir() and (demo["wh"] / "catalog.duckdb").exists()
    out = demo["out"]
    assert out.count("\nQ: ") == 1
    assert "[2] " in out and "[3] " not in out
    assert "channels=bm25" in out


def test_dagster_demo_records_into_dagster_home(demo):
    assert all(demo["records"].values()), demo["records"]
    assert demo["runs"] >= 2  # one materialization run per demo library


@pytest.mark.parametrize("extra", [["--engine-only"], ["--mode", "bm25"], ["--embedding", "none"]])
def test_engine_only_demo_after_the_dagster_demo(demo, capsys, monkeypatch, extra):
    """Used to crash: 'MultiIndexRetriever' object has no attribute 'index'."""
    monkeypatch.setenv("RAGSPINE_EMBEDDING", "none")
    assert main(["demo", "--warehouse", str(demo["wh"]), "--questions", "1", "--top-k", "1", *extra]) == 0
    out = capsys.readouterr().out
    assert "active chunks" in out and "[1] " in out and "[2] " not in out


def test_readme_has_the_commands_this_test_runs():
    cmds = fenced_ragspine_commands(README.read_text(encoding="utf-8"))
    subs = {c.split()[1] for c in cmds}
    assert {"demo", "query"} <= subs and len(cmds) >= 5


def test_every_fenced_readme_ragspine_command_runs(demo, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("RAGSPINE_EMBEDDING", "none")
    for command in fenced_ragspine_commands(README.read_text(encoding="utf-8")):
        argv = bash_argv(command, tmp_path)[1:]
        if "--warehouse" not in argv and argv[0] in ("demo", "query"):
            argv += ["--warehouse", str(demo["wh"])]
        rc = main(argv)
        out, err = capsys.readouterr()
        assert rc == 0, f"{command!r}: rc={rc}\n{err}"
        assert out.strip(), f"{command!r} printed nothing"
        if "--json" in argv:
            assert isinstance(json.loads(out), list)
