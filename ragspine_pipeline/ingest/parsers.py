"""Document parsers by file type: .md/.txt, .html (BeautifulSoup), .pdf (pypdf), .docx
(python-docx, the ``[docx]`` extra).

A parser returns the document text and the metadata the file itself declares (YAML front
matter of a ``.md`` or ``.txt`` file, ``<meta name|property|http-equiv|itemprop=… content=…>`` of
an HTML page, the core title of a Word file); it raises ``ParseError`` with a reason for files it cannot read. Callers
record the failure and carry on with the rest of the library. A ParseError names the kind
of problem only (never the file's bytes, which third-party messages quote), and the
parser libraries' loggers are detached while they run (``quiet``).

Text files are UTF-8 (a UTF-8 byte-order mark is dropped); a UTF-16 or UTF-32 file is
accepted when it starts with its byte-order mark, as editors on Windows write them.

Each parser also reports the *structure* it sees, as offsets into the text it returns
(``StructureMark``): markdown ``#`` headings, HTML ``h1``–``h6``, PDF page starts, and
Word ``Heading N`` / ``Title`` paragraphs (as the ``html`` kind: a level-1..6 heading, which
every structure-aware chunker reads), numbered headings found in any text (``1.2 Scope``, ``第三章 总则``, ``第十二条``,
``Article 5``). Structure-aware chunkers read these marks instead of parsing again, so
every locator they produce indexes the stored text.
"""

from __future__ import annotations

import codecs
import json
import re
import zipfile
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

from .. import settings
from ..text_structure import StructureMark, text_structure
from .locators import Anchor
from .metadata_keys import match_key
from .quiet import quiet_parser_logs


class ParseError(ValueError):
    pass


SUFFIXES = (".md", ".txt", ".html", ".htm", ".pdf", ".docx")
MAX_FILE_BYTES_ENV = "RAGSPINE_MAX_FILE_BYTES"
DEFAULT_MAX_FILE_BYTES = 128 * 1024 * 1024

# Longest first: the UTF-32 LE mark starts with the UTF-16 LE one.
_BOMS = ((codecs.BOM_UTF32_LE, "utf-32-le"), (codecs.BOM_UTF32_BE, "utf-32-be"),
         (codecs.BOM_UTF8, "utf-8"), (codecs.BOM_UTF16_LE, "utf-16-le"), (codecs.BOM_UTF16_BE, "utf-16-be"))


def structure_to_json(marks: tuple[StructureMark, ...] | list[StructureMark],
                      anchors: tuple[Anchor, ...] | list[Anchor] = ()) -> str:
    """Compact JSON for the ``raw_documents.structure`` column: the marks as a list, or
    ``{"marks": [...], "anchors": [...]}`` when the parser recorded locator anchors (the
    citation's pages / blocks / element, ``locators.py``), so both travel in one column."""
    rows = [m.to_list() for m in marks]
    if anchors:
        return json.dumps({"marks": rows, "anchors": [a.to_list() for a in anchors]}, separators=(",", ":"))
    return json.dumps(rows, separators=(",", ":"))


def structure_from_json(raw: str | None) -> tuple[StructureMark, ...]:
    """Marks from the ``structure`` column; ``None`` (a row written before it existed) is ()."""
    if not raw:
        return ()
    rows = json.loads(raw)
    if isinstance(rows, dict):
        rows = rows.get("marks") or []
    return tuple(StructureMark.from_list(r) for r in rows)


def anchors_from_structure_json(raw: str | None) -> tuple[Anchor, ...]:
    """Locator anchors from the ``structure`` column; () for a plain list (md/txt, or a
    row written before anchors existed)."""
    rows = json.loads(raw) if raw else None
    if not isinstance(rows, dict):
        return ()
    return tuple(Anchor.from_list(r) for r in rows.get("anchors") or [])


@dataclass(frozen=True)
class ParsedFile:
    """What a parser read: the text, metadata declared inside the file (lists of values
    per key as written; keys as written — the document reader matches them), the
    structure marks it saw, as offsets into ``text`` (sorted by start), and metadata it
    saw but could not read as a key (the reader makes such a document RESTRICTED), and
    for PDF/DOCX/HTML where each extracted block came from in the file (``anchors``,
    read by ``locators.locate``)."""

    text: str
    metadata: dict[str, list[Any]] = field(default_factory=dict)
    structure: tuple[StructureMark, ...] = ()
    metadata_problems: tuple[str, ...] = ()
    anchors: tuple[Anchor, ...] = ()


def _merge_marks(*groups: tuple[StructureMark, ...] | list[StructureMark]) -> tuple[StructureMark, ...]:
    """One mark per start offset (the first group wins), sorted by start."""
    by_start: dict[tuple[int, bool], StructureMark] = {}
    for g in groups:
        for m in g:
            by_start.setdefault((m.start, m.kind == "page"), m)
    return tuple(sorted(by_start.values(), key=lambda m: (m.start, m.kind != "page")))


