import pytest

from ragspine_pipeline.corpus import load_library
from ragspine_pipeline.ingest.parsers import ParseError, parse_file

pytest.importorskip("bs4")
pytest.importorskip("pypdf")


def minimal_pdf(text: str) -> bytes:
    """A one-page PDF with a Helvetica text line, with a correct xref table."""
    stream = f"BT /F1 18 Tf 72 720 Td ({text}) Tj ET".encode()
    objs = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R "
        b"/Resources << /Font << /F1 5 0 R >> >> >>",
        b"<< /Length " + str(len(stream)).encode() + b" >>\nstream\n" + stream + b"\nendstream",
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
    ]
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for i, body in enumerate(objs, start=1):
        offsets.append(len(out))
        out += f"{i} 0 obj\n".encode() + body + b"\nendobj\n"
    xref = len(out)
    out += f"xref\n0 {len(objs) + 1}\n0000000000 65535 f \n".encode()
    out += b"".join(f"{o:010d} 00000 n \n".encode() for o in offsets)
    out += f"trailer\n<< /Size {len(objs) + 1} /Root 1 0 R >>\nstartxref\n{xref}\n%%EOF\n".encode()
    return bytes(out)


def test_html_pdf_and_failures(tmp_path):
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "page.html").write_text("<html><head><style>p{}</style><script>var x=1</script></head><body>"
                                   "<h1>Lyon plant</h1><p>Energy costs  tripled.</p><p>Production moved.</p></body></html>",
                                   encoding="utf-8")
    (lib / "report.pdf").write_bytes(minimal_pdf("Revenue fell in 2023"))
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
