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
