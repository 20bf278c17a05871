"""One document as the engine sees it: text, title, metadata and its resolved label.

Metadata comes from every source a user would write it in — the ``<name>.meta.json``
sidecar, YAML front matter of a markdown file, ``<meta name|property|http-equiv=…>`` of
an HTML page — with the known keys matched as written, ASCII case-insensitively
(``Sensitivity`` is ``sensitivity``; see ``metadata_keys``). A key that only imitates a
known key (zero-width or look-alike characters) makes the document RESTRICTED. The
sensitivity label is resolved fail-closed (``sensitivity.resolve_label``): an unknown,
oddly spelt or malformed label, or conflicting labels, give the most restrictive
reading, and the reason is kept on the document for the ``sensitivity_labels_valid``
check.

Sidecars are a closed schema (``metadata_keys.declared_keys``); a file named as the
document's sidecar in another case or as ``<file>.<ext>.meta.json`` is read and reported
(``sidecars``); a label written where it is not read — a key that contains the label key,
a line of the first lines, front matter the parser could not read — is found by
``label_scan`` and reported. Every such problem makes the document RESTRICTED.

A file is refused (``CorpusError``, reported as a parse failure, so the document is
withheld and the rest of the library still builds) when it or its sidecar is a symlink
that leaves its library folder (or the corpus root) or cannot be resolved, when it is
hard-linked from another library, when the
sidecar cannot be read (a directory, a FIFO, an I/O or permission error), when it is
larger than the configured limit, or when a metadata value cannot be read as written (a
dict, list or NaN where a string is expected): nothing is coerced silently. A symlink
followed inside its library takes the stricter of its own label and its target's; a
hard-linked file, the strictest label of all its names. Messages name the file and the
kind of problem, never a value or the text.
"""

from __future__ import annotations

import hashlib
import json
import math
import stat
from dataclasses import dataclass
from datetime import date, datetime
from pathlib import Path
from typing import Any

from .. import settings
from ..retrieval.lexical.analysis.analyzer import LanguageError, resolve_language
from ..sensitivity import RESTRICTED_SENSITIVITY, resolve_label, strictest
from .label_scan import free_key_problem, written_label_problem
from .metadata_keys import METADATA_KEYS_ENV, SENSITIVITY_KEY, declared_keys, match_key, plain_key
from .parsers import SUFFIXES, ParsedFile, ParseError, StructureMark, check_size, parse_source
from .sidecars import SIDECAR_SUFFIX, CorpusView, find_sidecars

TITLE_MAX_CHARS = 300
DEFAULT_LABEL_ENV = "RAGSPINE_DEFAULT_SENSITIVITY"  # "required": a missing label counts as RESTRICTED
DEFAULT_LABEL = "INTERNAL"


ON_PARSE_ERROR_ENV = "RAGSPINE_ON_PARSE_ERROR"
ON_PARSE_ERROR = ("withhold", "serve_last_good")


def on_parse_error_policy(value: str | None = None) -> str:
    """What a document whose file stopped parsing serves meanwhile: "withhold" (nothing,
    the default: a relabel with a typo must not keep the old text online) or
    "serve_last_good" (availability first, an explicit opt-out)."""
    if not value:  # the variable, spelt exactly (the registry's error names it); blank: withhold
        return str(settings.get(ON_PARSE_ERROR_ENV))
    if value not in ON_PARSE_ERROR:  # a run-config field: its own message, as before
        raise ValueError(f"on_parse_error must be one of {', '.join(ON_PARSE_ERROR)}, not {value!r}")
    return value


class CorpusError(ValueError):
    """A corpus folder or document cannot be read as asked."""


@dataclass(frozen=True)
class Document:
    doc_id: str
    title: str
    text: str
    metadata: dict[str, Any]
    source_path: str = ""
    label_problem: str = ""  # why the label was forced to RESTRICTED ("" when it was read as written)
    # Headings / pages the parser saw, as offsets into ``text`` (structure-aware chunkers
    # read these; derived from the file like ``text``, so not part of the content hash).
    structure: tuple[StructureMark, ...] = ()
    # Where each extracted block sits in a PDF/DOCX/HTML file (``locators.Anchor``): the
    # citation's pages / blocks / element path; derived like ``structure``, so not hashed.
    anchors: tuple[Any, ...] = ()

    @property
    def content_hash(self) -> str:
        payload = json.dumps([self.title, self.text, self.metadata], ensure_ascii=False, sort_keys=True)
        return hashlib.sha256(payload.encode()).hexdigest()


