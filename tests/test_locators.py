"""A citation's locator checked against the file it points into, for every file type:
``space: file`` spans slice the file's text; PDF page spans slice pypdf's page text; a DOCX
block names the paragraph / table row holding the text; an HTML element path resolves to
the element holding the span's start."""

import pytest
from chunker_docs import multipage_pdf

from ragspine_pipeline.ingest.locators import anchors_from_json, anchors_to_json, locate
from ragspine_pipeline.ingest.parsers import parse_source
from ragspine_pipeline.retrieval.chunking.chunking import SourceLocator

pytest.importorskip("bs4")
pytest.importorskip("pypdf")


def test_space_names_what_the_span_indexes():
    assert SourceLocator("d", 0, 3, "/lib/a.md").to_dict()["space"] == "file"
    assert SourceLocator("d", 0, 3, "/lib/a.TXT").to_dict()["space"] == "file"
    for ext in ("pdf", "docx", "html", "htm"):
        assert SourceLocator("d", 0, 3, f"/lib/a.{ext}").to_dict()["space"] == "extracted"
    assert "space" not in SourceLocator("node", 0, 3, "").to_dict()  # a summary node: no file


def test_markdown_span_slices_the_file(tmp_path):
    path = tmp_path / "a.md"
    path.write_text("# Title\n\nThe supplier limit is 42 units.\n", encoding="utf-8")
    parsed = parse_source(path)
    start = parsed.text.index("supplier")
    end = start + len("supplier limit")
    assert locate(parsed.anchors, start, end, str(path)) == {"space": "file"}
    assert path.read_text(encoding="utf-8")[start:end] == "supplier limit"
    path.write_text("---\nsensitivity: PUBLIC\n---\n# Title\n\nThe supplier limit is 42 units.\n", encoding="utf-8")
    parsed = parse_source(path)
    start = parsed.text.index("supplier")
    loc = locate(parsed.anchors, start, start + 8, str(path))
    off = loc["body_offset"]
    assert off > 0 and path.read_text(encoding="utf-8")[off + start:off + start + 8] == "supplier"


def test_pdf_pages_slice_each_page_text(tmp_path):
    from pypdf import PdfReader

    path = tmp_path / "r.pdf"
    path.write_bytes(multipage_pdf([["Alpha page one text"], [], ["Bravo second page", "Charlie line"]]))
    parsed = parse_source(path)
    start = parsed.text.index("one text")
    end = parsed.text.index("Bravo") + len("Bravo second")
    loc = locate(parsed.anchors, start, end, str(path))
    assert loc["space"] == "extracted"
    assert [p["page"] for p in loc["pages"]] == [1, 3]  # the empty page 2 keeps its number
    reader = PdfReader(str(path))
    got = [reader.pages[p["page"] - 1].extract_text()[p["start"]:p["end"]] for p in loc["pages"]]
    assert got == ["one text", "Bravo second"]
    assert "".join(got) == parsed.text[start:end].replace("\n\n", "")
    # The anchors survive their JSON form (how they are stored).
    assert anchors_from_json(anchors_to_json(parsed.anchors)) == parsed.anchors


def test_docx_blocks_name_the_paragraph_and_table_row(tmp_path):
    docx = pytest.importorskip("docx")
    path = tmp_path / "w.docx"
    d = docx.Document()
    d.add_heading("Policy", 1)
    d.add_paragraph("")  # an empty paragraph still counts in Document.paragraphs
    d.add_paragraph("Suppliers are reviewed yearly.")
    table = d.add_table(rows=2, cols=2)
    table.cell(1, 0).text, table.cell(1, 1).text = "Approved suppliers", "42"
    d.save(str(path))
    parsed = parse_source(path)
    start = parsed.text.index("reviewed")
    loc = locate(parsed.anchors, start, start + 8, str(path))
    assert loc == {"space": "extracted", "blocks": [{"paragraph": 2}]}
    opened = docx.Document(str(path))
    assert "reviewed" in opened.paragraphs[loc["blocks"][0]["paragraph"]].text
    start = parsed.text.index("Approved")
    loc = locate(parsed.anchors, start, len(parsed.text), str(path))
    (block,) = loc["blocks"]
    row = opened.tables[block["table"]].rows[block["row"]]
    assert "Approved suppliers" in [c.text for c in row.cells]


