"""``ragspine index PATH``: a folder of md/txt/html/pdf/docx files (one unreadable) built
into a warehouse, in-process and through the Dagster code location, then queried.

BM25 only (``RAGSPINE_EMBEDDING_BACKEND=none``) so no model is loaded."""

from __future__ import annotations

import importlib.util
import json
import os
import re
from pathlib import Path

import pytest

from ragspine_pipeline import cli, indexing, paths
from ragspine_pipeline.graph.dimensions import load_dimensions
from ragspine_pipeline.retrieval.link.assembly import default_glossary_path
from tests.chunker_docs import multipage_pdf

docx = pytest.importorskip("docx")
CHECK_FAILED = indexing.EXIT_CHECK_FAILED  # make_corpus holds an unreadable PDF: parse_failures_zero fails


@pytest.fixture(autouse=True)
def _bm25_only(monkeypatch):
    monkeypatch.setenv("RAGSPINE_EMBEDDING_BACKEND", "none")
    monkeypatch.setenv("RAGSPINE_RETRIEVAL_MODE", "bm25")
    for name in ("RAGSPINE_GLOSSARY", "RAGSPINE_GRAPH_DIMENSIONS", "RAGSPINE_CORPUS_ROOT", "RAGSPINE_EMBEDDING",
                 "RAGSPINE_WAREHOUSE", "DAGSTER_HOME"):
        monkeypatch.delenv(name, raising=False)


def write_docx(path: Path, heading: str, body: str) -> None:
    d = docx.Document()
    d.add_heading(heading, 1)
    d.add_paragraph(body)
    table = d.add_table(rows=1, cols=2)
    table.cell(0, 0).text, table.cell(0, 1).text = "Approved suppliers", "42"
    d.save(str(path))


def make_corpus(root: Path) -> Path:
    """Two libraries: ``policies`` (md, txt, docx, an unreadable pdf) and ``reports`` (html, pdf)."""
    pol, rep = root / "policies", root / "reports"
    pol.mkdir(parents=True)
    rep.mkdir()
    (pol / "travel.md").write_text("# Travel policy\n\nEconomy class for flights under six hours.\n")
    (pol / "remote.txt").write_text("Remote work is allowed three days a week with manager approval.\n")
    write_docx(pol / "suppliers.docx", "Supplier onboarding",
               "Every supplier signs the zebrafish code of conduct before the first purchase order.")
    (pol / "broken.pdf").write_bytes(b"%PDF-1.4 this is not a pdf at all")
    (rep / "q3.html").write_text("<html><head><title>Q3 report</title></head><body><h1>Q3</h1>"
                                 "<p>Quarterly turnover rose with the new kiwifruit line.</p></body></html>")
    (rep / "annual.pdf").write_bytes(multipage_pdf([["Annual report", "Harbour logistics margins improved."]]))
    return root


def tree(root: Path) -> dict[str, int]:
    """Every file under ``root`` with its mtime: what a rerun must leave exactly as it was."""
    return {str(p.relative_to(root)): p.stat().st_mtime_ns for p in sorted(root.rglob("*")) if p.is_file()}


def run(capsys, *argv: str) -> tuple[int, str, str]:
    rc = cli.main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_index_in_process_then_query_then_rerun_writes_nothing(tmp_path, capsys):
    corpus, wh = make_corpus(tmp_path / "corpus"), tmp_path / "wh"
    rc, out, err = run(capsys, "index", str(corpus), "--warehouse", str(wh), "--in-process")
    assert rc == CHECK_FAILED, out + err
    assert "running the same engine steps in-process (--in-process given)" in out
    assert "policies: documents 3 (4 parsed this run, 1 unreadable)" in out  # progress per library
    assert "reports: documents 2 (2 parsed this run, 0 unreadable)" in out
    assert "policies: chunks 3 active (3 new, 0 changed" in out
    assert "policies:   ! broken.pdf: unreadable PDF" in out  # named once, and the rest still built
    assert "unreadable files (1), withheld until they parse: policies/broken.pdf: unreadable PDF" in out
    assert "checks that failed: policies/parse_failures_zero" in out and "exit code 3: a check failed" in out
    assert "policies: embeddings off" in out
    assert "summary: 2/2 libraries indexed" in out and "2 published a new snapshot" in out
    assert f"ragspine query --warehouse {wh}" in out
    for question, doc in (("zebrafish code of conduct", "policies/suppliers"), ("kiwifruit", "reports/q3"),
                          ("harbour logistics", "reports/annual"), ("economy class flights", "policies/travel"),
                          ("remote work manager approval", "policies/remote")):
        rc, out, err = run(capsys, "query", question, "--warehouse", str(wh), "--json", "--top-k", "1")
        assert rc == 0, err
        assert json.loads(out)[0]["doc_id"] == doc, question
    before = tree(wh)
    rc, out, _ = run(capsys, "index", str(corpus), "--warehouse", str(wh), "--in-process")
    assert rc == CHECK_FAILED and "0 published a new snapshot, 2 unchanged" in out
    assert tree(wh) == before  # nothing published, no data file written or touched