@dataclass(frozen=True)
class MetaSource:
    """Metadata from one place: ``where`` names it in messages, ``values`` holds every value
    per key as written, ``closed``: a sidecar (only declared keys), not free-form."""

    where: str
    values: dict[str, list[Any]]
    closed: bool = False


@dataclass
class DocumentError:
    path: str
    error: str


def sidecar_path(path: Path) -> Path:
    return path.with_name(path.stem + SIDECAR_SUFFIX)


def default_label() -> str | None:
    """The label of a document that declares none (None: the library requires one)."""
    raw = str(settings.get(DEFAULT_LABEL_ENV)).strip()  # blank: the declared default, INTERNAL
    return None if raw.casefold() == "required" else raw


def title_from_text(text: str, fallback: str) -> str:
    """The first non-empty line (markdown ``#`` removed), capped at TITLE_MAX_CHARS.

    Scans line by line without splitting the whole text: a 2M-character single-line file
    costs one line, and its title (copied into every chunk) stays short.
    """
    pos = 0
    while pos < len(text):
        nl = text.find("\n", pos)
        end = len(text) if nl < 0 else nl
        line = text[pos:min(end, pos + 4 * TITLE_MAX_CHARS)].strip()
        if line:
            return cap_title(line.lstrip("#").strip() or fallback)
        pos = end + 1
    return fallback


def cap_title(title: str) -> str:
    return title if len(title) <= TITLE_MAX_CHARS else title[:TITLE_MAX_CHARS - 1].rstrip() + "…"


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a valid metadata value")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object whose keys are all distinct: ``json`` keeps the last of two equal keys,
    which would let a second ``"sensitivity"`` silently replace the first."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError("an object repeats a key (the last would silently win)")
        out[key] = value
    return out


def read_sidecar(path: Path) -> dict[str, Any]:
    """The sidecar's JSON object; CorpusError for anything that is not a readable one.

    A directory, FIFO or device in place of the sidecar, a dangling link, a permission or
    I/O error: the label cannot be read, so the document must not be served — but only
    that document (the caller records a parse failure and goes on with the library).
    The file type is checked before opening: reading a FIFO would block the build.
    """
    try:
        if not stat.S_ISREG(path.stat().st_mode):
            raise CorpusError(f"{path.name}: metadata sidecar is not a regular file")
        check_size(path)
        data = path.read_bytes()
    except ParseError as exc:
        raise CorpusError(f"{path.name}: {exc}") from None
    except OSError as exc:
        raise CorpusError(f"{path.name}: cannot read metadata sidecar ({exc.strerror or type(exc).__name__})") from None
    try:
        meta = json.loads(data.decode("utf-8-sig"), parse_constant=_reject_constant, object_pairs_hook=_unique_keys)
    except UnicodeDecodeError as exc:
        raise CorpusError(f"{path.name}: invalid metadata sidecar (not UTF-8: {exc.reason})") from None
    except json.JSONDecodeError as exc:  # its message is a position, never the text
        raise CorpusError(f"{path.name}: invalid metadata sidecar ({exc.msg} at line {exc.lineno})") from None
    except ValueError as exc:  # _reject_constant / _unique_keys: fixed wording
        raise CorpusError(f"{path.name}: invalid metadata sidecar ({exc})") from None
    if not isinstance(meta, dict):
        raise CorpusError(f"{path.name}: metadata sidecar must be a JSON object")
    return meta


def _scalar(key: str, value: Any, where: str) -> str:
    """A known metadata field's value as text; a value that is not a scalar is an error."""
    if isinstance(value, bool) or value is None or isinstance(value, dict | list | tuple | set):
        raise CorpusError(f"{where}: metadata {key!r} must be a string or a number, not {type(value).__name__}")
    if isinstance(value, float) and not math.isfinite(value):
        raise CorpusError(f"{where}: metadata {key!r} is {value}")
    if isinstance(value, datetime | date):
        return value.isoformat()
    return str(value)


