"""The settings registry: complete, documented, read at call time, one clear error per bad value."""

from __future__ import annotations

import ast
import importlib
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ragspine_pipeline import settings
from ragspine_pipeline.settings import REGISTRY, SettingsError

ROOT = Path(__file__).resolve().parents[1]
SOURCES = [ROOT / "ragspine_pipeline", ROOT / "assets", ROOT / "resources", ROOT / "definitions.py",
           ROOT / "benchmarks"]
SETTINGS_DIR = ROOT / "ragspine_pipeline" / "settings"
NAME = re.compile(r"RAGSPINE_[A-Z0-9_]+")


def _py_files(include_settings: bool = True) -> list[Path]:
    out: list[Path] = []
    for src in SOURCES:
        files = [src] if src.is_file() else sorted(src.rglob("*.py"))
        out += [f for f in files if include_settings or SETTINGS_DIR not in f.parents]
    return out


def _names_in_source() -> set[str]:
    return {m for f in _py_files(include_settings=False) for m in NAME.findall(f.read_text(encoding="utf-8"))}


# ----------------------------------------------------------------------------- (a) complete
def test_every_variable_in_the_source_is_declared_once():
    found = _names_in_source()
    assert len(found) > 50
    prefixes = {n for n in found if n.endswith("_")}  # "RAGSPINE_RAPTOR_*" in prose
    missing = sorted(n for n in found - prefixes if n not in REGISTRY)
    assert not missing, f"declare these in ragspine_pipeline/settings/registry.py: {missing}"
    assert all(any(d.startswith(p) for d in REGISTRY) for p in prefixes)
    assert len(settings.SETTINGS) == len(REGISTRY)  # no name declared twice


def test_no_declared_variable_is_stale():
    unused = sorted(set(REGISTRY) - _names_in_source())
    assert not unused, f"declared but read nowhere: {unused}"


def test_every_declaration_is_documented():
    for s in settings.SETTINGS:
        assert s.doc.strip() and s.spec.strip() and s.accepted.strip(), s.name
        assert s.group in settings.GROUPS, s.name
        if s.default is not None:  # the declared default itself parses
            settings.resolve(s.name, s.default)
    assert {s.name for s in settings.SETTINGS if s.secret} == {"RAGSPINE_LLM_API_KEY", "RAGSPINE_EMBED_API_KEY"}
    assert {s.name for s in settings.SETTINGS if s.group == "benchmark"} == {
        "RAGSPINE_BENCH_DATA", "RAGSPINE_BENCH_VECTORS", "RAGSPINE_JAVA", "RAGSPINE_ANSERINI_JAR",
        "RAGSPINE_BENCH_REUSE_INDEX", "RAGSPINE_BENCH_TREE"}


def test_registry_choices_match_the_factories():
    """The accepted values the registry prints are the ones each factory dispatches on."""
    from ragspine_pipeline.graph.relations import EXTRACTORS
    from ragspine_pipeline.graph.store import STORES
    from ragspine_pipeline.ingest.documents import ON_PARSE_ERROR
    from ragspine_pipeline.modes import LEXICAL_MODES, VECTOR_MODES
    from ragspine_pipeline.retrieval.hybrid.fusion import FUSION_METHODS
    from ragspine_pipeline.retrieval.link.routing import ROUTERS
    from ragspine_pipeline.retrieval.postprocess import ACCEPTED as POSTPROCESSORS
    from ragspine_pipeline.retrieval.raptor.retriever import MODES
    from ragspine_pipeline.retrieval.rerank.cross_encoder import ACCEPTED as RERANKERS
    from ragspine_pipeline.retrieval.vector.embedding_backends import ACCEPTED_SPECS

    def values(name):
        p = REGISTRY[name].parser
        return set(getattr(p, "values", ()) or p.heads)

    assert values("RAGSPINE_RETRIEVAL_MODE") == set(VECTOR_MODES + LEXICAL_MODES)
    assert values("RAGSPINE_EMBEDDING_BACKEND") == set(ACCEPTED_SPECS)
    assert values("RAGSPINE_RERANKER") == set(RERANKERS)
    assert values("RAGSPINE_POSTPROCESSOR") == set(POSTPROCESSORS)
    assert values("RAGSPINE_ROUTER") == set(ROUTERS)
    assert values("RAGSPINE_GRAPH_STORE") == set(STORES)
    assert values("RAGSPINE_RELATION_EXTRACTOR") == set(EXTRACTORS)
    assert values("RAGSPINE_RAPTOR_MODE") == set(MODES)
    assert values("RAGSPINE_FUSION") == set(FUSION_METHODS)
    assert values("RAGSPINE_ON_PARSE_ERROR") == set(ON_PARSE_ERROR)


