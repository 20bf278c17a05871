import pytest
from chunker_docs import multipage_pdf

from ragspine_pipeline.corpus import load_library
from ragspine_pipeline.ingest.parsers import ParseError, parse_file

pytest.importorskip("bs4")
pytest.importorskip("pypdf")


def test_html_pdf_and_failures(tmp_path):
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "page.html").write_text("<html><head><style>p{}</style><script>var x=1</script></head><body>"
                                   "<h1>Lyon plant</h1><p>Energy costs  tripled.</p><p>Production moved.</p></body></html>",
                                   encoding="utf-8")
    (lib / "report.pdf").write_bytes(multipage_pdf([["Revenue fell in 2023"]]))
    (lib / "broken.pdf").write_bytes(b"%PDF-1.4 not really a pdf")
    (lib / "bad.txt").write_bytes(b"\xff\xfe\xc3\x28")
    (lib / "bad.meta.json").write_text("{not json", encoding="utf-8")
    assert parse_file(lib / "page.html") == "Lyon plant\n\nEnergy costs tripled.\n\nProduction moved."
    assert "Revenue fell in 2023" in parse_file(lib / "report.pdf")
    with pytest.raises(ParseError):
        parse_file(lib / "broken.pdf")
    docs, errors = load_library(lib)
    assert sorted(d.doc_id for d in docs) == ["lib/page", "lib/report"]
    assert {e.path.rsplit("/", 1)[1] for e in errors} == {"broken.pdf", "bad.txt"}
    assert next(d for d in docs if d.doc_id == "lib/page").title == "Lyon plant"
