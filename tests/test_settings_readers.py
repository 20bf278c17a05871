"""The readers migrated to the settings registry keep their meaning: the mode, the
post-processor chain, the glossary, the reranker of the resource, the chunker, the
fusion, the analyzer, the file-size limit, the parse-error policy, the default and known
sensitivity labels, and the warehouse's lock timeout and failure hook.

Each reads its ``RAGSPINE_*`` variable through ``settings`` at call time: an explicit
argument wins, a blank variable is the default, and a bad value is one error that names
the variable (the registry's, or the caller's class carrying the same message).
"""

from __future__ import annotations

import json

import pytest

from ragspine_pipeline import modes, settings
from ragspine_pipeline.ingest.documents import DEFAULT_LABEL, default_label, on_parse_error_policy
from ragspine_pipeline.ingest.parsers import DEFAULT_MAX_FILE_BYTES, ParseError, max_file_bytes
from ragspine_pipeline.retrieval.chunking import make_chunker
from ragspine_pipeline.retrieval.hybrid.fusion import fusion_configured, fusion_from_env
from ragspine_pipeline.retrieval.lexical.analysis.analyzer import make_analyzer
from ragspine_pipeline.retrieval.link.assembly import default_glossary_path, glossary_file
from ragspine_pipeline.retrieval.postprocess import make_postprocessor
from ragspine_pipeline.sensitivity import (
    DEFAULT_LABELS,
    LabelConfigError,
    is_restricted,
    known_labels,
)
from ragspine_pipeline.warehouse.versioned import (
    PublishInterrupted,
    fail_before_publish,
    writer_lock,
)


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


# ----------------------------------------------------------------------------- issue #26 item 2 leftovers
def test_fusion_variables_through_the_registry(monkeypatch):
    for name in ("RAGSPINE_FUSION", "RAGSPINE_FUSION_DENSE_WEIGHT"):
        monkeypatch.delenv(name, raising=False)
    cfg = fusion_from_env()
    assert (cfg.method, cfg.dense_weight, cfg.source, fusion_configured()) == ("rrf", 1.0, "default", False)
    monkeypatch.setenv("RAGSPINE_FUSION", " Convex ")
    cfg = fusion_from_env()
    assert (cfg.method, cfg.dense_weight, cfg.source, fusion_configured()) == ("convex", 0.5, "env", True)
    monkeypatch.delenv("RAGSPINE_FUSION")
    monkeypatch.setenv("RAGSPINE_FUSION_DENSE_WEIGHT", "0.25")  # a weight with rrf means weighted_rrf
    cfg = fusion_from_env()
    assert (cfg.method, cfg.dense_weight, cfg.source, fusion_configured()) == ("weighted_rrf", 0.25, "env", True)
    monkeypatch.setenv("RAGSPINE_FUSION_DENSE_WEIGHT", "heavy")
    with pytest.raises(settings.SettingsError, match="RAGSPINE_FUSION_DENSE_WEIGHT='heavy': use a number"):
        fusion_from_env()
    monkeypatch.delenv("RAGSPINE_FUSION_DENSE_WEIGHT")
    monkeypatch.setenv("RAGSPINE_FUSION", "bogus")
    with pytest.raises(ValueError, match="RAGSPINE_FUSION='bogus': unknown fusion method"):
        fusion_from_env()


def test_analyzer_variable_through_the_registry(monkeypatch):
    monkeypatch.setenv("RAGSPINE_ANALYZER", "  ")
    assert make_analyzer().name == "unicode"  # blank is the default
    monkeypatch.setenv("RAGSPINE_ANALYZER", " UNICODE:DE+fold ")
    assert make_analyzer().name == "unicode:german+fold"
    assert make_analyzer("english") is make_analyzer("english")  # the argument wins
    monkeypatch.setenv("RAGSPINE_ANALYZER", "klingon")
    with pytest.raises(ValueError, match="RAGSPINE_ANALYZER='klingon': unknown analyzer"):
        make_analyzer()
    with pytest.raises(ValueError, match="^unknown analyzer 'tlh'"):  # an argument: the factory's own error
        make_analyzer("tlh")


def test_max_file_bytes_keeps_parse_error(monkeypatch):
    monkeypatch.delenv("RAGSPINE_MAX_FILE_BYTES", raising=False)
    assert max_file_bytes() == DEFAULT_MAX_FILE_BYTES
    monkeypatch.setenv("RAGSPINE_MAX_FILE_BYTES", " 2048 ")
    assert max_file_bytes() == 2048
    monkeypatch.setenv("RAGSPINE_MAX_FILE_BYTES", "2k")
    with pytest.raises(ParseError, match="RAGSPINE_MAX_FILE_BYTES='2k': use an integer"):
        max_file_bytes()