def test_without_a_code_location_the_engine_steps_run_in_process_and_say_so(tmp_path, monkeypatch, capsys):
    """A plain install: no definitions.py beside the package."""
    monkeypatch.setattr(paths, "definitions_file", lambda: None)
    corpus, wh = make_corpus(tmp_path / "corpus"), tmp_path / "wh"
    rc, out, err = run(capsys, "index", str(corpus), "--warehouse", str(wh))
    assert rc == CHECK_FAILED, out + err
    assert "running the same engine steps in-process (no Dagster code location: a plain install has no " \
           "definitions.py" in out
    assert "summary: 2/2 libraries indexed" in out


def test_index_reports_embedding_throughput(tmp_path, capsys):
    corpus, wh = make_corpus(tmp_path / "corpus"), tmp_path / "wh"
    rc, out, err = run(capsys, "index", str(corpus), "--warehouse", str(wh), "--in-process",
                       "--embedding", "deterministic:32")
    assert rc == CHECK_FAILED, out + err
    assert "embeddings[policies]" in out  # live progress of the embedding step
    assert re.search(r"policies: embeddings 3 embedded at [0-9.]+ items/s", out), out
    rc, out, _ = run(capsys, "index", str(corpus), "--warehouse", str(wh), "--in-process",
                     "--embedding", "deterministic:32")
    assert "policies: embeddings unchanged (3 vectors" in out


def test_index_through_the_code_location_and_a_second_folder_leaves_others_untouched(tmp_path, capsys):
    pytest.importorskip("dagster")
    if paths.definitions_file() is None:
        pytest.skip("not a checkout: no Dagster code location")
    corpus, wh = make_corpus(tmp_path / "corpus"), tmp_path / "wh"
    rc, out, err = run(capsys, "index", str(corpus), "--warehouse", str(wh))
    assert rc == CHECK_FAILED, out + err
    assert "through the Dagster code location" in out and "in-process" not in out
    assert "policies: documents 3" in out and "1 unreadable" in out
    before = tree(wh)
    rc, out, _ = run(capsys, "index", str(corpus), "--warehouse", str(wh))
    assert rc == CHECK_FAILED and "0 published a new snapshot" in out
    assert tree(wh) == before
    # A second folder, as one library, into the same warehouse: the first two stay as they were.
    other = tmp_path / "Field notes"
    other.mkdir()
    (other / "note.md").write_text("# Note\n\nThe pelican survey counted forty birds.\n")
    snaps = {lib: sorted((wh / "retrieval_snapshot" / lib).iterdir()) for lib in ("policies", "reports")}
    rc, out, err = run(capsys, "index", str(other), "--warehouse", str(wh), "--library", "notes")
    assert rc == 0, out + err
    assert "running the same engine steps in-process (--library notes: the code location reads" in out
    assert {lib: sorted((wh / "retrieval_snapshot" / lib).iterdir()) for lib in snaps} == snaps
    rc, out, _ = run(capsys, "query", "pelican survey", "--warehouse", str(wh), "--json", "--top-k", "1")
    assert json.loads(out)[0]["doc_id"] == "notes/note"
    rc, out, _ = run(capsys, "query", "kiwifruit", "--warehouse", str(wh), "--json", "--top-k", "1")
    assert json.loads(out)[0]["doc_id"] == "reports/q3"


@pytest.mark.parametrize("name", ["a...b", "tab\tname", ".hidden", "a/b", " padded", "bad name!", "a$b", "two  spaces"])
def test_library_names_dagster_rejects_are_clear_errors_naming_the_folder(tmp_path, capsys, name):
    folder = tmp_path / "docs"
    folder.mkdir()
    rc, out, err = run(capsys, "index", str(folder), "--warehouse", str(tmp_path / "wh"), "--library", name)
    assert rc == 2 and out == ""
    assert err.startswith("ragspine: error: ") and str(folder) in err and err.count("\n") == 1
    assert not (tmp_path / "wh").exists()


def test_subfolder_named_what_dagster_rejects_is_named_in_the_error(tmp_path):
    (tmp_path / "ok").mkdir()
    (tmp_path / "q1...q2").mkdir()
    with pytest.raises(indexing.IndexInputError, match=r"q1\.\.\.q2.*--library"):
        indexing.plan_libraries(tmp_path)


def test_a_folder_without_subfolders_says_to_use_library(tmp_path, capsys):
    (tmp_path / "a.md").write_text("# A\n\ntext\n")
    rc, _, err = run(capsys, "index", str(tmp_path), "--warehouse", str(tmp_path / "wh"))
    assert rc == 2 and "--library NAME" in err


