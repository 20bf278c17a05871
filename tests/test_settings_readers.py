"""The readers migrated to the settings registry keep their meaning: the mode, the
post-processor chain, the glossary, the reranker of the resource and the chunker.

Each reads its ``RAGSPINE_*`` variable through ``settings`` at call time: an explicit
argument wins, a blank variable is the default, and a bad value is one error that names
the variable (the registry's, or the caller's class carrying the same message).
"""

from __future__ import annotations

import json

import pytest

from ragspine_pipeline import modes, settings
from ragspine_pipeline.retrieval.chunking import make_chunker
from ragspine_pipeline.retrieval.link.assembly import default_glossary_path, glossary_file
from ragspine_pipeline.retrieval.postprocess import make_postprocessor


def test_mode_argument_then_variable_then_auto(monkeypatch):
    assert modes.retrieval_mode() == "auto"
    monkeypatch.setenv("RAGSPINE_RETRIEVAL_MODE", " BM25 ")
    assert modes.retrieval_mode() == "bm25"
    assert modes.retrieval_mode("Hybrid") == "hybrid"  # the argument wins, folded
    monkeypatch.setenv("RAGSPINE_RETRIEVAL_MODE", "  ")
    assert modes.retrieval_mode() == "auto"  # blank is unset


def test_a_bad_mode_names_the_variable_only_when_it_came_from_it(monkeypatch):
    with pytest.raises(modes.RetrievalModeError) as arg:
        modes.retrieval_mode("turbo")
    assert str(arg.value).startswith("unknown retrieval mode 'turbo'; use one of auto, hybrid, vector")
    monkeypatch.setenv("RAGSPINE_RETRIEVAL_MODE", "sideways")
    with pytest.raises(modes.RetrievalModeError) as env:
        modes.retrieval_mode()
    assert str(env.value).startswith("RAGSPINE_RETRIEVAL_MODE: unknown retrieval mode 'sideways'")


def test_postprocessor_variable_is_read_through_the_registry(monkeypatch):
    assert make_postprocessor() is None  # default none: snippets as the retriever returns them
    monkeypatch.setenv("RAGSPINE_POSTPROCESSOR", "MMR:0.5, lost_in_middle")
    chain = make_postprocessor()
    assert chain.names == ["mmr", "lost_in_middle"] and chain.steps[0].lambda_ == 0.5
    assert make_postprocessor("compress").names == ["compress"]  # an argument wins
    monkeypatch.setenv("RAGSPINE_POSTPROCESSOR", "mmr,rerank")
    with pytest.raises(settings.SettingsError, match=r"RAGSPINE_POSTPROCESSOR='mmr,rerank'.*'rerank'"):
        make_postprocessor()


def test_glossary_set_but_empty_disables_it_unset_is_the_demo(monkeypatch, tmp_path):
    demo = default_glossary_path()
    assert demo is not None and demo.name == "glossary.json"
    for off in ("", "  ", "none", "OFF"):
        monkeypatch.setenv("RAGSPINE_GLOSSARY", off)
        assert default_glossary_path() is None and glossary_file() is None
    mine = tmp_path / "g.json"
    mine.write_text(json.dumps([]), encoding="utf-8")
    monkeypatch.setenv("RAGSPINE_GLOSSARY", str(mine))
    assert glossary_file() == mine
    monkeypatch.setenv("RAGSPINE_GLOSSARY", str(tmp_path / "missing.json"))
    with pytest.raises(ValueError, match="RAGSPINE_GLOSSARY=.*no such glossary file"):
        glossary_file()


def test_chunker_variable_is_read_through_the_registry(monkeypatch):
    assert make_chunker().key == "paragraph:480:80"
    monkeypatch.setenv("RAGSPINE_CHUNKER", " layout:300:0 ")
    assert make_chunker().key == make_chunker("layout:300:0").key
    monkeypatch.setenv("RAGSPINE_CHUNKER", "")
    assert make_chunker().key == "paragraph:480:80"
    monkeypatch.setenv("RAGSPINE_CHUNKER", "tokens:100")
    with pytest.raises(settings.SettingsError, match="RAGSPINE_CHUNKER='tokens:100': unknown chunker"):
        make_chunker()
    with pytest.raises(ValueError, match="unknown chunker 'tokens'"):  # an argument: the factory's own error
        make_chunker("tokens")


def test_resource_reranker_field_then_variable(monkeypatch):
    pytest.importorskip("dagster")
    from resources.retrieval import RetrievalResource

    res = RetrievalResource(warehouse_root="unused")
    assert res._reranker() is None  # unset: none
    monkeypatch.setenv("RAGSPINE_RERANKER", "listwise")
    monkeypatch.setenv("RAGSPINE_LLM_BASE_URL", "http://127.0.0.1:9/v1")
    assert type(res._reranker()).__name__ == "ListwiseReranker"
    assert RetrievalResource(warehouse_root="unused", reranker="none")._reranker() is None  # the field wins
    monkeypatch.setenv("RAGSPINE_RERANKER", "magic")
    with pytest.raises(settings.SettingsError, match="RAGSPINE_RERANKER='magic'"):
        res._reranker()
