"""A long index tells you where it is (issue 43, item 7): the embedding step's progress
(counts, rate, ETA) at most ``PROGRESS_EVERY_S`` apart in both doors, large documents
announced with their expected time, the documented exit codes, and the library-name rule
at both doors. Counted over batches with a fake clock, never timed."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ragspine_pipeline import cli, indexing, paths
from ragspine_pipeline.warehouse import embeddings_step
from ragspine_pipeline.warehouse.embeddings_step import (
    PROGRESS_EVERY_S,
    EmbedProgress,
    embed_with_progress,
)


@pytest.fixture(autouse=True)
def _clean(monkeypatch):
    for name in ("RAGSPINE_GLOSSARY", "RAGSPINE_GRAPH_DIMENSIONS", "RAGSPINE_CORPUS_ROOT", "RAGSPINE_EMBEDDING",
                 "RAGSPINE_WAREHOUSE", "DAGSTER_HOME", "RAGSPINE_EMBEDDING_BACKEND"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("RAGSPINE_RETRIEVAL_MODE", "bm25")


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class SlowBackend:
    """Each call advances the fake clock by ``per_text`` seconds per text."""

    model_id = "slow-test"

    def __init__(self, clock: FakeClock, per_text: float) -> None:
        self.clock, self.per_text, self.calls = clock, per_text, 0

    def embed_texts(self, texts):
        self.calls += 1
        self.clock.now += self.per_text * len(texts)
        return [[float(len(t)), 1.0] for t in texts]


def _run(n: int, batch: int, per_text: float, ids=None):
    clock, lines = FakeClock(), []
    backend = SlowBackend(clock, per_text)
    stamped = []

    def log(line: str) -> None:
        lines.append(line)
        stamped.append(clock.now)

    vecs = embed_with_progress(backend, [f"text {i}" for i in range(n)], "lib", log, ids=ids, batch=batch,
                               clock=clock)
    return backend, lines, stamped, vecs


def test_one_callback_per_batch_and_no_gap_over_the_interval():
    # 100 batches of 10 texts, 3 s a batch: 300 s of embedding.
    backend, lines, stamped, vecs = _run(1000, 10, 0.3)
    assert backend.calls == 100 and len(vecs) == 1000
    progress = [ln for ln in lines if "ETA" in ln or "(100%)" in ln]
    gaps = [b - a for a, b in zip(stamped[1:], stamped[2:], strict=False)]
    assert gaps and max(gaps) <= PROGRESS_EVERY_S + 1e-9  # never a gap past the interval
    assert 25 <= len(progress) <= 40  # about every 9-10 s, not after every batch
    assert re.fullmatch(r"embeddings\[lib\]: 10/1,000 texts \(1%\), 3\.3 texts/s, ETA 4m57s", progress[0]), progress[0]
    assert progress[-1] == "embeddings[lib]: 1,000/1,000 texts in 5m00s, 3.3 texts/s (100%)"
    assert lines[0] == "embeddings[lib]: 1,000 texts to embed in batches of 10"


def test_the_hook_counts_batches_not_time():
    clock, said = FakeClock(), []
    hook = EmbedProgress("embeddings[x]", said.append, every_s=10.0, batch=5, clock=clock)
    for done in range(5, 101, 5):  # 20 batches, no time passes: first and last line only
        hook(done, 100)
    assert hook.calls == 20 and hook.lines == 2 and said[-1].endswith("(100%)")


def test_a_large_document_is_announced_with_its_expected_time(monkeypatch):
    monkeypatch.setattr(embeddings_step, "LARGE_FILE_CHUNKS", 30)
    ids = [f"lib/small#{i:04d}-x" for i in range(20)] + [f"lib/big.txt#{i:04d}-x" for i in range(60)]
    _, lines, _, _ = _run(80, 10, 0.5, ids=ids)
    (announce,) = [ln for ln in lines if "big.txt" in ln]
    assert announce == "embeddings[lib]: lib/big.txt has 60 chunks to embed (over 30): about 30s at 2.0 texts/s"
    assert lines.index(announce) < next(i for i, ln in enumerate(lines) if "(100%)" in ln)
    assert not any("lib/small" in ln for ln in lines)


def test_progress_reaches_the_progress_logger(caplog):
    import logging

    with caplog.at_level(logging.INFO, logger="ragspine.progress"):
        _run(30, 10, 0.1)
    assert any(r.name == "ragspine.progress" and "(100%)" in r.getMessage() for r in caplog.records)


# ------------------------------------------------------------------------- exit codes
def test_exit_codes_are_decided_after_every_library():
    ok = indexing.LibraryReport("a", checks={"x": True})
    check = indexing.LibraryReport("b", checks={"x": True, "parse_failures_zero": False})
    broken = indexing.LibraryReport("c", error="RuntimeError: boom")
    assert indexing.exit_code([ok]) == indexing.EXIT_OK == 0
    assert indexing.exit_code([ok, check]) == indexing.EXIT_CHECK_FAILED == 3
    assert indexing.exit_code([check, broken, ok]) == indexing.EXIT_LIBRARY_FAILED == 1
    assert indexing.EXIT_INPUT_ERROR == 2


def _corpus(root: Path) -> Path:
    for lib, text in (("alpha", "The pelican survey counted forty birds on the island."),
                      ("beta", "The harbour logistics margins improved in the third quarter.")):
        (root / lib).mkdir(parents=True)
        (root / lib / "note.md").write_text(f"# Note\n\n{text}\n")
    return root


def test_a_failed_library_exits_1_after_the_rest_is_built(tmp_path, monkeypatch, capsys):
    real = indexing.index_library

    def flaky(wh, source, *, progress=None):
        if source.name == "alpha":
            raise RuntimeError("disk on fire")
        return real(wh, source, progress=progress)

    monkeypatch.setattr(indexing, "index_library", flaky)
    monkeypatch.setenv("RAGSPINE_EMBEDDING_BACKEND", "none")
    rc = cli.main(["index", str(_corpus(tmp_path / "c")), "--warehouse", str(tmp_path / "wh"), "--in-process"])
    out = capsys.readouterr().out
    assert rc == indexing.EXIT_LIBRARY_FAILED
    assert "alpha: FAILED (RuntimeError: disk on fire)" in out and "beta: snapshot" in out
    assert "exit code 1: a library failed" in out


def test_in_process_index_prints_building_and_embedding_progress(tmp_path, capsys):
    rc = cli.main(["index", str(_corpus(tmp_path / "c")), "--warehouse", str(tmp_path / "wh"), "--in-process",
                   "--embedding", "deterministic:16"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert indexing.building_line("alpha") in out
    assert "embeddings[alpha]: 1 texts to embed" in out and "embeddings[alpha]: 1/1 texts in" in out
    assert re.search(r"alpha: raw_documents done in [0-9.]+ s: documents 1, parsed 1", out), out
    assert re.search(r"alpha: chunks done in [0-9.]+ s: active chunks 1, new 1", out), out
    assert out.index("alpha: lexical_index done") < out.index("embeddings[alpha]: 1/1") \
        < out.index("alpha: embeddings done") < out.index("alpha: retrieval_snapshot done")


def _checkout() -> None:
    pytest.importorskip("dagster")
    if paths.definitions_file() is None:
        pytest.skip("not a checkout: no Dagster code location")


def test_code_location_index_prints_embedding_progress(tmp_path, capsys):
    """The Dagster door: its console is quiet, the progress lines still reach stdout."""
    _checkout()
    rc = cli.main(["index", str(_corpus(tmp_path / "c")), "--warehouse", str(tmp_path / "wh"),
                   "--embedding", "deterministic:16"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "through the Dagster code location" in out and "in-process" not in out
    assert out.index(indexing.building_line("alpha")) < out.index("alpha: raw_documents done") \
        < out.index("alpha: chunks done") < out.index("embeddings[alpha]: 1/1 texts in") \
        < out.index("alpha: retrieval_snapshot done") < out.index("alpha: documents 1")
    assert "embeddings[beta]: 1/1 texts in" in out


def test_code_location_refuses_a_library_name_outside_the_rule(tmp_path):
    """A partition a sensor (or a user in the UI) added under a name the README calls an error."""
    _checkout()
    import dagster as dg

    from ragspine_pipeline.cli_index import code_location

    (tmp_path / "c" / "bad name!").mkdir(parents=True)
    (tmp_path / "c" / "bad name!" / "a.md").write_text("# A\n\nSome text about pelicans and their islands.\n")
    with indexing.environment({"RAGSPINE_WAREHOUSE": str(tmp_path / "wh"),
                               "RAGSPINE_CORPUS_ROOT": str(tmp_path / "c")}):
        module = code_location()
        with pytest.raises(dg.Failure, match=r"library name 'bad name!' .* contains '!'"):
            module.materialize_library("bad name!", dg.DagsterInstance.ephemeral())
    assert not (tmp_path / "wh" / "raw_documents").exists()
