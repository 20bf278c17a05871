"""benchmarks/*.py from a fresh clone: clear one-line errors, results where the command says."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
COMMITTED = ROOT / "benchmarks" / "results"


def bench(*args, timeout=120):
    return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("argv", [
    ["benchmarks/bench_bm25.py", "reference"],
    ["benchmarks/bench_bm25.py", "peers"],
    ["benchmarks/bench_dense.py"],
    ["benchmarks/bench_pipeline.py", "--only", "cranfield"],
])
def test_missing_data_folder_is_one_line_naming_the_path(tmp_path, argv):
    missing = tmp_path / "no-such-eval"
    p = bench(*argv, "--data", str(missing), "--out", str(tmp_path / "out"))
    assert p.returncode == 2
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and str(missing) in lines[0] and "Traceback" not in p.stderr, p.stderr
    assert not (tmp_path / "out").exists()


def test_results_go_to_out_and_committed_results_are_untouched(tmp_path):
    before = {p.name: p.read_bytes() for p in COMMITTED.iterdir() if p.is_file()}
    out = tmp_path / "out"
    p = bench("benchmarks/bench_bm25.py", "reference", "--sets", "", "--out", str(out))
    assert p.returncode == 0, p.stderr
    assert {f.name for f in out.iterdir()} == {"bm25_reference.json", "bm25_reference.md"}
    assert str(out) in p.stderr  # the command says where it wrote
    assert {p.name: p.read_bytes() for p in COMMITTED.iterdir() if p.is_file()} == before


def test_default_results_folder_is_git_ignored(tmp_path, monkeypatch):
    sys.path.insert(0, str(ROOT))
    from benchmarks import common

    monkeypatch.setattr(common, "DEFAULT_OUT", tmp_path / "out")
    out = common.out_dir(None)
    assert out == tmp_path / "out" and (out / ".gitignore").read_text() == "*\n"
    assert common.out_dir(str(tmp_path / "chosen")) == tmp_path / "chosen"
    assert not (tmp_path / "chosen" / ".gitignore").exists()
