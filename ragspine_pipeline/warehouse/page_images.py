"""Page images of a library's PDFs for the visual slot (``RAGSPINE_VISUAL_EMBEDDER``).

``build_page_images`` renders every page of every current PDF of a library (pypdfium2,
``[colpali]``), embeds the pages into patch vectors with the configured
``VisualEmbedder`` and writes one versioned table, ``page_images/pages``: a page
reference (doc_id, page, title, source_path, size) and its patch matrix. It runs only
when the layer is enabled (no embedder: nothing rendered, nothing written).

RESTRICTED documents are excluded at build time: their files are never opened, their
pages never rendered or embedded (``is_restricted``, fail closed: an odd label counts),
and ``restricted_pages_check`` proves the published table holds no page of a document
whose current label is restricted. ``load_page_index`` turns the table back into a
``VisualPageIndex`` whose hits are page references (``is_visual``, never ``citable``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from ..retrieval.rerank.visual import PageImage, VisualEmbedder, VisualPageIndex, render_pdf_pages
from ..sensitivity import is_restricted
from .catalog import redacted_doc_ids
from .chunk_tables import active_chunk_table, withheld_docs
from .common import CHUNKS, RAW, SNAPSHOT, CheckOutcome, StepResult
from .raw import raw_state
from .versioned import VersionedTables, WarehouseError

PAGE_IMAGES = "page_images"
TABLE = "pages"
DEFAULT_SCALE = 1.0

__all__ = ["PAGE_IMAGES", "build_page_images", "load_page_index", "restricted_pages_check"]

_SCHEMA = pa.schema([("doc_id", pa.string()), ("page", pa.int32()), ("title", pa.string()),
                     ("sensitivity", pa.string()), ("source_path", pa.string()), ("width", pa.int32()),
                     ("height", pa.int32()), ("n_patches", pa.int32()), ("dim", pa.int32()),
                     ("patches", pa.list_(pa.float32()))])


def _current_docs(wh: VersionedTables, library: str) -> list[dict[str, Any]]:
    pub = wh.latest(RAW, library)
    if pub is None:
        raise WarehouseError(f"no raw_documents published for {library}")
    t = raw_state(pub, columns=["doc_id", "title", "sensitivity", "source_path", "parse_error"])
    return t.to_pylist() if t is not None else []


def servable_docs(wh: VersionedTables, library: str) -> set[str]:
    """Documents whose pages may be rendered and served today (an allow-list, fail closed).

    A page image shows the whole page, so a document qualifies only when the latest chunks
    version serves it entirely: it has active chunks, none of them RESTRICTED (a document with
    one restricted section has restricted pages), it is not withheld or withdrawn, and the
    published snapshot does not redact it (restricted in any stored version). Anything the
    warehouse cannot vouch for — no chunks published yet, a document missing from them — is
    left out.
    """
    pub = wh.latest(CHUNKS, library)
    if pub is None:
        return set()
    t = active_chunk_table(pub, columns=["doc_id", "sensitivity"])
    docs, restricted = set(), set()
    for doc, label in zip(t.column("doc_id").to_pylist(), t.column("sensitivity").to_pylist(), strict=True):
        (restricted if is_restricted(label) else docs).add(doc)
    allowed = docs - restricted - withheld_docs(pub)
    snap = wh.latest(SNAPSHOT, library)
    if snap is not None:
        allowed -= redacted_doc_ids(wh, library, snap.manifest["metadata"])
    return allowed


def _pdf_file(source_path: str, corpus_root: Path, library: str) -> Path:
    p = Path(source_path)
    return p if p.is_absolute() else Path(corpus_root) / library / p


def build_page_images(wh: VersionedTables, corpus_root: str | Path, library: str,
                      embedder: VisualEmbedder, *, scale: float = DEFAULT_SCALE) -> StepResult:
    """Render, embed and publish the pages of the library's open PDFs (one new version)."""
    if not callable(getattr(embedder, "embed_pages", None)):
        raise TypeError(f"{type(embedder).__name__} is not a VisualEmbedder")
    rows: list[dict[str, Any]] = []
    restricted_docs, failed = 0, []
    allowed = servable_docs(wh, library)
    for d in _current_docs(wh, library):
        if not str(d["source_path"]).lower().endswith(".pdf") or d.get("parse_error"):
            continue
        if is_restricted(d["sensitivity"]) or d["doc_id"] not in allowed:
            restricted_docs += 1  # never opened, rendered or embedded
            continue
        try:
            pages = render_pdf_pages(_pdf_file(d["source_path"], Path(corpus_root), library), scale=scale,
                                     doc_id=d["doc_id"], sensitivity=d["sensitivity"])
        except Exception as exc:  # noqa: BLE001 - one unreadable file never stops the others
            if type(exc).__name__ == "VisualEmbedderUnavailable":
                raise
            failed.append(f"{Path(d['source_path']).name}: {type(exc).__name__}: {exc}")
            continue
        patches = embedder.embed_pages([p.pixels for p in pages]) if pages else []
        for p, m in zip(pages, patches, strict=True):
            m = np.asarray(m, dtype=np.float32)
            rows.append({"doc_id": p.doc_id, "page": p.page, "title": d.get("title") or "",
                         "sensitivity": str(d["sensitivity"]), "source_path": d["source_path"],
                         "width": int(p.pixels.shape[1]), "height": int(p.pixels.shape[0]),
                         "n_patches": int(m.shape[0]), "dim": int(m.shape[1]), "patches": m.ravel().tolist()})
    model_id = str(getattr(embedder, "model_id", type(embedder).__name__))
    meta = {"model_id": model_id, "pages": len(rows), "documents": len({r["doc_id"] for r in rows}),
            "restricted_documents_excluded": restricted_docs, "failed_files": failed, "scale": scale}
    table = pa.Table.from_pylist(rows, schema=_SCHEMA)
    pub = wh.write(PAGE_IMAGES, library, {TABLE: table}, {**meta, "failed_files": json.dumps(failed)})
    return StepResult(pub, meta, {"restricted_pages_excluded": restricted_pages_check(wh, library)})


