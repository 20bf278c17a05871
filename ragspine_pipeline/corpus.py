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
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .ingest.documents import (
    CorpusError,
    Document,
    DocumentError,
    on_parse_error_policy,
    read_document,
)
from .ingest.parsers import SUFFIXES
from .ingest.sidecars import CorpusView, orphan_sidecars
from .paths import DEMO_ROOT  # the packaged demo corpus, re-exported here (the spec's path)
from .retrieval.chunking.chunk_store import ChunkStore

# The chunker factory lives in chunking/ (its base module); re-exported here, where the
# engine-only ingest and older imports find it.
from .retrieval.chunking.factory import (
    CHUNKER_SPECS,
    Chunker,
    KeyedChunker,
    ParagraphChunker,
    make_chunker,
    paragraph_chunker,
)

__all__ = ["CHUNKER_SPECS", "DEMO_ROOT", "Chunker", "CorpusError", "Document", "DocumentError", "IngestReport",
           "KeyedChunker", "ParagraphChunker", "ingest_documents", "ingest_folder", "iter_library_files",
           "list_libraries", "load_golden", "load_library", "make_chunker", "paragraph_chunker"]

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
    outside ``folder`` (another library) or outside its parent (the corpus root), or a
    file hard-linked into another library, is a failure, never read. A file named like a
    sidecar that belongs to no document (an orphan: its label would label nothing, most
    likely a misnamed one) is reported as a failure too."""
    root = Path(folder)
    if not root.is_dir():
        raise CorpusError(f"library folder not found: {root}")
    lib = library or root.name
    docs: list[Document] = []
    errors: list[DocumentError] = []
    files = iter_library_files(root)
    view = CorpusView(root.parent, SUFFIXES)  # folders listed once; hard links walked once, if any
    for p in files:
        try:
            docs.append(read_document(p, lib, root=root.parent, folder=root, view=view))
        except CorpusError as exc:
            errors.append(DocumentError(str(p), str(exc)))
    for orphan in orphan_sidecars(root, files):
        errors.append(DocumentError(str(orphan), f"{orphan.name}: metadata sidecar of no document (orphan)"))
    return docs, errors


def list_libraries(corpus_root: str | os.PathLike[str] = DEMO_ROOT) -> list[str]:
    root = Path(corpus_root)
    return sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))


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