def test_registry_defaults_match_the_code_constants():
    """A default declared here and a constant in the code must not drift apart."""
    from ragspine_pipeline.ingest.parsers import DEFAULT_MAX_FILE_BYTES
    from ragspine_pipeline.llm.provider import OpenAICompatibleProvider
    from ragspine_pipeline.retrieval.limits import DEFAULT_MAX_QUERY_CHARS
    from ragspine_pipeline.retrieval.link.multi_index import DEFAULT_MIN_RELATIVE_STRENGTH
    from ragspine_pipeline.retrieval.raptor.retriever import DEFAULT_MODE
    from ragspine_pipeline.retrieval.raptor.tree import DEFAULT_DEPTH, DEFAULT_THRESHOLD
    from ragspine_pipeline.retrieval.vector.embedding_backends import OpenAIEmbeddingBackend
    from ragspine_pipeline.retrieval.vector.onnx_backend import DEFAULT_BATCH_SIZE
    from ragspine_pipeline.warehouse.versioned import DEFAULT_LOCK_TIMEOUT_S, DEFAULT_RETAIN_FOR_S

    expected = {
        "RAGSPINE_MAX_FILE_BYTES": DEFAULT_MAX_FILE_BYTES, "RAGSPINE_MAX_QUERY_CHARS": DEFAULT_MAX_QUERY_CHARS,
        "RAGSPINE_LIBRARY_MIN_STRENGTH": DEFAULT_MIN_RELATIVE_STRENGTH, "RAGSPINE_RAPTOR_MODE": DEFAULT_MODE,
        "RAGSPINE_RAPTOR_DEPTH": DEFAULT_DEPTH, "RAGSPINE_RAPTOR_THRESHOLD": DEFAULT_THRESHOLD,
        "RAGSPINE_EMBED_BATCH": DEFAULT_BATCH_SIZE, "RAGSPINE_LOCK_TIMEOUT": DEFAULT_LOCK_TIMEOUT_S,
        "RAGSPINE_RETAIN_FOR_S": DEFAULT_RETAIN_FOR_S, "RAGSPINE_LLM_TIMEOUT": OpenAICompatibleProvider.timeout,
        "RAGSPINE_LLM_MODEL": OpenAICompatibleProvider.model,
        "RAGSPINE_EMBED_BASE_URL": OpenAIEmbeddingBackend.base_url,
        "RAGSPINE_EMBED_MODEL": OpenAIEmbeddingBackend.model,
    }
    assert {name: settings.get(name) for name in expected} == expected