def merge_metadata(sources: list[MetaSource], *, default: str | None,
                   problems: tuple[str, ...] = ()) -> tuple[dict[str, Any], str]:
    """(metadata, label problem) from metadata sources, highest precedence first.

    Known keys are matched as written, ASCII case-insensitively (``match_key``).
    ``sensitivity`` collects every value of every source (the most restrictive wins); any
    other known key takes the first source's value, and two different values for it in
    one source are an error. A key that imitates a known key is dropped with its value
    and makes the document RESTRICTED (reported), as do ``problems`` (metadata a parser
    saw but could not read as a key), a key a sidecar does not declare (sidecars are a
    closed schema: ``declared_keys``), and a free-form key holding a label the reader
    does not read (``label_scan.free_key_problem``). Other keys are kept as written
    (first source wins). Messages name the place and the kind of problem, never a value.
    """
    known: dict[str, str] = {}
    labels: list[Any] = []
    extra: dict[str, Any] = {}
    key_problems: list[str] = list(problems)
    declared = declared_keys() if any(src.closed for src in sources) else frozenset()
    for src in sources:
        where, seen = src.where, {}
        for pos, (key, values) in enumerate(src.values.items(), 1):
            match = match_key(key)
            fold = match.known
            if match.misspelt:
                key_problems.append(f"{where}: metadata key {ascii(key)[:80]} is not written exactly as {fold!r}")
                continue
            if src.closed and not fold and plain_key(key) not in declared:
                key_problems.append(f"{where}: metadata key #{pos} ({len(key)} characters) is not declared "
                                    f"(known keys, or {METADATA_KEYS_ENV})")
                continue
            if not src.closed and not fold and (why := free_key_problem(key, values)):
                key_problems.append(f"{where}: {why}")
                continue
            if fold == SENSITIVITY_KEY:
                labels.extend(values)
                continue
            if fold:
                for v in values:
                    text = _scalar(key, v, where)
                    if fold in seen and seen[fold] != text:
                        raise CorpusError(f"{where}: conflicting values for {fold!r}")
                    seen[fold] = text
                continue
            for v in values:
                if isinstance(v, float) and not math.isfinite(v):
                    raise CorpusError(f"{where}: metadata key #{pos} has a value of {v}")
                extra.setdefault(key, v if isinstance(v, str | int | float | bool) or v is None
                                 else json.loads(json.dumps(v, default=str)))
        if "language" in seen:  # the analyzer stems by it: a typo must not index silently
            try:
                resolve_language(seen["language"])
            except LanguageError:  # its message quotes the value: name the key only
                raise CorpusError(f"{where}: metadata 'language' is not a known language "
                                  "(an ISO 639-1 code or a Snowball language name)") from None
        for k, v in seen.items():
            known.setdefault(k, v)
    verdict = resolve_label(labels, default=default)
    label = RESTRICTED_SENSITIVITY if key_problems else verdict.label
    out = {**extra, **known, SENSITIVITY_KEY: label}
    return out, "; ".join([*key_problems, *filter(None, [verdict.problem])])


def _inside(resolved: Path, root: Path) -> bool:
    return resolved.is_relative_to(root.resolve())


def _check_bounds(p: Path, root: Path | None, folder: Path | None, library: str) -> None:
    """Refuse ``p`` when it resolves outside the corpus root or outside its own library
    folder: a link from one library into another would publish the other's documents
    under this library's labels."""
    if not (p.is_symlink() or p.exists()):
        return
    try:
        resolved = p.resolve(strict=True)
    except (OSError, RuntimeError):
        raise CorpusError(f"{p.name}: symlink cannot be resolved (dangling or a loop); refused") from None
    if root is not None and not _inside(resolved, root):
        raise CorpusError(f"{p.name}: symlink points outside the corpus root; refused")
    if folder is not None and not _inside(resolved, folder):
        raise CorpusError(f"{p.name}: symlink points outside the corpus library {library!r}; refused")


def _has_sidecar(sidecar: Path) -> bool:
    return sidecar.is_symlink() or sidecar.exists()


@dataclass(frozen=True)
class _Reading:
    """Where one document is read: the bounds a file may resolve within (``root``, the
    corpus root; ``folder``, the library folder; either may be None) and the view of the
    library read (sidecar listings, hard links), or None for an unbounded read."""

    library: str
    root: Path | None
    folder: Path | None
    view: CorpusView | None

    @property
    def bounded(self) -> bool:
        return self.root is not None or self.folder is not None


def _sidecar_sources(path: Path, at: _Reading) -> tuple[list[MetaSource], list[str]]:
    """The sidecar sources of document ``path`` (its ``<stem>.meta.json`` first, then every
    file named as its sidecar some other way) and the problems those names are."""
    found = find_sidecars(path, at.view)
    sources, problems = [], []
    for side in (found.canonical, *found.odd):
        if not _has_sidecar(side):
            continue
        if at.bounded:
            _check_bounds(side, at.root, at.folder, at.library)
        sources.append(MetaSource(side.name, {k: [v] for k, v in read_sidecar(side).items()}, closed=True))
    for side in found.odd:
        problems.append(f"{side.name}: a sidecar of {path.name} not named exactly {found.canonical.name}")
    return sources, problems


