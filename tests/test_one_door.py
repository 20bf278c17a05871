"""One door: the same question with the same settings gets byte-identical snippets from
the CLI (``ragspine query --json``), the Python API (``open_published_retriever``), the
Dagster ``RetrievalResource`` and the ``ask`` job — all of them assemble the served
retriever in ``ragspine_pipeline.serving`` (with ``retrieval.link.assembly``).

Before, only the resource applied ``RAGSPINE_ROUTER``, the CLI hard-coded the demo
glossary, and ``auto`` meant two things; each setting below is one of those.
"""

import json
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the code location (resources/, assets/)

from ragspine_pipeline.cli import main  # noqa: E402
from ragspine_pipeline.retrieval.vector.embedding_backends import DeterministicHashBackend  # noqa: E402
from ragspine_pipeline.serving import open_published_retriever  # noqa: E402

QUESTIONS = [
    ("为什么营收下滑", {"entity": "ACME_CN"}),
    ("why close the Lyon plant", None),
    ("zorblat policy", None),  # only the custom glossary knows the word
    ("gross margin decline tariffs", None),
]
TOP_K = 4
CUSTOM_GLOSSARY = {"groups": [{"kind": "topic", "terms": ["zorblat", "remote work", "travel"]}]}

# name -> RAGSPINE_* settings (the fixture's glossary path is filled in below)
SETTINGS = {
    "default": {},
    "bm25": {"RAGSPINE_RETRIEVAL_MODE": "bm25"},
    "postprocessor": {"RAGSPINE_POSTPROCESSOR": "mmr,lost_in_middle"},
    "router_none": {"RAGSPINE_ROUTER": "none"},
    "rag_fusion": {"RAGSPINE_QUERY_TRANSFORM": "rag_fusion", "RAGSPINE_RETRIEVAL_MODE": "bm25"},
    "auto_filters_crag": {"RAGSPINE_AUTO_FILTERS": "on", "RAGSPINE_CORRECTIVE": "on"},
    "glossary": {"RAGSPINE_GLOSSARY": "<custom>"},
    "no_glossary": {"RAGSPINE_GLOSSARY": "none"},
}


def canonical(snippets) -> str:
    return json.dumps(json.loads(json.dumps(list(snippets), default=str)), ensure_ascii=False, sort_keys=True)


def via_cli(warehouse, capsys, query, filters) -> str:
    argv = ["query", query, "--warehouse", str(warehouse), "--json", "--top-k", str(TOP_K)]
    for field, value in (filters or {}).items():
        argv += ["--filter", f"{field}={value}"]
    rc = main(argv)
    out = capsys.readouterr()
    assert rc == 0, out.err
    return canonical(json.loads(out.out))


def via_api(warehouse, query, filters) -> str:
    return canonical(open_published_retriever(warehouse).retrieve(query, filters=filters, top_k=TOP_K))


def via_resource(warehouse, query, filters) -> str:
    from resources.retrieval import RetrievalResource

    return canonical(RetrievalResource(warehouse_root=str(warehouse)).ask(query, filters=filters, top_k=TOP_K))


def via_ask_job(query, filters) -> str:
    """The ``ask`` job of the code location (its RetrievalResource reads RAGSPINE_WAREHOUSE)."""
    import definitions

    clauses = [{"field": f, "value": v} for f, v in (filters or {}).items()]
    result = definitions.defs.get_job_def("ask").execute_in_process(
        run_config={"ops": {"ask_question": {"config": {"query": query, "filters": clauses, "top_k": TOP_K}}}})
    return canonical(result.output_for_node("ask_question"))


@pytest.fixture(scope="module")
def custom_glossary(tmp_path_factory):
    path = tmp_path_factory.mktemp("glossary") / "custom.json"
    path.write_text(json.dumps(CUSTOM_GLOSSARY), encoding="utf-8")
    return path


def _apply(monkeypatch, name, custom_glossary):
    for var, value in SETTINGS[name].items():
        monkeypatch.setenv(var, str(custom_glossary) if value == "<custom>" else value)


def _answers(published_demo, capsys):
    out = {}
    for query, filters in QUESTIONS:
        doors = {"cli": via_cli(published_demo, capsys, query, filters),
                 "api": via_api(published_demo, query, filters),
                 "resource": via_resource(published_demo, query, filters)}
        assert len(set(doors.values())) == 1, (query, {k: v[:300] for k, v in doors.items()})
        out[query] = doors["cli"]
    return out


@pytest.fixture(scope="module")
def default_answers(published_demo):
    """The default settings' answers through the Python API (the reference each setting
    must move for at least one question, so the comparison can fail)."""
    with pytest.MonkeyPatch.context() as mp:
        for var in [v for v in os.environ if v.startswith("RAGSPINE_")]:
            mp.delenv(var, raising=False)
        return {q: via_api(published_demo, q, f) for q, f in QUESTIONS}


@pytest.mark.parametrize("name", list(SETTINGS))
def test_every_door_gives_the_same_snippets(name, published_demo, custom_glossary, default_answers, monkeypatch,
                                            capsys):
    _apply(monkeypatch, name, custom_glossary)
    answers = _answers(published_demo, capsys)
    assert all(json.loads(a) for q, a in answers.items() if q != "zorblat policy")  # real answers, not empty
    if name != "default":  # the setting took effect (the same everywhere), so equality means something
        assert answers != default_answers, name
    else:
        assert answers == default_answers