def test_corpus_glossary_and_dimensions_are_its_own_or_none(tmp_path, monkeypatch, capsys):
    # The demo corpus keeps its ACME files; any other corpus root gets its own or none.
    assert default_glossary_path() == paths.DEMO_GLOSSARY
    assert len(load_dimensions().entities) > 0
    monkeypatch.setenv("RAGSPINE_CORPUS_ROOT", str(tmp_path))
    assert default_glossary_path() is None
    assert load_dimensions().entities == () and load_dimensions().metrics == ()
    (tmp_path / "glossary.json").write_text(json.dumps({"groups": [{"kind": "term", "terms": ["pelican",
                                                                                              "seabird"]}]}))
    (tmp_path / "dimensions.json").write_text(json.dumps({"entities": [{"id": "BIRDCO"}], "metrics": []}))
    assert default_glossary_path() == tmp_path / "glossary.json"
    assert [e.id for e in load_dimensions().entities] == ["BIRDCO"]
    monkeypatch.delenv("RAGSPINE_CORPUS_ROOT")
    # Indexed: the warehouse keeps the corpus's glossary, and a query uses it (not the demo's).
    lib = tmp_path / "birds"
    lib.mkdir()
    (lib / "survey.md").write_text("# Survey\n\nThe seabird colony grew this year.\n")
    wh = tmp_path / "wh"
    rc, out, err = run(capsys, "index", str(tmp_path), "--warehouse", str(wh), "--in-process")
    assert rc == 0, out + err
    assert indexing.warehouse_glossary(wh) == wh / "glossary.json"
    assert json.loads((wh / "glossary.json").read_text())["groups"][0]["terms"] == ["pelican", "seabird"]
    rc, out, _ = run(capsys, "query", "pelican", "--warehouse", str(wh), "--json", "--top-k", "1")
    assert json.loads(out)[0]["doc_id"] == "birds/survey"  # found through the corpus's own synonym
    # Every door serves the warehouse with its corpus's glossary: the Python API and the
    # Dagster resource answer the synonym query exactly as the CLI does.
    from ragspine_pipeline.serving import open_published_retriever

    api = [s["doc_id"] for s in open_published_retriever(wh).retrieve("pelican", top_k=1)]
    assert api == ["birds/survey"]
    if importlib.util.find_spec("dagster") is not None:
        from resources import RetrievalResource

        res = RetrievalResource(warehouse_root=str(wh))
        assert [s["doc_id"] for s in res.retriever().retrieve("pelican", top_k=1)] == api
    graph = wh / "relation_graph" / "birds"
    assert graph.is_dir()


def test_a_corpus_without_a_glossary_queries_with_none(tmp_path, capsys):
    corpus, wh = make_corpus(tmp_path / "corpus"), tmp_path / "wh"
    assert run(capsys, "index", str(corpus), "--warehouse", str(wh), "--in-process")[0] == CHECK_FAILED
    assert indexing.warehouse_glossary(wh) is False
    assert not (wh / "glossary.json").exists()
    rec = json.loads((wh / "libraries.json").read_text())["libraries"]
    assert rec["policies"] == {"folder": str((corpus / "policies").resolve()), "glossary": None, "dimensions": None}
    assert os.environ.get("RAGSPINE_GLOSSARY") is None  # the build's settings did not leak out


def test_a_warehouse_shared_with_the_demo_keeps_the_demo_glossary_for_the_demo(tmp_path, capsys):
    pytest.importorskip("dagster")
    if paths.definitions_file() is None:
        pytest.skip("not a checkout: no Dagster code location")
    corpus, wh = make_corpus(tmp_path / "corpus"), tmp_path / "wh"
    assert run(capsys, "index", str(corpus), "--warehouse", str(wh), "--in-process")[0] == CHECK_FAILED
    assert indexing.warehouse_glossary(wh) is False  # the user corpus has none
    rc, out, err = run(capsys, "demo", "--questions", "0", "--warehouse", str(wh))
    assert rc == 0, out + err
    rec = json.loads((wh / "libraries.json").read_text())["libraries"]
    assert rec["acme_reports"]["glossary"] == str(paths.DEMO_GLOSSARY.resolve())
    assert rec["policies"]["glossary"] is None
    assert json.loads((wh / "glossary.json").read_text()) == json.loads(paths.DEMO_GLOSSARY.read_text())



def test_docx_parser_reads_paragraphs_tables_headings_and_title(tmp_path):
    from ragspine_pipeline.ingest.parsers import ParseError, parse_source

    d = docx.Document()
    d.core_properties.title = "Supplier Policy"
    d.add_heading("Supplier onboarding", 1)
    d.add_paragraph("Every supplier signs the code of conduct.")
    table = d.add_table(rows=1, cols=3)
    table.cell(0, 0).merge(table.cell(0, 1)).text = "Approved suppliers"
    table.cell(0, 2).text = "42"
    d.add_heading("Audits", 2)
    d.save(str(tmp_path / "p.docx"))
    parsed = parse_source(tmp_path / "p.docx")
    assert parsed.text == ("Supplier onboarding\n\nEvery supplier signs the code of conduct.\n\n"
                           "Approved suppliers | 42\n\nAudits")  # a merged cell once
    assert [(parsed.text[m.start:m.end], m.level) for m in parsed.structure] == [("Supplier onboarding", 1),
                                                                                 ("Audits", 2)]
    assert parsed.metadata == {"title": ["Supplier Policy"]}
    (tmp_path / "bad.docx").write_bytes(b"PK\x03\x04 not really a zip")
    with pytest.raises(ParseError, match="unreadable Word file"):
        parse_source(tmp_path / "bad.docx")