def _label_of(path: Path, parsed: ParsedFile, at: _Reading) -> tuple[dict[str, Any], str]:
    """(metadata, label problem) of the file at ``path`` read with ``parsed``'s content."""
    sources, problems = _sidecar_sources(path, at)
    if parsed.metadata:
        sources.append(MetaSource(path.name, parsed.metadata))
    meta, problem = merge_metadata(sources, default=default_label(), problems=(*problems, *parsed.metadata_problems))
    written = written_label_problem(parsed.text, meta[SENSITIVITY_KEY])
    if written:
        meta[SENSITIVITY_KEY] = RESTRICTED_SENSITIVITY
        problem = "; ".join(filter(None, [problem, f"{path.name}: {written}"]))
    return meta, problem


def _target_label(path: Path, parsed: ParsedFile, at: _Reading) -> tuple[str, str] | None:
    """(label, problem) the target of symlink ``path`` has on its own (its sidecar and its
    in-file metadata), or None when ``path`` is not a link. A link must never be more
    visible than what it points at."""
    target = path.resolve(strict=True)
    if target == path.parent.resolve() / path.name:
        return None
    meta, problem = _label_of(target, parsed, at)
    return meta[SENSITIVITY_KEY], (f"link target {target.name}: {problem}" if problem else "")


def _linked_labels(path: Path, parsed: ParsedFile, at: _Reading) -> tuple[list[str], list[str]]:
    """Labels and problems of the other names (hard links) of ``path``'s file in the corpus.

    A name in another library (or outside the library folder) is refused like a symlink
    leaving it: one file would otherwise be published under two libraries' labels."""
    if at.view is None:
        return [], []
    labels, problems = [], []
    for other in at.view.names(path):
        if at.folder is not None and not _inside(other.resolve(), at.folder):
            raise CorpusError(f"{path.name}: hard link shares its file with a document outside the corpus "
                              f"library {at.library!r}; refused")
        meta, problem = _label_of(other, parsed, at)
        labels.append(meta[SENSITIVITY_KEY])
        if problem:
            problems.append(f"hard link {other.name}: {problem}")
    return labels, problems


def read_document(path: Path, library: str, *, root: Path | None = None, folder: Path | None = None,
                  view: CorpusView | None = None) -> Document:
    """One document (.md .txt .html .pdf .docx) + its sidecar; CorpusError if it cannot be read.

    ``root`` (the corpus root) and ``folder`` (the library folder; ``root / library`` when
    only ``root`` is given) bound where the file and its sidecar may resolve: a symlink
    leaving either is refused, never followed, and so is a file hard-linked into another
    library. ``view``: the library read's folder listings and hard links, taken once per
    read of a library (built here for this document when not given). Any OS error while
    reading is a CorpusError for this document alone.
    """
    path = Path(path)
    if folder is None and root is not None:
        folder = Path(root) / library
    if view is None and (root is not None or folder is not None):
        view = CorpusView(Path(root if root is not None else folder), SUFFIXES)
    try:
        return _read_document(path, _Reading(library, root, folder, view))
    except OSError as exc:
        raise CorpusError(f"{path.name}: cannot read ({exc.strerror or type(exc).__name__})") from None


def _read_document(path: Path, at: _Reading) -> Document:
    where = path.name
    if at.bounded:
        _check_bounds(path, at.root, at.folder, at.library)
    try:
        parsed = parse_source(path)
    except ParseError as exc:
        raise CorpusError(f"{where}: {exc}") from None
    meta, problem = _label_of(path, parsed, at)
    linked = _target_label(path, parsed, at)
    if linked is not None:
        meta[SENSITIVITY_KEY] = strictest([meta[SENSITIVITY_KEY], linked[0]])
        problem = "; ".join(filter(None, [problem, linked[1]]))
    hard_labels, hard_problems = _linked_labels(path, parsed, at)
    if hard_labels:
        meta[SENSITIVITY_KEY] = strictest([meta[SENSITIVITY_KEY], *hard_labels])
        problem = "; ".join(filter(None, [problem, *hard_problems]))
    title = cap_title(meta.pop("title", "") or "") or title_from_text(parsed.text, path.stem)
    return Document(f"{at.library}/{path.stem}", title, parsed.text, meta, str(path), problem, parsed.structure,
                    parsed.anchors)
