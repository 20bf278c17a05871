"""One document as the engine sees it: text, title, metadata and its resolved label.

Metadata comes from every source a user would write it in — the ``<name>.meta.json``
sidecar, YAML front matter of a markdown file, ``<meta name=…>`` of an HTML page — with
the known keys matched case-insensitively (``Sensitivity`` is ``sensitivity``). The
sensitivity label is resolved fail-closed (``sensitivity.resolve_label``): an unknown
or malformed label, or conflicting labels, give the most restrictive reading, and the
reason is kept on the document for the ``sensitivity_labels_valid`` check.

A file is refused (``CorpusError``, reported as a parse failure) when it is a symlink
that leaves the corpus root, when it is larger than the configured limit, or when a
metadata value cannot be read as written (a dict, list or NaN where a string is
expected): nothing is coerced silently.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from dataclasses import dataclass
from datetime import date, datetime
from pathlib import Path
from typing import Any

from ..retrieval.lexical.analyzer import LanguageError, resolve_language
from ..sensitivity import resolve_label
from .parsers import ParseError, StructureMark, parse_source

TITLE_MAX_CHARS = 300
SIDECAR_SUFFIX = ".meta.json"
KNOWN_KEYS = ("title", "entity", "period", "geography", "topic", "language", "sensitivity")
DEFAULT_LABEL_ENV = "RAGSPINE_DEFAULT_SENSITIVITY"  # "required": a missing label counts as RESTRICTED
DEFAULT_LABEL = "INTERNAL"


ON_PARSE_ERROR_ENV = "RAGSPINE_ON_PARSE_ERROR"
ON_PARSE_ERROR = ("withhold", "serve_last_good")


def on_parse_error_policy(value: str | None = None) -> str:
    """What a document whose file stopped parsing serves meanwhile: "withhold" (nothing,
    the default: a relabel with a typo must not keep the old text online) or
    "serve_last_good" (availability first, an explicit opt-out)."""
    raw = (value if value else os.environ.get(ON_PARSE_ERROR_ENV, "")) or "withhold"
    if raw not in ON_PARSE_ERROR:
        raise ValueError(f"on_parse_error must be one of {', '.join(ON_PARSE_ERROR)}, not {raw!r}")
    return raw


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

    @property
    def content_hash(self) -> str:
        payload = json.dumps([self.title, self.text, self.metadata], ensure_ascii=False, sort_keys=True)
        return hashlib.sha256(payload.encode()).hexdigest()


@dataclass
class DocumentError:
    path: str
    error: str


def sidecar_path(path: Path) -> Path:
    return path.with_name(path.stem + SIDECAR_SUFFIX)


def default_label() -> str | None:
    """The label of a document that declares none (None: the library requires one)."""
    raw = os.environ.get(DEFAULT_LABEL_ENV, "").strip()
    if raw.casefold() == "required":
        return None
    return raw or DEFAULT_LABEL


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


def read_sidecar(path: Path) -> dict[str, Any]:
    try:
        meta = json.loads(path.read_bytes().decode("utf-8-sig"), parse_constant=_reject_constant)
    except (json.JSONDecodeError, UnicodeDecodeError, ValueError) as exc:
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


def merge_metadata(sources: list[tuple[str, dict[str, list[Any]]]], *, default: str | None
                   ) -> tuple[dict[str, Any], str]:
    """(metadata, label problem) from metadata sources, highest precedence first.

    Known keys are matched case-insensitively. ``sensitivity`` collects every value of
    every source (the most restrictive wins); any other known key takes the first
    source's value, and two different values for it in one source are an error.
    Unknown keys are kept as written (first source wins).
    """
    known: dict[str, str] = {}
    labels: list[Any] = []
    extra: dict[str, Any] = {}
    for where, meta in sources:
        seen: dict[str, str] = {}
        for key, values in meta.items():
            fold = key.strip().casefold()
            if fold == "sensitivity":
                labels.extend(values)
                continue
            if fold in KNOWN_KEYS:
                for v in values:
                    text = _scalar(key, v, where)
                    if fold in seen and seen[fold] != text:
                        raise CorpusError(f"{where}: conflicting values for {fold!r}")
                    seen[fold] = text
                continue
            for v in values:
                if isinstance(v, float) and not math.isfinite(v):
                    raise CorpusError(f"{where}: metadata {key!r} is {v}")
                extra.setdefault(key, v if isinstance(v, str | int | float | bool) or v is None
                                 else json.loads(json.dumps(v, default=str)))
        if "language" in seen:  # the analyzer stems by it: a typo must not index silently
            try:
                resolve_language(seen["language"])
            except LanguageError as exc:
                raise CorpusError(f"{where}: {exc}") from None
        for k, v in seen.items():
            known.setdefault(k, v)
    verdict = resolve_label(labels, default=default)
    out = {**{k: v for k, v in extra.items() if k.strip().casefold() not in KNOWN_KEYS}, **known,
           "sensitivity": verdict.label}
    return out, verdict.problem


def _inside(path: Path, root: Path) -> bool:
    try:
        path.resolve(strict=True).relative_to(root.resolve())
    except (ValueError, OSError):
        return False
    return True


def read_document(path: Path, library: str, *, root: Path | None = None) -> Document:
    """One document (.md .txt .html .pdf) + its sidecar; CorpusError if it cannot be read.

    ``root`` (the corpus root) bounds where the file and its sidecar may live: a symlink
    that resolves outside it is refused, never followed.
    """
    path = Path(path)
    where = path.name
    sidecar = sidecar_path(path)
    if root is not None:
        for p in (path, sidecar):
            if (p.exists() or p.is_symlink()) and not _inside(p, root):
                raise CorpusError(f"{p.name}: symlink points outside the corpus root; refused")
    try:
        parsed = parse_source(path)
    except ParseError as exc:
        raise CorpusError(f"{where}: {exc}") from None
    except OSError as exc:
        raise CorpusError(f"{where}: cannot read ({exc.strerror or exc})") from None
    sources: list[tuple[str, dict[str, list[Any]]]] = []
    if sidecar.exists():
        sources.append((sidecar.name, {k: [v] for k, v in read_sidecar(sidecar).items()}))
    if parsed.metadata:
        sources.append((where, parsed.metadata))
    meta, problem = merge_metadata(sources, default=default_label())
    title = cap_title(meta.pop("title", "") or "") or title_from_text(parsed.text, path.stem)
    return Document(f"{library}/{path.stem}", title, parsed.text, meta, str(path), problem, parsed.structure)