def max_file_bytes() -> int:
    """The largest file parsed; a bad value is a ParseError, so each document reports it."""
    return int(settings.get(MAX_FILE_BYTES_ENV, error=ParseError))


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


@lru_cache(maxsize=1)
def _unique_key_loader() -> type:
    """PyYAML's SafeLoader, refusing a mapping that repeats a key: ``safe_load`` keeps the
    last one, which would let a second ``sensitivity:`` silently replace the first."""
    class UniqueKeyLoader(yaml.SafeLoader):
        def construct_mapping(self, node: Any, deep: bool = False) -> dict[Any, Any]:
            seen: set[Any] = set()
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=deep)
                if isinstance(key, list | dict):
                    continue  # unhashable: the base class reports it
                if key in seen:
                    raise ParseError("YAML front matter repeats a key (the last would silently win)")
                seen.add(key)
            return super().construct_mapping(node, deep=deep)

    return UniqueKeyLoader


# A line of three or more dashes (ASCII or any Unicode dash), as it may open front matter.
_DASH_LINE = re.compile(r"[-\u2010-\u2015\u2212\ufe58\ufe63\uff0d]{3,}[ \t]*(?:\r\n|\r|\n|\Z)")
# What may stand before front matter without hiding it from a person: whitespace and
# invisible format characters (a BOM, a zero-width space).
_LEAD = re.compile(r"[\s\u200b-\u200f\u2060-\u2064\ufeff\u00ad\u180e]*")


def split_front_matter(text: str) -> tuple[str, dict[str, Any], tuple[str, ...]]:
    """(body, metadata, problems) of a text that may open with a ``---`` YAML block.

    Read only in its exact form: ``---`` as the very first line (``\\n`` or ``\\r\\n``
    line ends) and a closing ``---`` or ``...`` line. A text that *looks* as if it opens
    with front matter the reader cannot read — a first line of dashes after blank lines,
    spaces or a BOM, ``----``, CR-only line ends, no closing line — is returned whole with
    a problem (the document is then RESTRICTED and reported): read as body, its label
    would be served as text and the document under the default label.
    """
    lead = _LEAD.match(text)
    start = lead.end() if lead else 0
    if not _DASH_LINE.match(text, start):
        return text, {}, ()
    m = _FRONT_MATTER.match(text) if text.startswith("---") else None
    if m is None or start:
        return text, {}, ("the document opens with a line of dashes the reader cannot read as YAML front matter "
                          "(it must be the first line, exactly ---, with \\n line ends and a closing --- line)",)
    block, body = m.group(1), text[m.end():]
    try:
        meta = yaml.load(block, Loader=_unique_key_loader())  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        raise ParseError(f"invalid YAML front matter ({exc.__class__.__name__})") from None
    if meta is None:
        meta = {}
    if not isinstance(meta, dict):
        raise ParseError("YAML front matter must be a mapping of keys to values")
    return body, meta, ()


def parse_markdown(path: Path, *, markdown: bool = True) -> ParsedFile:
    """A ``.md`` or ``.txt`` file: front matter is read the same way in both (a label
    written there in a ``.txt`` would otherwise be served as text)."""
    full = parse_text(path)
    body, meta, problems = split_front_matter(full)
    # Offsets index the body; a citation adds how many characters the front matter took.
    skipped = len(full) - len(body) if full.endswith(body) else 0
    anchors = (Anchor(0, len(body), (("body_offset", skipped),), skipped),) if skipped and body else ()
    return ParsedFile(body, {str(k): [v] for k, v in meta.items()}, text_structure(body, markdown=markdown), problems,
                      anchors)


def parse_html(path: Path) -> ParsedFile:
    try:
        from bs4 import BeautifulSoup  # lazy: beautifulsoup4, the optional [pipeline] extra
    except ImportError:
        raise ParseError("HTML parsing needs beautifulsoup4 (the [pipeline] extra)") from None
    text = parse_text(path)
    with quiet_parser_logs():
        soup = BeautifulSoup(text, "html.parser", on_duplicate_attribute=_mark_duplicate)
    meta, problems = _html_meta(soup)
    for tag in soup(["script", "style", "noscript"]):
        tag.decompose()
    parts: list[str] = []
    marks: list[StructureMark] = []
    anchors: list[Anchor] = []
    pos = 0
    for el in soup.find_all(["h1", "h2", "h3", "h4", "h5", "h6", "p", "li", "td", "pre", "blockquote"]):
        block = " ".join(el.get_text(" ", strip=True).split())
        if not block:
            continue
        if parts:
            pos += 2  # the "\n\n" joining blocks
        if el.name in _HTML_HEADINGS:
            marks.append(StructureMark(pos, pos + len(block), int(el.name[1]), "html"))
        anchors.append(Anchor(pos, pos + len(block), (("element", _css_path(el)),)))
        parts.append(block)
        pos += len(block)
    text = "\n\n".join(parts)
    if not text:
        return ParsedFile(" ".join(soup.get_text(" ", strip=True).split()), meta, (), problems)
    return ParsedFile(text, meta, _merge_marks(marks, text_structure(text)), problems, tuple(anchors))


