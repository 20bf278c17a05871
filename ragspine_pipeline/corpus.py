"""Reading a corpus folder and ingesting it into the versioned chunk store.

A *library* is a folder; each document is a text file with an optional sidecar
``<name>.meta.json`` holding its metadata (title, entity, period, geography, topic,
language, sensitivity). Document ids are ``<library>/<file stem>``, so several libraries
can share one store and a library's withdrawals stay inside its own prefix.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from .ingest.documents import (
    CorpusError,
    Document,
    DocumentError,
    on_parse_error_policy,
    read_document,
)
from .ingest.parsers import SUFFIXES
from .paths import DEMO_ROOT  # the packaged demo corpus, re-exported here (the spec's path)
from .retrieval.chunking.chunk_store import ChunkStore
from .retrieval.chunking.chunking import (
    DEFAULT_CHUNK_CHARS,
    DEFAULT_OVERLAP_CHARS,
    Chunk,
    check_chunk_params,
    chunk_document,
)
from .retrieval.chunking.sentences import DEFAULT_PERCENTILE, SemanticChunker, SentenceWindowChunker
from .retrieval.chunking.structured import (
    PRESET_KINDS,
    ChunkerError,
    LayoutChunker,
    ParentChildChunker,
)
from .retrieval.vector.embedding_backends import (
    EmbeddingBackend,
    EmbeddingBackendUnavailable,
    embedding_spec_from_env,
    make_embedding_backend,
)


def iter_library_files(folder: Path) -> list[Path]:
    """The supported files under ``folder``, as the pipeline's scan finds them: hidden
    files and folders skipped, linked folders not descended into (a linked file is listed;
    ``read_document`` decides whether it may be read)."""
    return sorted(p for p in folder.rglob("*") if p.suffix.lower() in SUFFIXES and p.is_file()
                  and not any(part.startswith(".") for part in p.relative_to(folder).parts))


def load_library(folder: str | os.PathLike[str], library: str | None = None
                 ) -> tuple[list[Document], list[DocumentError]]:
    """All readable documents of a library folder, plus the files that failed.

    Same bounds as the pipeline's ``raw_documents``: a file or sidecar that resolves
    outside ``folder`` (another library) or outside its parent (the corpus root) is a
    failure, never read."""
    root = Path(folder)
    if not root.is_dir():
        raise CorpusError(f"library folder not found: {root}")
    lib = library or root.name
    docs: list[Document] = []
    errors: list[DocumentError] = []
    for p in iter_library_files(root):
        try:
            docs.append(read_document(p, lib, root=root.parent, folder=root))
        except CorpusError as exc:
            errors.append(DocumentError(str(p), str(exc)))
    return docs, errors


def list_libraries(corpus_root: str | os.PathLike[str] = DEMO_ROOT) -> list[str]:
    root = Path(corpus_root)
    return sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))


Chunker = Callable[[Document], list[Chunk]]


@dataclass(frozen=True)
class ParagraphChunker:
    """The default chunker as a value: ``key`` names it and its parameters, so a refresh
    can tell "same document, same chunker" and skip re-chunking."""

    max_chars: int = DEFAULT_CHUNK_CHARS
    overlap_chars: int = DEFAULT_OVERLAP_CHARS

    def __post_init__(self) -> None:
        check_chunk_params(self.max_chars, self.overlap_chars)  # bad run config fails up front

    @property
    def key(self) -> str:
        return f"paragraph:{self.max_chars}:{self.overlap_chars}"

    def __call__(self, doc: Document) -> list[Chunk]:
        return chunk_document(doc.text, doc_id=doc.doc_id, title=doc.title, metadata=doc.metadata,
                              max_chars=self.max_chars, overlap_chars=self.overlap_chars,
                              source_path=doc.source_path)


def paragraph_chunker(max_chars: int = DEFAULT_CHUNK_CHARS,
                      overlap_chars: int = DEFAULT_OVERLAP_CHARS) -> ParagraphChunker:
    return ParagraphChunker(max_chars, overlap_chars)


class KeyedChunker(Protocol):
    """A chunker as a value: called on a document; ``key`` names it and its parameters."""

    @property
    def key(self) -> str: ...

    def __call__(self, doc: Document) -> list[Chunk]: ...


CHUNKER_SPECS = ("paragraph[:max_chars[:overlap_chars]]", "layout[:max_chars[:overlap_chars]]",
                 "laws[:max_chars[:overlap_chars]]", "qa[:max_chars[:overlap_chars]]",
                 "book[:max_chars[:overlap_chars]]",
                 "parent_child[:parent_max_chars[:child_max_chars[:child_overlap_chars]]]",
                 "sentence_window[:window[:max_chars]]", "semantic[:percentile[:max_chars]]")


def _ints(raw: str, params: list[str], most: int, names: str) -> list[int]:
    try:
        ints = [int(p) for p in params]
    except ValueError:
        raise ValueError(f"chunker parameters must be integers: {raw!r}") from None
    if len(ints) > most:
        raise ValueError(f"{raw.split(':')[0]} takes at most {names}: {raw!r}")
    return ints


def _semantic(raw: str, params: list[str], backend: EmbeddingBackend | None) -> KeyedChunker:
    if len(params) > 2:
        raise ValueError(f"semantic takes at most percentile and max_chars: {raw!r}")
    try:
        pct = float(params[0]) if params else DEFAULT_PERCENTILE
        size = int(params[1]) if len(params) > 1 else DEFAULT_CHUNK_CHARS
    except ValueError:
        raise ValueError(f"semantic parameters are a percentile and an integer max_chars: {raw!r}") from None
    if backend is None:
        spec = embedding_spec_from_env("auto")
        try:
            backend = make_embedding_backend(spec)
        except EmbeddingBackendUnavailable as exc:
            raise ChunkerError(f"the semantic chunker needs a dense embedding backend ({exc})") from None
        if backend is None:
            raise ChunkerError(
                f"the semantic chunker needs a dense embedding backend, and embedding spec {spec!r} builds none "
                "here: install the [embed-onnx] extra (pip install 'ragspine-pipeline[embed-onnx]') or set "
                "RAGSPINE_EMBEDDING_BACKEND")
    return SemanticChunker(backend, pct, size)


def make_chunker(spec: str | None = None, *, embedding_backend: EmbeddingBackend | None = None) -> KeyedChunker:
    """Chunker from a spec (``RAGSPINE_CHUNKER`` when None; default ``paragraph``).

    Specs (see ``CHUNKER_SPECS``): ``paragraph``, ``layout``, ``laws``, ``qa``, ``book``
    (``NAME:MAX:OVERLAP``), ``parent_child:PARENT:CHILD:OVERLAP``,
    ``sentence_window:WINDOW:MAX`` and ``semantic:PERCENTILE:MAX`` — which embeds with
    ``embedding_backend``, else the one ``RAGSPINE_EMBEDDING_BACKEND`` (default auto)
    builds, and is a ChunkerError naming the ``[embed-onnx]`` extra when there is none.
    Every parameter is checked here, so bad run config fails before any work.
    """
    raw = (spec if spec is not None else os.environ.get("RAGSPINE_CHUNKER", "paragraph")).strip() or "paragraph"
    name, *params = raw.split(":")
    name = name.strip().lower()
    if name == "paragraph":
        return ParagraphChunker(*_ints(raw, params, 2, "max_chars and overlap_chars"))
    if name in PRESET_KINDS:
        return LayoutChunker(*_ints(raw, params, 2, "max_chars and overlap_chars"), preset=name)
    if name == "parent_child":
        return ParentChildChunker(*_ints(raw, params, 3, "parent_max_chars, child_max_chars, child_overlap_chars"))
    if name == "sentence_window":
        return SentenceWindowChunker(*_ints(raw, params, 2, "window and max_chars"))
    if name == "semantic":
        return _semantic(raw, params, embedding_backend)
    raise ValueError(f"unknown chunker {name!r}; available: {', '.join(CHUNKER_SPECS)}")


@dataclass
class IngestReport:
    new: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    withdrawn: list[str] = field(default_factory=list)
    rows_written: int = 0
    errors: list[DocumentError] = field(default_factory=list)

    def summary(self) -> dict[str, int]:
        return {"new": len(self.new), "changed": len(self.changed), "unchanged": len(self.unchanged),
                "withdrawn": len(self.withdrawn), "rows_written": self.rows_written,
                "errors": len(self.errors)}


def ingest_documents(store: ChunkStore, docs: Sequence[Document], *, scope_prefix: str,
                     chunker: Chunker | None = None, valid_as_of: str = "",
                     errors: Iterable[DocumentError] = (), on_parse_error: str | None = None) -> IngestReport:
    """Chunk and publish ``docs``; withdraw active docs under ``scope_prefix`` not in ``docs``.

    Documents that failed to read (``errors``) are withheld: their active rows are
    withdrawn from serving (the rows stay stored as history, and the document comes back
    as a new version once it reads again), so a relabel that fails to parse cannot keep
    serving the old text. ``on_parse_error="serve_last_good"`` (or
    ``RAGSPINE_ON_PARSE_ERROR``) keeps serving the last good version instead.
    """
    withhold = on_parse_error_policy(on_parse_error) == "withhold"
    chunker = chunker or paragraph_chunker()
    report = IngestReport(errors=list(errors))
    failed_ids = {f"{scope_prefix}{Path(e.path).stem}" for e in report.errors}
    present = {d.doc_id for d in docs}
    known = {d for d in store.active_doc_ids() if d.startswith(scope_prefix)}
    ordered = sorted(docs, key=lambda d: d.doc_id)
    key = getattr(chunker, "key", None)
    hashes: dict[str, str] = {}
    if key:
        hashes = {d.doc_id: hashlib.sha256(f"{d.content_hash}\x1f{key}".encode()).hexdigest() for d in ordered}
        previous = store.latest_source_hashes()
        skipped = [d for d in ordered if d.doc_id in known and previous.get(d.doc_id) == hashes[d.doc_id]]
    else:
        skipped = []
    skip_ids = {d.doc_id for d in skipped}
    todo = [d for d in ordered if d.doc_id not in skip_ids]
    before = store.latest_versions()
    chunked = [(doc.doc_id, chunker(doc)) for doc in todo]
    gone = sorted(known - present - (set() if withhold else failed_ids))
    # One transaction: the library's new state publishes whole or not at all.
    report.rows_written = store.replace_many(chunked + [(g, []) for g in gone], valid_as_of=valid_as_of,
                                             source_hashes=hashes)
    after = store.latest_versions()
    report.unchanged.extend(d.doc_id for d in skipped)
    for doc in todo:
        v0, v1 = before.get(doc.doc_id, 0), after.get(doc.doc_id, 0)
        if doc.doc_id in known and v1 == v0:
            report.unchanged.append(doc.doc_id)
        elif v0 > 0:
            report.changed.append(doc.doc_id)
        else:
            report.new.append(doc.doc_id)
    report.unchanged.sort()
    report.withdrawn.extend(gone)
    return report


def ingest_folder(store: ChunkStore, folder: str | os.PathLike[str], *, library: str | None = None,
                  chunker: Chunker | None = None) -> IngestReport:
    root = Path(folder)
    lib = library or root.name
    docs, errors = load_library(root, lib)
    return ingest_documents(store, docs, scope_prefix=f"{lib}/", chunker=chunker, errors=errors)


def load_golden(path: str | os.PathLike[str] = DEMO_ROOT / "golden_queries.json") -> list[dict[str, Any]]:
    return json.loads(Path(path).read_text(encoding="utf-8"))
