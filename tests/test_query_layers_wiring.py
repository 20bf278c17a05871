"""The query layers reached from the service wiring: RetrievalResource, the CLI's
``open_retriever`` and ``build_narrative_retriever`` (RAGSPINE_* variables)."""

import json

import pytest

from ragspine_pipeline.cli import main, open_retriever
from ragspine_pipeline.retrieval.query import LayeredRetriever, RetrievalResult

LAYER_ENVS = ("RAGSPINE_QUERY_TRANSFORM", "RAGSPINE_QUERY_DECOMPOSE", "RAGSPINE_ADAPTIVE",
              "RAGSPINE_CORRECTIVE", "RAGSPINE_AUTO_FILTERS", "RAGSPINE_POSTPROCESSOR",
              "RAGSPINE_SECURITY_CONFIG", "RAGSPINE_COMPETITORS", "RAGSPINE_LLM_BASE_URL")


@pytest.fixture(autouse=True)
def _no_layer_env(monkeypatch):
    for v in LAYER_ENVS:
        monkeypatch.delenv(v, raising=False)


def test_resource_off_is_plain_and_fields_and_env_turn_layers_on(published_demo, monkeypatch):
    import dagster as dg

    from resources.retrieval import RetrievalResource

    res = RetrievalResource(warehouse_root=str(published_demo))
    q = "为什么营收下滑"
    plain = res.ask(q, top_k=5)
    assert not isinstance(res.retriever(), LayeredRetriever) and type(plain) is list
    on = RetrievalResource(warehouse_root=str(published_demo), transform="rag_fusion",
                           postprocessor="mmr,lost_in_middle", auto_filters="on", corrective="on")
    out = on.ask(q, top_k=5)
    assert isinstance(out, RetrievalResult) and out.status == "ok"
    assert out.report["layers"] == ["security_gate", "auto_filters", "rag_fusion", "corrective",
                                    "mmr", "lost_in_middle"]
    assert all("rag_fusion" in s["layers"] and s["layers"][-2:] == ["mmr", "lost_in_middle"] for s in out)
    monkeypatch.setenv("RAGSPINE_COMPETITORS", "Globex")
    refused = RetrievalResource(warehouse_root=str(published_demo)).ask("Globex 营收", top_k=5)
    assert refused == [] and refused.status == "refused"
    monkeypatch.setenv("RAGSPINE_QUERY_TRANSFORM", "hyde")  # no LLM configured: a clear failure
    with pytest.raises(dg.Failure, match="RAGSPINE_LLM_BASE_URL"):
        RetrievalResource(warehouse_root=str(published_demo)).ask(q)


def test_cli_open_retriever_reads_the_variables(published_demo, monkeypatch, capsys):
    plain = open_retriever(published_demo, mode="bm25", embedding=None)
    assert not isinstance(plain, LayeredRetriever)
    monkeypatch.setenv("RAGSPINE_QUERY_TRANSFORM", "rag_fusion")
    monkeypatch.setenv("RAGSPINE_POSTPROCESSOR", "compress:40")
    layered = open_retriever(published_demo, mode="bm25", embedding=None)
    assert isinstance(layered, LayeredRetriever)
    assert main(["query", "why close the Lyon plant", "--warehouse", str(published_demo), "--mode", "bm25",
                 "--json", "--top-k", "3"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out and all(s["layers"] == ["rag_fusion", "compress"] for s in out)
    assert all(len(s.get("prompt_text", s["text"])) <= 40 for s in out)
    monkeypatch.setenv("RAGSPINE_POSTPROCESSOR", "bogus")
    assert main(["query", "why close the Lyon plant", "--warehouse", str(published_demo), "--mode", "bm25"]) != 0
    assert "bogus" in capsys.readouterr().err


def test_build_narrative_retriever_reads_postprocessor_env(tmp_path, monkeypatch):
    from ragspine_pipeline.retrieval.link.narrative_link import build_narrative_retriever

    r, store = build_narrative_retriever(tmp_path / "c.db")
    store.close()
    assert r.postprocessor is None
    monkeypatch.setenv("RAGSPINE_POSTPROCESSOR", "mmr,lost_in_middle")
    r, store = build_narrative_retriever(tmp_path / "c.db")
    store.close()
    assert r.postprocessor.names == ["mmr", "lost_in_middle"]


def test_cli_flags_and_refusals_on_stderr(published_demo, monkeypatch, capsys):
    base = ["query", "why close the Lyon plant", "--warehouse", str(published_demo), "--mode", "bm25", "--json",
            "--top-k", "3"]
    assert main(base + ["--transform", "rag_fusion", "--postprocess", "lost_in_middle"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out and all(s["layers"] == ["rag_fusion", "lost_in_middle"] for s in out)
    monkeypatch.setenv("RAGSPINE_POSTPROCESSOR", "compress")
    assert main(base + ["--postprocess", "none"]) == 0  # the flag wins over the variable
    assert all("layers" not in s for s in json.loads(capsys.readouterr().out))
    monkeypatch.setenv("RAGSPINE_COMPETITORS", "Lyon")
    assert main(base) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out) == [] and "status refused" in captured.err and "Lyon" in captured.err
    assert main(base + ["--transform", "magic"]) != 0
    assert "magic" in capsys.readouterr().err


def test_bench_query_layers_runs_side_by_side_on_the_demo_set():
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from benchmarks.bench_query_layers import CONFIGS, demo_set, run

    rows = run(*demo_set())
    assert [r["config"] for r in rows] == list(CONFIGS)
    plain = rows[0]
    assert plain["latency_ratio"] == 1.0 and 0.5 < plain["ndcg@10"] <= 1.0
    assert all(0.0 <= r["ndcg@10"] <= 1.0 and r["queries"] == 8 for r in rows)
