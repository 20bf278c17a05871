"""``ragspine query --warehouse PATH`` never builds a warehouse (#25 item 6).

A path with no published snapshot and no chunk store — a missing folder, an unrelated
folder, a file — is a one-line error naming the path and the command that builds one
(``ragspine demo``), exit code 2, and nothing is written. Over a real warehouse the
query reads only; the engine-only vector cache inside a chunk-store warehouse is the one
thing it may add.
"""

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ragspine_pipeline.cli import build_demo_store, main
from ragspine_pipeline.serving import NoWarehouse, open_retriever

ROOT = Path(__file__).resolve().parents[1]


def tree(root: Path) -> dict[str, tuple]:
    """Every path under ``root`` (itself included) with its kind, size, mtime and content hash."""
    if not os.path.lexists(root):
        return {}
    paths = [root, *root.rglob("*")] if root.is_dir() else [root]
    out = {}
    for p in paths:
        st = p.lstat()
        digest = hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else ""
        out[str(p.relative_to(root.parent))] = (p.is_dir(), st.st_size if p.is_file() else 0, st.st_mtime_ns, digest)
    return out


def query(capsys, warehouse: Path, *extra: str) -> tuple[int, str, str]:
    rc = main(["query", "why close the Lyon plant", "--warehouse", str(warehouse), *extra])
    out = capsys.readouterr()
    return rc, out.out, out.err


def assert_one_line_error(rc: int, out: str, err: str, path: Path) -> None:
    lines = err.strip().splitlines()
    assert rc == 2 and out == "", (rc, out, err)
    assert len(lines) == 1 and "Traceback" not in err, err
    assert str(path) in lines[0] and "ragspine demo" in lines[0], lines[0]


@pytest.fixture
def unrelated(tmp_path):
    folder = tmp_path / "my_documents"
    (folder / "notes").mkdir(parents=True)
    (folder / "notes" / "todo.md").write_text("# todo\n\nbuy milk\n", encoding="utf-8")
    (folder / "report.txt").write_text("quarterly numbers\n", encoding="utf-8")
    return folder


@pytest.mark.parametrize("extra", [(), ("--json",), ("--mode", "bm25"), ("--mode", "hybrid", "--embedding", "deterministic")])
def test_missing_folder_is_an_error_and_is_not_created(tmp_path, capsys, extra):
    missing = tmp_path / "nowhere" / "warehouse"
    before = tree(tmp_path)
    assert_one_line_error(*query(capsys, missing, *extra), missing)
    assert not missing.exists() and not missing.parent.exists()
    assert tree(tmp_path) == before


@pytest.mark.parametrize("extra", [(), ("--json",), ("--mode", "hybrid", "--embedding", "deterministic")])
def test_unrelated_folder_is_left_as_it_was(unrelated, capsys, extra):
    before = tree(unrelated)
    assert_one_line_error(*query(capsys, unrelated, *extra), unrelated)
    assert tree(unrelated) == before
    assert not (unrelated / "chunks.duckdb").exists() and not (unrelated / "engine_vectors").exists()


def test_a_file_is_an_error_not_a_traceback(tmp_path, capsys):
    f = tmp_path / "warehouse.txt"
    f.write_text("not a warehouse\n", encoding="utf-8")
    before = tree(tmp_path)
    assert_one_line_error(*query(capsys, f), f)
    assert tree(tmp_path) == before


def test_a_snapshot_folder_with_nothing_published_is_an_error(tmp_path, capsys):
    wh = tmp_path / "wh"
    (wh / "retrieval_snapshot").mkdir(parents=True)
    before = tree(wh)
    assert_one_line_error(*query(capsys, wh), wh)
    assert tree(wh) == before


def test_the_console_script_says_the_same(tmp_path):
    missing = tmp_path / "gone"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.run([sys.executable, "-m", "ragspine_pipeline.cli", "query", "x", "--warehouse", str(missing)],
                       capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 2 and p.stdout == ""
    assert len(p.stderr.strip().splitlines()) == 1 and "ragspine demo" in p.stderr and str(missing) in p.stderr
    assert not missing.exists()


def test_the_python_door_raises_the_typed_error(tmp_path):
    with pytest.raises(NoWarehouse) as exc:
        open_retriever(tmp_path / "absent")
    assert exc.value.path == tmp_path / "absent" and isinstance(exc.value, FileNotFoundError)
    assert not (tmp_path / "absent").exists()


def test_query_over_a_published_warehouse_writes_nothing(published_demo, capsys):
    before = tree(published_demo)
    rc, out, _ = query(capsys, published_demo, "--json", "--mode", "hybrid", "--embedding", "deterministic")
    assert rc == 0 and out.strip().startswith("[")
    assert tree(published_demo) == before


def test_chunk_store_warehouse_gains_only_the_vector_cache(tmp_path, capsys):
    wh = tmp_path / "engine"
    build_demo_store(wh, quiet=True)  # `ragspine demo --engine-only` builds it; query only reads
    before = tree(wh)
    rc, out, _ = query(capsys, wh, "--json", "--mode", "bm25")
    assert rc == 0 and tree(wh) == before
    rc, out, _ = query(capsys, wh, "--json", "--mode", "hybrid", "--embedding", "deterministic")
    assert rc == 0
    after = tree(wh)
    added = sorted(set(after) - set(before))
    assert added and all(p.startswith("engine/engine_vectors") for p in added), added
    # Everything that was there is unchanged (the folder's own mtime moves with the new dir).
    assert {p: after[p] for p in before if p != "engine"} == {p: v for p, v in before.items() if p != "engine"}