def _css_path(el: Any) -> str:
    """A CSS path BeautifulSoup's ``select_one`` (``html.parser``) resolves to ``el`` in a
    fresh parse of the same file: ``tag:nth-of-type(k)`` per step, the first step pinned to
    the top level (``:not(* *)``) unless it is ``html``. script/style/noscript removed
    before this cannot shift a count: only tags of the same name are counted."""
    steps: list[str] = []
    node = el
    while node is not None and node.name and node.parent is not None:
        k = 1 + sum(1 for sib in node.find_previous_siblings(node.name))
        top = node.parent.parent is None
        if node.name == "html" and top:
            steps.append("html")
        else:
            steps.append(f"{node.name}:nth-of-type({k})" + (":not(* *)" if top else ""))
        node = node.parent
    return " > ".join(reversed(steps))


_HTML_HEADINGS = frozenset({"h1", "h2", "h3", "h4", "h5", "h6"})
# Every attribute a <meta> tag names its key with: a label declared in any of these forms
# is a label (reading fewer forms would let ``property="sensitivity"`` drop one silently).
HTML_META_KEY_ATTRS = ("name", "property", "http-equiv", "itemprop")


# An attribute name no HTML parser produces (they are lower-cased, and have no NUL): where
# ``_mark_duplicate`` records that a tag repeats an attribute.
_DUPLICATE_MARK = "\x00duplicate"


def _mark_duplicate(attrs: dict[str, Any], key: str, value: Any) -> None:
    """A tag repeats attribute ``key``: keep the first value (as browsers do) and mark the
    tag. BeautifulSoup keeps the last by default, so ``content="RESTRICTED"
    content="PUBLIC"`` would read as PUBLIC."""
    del value
    attrs[_DUPLICATE_MARK] = key


def _html_meta(soup: Any) -> tuple[dict[str, list[Any]], tuple[str, ...]]:
    """Key -> values of the page's ``<meta>`` tags, in every key form, and the tags that
    name a known key some other way (``<meta nаme=…>`` with a Cyrillic ``а``,
    ``data-name=…``): those cannot be read, so they are problems, not skipped. A tag whose
    key is (or imitates) a known metadata key but has no ``content`` gives None, which the
    document reader refuses or counts as RESTRICTED; other content-less tags are skipped."""
    meta: dict[str, list[Any]] = {}
    problems: list[str] = []
    for tag in soup.find_all("meta"):
        if _DUPLICATE_MARK in tag.attrs:
            problems.append("a <meta> tag repeats an attribute (browsers keep the first value, parsers the last)")
            continue
        keys = [tag.get(attr) for attr in HTML_META_KEY_ATTRS if isinstance(tag.get(attr), str)]
        for key in keys:
            if tag.has_attr("content"):
                meta.setdefault(key, []).append(tag.get("content"))
            elif match_key(key).known:
                meta.setdefault(key, []).append(None)
        if keys:
            continue
        for attr, value in tag.attrs.items():
            if attr != "content" and isinstance(value, str) and match_key(value).known:
                problems.append(f"<meta {ascii(attr)[:40]}=…> names {match_key(value).known!r} "
                                f"but {'/'.join(HTML_META_KEY_ATTRS)} is how a key is given")
    return meta, tuple(problems)


def parse_pdf(path: Path) -> ParsedFile:
    try:
        # lazy: pypdf, the optional [pipeline] extra, for PDF files
        from pypdf import PdfReader
        from pypdf.errors import PdfReadError
    except ImportError:
        raise ParseError("PDF parsing needs pypdf (the [pipeline] extra)") from None
    check_size(path)
    try:
        with quiet_parser_logs():
            reader = PdfReader(str(path))
            raw_pages = [p.extract_text() or "" for p in reader.pages]
    except (PdfReadError, ValueError, KeyError, OSError) as exc:
        # pypdf's messages quote bytes of the file: the kind of error only.
        raise ParseError(f"unreadable PDF ({type(exc).__name__})") from None
    except Exception as exc:  # noqa: BLE001 - pypdf raises many kinds on a crafted file: one bad file
        raise ParseError(f"unreadable PDF ({type(exc).__name__})") from None
    pages = [p.strip() for p in raw_pages]
    text = "\n\n".join(p for p in pages if p)
    if not text:
        raise ParseError("PDF has no extractable text (scanned image?)")
    page_marks, anchors, pos = [], [], 0
    for number, (raw, p) in enumerate(zip(raw_pages, pages, strict=True), 1):
        if not p:
            continue
        page_marks.append(StructureMark(pos, pos, 0, "page"))
        # Offsets within the page are into pypdf's unstripped extract_text() of that page.
        anchors.append(Anchor(pos, pos + len(p), (("page", number),), len(raw) - len(raw.lstrip())))
        pos += len(p) + 2
    return ParsedFile(text, {}, _merge_marks(page_marks, text_structure(text)), (), tuple(anchors))