@pytest.mark.parametrize("html", [
    "<!doctype html><html><head><title>T</title><script>x()</script></head><body>"
    "<h1>Report</h1><p>First para.</p><div><p>Nested para.</p></div><p>Third para holds the figure 42.</p>"
    "</body></html>",
    "<p>First para.</p><div><p>Nested para.</p></div><p>Third para holds the figure 42.</p>",  # no <html>
])
def test_html_element_path_resolves_to_the_element(tmp_path, html):
    from bs4 import BeautifulSoup

    path = tmp_path / "p.html"
    path.write_text(html, encoding="utf-8")
    parsed = parse_source(path)
    start = parsed.text.index("holds the figure")
    loc = locate(parsed.anchors, start, start + 16, str(path))
    assert loc["space"] == "extracted"
    el = BeautifulSoup(path.read_text(encoding="utf-8"), "html.parser").select_one(loc["element"])
    assert el is not None and "holds the figure" in el.get_text()
    start = parsed.text.index("Nested")
    el = BeautifulSoup(html, "html.parser").select_one(locate(parsed.anchors, start, start + 6, str(path))["element"])
    assert el.get_text() == "Nested para."


def test_locators_survive_the_warehouse_into_served_snippets(tmp_path, monkeypatch, capsys):
    """raw documents -> chunks -> published snapshot -> snippet: each format's locator fields
    arrive in ``ragspine query --json`` and still point at the text in the file."""
    import json

    docx = pytest.importorskip("docx")
    from pypdf import PdfReader

    from ragspine_pipeline import cli

    monkeypatch.setenv("RAGSPINE_EMBEDDING_BACKEND", "none")
    monkeypatch.setenv("RAGSPINE_RETRIEVAL_MODE", "bm25")
    for name in ("RAGSPINE_GLOSSARY", "RAGSPINE_GRAPH_DIMENSIONS", "RAGSPINE_CORPUS_ROOT", "RAGSPINE_EMBEDDING",
                 "RAGSPINE_WAREHOUSE", "DAGSTER_HOME"):
        monkeypatch.delenv(name, raising=False)
    lib = tmp_path / "corpus" / "docs"
    lib.mkdir(parents=True)
    (lib / "travel.md").write_text("# Travel\n\nEconomy class for flights under six hours.\n")
    (lib / "annual.pdf").write_bytes(multipage_pdf([["Annual report"], ["Harbour logistics margins improved."]]))
    d = docx.Document()
    d.add_paragraph("Intro paragraph.")
    d.add_paragraph("Every supplier signs the zebrafish code of conduct.")
    d.save(str(lib / "suppliers.docx"))
    (lib / "q3.html").write_text("<html><body><h1>Q3</h1><div><p>Turnover rose with the kiwifruit line.</p></div>"
                                 "</body></html>")
    wh = tmp_path / "wh"
    assert cli.main(["index", str(tmp_path / "corpus"), "--warehouse", str(wh), "--in-process"]) == 0
    capsys.readouterr()

    def top(question: str) -> dict:
        assert cli.main(["query", question, "--warehouse", str(wh), "--json", "--top-k", "1"]) == 0
        return json.loads(capsys.readouterr().out)[0]

    s = top("economy class flights")
    assert s["source_locator"]["space"] == "file"
    assert (lib / "travel.md").read_text()[s["source_locator"]["start"]:s["source_locator"]["end"]] == s["text"]
    s = top("harbour logistics")
    (page,) = [p for p in s["source_locator"]["pages"] if p["page"] == 2]
    assert s["source_locator"]["space"] == "extracted"
    assert PdfReader(str(lib / "annual.pdf")).pages[1].extract_text()[page["start"]:page["end"]] in s["text"]
    s = top("zebrafish code of conduct")
    paras = docx.Document(str(lib / "suppliers.docx")).paragraphs
    assert any("zebrafish" in paras[b["paragraph"]].text for b in s["source_locator"]["blocks"])
    s = top("kiwifruit turnover")
    from bs4 import BeautifulSoup

    el = BeautifulSoup((lib / "q3.html").read_text(), "html.parser").select_one(s["source_locator"]["element"])
    assert el is not None and el.get_text(" ", strip=True)[:10] in s["text"]


def test_plain_output_names_the_page_block_or_element():
    from ragspine_pipeline.snippet_format import where_in_file

    assert where_in_file({"start": 0, "end": 3, "space": "file"}) == ""
    assert where_in_file({"pages": [{"page": 3, "start": 0, "end": 2}, {"page": 4, "start": 0, "end": 1}]}) == " p. 3-4"
    assert where_in_file({"blocks": [{"paragraph": 2}]}) == " para 2"
    assert where_in_file({"blocks": [{"table": 0, "row": 1}]}) == " table 0 row 1"
    assert where_in_file({"element": "html > body > p:nth-of-type(2)"}) == " at html > body > p:nth-of-type(2)"