def test_parse_error_policy_and_default_label(monkeypatch):
    monkeypatch.delenv("RAGSPINE_ON_PARSE_ERROR", raising=False)
    assert on_parse_error_policy() == "withhold"
    monkeypatch.setenv("RAGSPINE_ON_PARSE_ERROR", "serve_last_good")
    assert on_parse_error_policy() == "serve_last_good"
    assert on_parse_error_policy("withhold") == "withhold"  # the run-config field wins
    monkeypatch.setenv("RAGSPINE_ON_PARSE_ERROR", "Serve_Last_Good")  # exact spelling, as before
    with pytest.raises(ValueError, match="RAGSPINE_ON_PARSE_ERROR='Serve_Last_Good'"):
        on_parse_error_policy()
    with pytest.raises(ValueError, match="^on_parse_error must be one of withhold, serve_last_good, not 'keep'"):
        on_parse_error_policy("keep")

    assert settings.setting("RAGSPINE_DEFAULT_SENSITIVITY").default == DEFAULT_LABEL
    monkeypatch.delenv("RAGSPINE_DEFAULT_SENSITIVITY", raising=False)
    assert default_label() == "INTERNAL"
    monkeypatch.setenv("RAGSPINE_DEFAULT_SENSITIVITY", " public ")
    assert default_label() == "public"  # stripped only: resolve_label judges the spelling
    monkeypatch.setenv("RAGSPINE_DEFAULT_SENSITIVITY", " Required ")
    assert default_label() is None


def test_sensitivity_labels_keep_their_strict_reader(monkeypatch):
    monkeypatch.setenv("RAGSPINE_SENSITIVITY_LABELS", " ")
    assert known_labels() == DEFAULT_LABELS
    monkeypatch.setenv("RAGSPINE_SENSITIVITY_LABELS", "open, restricted ,team")
    assert known_labels() == ("OPEN", "TEAM", "RESTRICTED")
    assert not is_restricted("team") and is_restricted("INTERNAL")
    monkeypatch.setenv("RAGSPINE_SENSITIVITY_LABELS", "PUBLIC,SECRET")
    with pytest.raises(LabelConfigError, match="must include RESTRICTED"):
        known_labels()
    monkeypatch.setenv("RAGSPINE_SENSITIVITY_LABELS", "PUB\u200bLIC,RESTRICTED")  # stricter than the registry
    with pytest.raises(LabelConfigError, match="invisible"):
        known_labels()


def test_warehouse_lock_timeout_and_failure_hook(monkeypatch, tmp_path):
    monkeypatch.setenv("RAGSPINE_FAIL_BEFORE_PUBLISH", "chunks")
    fail_before_publish("documents", "documents v2")  # another asset: no failure
    with pytest.raises(PublishInterrupted, match="chunks v3"):
        fail_before_publish("chunks", "chunks v3")
    monkeypatch.setenv("RAGSPINE_FAIL_BEFORE_PUBLISH", "*")
    with pytest.raises(PublishInterrupted):
        fail_before_publish("catalog", "the catalog")
    monkeypatch.setenv("RAGSPINE_LOCK_TIMEOUT", "soon")
    with pytest.raises(settings.SettingsError, match="RAGSPINE_LOCK_TIMEOUT='soon': use a number"), \
            writer_lock(tmp_path / "lib.lock"):
        pass
    with writer_lock(tmp_path / "lib.lock", timeout=1.0):  # an argument wins over the bad variable
        assert (tmp_path / "lib.lock").exists()


@pytest.mark.parametrize("raw", ["PUBLIC,RESTRICTED", " internal , restricted ", "PUBLIC,ＲＥＳＴＲＩＣＴＥＤ",
                                 "PU\u200bBLIC,RESTRICTED", "PUBLIC", "PUBLIC,RESTRI\u00adCTED"])
def test_registry_and_label_reader_agree_on_sensitivity_labels(raw, monkeypatch):
    """`ragspine config` must not call a labels value fine that indexing then refuses."""
    from ragspine_pipeline import sensitivity
    from ragspine_pipeline.settings.model import Invalid, Labels

    monkeypatch.setenv("RAGSPINE_SENSITIVITY_LABELS", raw)
    try:
        sensitivity.known_labels()
        reader_ok = True
    except sensitivity.LabelConfigError:
        reader_ok = False
    try:
        Labels()(raw)
        registry_ok = True
    except Invalid:
        registry_ok = False
    assert registry_ok == reader_ok
