"""Document parsers by file type: .md/.txt (UTF-8), .html (BeautifulSoup), .pdf (pypdf).

A parser returns the document text; it raises ``ParseError`` with a reason for files it
cannot read. Callers record the failure and carry on with the rest of the library.
"""

from __future__ import annotations

from pathlib import Path


class ParseError(ValueError):
    pass


SUFFIXES = (".md", ".txt", ".html", ".htm", ".pdf")


def parse_text(path: Path) -> str:
    try:
        return path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ParseError(f"not valid UTF-8 ({exc.reason} at byte {exc.start})") from None


def parse_html(path: Path) -> str:
    try:
        from bs4 import BeautifulSoup
    except ImportError:
        raise ParseError("HTML parsing needs beautifulsoup4 (the [pipeline] extra)") from None
    soup = BeautifulSoup(parse_text(path), "html.parser")
    for tag in soup(["script", "style", "noscript"]):
        tag.decompose()
    blocks = [" ".join(el.get_text(" ", strip=True).split())
              for el in soup.find_all(["h1", "h2", "h3", "h4", "p", "li", "td", "pre", "blockquote"])]
    text = "\n\n".join(b for b in blocks if b)
    return text or " ".join(soup.get_text(" ", strip=True).split())


def parse_pdf(path: Path) -> str:
    try:
        from pypdf import PdfReader
        from pypdf.errors import PdfReadError
    except ImportError:
        raise ParseError("PDF parsing needs pypdf (the [pipeline] extra)") from None
    try:
        reader = PdfReader(str(path))
        pages = [(p.extract_text() or "").strip() for p in reader.pages]
    except (PdfReadError, ValueError, KeyError, OSError) as exc:
        raise ParseError(f"unreadable PDF: {exc}") from None
    text = "\n\n".join(p for p in pages if p)
    if not text:
        raise ParseError("PDF has no extractable text (scanned image?)")
    return text


def parse_file(path: Path) -> str:
    suffix = path.suffix.lower()
    if suffix in (".md", ".txt"):
        return parse_text(path)
    if suffix in (".html", ".htm"):
        return parse_html(path)
    if suffix == ".pdf":
        return parse_pdf(path)
    raise ParseError(f"unsupported file type {suffix!r}")