_DOCX_HEADING = re.compile(r"(?:heading|überschrift|titre|título|titolo|kop)\s*([1-6])$", re.I)


def _docx_blocks(document: Any) -> list[tuple[str, int, tuple[tuple[str, int], ...]]]:
    """(text, heading level or 0, where in the file) of each body paragraph and table row,
    in reading order; "where" is ``paragraph`` = index into ``Document.paragraphs`` or
    ``table``/``row`` = ``Document.tables[t].rows[r]``.

    A table row becomes one line, its cells joined by `` | `` (a figure keeps its row label).
    """
    # lazy: python-docx, the optional [docx] extra (parse_docx has loaded it)
    from docx.table import Table

    blocks: list[tuple[str, int, tuple[tuple[str, int], ...]]] = []
    n_par = n_table = 0
    for item in document.iter_inner_content():
        if isinstance(item, Table):
            for r, row in enumerate(item.rows):
                cells = {id(c._tc): c.text.strip() for c in row.cells}  # a merged cell repeats: once
                line = " | ".join(t for t in cells.values() if t)
                if line:
                    blocks.append((line, 0, (("table", n_table), ("row", r))))
            n_table += 1
            continue
        n_par += 1
        text = item.text.strip()
        if not text:
            continue
        style = (item.style.name if item.style is not None else "") or ""
        m = _DOCX_HEADING.match(style.strip())
        level = 1 if style.strip().lower() == "title" else int(m.group(1)) if m else 0
        blocks.append((text, level, (("paragraph", n_par - 1),)))
    return blocks


def parse_docx(path: Path) -> ParsedFile:
    """Paragraphs and table rows of a Word file, blank-line separated; headings as marks.

    Why python-docx: it reads the OOXML body in document order (paragraphs and tables
    interleaved) without Word or LibreOffice. A legacy ``.doc`` or a corrupt archive is a
    ParseError for this file alone.
    """
    try:
        # lazy: python-docx, the optional [docx] extra, for Word files
        import docx
        from docx.opc.exceptions import PackageNotFoundError
    except ImportError:
        raise ParseError("Word parsing needs python-docx (the [docx] extra)") from None
    check_size(path)
    try:
        with quiet_parser_logs():
            document = docx.Document(str(path))
            blocks = _docx_blocks(document)
            title = (document.core_properties.title or "").strip()
    except (PackageNotFoundError, zipfile.BadZipFile, KeyError, ValueError, OSError) as exc:
        # lxml's and zipfile's messages quote the file (an entity name, a member name): the kind only.
        raise ParseError(f"unreadable Word file ({type(exc).__name__})") from None
    except Exception as exc:  # noqa: BLE001 - lxml's XMLSyntaxError and kin: one bad file, never the library
        raise ParseError(f"unreadable Word file ({type(exc).__name__})") from None
    if not blocks:
        raise ParseError("Word file has no text")
    parts, marks, anchors, pos = [], [], [], 0
    for text, level, ref in blocks:
        if level:
            marks.append(StructureMark(pos, pos + len(text), level, "html"))
        anchors.append(Anchor(pos, pos + len(text), ref))
        parts.append(text)
        pos += len(text) + 2
    body = "\n\n".join(parts)
    return ParsedFile(body, {"title": [title]} if title else {}, _merge_marks(marks, text_structure(body)), (),
                      tuple(anchors))


def parse_source(path: Path) -> ParsedFile:
    """Text and in-file metadata of one supported file."""
    suffix = path.suffix.lower()
    if suffix == ".md":
        return parse_markdown(path)
    if suffix == ".txt":
        return parse_markdown(path, markdown=False)
    if suffix in (".html", ".htm"):
        return parse_html(path)
    if suffix == ".pdf":
        return parse_pdf(path)
    if suffix == ".docx":
        return parse_docx(path)
    raise ParseError(f"unsupported file type ({ascii(suffix)[:20]})")


def parse_file(path: Path) -> str:
    """The text of one supported file (metadata declared inside it is left out)."""
    return parse_source(path).text