@pytest.mark.parametrize("name", ["default", "postprocessor", "router_none"])
def test_the_ask_job_gives_the_same_snippets(name, published_demo, custom_glossary, monkeypatch):
    _apply(monkeypatch, name, custom_glossary)
    monkeypatch.setenv("RAGSPINE_WAREHOUSE", str(published_demo))
    for query, filters in QUESTIONS[:2]:
        assert via_ask_job(query, filters) == via_api(published_demo, query, filters)


def test_router_applies_at_every_door(published_demo, monkeypatch):
    """``rules`` (the default) narrows a question about one library's metrics to that
    library at every door; ``none`` searches both. Before, the CLI and the Python API
    never routed."""
    from ragspine_pipeline.cli import open_retriever
    from resources.retrieval import RetrievalResource

    def routes(query):
        doors = (open_retriever(published_demo, mode=None, embedding=None, progress=False),
                 open_published_retriever(published_demo),
                 RetrievalResource(warehouse_root=str(published_demo)).retriever())
        return [door.route(query) for door in doors]

    query = "gross margin decline tariffs"
    assert routes(query) == [["acme_reports"]] * 3
    answer = json.loads(via_api(published_demo, query, None))
    assert answer and {s["library_id"] for s in answer} == {"acme_reports"}
    monkeypatch.setenv("RAGSPINE_ROUTER", "none")
    assert routes(query) == [["acme_policies", "acme_reports"]] * 3


def test_custom_glossary_reaches_every_door(published_demo, custom_glossary, capsys, monkeypatch):
    """The CLI used to hard-code the demo glossary: a word only the custom file knows
    finds nothing without it (BM25: no dense neighbour), and the same snippets through
    every door with it."""
    monkeypatch.setenv("RAGSPINE_RETRIEVAL_MODE", "bm25")
    assert json.loads(via_cli(published_demo, capsys, "zorblat", None)) == []
    monkeypatch.setenv("RAGSPINE_GLOSSARY", str(custom_glossary))
    cli = via_cli(published_demo, capsys, "zorblat", None)
    assert json.loads(cli) and cli == via_api(published_demo, "zorblat", None) == \
        via_resource(published_demo, "zorblat", None)


def test_one_resolution_of_the_retrieval_mode(monkeypatch):
    """``modes.resolve_retrieval`` is the only place a mode is read. ``auto``: the index's
    own vectors, else a backend asked for, else — where the source records no embedding
    choice (a chunk store) — the configured one; a snapshot published without vectors
    stays BM25. hybrid / vector need vectors or fail."""
    from ragspine_pipeline import modes

    built = []

    def factory(spec=None):
        built.append(spec)
        return None if spec == "none" else DeterministicHashBackend()

    monkeypatch.setattr(modes, "make_embedding_backend", factory)
    monkeypatch.setenv("RAGSPINE_EMBEDDING_BACKEND", "deterministic")
    assert modes.resolve_retrieval("auto", stored_vectors=True) == (None, ("bm25", "dense"))
    assert modes.resolve_retrieval("vector", stored_vectors=True) == (None, ("dense",))
    assert modes.resolve_retrieval("auto", stored_vectors=False) == (None, ("bm25",))
    assert modes.resolve_retrieval("bm25", "deterministic") == (None, ("bm25",))
    assert built == []  # none of these builds a backend
    given = DeterministicHashBackend()
    assert modes.resolve_retrieval("auto", given, stored_vectors=False) == (given, ("bm25", "dense"))
    assert modes.resolve_retrieval("auto")[1] == ("bm25", "dense") and built == ["deterministic"]
    assert modes.resolve_retrieval("hybrid", stored_vectors=False)[1] == ("bm25", "dense")
    with pytest.raises(modes.RetrievalModeError, match="needs an embedding backend"):
        modes.resolve_retrieval("vector", "none", stored_vectors=False)
    monkeypatch.setenv("RAGSPINE_RETRIEVAL_MODE", "sideways")
    with pytest.raises(modes.RetrievalModeError, match="RAGSPINE_RETRIEVAL_MODE"):
        modes.resolve_retrieval()


@pytest.fixture(scope="module")
def unembedded(tmp_path_factory):
    """One demo library published without vectors (the pipeline ran with no backend)."""
    from ragspine_pipeline.corpus import DEMO_ROOT
    from ragspine_pipeline.warehouse import pipeline as P
    from ragspine_pipeline.warehouse.versioned import VersionedTables

    root = tmp_path_factory.mktemp("unembedded")
    wh = VersionedTables(root)
    P.build_raw_documents(wh, DEMO_ROOT, "acme_reports")
    P.build_chunks(wh, "acme_reports")
    P.build_lexical_index(wh, "acme_reports")
    P.publish_snapshot(wh, "acme_reports")
    return root


def test_auto_over_a_snapshot_without_vectors_is_bm25_at_every_door(unembedded, capsys, monkeypatch):
    """Before, the CLI built the configured backend and embedded such a snapshot lazily
    while the API and the resource served BM25: ``auto`` meant two things."""
    monkeypatch.setenv("RAGSPINE_EMBEDDING_BACKEND", "deterministic")
    q, flt = QUESTIONS[0]
    answers = {via_cli(unembedded, capsys, q, flt), via_api(unembedded, q, flt), via_resource(unembedded, q, flt)}
    assert len(answers) == 1
    snippets = json.loads(answers.pop())
    assert snippets and all(s["scores"]["vector"] is None for s in snippets)
    monkeypatch.setenv("RAGSPINE_RETRIEVAL_MODE", "hybrid")  # asked for: every door embeds lazily
    hybrid = {via_cli(unembedded, capsys, q, flt), via_api(unembedded, q, flt), via_resource(unembedded, q, flt)}
    assert len(hybrid) == 1 and all(s["scores"]["vector"] is not None for s in json.loads(hybrid.pop()))
