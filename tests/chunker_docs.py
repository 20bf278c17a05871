"""Shared helpers of the chunker tests: the golden documents and a multi-page PDF writer."""

from __future__ import annotations

from pathlib import Path

DATA = Path(__file__).resolve().parent / "data" / "chunking"

# The committed tests/data/chunking/quarterly_risk_report_en.pdf is multipage_pdf(RISK_REPORT_PAGES).
RISK_REPORT_PAGES = [
    ["Quarterly Risk Report Q3 2024", "1 Summary",
     "Credit losses stayed below plan at 0.4% of the loan book.",
     "1.1 Liquidity", "The liquidity coverage ratio was 142%, above the 120% floor."],
    ["2 Market risk", "Value at risk fell to EUR 12 million after the bond portfolio was shortened.",
     "3 Operational risk", "Two incidents were reported; neither caused a loss above EUR 1 million."],
    ["4 Outlook", "Credit losses are expected to rise to 0.5% in 2025 as rates stay high."],
]


def multipage_pdf(pages: list[list[str]]) -> bytes:
    """A PDF with one Helvetica text block per page (one line per string), correct xref."""
    n = len(pages)
    kids = " ".join(f"{3 + 2 * i} 0 R" for i in range(n))
    font_id = 3 + 2 * n
    objs = [b"<< /Type /Catalog /Pages 2 0 R >>", f"<< /Type /Pages /Kids [{kids}] /Count {n} >>".encode()]
    for i, lines in enumerate(pages):
        esc = [ln.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)") for ln in lines]
        body = " T* ".join(f"({ln}) Tj" for ln in esc)
        stream = f"BT /F1 11 Tf 14 TL 72 740 Td {body} ET".encode()
        objs.append(f"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents {4 + 2 * i} 0 R "
                    f"/Resources << /Font << /F1 {font_id} 0 R >> >> >>".encode())
        objs.append(b"<< /Length " + str(len(stream)).encode() + b" >>\nstream\n" + stream + b"\nendstream")
    objs.append(b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>")
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


if __name__ == "__main__":  # regenerate the committed PDF
    (DATA / "quarterly_risk_report_en.pdf").write_bytes(multipage_pdf(RISK_REPORT_PAGES))