# ----------------------------------------------------------------------------- (b) generated docs
def test_configuration_doc_is_what_the_generator_writes_now():
    doc = ROOT / "docs" / "configuration.md"
    assert doc.read_text(encoding="utf-8") == settings.configuration_markdown(), (
        "docs/configuration.md is stale: run python tools/gen_config_table.py")
    r = subprocess.run([sys.executable, str(ROOT / "tools" / "gen_config_table.py"), "--check"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr


def test_readme_configuration_table_is_the_registry():
    """The README's table is generated from the registry (every variable outside the left-out
    groups, once; docs/configuration.md has them all)."""
    from ragspine_pipeline.settings.markdown import (
        README_END,
        README_LEFT_OUT,
        README_START,
        readme_table,
        with_readme_table,
    )

    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert readme == with_readme_table(readme), "README.md's table is stale: run python tools/gen_config_table.py"
    block = readme[readme.index(README_START):readme.index(README_END)]
    assert readme_table() in block
    names = [line.split("`")[1] for line in block.splitlines() if line.startswith("| `RAGSPINE_")]
    assert names == [s.name for s in settings.SETTINGS if s.group not in README_LEFT_OUT]
    with pytest.raises(ValueError, match="markers"):
        with_readme_table("# no table here\n")


def test_markdown_table_has_one_row_per_variable():
    table = settings.markdown_table()
    rows = [line for line in table.splitlines() if line.startswith("| `RAGSPINE_")]
    assert [r.split("`")[1] for r in rows] == [s.name for s in settings.SETTINGS]
    row = next(r for r in rows if "`RAGSPINE_RETRIEVAL_MODE`" in r)
    assert "| auto |" in row and "economy" in row and "現在の検索プロダクトプリセット" in row
    assert "🔒" in next(r for r in rows if "`RAGSPINE_LLM_API_KEY`" in r)
    assert len(settings.markdown_table("graph").splitlines()) == 2 + 4


# ----------------------------------------------------------------------------- reading
def test_argument_then_environment_then_default(monkeypatch):
    assert settings.resolve("RAGSPINE_RETRIEVAL_MODE").source == "default"
    assert settings.get("RAGSPINE_RETRIEVAL_MODE") == "auto"
    monkeypatch.setenv("RAGSPINE_RETRIEVAL_MODE", " BM25 ")
    r = settings.resolve("RAGSPINE_RETRIEVAL_MODE")
    assert (r.value, r.source, r.text) == ("bm25", "environment", " BM25 ")
    r = settings.resolve("RAGSPINE_RETRIEVAL_MODE", "hybrid")
    assert (r.value, r.source) == ("hybrid", "argument")
    monkeypatch.setenv("RAGSPINE_RETRIEVAL_MODE", "   ")  # blank counts as unset
    assert settings.resolve("RAGSPINE_RETRIEVAL_MODE").source == "default"


def test_typed_values(monkeypatch):
    monkeypatch.setenv("RAGSPINE_EMBED_BATCH", "32")
    monkeypatch.setenv("RAGSPINE_RAPTOR_THRESHOLD", "0.5")
    monkeypatch.setenv("RAGSPINE_RAPTOR", "YES")
    monkeypatch.setenv("RAGSPINE_COMPETITORS", "Hooli, ,Pied Piper")
    assert settings.get("RAGSPINE_EMBED_BATCH") == 32
    assert settings.get("RAGSPINE_RAPTOR_THRESHOLD") == 0.5
    assert settings.get("RAGSPINE_RAPTOR") is True
    assert settings.get("RAGSPINE_COMPETITORS") == ("Hooli", "Pied Piper")
    assert settings.get("RAGSPINE_EMBED_THREADS") is None  # computed by the reader (usable CPUs)
    assert settings.get("RAGSPINE_LLM_TIMEOUT") == 60.0
    assert settings.get("RAGSPINE_POSTPROCESSOR", "MMR:0.7, litm") == "MMR:0.7, litm"  # spec text, case kept


def test_lenient_spellings_stay_accepted(monkeypatch):
    """What the code read before the registry still reads the same."""
    assert settings.get("RAGSPINE_GRAPH_COMMUNITIES", "maybe") is False  # anything but on-words: off
    assert settings.get("RAGSPINE_PROGRESS", "no") is True  # only "0" turns the bar off
    assert settings.get("RAGSPINE_PROGRESS", "0") is False
    assert settings.get("RAGSPINE_ADAPTIVE", "heuristic") == "heuristic"
    assert settings.get("RAGSPINE_QUERY_TRANSFORM", "Rag-Fusion") == "rag-fusion"
    assert settings.get("RAGSPINE_CONTEXTUAL", "title, heading") == "title, heading"
    assert settings.get("RAGSPINE_ANALYZER", "unicode:german+fold") == "unicode:german+fold"
    assert settings.get("RAGSPINE_EMBEDDING_BACKEND", "st:/Models/Qwen3") == "st:/Models/Qwen3"


def test_undeclared_names_are_refused():
    with pytest.raises(KeyError, match="not declared"):
        settings.get("RAGSPINE_NO_SUCH_THING")
    with pytest.raises(KeyError):
        settings.raw("RAGSPINE_NO_SUCH_THING")


# ----------------------------------------------------------------------------- (c) bad values
@pytest.mark.parametrize(("name", "value", "accepted"), [
    ("RAGSPINE_RETRIEVAL_MODE", "turbo", "one of auto, hybrid, vector, economy, bm25, lexical"),
    ("RAGSPINE_RERANKER", "bogus", "cross_encoder"),
    ("RAGSPINE_POSTPROCESSOR", "mmr,bogus", "lost_in_middle"),
    ("RAGSPINE_EMBED_BATCH", "0", "an integer >= 1"),
    ("RAGSPINE_RAPTOR_DEPTH", "three", "an integer"),
    ("RAGSPINE_LLM_TIMEOUT", "soon", "a number"),
    ("RAGSPINE_RAPTOR", "maybe", "on or off"),
    ("RAGSPINE_REFRESH_CRON", "every morning", "five fields"),
    ("RAGSPINE_REFRESH_TZ", "Mars/Olympus", "IANA time zone"),
    ("RAGSPINE_SENSITIVITY_LABELS", "PUBLIC,SECRET", "RESTRICTED"),
    ("RAGSPINE_ON_PARSE_ERROR", "Withhold", "withhold or serve_last_good"),  # exact spelling, as before
])
def test_a_bad_value_is_one_clear_error(monkeypatch, name, value, accepted):
    monkeypatch.setenv(name, value)
    with pytest.raises(SettingsError) as e:
        settings.get(name)
    msg = str(e.value)
    assert msg.startswith(f"{name}={value!r}: ") and accepted in msg
    assert isinstance(e.value, ValueError)
    assert (e.value.name, e.value.value, e.value.source) == (name, value, "environment")
    with pytest.raises(SettingsError, match=re.escape(name)) as e:  # an argument is checked the same way
        settings.get(name, value)
    assert e.value.source == "argument"


def test_error_names_what_is_unknown_and_can_take_the_callers_class(monkeypatch):
    class GraphProblem(ValueError):
        pass

    monkeypatch.setenv("RAGSPINE_GRAPH_STORE", "neo4j")
    with pytest.raises(GraphProblem, match=r"RAGSPINE_GRAPH_STORE='neo4j': unknown graph store; "
                                          r"use memory or networkx") as e:
        settings.get("RAGSPINE_GRAPH_STORE", error=GraphProblem)
    assert isinstance(e.value.__cause__, SettingsError)


def test_factories_give_the_registry_error_for_bad_variables(monkeypatch):
    from ragspine_pipeline.graph.relations import RelationExtractorError, make_relation_extractor
    from ragspine_pipeline.graph.store import GraphStoreError, make_graph_store
    from ragspine_pipeline.retrieval.query import make_query_layers

    monkeypatch.setenv("RAGSPINE_GRAPH_STORE", "neo4j")
    with pytest.raises(GraphStoreError, match="RAGSPINE_GRAPH_STORE='neo4j': unknown graph store"):
        make_graph_store()
    monkeypatch.setenv("RAGSPINE_RELATION_EXTRACTOR", "spacy")
    with pytest.raises(RelationExtractorError, match="RAGSPINE_RELATION_EXTRACTOR='spacy'"):
        make_relation_extractor()
    monkeypatch.setenv("RAGSPINE_ADAPTIVE", "sometimes")
    with pytest.raises(SettingsError, match="RAGSPINE_ADAPTIVE='sometimes': use one of off, on, llm"):
        make_query_layers(object())


# ----------------------------------------------------------------------------- (d) report + secrets
def test_report_says_where_each_value_came_from_and_masks_secrets(monkeypatch, capsys):
    monkeypatch.setenv("RAGSPINE_LLM_API_KEY", "sk-live-abcdef123456")
    monkeypatch.setenv("RAGSPINE_RERANKER", "colbert")
    rows = {r.name: r for r in settings.report({"RAGSPINE_RETRIEVAL_MODE": "bm25"})}
    assert len(rows) == len(REGISTRY)
    assert (rows["RAGSPINE_RERANKER"].shown, rows["RAGSPINE_RERANKER"].source) == ("colbert", "environment")
    assert (rows["RAGSPINE_RETRIEVAL_MODE"].shown, rows["RAGSPINE_RETRIEVAL_MODE"].source) == ("bm25", "argument")
    assert (rows["RAGSPINE_ROUTER"].shown, rows["RAGSPINE_ROUTER"].source) == ("rules", "default")
    assert rows["RAGSPINE_LLM_API_KEY"].shown == settings.MASK
    text = settings.format_report(list(rows.values()))
    assert "sk-live" not in text and "123456" not in text and settings.MASK in text
    assert re.search(r"RAGSPINE_RERANKER\s+colbert\s+\(environment\)", text)

    assert settings.config_main(["--json"]) == 0
    out = capsys.readouterr().out
    assert "sk-live" not in out and "123456" not in out
    by_name = {d["name"]: d for d in json.loads(out)}
    assert by_name["RAGSPINE_LLM_API_KEY"] == {"name": "RAGSPINE_LLM_API_KEY", "value": settings.MASK,
                                               "source": "environment", "secret": True}
    assert settings.config_main(["--changed"]) == 0
    out = capsys.readouterr().out
    assert "RAGSPINE_RERANKER" in out and "RAGSPINE_ROUTER" not in out and "sk-live" not in out


def test_config_command_reports_every_bad_value_and_fails(monkeypatch, capsys):
    monkeypatch.setenv("RAGSPINE_RAPTOR_DEPTH", "deep")
    code = settings.config_main(["--set", "RAGSPINE_ROUTER=magic", "--group", "retrieval"])
    out, err = capsys.readouterr()
    assert code == 2
    assert "RAGSPINE_ROUTER='magic': unknown router; use one of rules, llm, none" in err
    assert "RAGSPINE_RAPTOR_DEPTH" not in err  # another group
    assert re.search(r"RAGSPINE_ROUTER\s+INVALID\s+\(argument\)", out)
    assert settings.config_main(["--set", "RAGSPINE_NOPE=1"]) == 2
    assert "not declared" in capsys.readouterr().err


def test_config_command_runs_as_a_program():
    r = subprocess.run([sys.executable, "-c", "import sys; from ragspine_pipeline.settings import config_main; "
                        "sys.exit(config_main(['--changed']))"], capture_output=True, text=True, timeout=120,
                       env={"PATH": "/usr/bin:/bin", "RAGSPINE_EMBED_API_KEY": "tok-123456789",
                            "RAGSPINE_CHUNKER": "laws"}, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert "RAGSPINE_CHUNKER" in r.stdout and "laws" in r.stdout and "tok-123" not in r.stdout


# ----------------------------------------------------------------------------- (e) call time, not import time
def test_schedule_reads_its_variables_when_built_not_at_import(monkeypatch):
    import assets.automation as automation

    monkeypatch.setenv("RAGSPINE_REFRESH_CRON", "whenever")
    monkeypatch.setenv("RAGSPINE_REFRESH_TZ", "Nowhere/Land")
    importlib.reload(automation)  # importing with bad values set does not fail
    with pytest.raises(SettingsError, match="RAGSPINE_REFRESH_CRON='whenever'"):
        automation.build_refresh_schedule()
    monkeypatch.setenv("RAGSPINE_REFRESH_CRON", "30 4 * * 1-5")
    monkeypatch.setenv("RAGSPINE_REFRESH_TZ", "Europe/Paris")
    sched = automation.build_refresh_schedule()
    assert (sched.cron_schedule, sched.execution_timezone) == ("30 4 * * 1-5", "Europe/Paris")
    monkeypatch.delenv("RAGSPINE_REFRESH_CRON")
    monkeypatch.delenv("RAGSPINE_REFRESH_TZ")
    sched = automation.build_refresh_schedule()
    assert (sched.cron_schedule, sched.execution_timezone) == ("0 3 * * *", "UTC")


def _third_party_default(node: ast.AST) -> bool:
    """``os.environ.setdefault("NAME", ...)`` for a NAME that is not a RAGSPINE_* setting: a
    default written for another library (its own switch), which reads no setting of ours."""
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr == "setdefault" and isinstance(node.func.value, ast.Attribute)
            and node.func.value.attr == "environ" and isinstance(node.func.value.value, ast.Name)
            and node.func.value.value.id == "os" and bool(node.args)
            and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)
            and not node.args[0].value.startswith("RAGSPINE_"))


def _import_time_env_reads(path: Path) -> list[int]:
    """Lines where ``os.environ`` / ``os.getenv`` is evaluated when the module is imported:
    module and class bodies, decorators and default arguments (not function bodies)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    hits: list[int] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            outer = [*getattr(node, "decorator_list", []), *node.args.defaults,
                     *[d for d in node.args.kw_defaults if d is not None]]
            for child in outer:
                visit(child, in_function)
            for child in (node.body if isinstance(node.body, list) else [node.body]):
                visit(child, True)
            return
        if not in_function and _third_party_default(node):
            return  # e.g. HAYSTACK_TELEMETRY_ENABLED set before that framework's import: no read
        if (not in_function and isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv")
                and isinstance(node.value, ast.Name) and node.value.id == "os"):
            hits.append(node.lineno)
        for child in ast.iter_child_nodes(node):
            visit(child, in_function)

    visit(tree, False)
    return hits


def test_no_module_reads_the_environment_at_import():
    found = {str(f.relative_to(ROOT)): lines for f in _py_files()
             if "benchmarks" not in f.parts and (lines := _import_time_env_reads(f))}
    assert not found, found


def test_settings_import_nothing_from_the_package():
    for f in SETTINGS_DIR.glob("*.py"):
        tree = ast.parse(f.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                assert node.level <= 1 and not (node.module or "").startswith("ragspine_pipeline"), f
            if isinstance(node, ast.Import):
                assert not any(a.name.startswith(("ragspine_pipeline", "dagster")) for a in node.names), f