def _pages_table(wh: VersionedTables, library: str) -> pa.Table | None:
    pub = wh.latest(PAGE_IMAGES, library)
    if pub is None:
        return None
    return pa.concat_tables([wh.read(PAGE_IMAGES, library, TABLE, pub.version)])


def restricted_pages_check(wh: VersionedTables, library: str) -> CheckOutcome:
    """No published page belongs to a document whose current label (or its stored label)
    is restricted."""
    t = _pages_table(wh, library)
    if t is None or t.num_rows == 0:
        return CheckOutcome(True, {"restricted_pages": 0, "pages": 0})
    restricted_now = {d["doc_id"] for d in _current_docs(wh, library) if is_restricted(d["sensitivity"])}
    allowed = servable_docs(wh, library)
    bad = sorted({f"{doc}#p{page}" for doc, page, label in zip(
        t.column("doc_id").to_pylist(), t.column("page").to_pylist(), t.column("sensitivity").to_pylist(),
        strict=True) if doc in restricted_now or doc not in allowed or is_restricted(label)})
    return CheckOutcome(not bad, {"restricted_pages": len(bad), "pages": t.num_rows, "examples": bad[:10]})


def load_page_index(wh: VersionedTables, library: str, embedder: VisualEmbedder) -> VisualPageIndex:
    """The published pages as a searchable index (the same embedder must embed queries)."""
    t = _pages_table(wh, library)
    if t is None:
        raise WarehouseError(f"no page_images published for {library} (set RAGSPINE_VISUAL_EMBEDDER and "
                             "materialize page_images)")
    pub = wh.latest(PAGE_IMAGES, library)
    stored_model = pub.manifest.get("metadata", {}).get("model_id") if pub else None
    model_id = str(getattr(embedder, "model_id", type(embedder).__name__))
    if stored_model and stored_model != model_id:
        raise WarehouseError(f"page_images of {library} were embedded with {stored_model!r}, not {model_id!r}: "
                             "rematerialize page_images with this embedder")
    pages, patches = [], []
    allowed = servable_docs(wh, library)  # re-checked at serve time: a relabel since the build hides its pages
    for r in t.to_pylist():
        if is_restricted(r["sensitivity"]) or r["doc_id"] not in allowed:
            continue
        pages.append(PageImage(r["doc_id"], r["page"], np.zeros((0, 0), np.uint8), r["sensitivity"], r["title"],
                               {"source_path": r["source_path"], "width": r["width"], "height": r["height"]}))
        patches.append(np.asarray(r["patches"], dtype=np.float32).reshape(r["n_patches"], r["dim"]))
    return VisualPageIndex.from_embeddings(pages, patches, embedder)
