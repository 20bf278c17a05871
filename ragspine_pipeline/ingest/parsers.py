"""Document parsers by file type: .md/.txt, .html (BeautifulSoup), .pdf (pypdf).

A parser returns the document text and the metadata the file itself declares (YAML front
matter of a markdown file, ``<meta name=… content=…>`` of an HTML page); it raises
``ParseError`` with a reason for files it cannot read. Callers record the failure and
carry on with the rest of the library.

Text files are UTF-8 (a UTF-8 byte-order mark is dropped); a UTF-16 or UTF-32 file is
accepted when it starts with its byte-order mark, as editors on Windows write them.
"""

from __future__ import annotations

import codecs
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class ParseError(ValueError):
    pass


SUFFIXES = (".md", ".txt", ".html", ".htm", ".pdf")
MAX_FILE_BYTES_ENV = "RAGSPINE_MAX_FILE_BYTES"
DEFAULT_MAX_FILE_BYTES = 128 * 1024 * 1024

# Longest first: the UTF-32 LE mark starts with the UTF-16 LE one.
_BOMS = ((codecs.BOM_UTF32_LE, "utf-32-le"), (codecs.BOM_UTF32_BE, "utf-32-be"),
         (codecs.BOM_UTF8, "utf-8"), (codecs.BOM_UTF16_LE, "utf-16-le"), (codecs.BOM_UTF16_BE, "utf-16-be"))


@dataclass(frozen=True)
class ParsedFile:
    """What a parser read: the text, and metadata declared inside the file (lists of values
    per key as written; keys as written — the document reader matches them)."""

    text: str
    metadata: dict[str, list[Any]] = field(default_factory=dict)


def max_file_bytes() -> int:
    raw = os.environ.get(MAX_FILE_BYTES_ENV, "")
    try:
        return int(raw) if raw.strip() else DEFAULT_MAX_FILE_BYTES
    except ValueError:
        raise ParseError(f"{MAX_FILE_BYTES_ENV}={raw!r} is not an integer") from None


def check_size(path: Path) -> None:
    size, limit = path.stat().st_size, max_file_bytes()
    if size > limit:
        raise ParseError(f"file is {size} bytes, over the {limit}-byte limit ({MAX_FILE_BYTES_ENV})")


def decode_text(data: bytes) -> str:
    for bom, enc in _BOMS:
        if data.startswith(bom):
            try:
                return data[len(bom):].decode(enc)
            except UnicodeDecodeError as exc:
                raise ParseError(f"not valid {enc.upper()} ({exc.reason} at byte {exc.start + len(bom)})") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ParseError(f"not valid UTF-8 ({exc.reason} at byte {exc.start})") from None


def parse_text(path: Path) -> str:
    check_size(path)
    return decode_text(path.read_bytes())


_FRONT_MATTER = re.compile(r"---[ \t]*\r?\n(.*?)^(?:---|\.\.\.)[ \t]*(?:\r?\n|\Z)", re.S | re.M)


def split_front_matter(text: str) -> tuple[str, dict[str, Any]]:
    """(body, metadata) of a markdown text that opens with a ``---`` YAML block."""
    m = _FRONT_MATTER.match(text) if text.startswith("---") else None
    if m is None:
        return text, {}
    block, body = m.group(1), text[m.end():]
    import yaml

    try:
        meta = yaml.safe_load(block)
    except yaml.YAMLError as exc:
        raise ParseError(f"invalid YAML front matter ({exc.__class__.__name__})") from None
    if meta is None:
        meta = {}
    if not isinstance(meta, dict):
        raise ParseError("YAML front matter must be a mapping of keys to values")
    return body, meta


def parse_markdown(path: Path) -> ParsedFile:
    body, meta = split_front_matter(parse_text(path))
    return ParsedFile(body, {str(k): [v] for k, v in meta.items()})


def parse_html(path: Path) -> ParsedFile:
    try:
        from bs4 import BeautifulSoup
    except ImportError:
        raise ParseError("HTML parsing needs beautifulsoup4 (the [pipeline] extra)") from None
    soup = BeautifulSoup(parse_text(path), "html.parser")
    meta: dict[str, list[Any]] = {}
    for tag in soup.find_all("meta"):
        name = tag.get("name")
        if isinstance(name, str) and tag.has_attr("content"):
            meta.setdefault(name, []).append(tag.get("content"))
    for tag in soup(["script", "style", "noscript"]):
        tag.decompose()
    blocks = [" ".join(el.get_text(" ", strip=True).split())
              for el in soup.find_all(["h1", "h2", "h3", "h4", "p", "li", "td", "pre", "blockquote"])]
    text = "\n\n".join(b for b in blocks if b)
    return ParsedFile(text or " ".join(soup.get_text(" ", strip=True).split()), meta)


def parse_pdf(path: Path) -> ParsedFile:
    try:
        from pypdf import PdfReader
        from pypdf.errors import PdfReadError
    except ImportError:
        raise ParseError("PDF parsing needs pypdf (the [pipeline] extra)") from None
    check_size(path)
    try:
        reader = PdfReader(str(path))
        pages = [(p.extract_text() or "").strip() for p in reader.pages]
    except (PdfReadError, ValueError, KeyError, OSError) as exc:
        raise ParseError(f"unreadable PDF: {exc}") from None
    text = "\n\n".join(p for p in pages if p)
    if not text:
        raise ParseError("PDF has no extractable text (scanned image?)")
    return ParsedFile(text)


def parse_source(path: Path) -> ParsedFile:
    """Text and in-file metadata of one supported file."""
    suffix = path.suffix.lower()
    if suffix == ".md":
        return parse_markdown(path)
    if suffix == ".txt":
        return ParsedFile(parse_text(path))
    if suffix in (".html", ".htm"):
        return parse_html(path)
    if suffix == ".pdf":
        return parse_pdf(path)
    raise ParseError(f"unsupported file type {suffix!r}")


def parse_file(path: Path) -> str:
    """The text of one supported file (metadata declared inside it is left out)."""
    return parse_source(path).text
