"""The visual slot: page images scored by late interaction (ColPali-style), off by default.

``RAGSPINE_VISUAL_EMBEDDER`` (default ``none``) picks a ``VisualEmbedder``: ``colpali`` /
``colqwen2`` name the real models, which need their weights on this machine and a GPU —
neither ships in a package here, so naming them is a ``VisualEmbedderUnavailable`` that
says what is missing; ``deterministic`` is a small patch embedder for tests and demos.

``render_pdf_pages`` renders PDF pages with pypdfium2 (only called when the layer is
enabled). ``VisualPageIndex`` holds page patch embeddings; RESTRICTED pages are left out
when it is built (``is_restricted``), so no query can score them. Search is ``maxsim``
from the late-interaction reranker, and hits are page *references* — ``is_visual``
True, ``citable`` False: a page image is a pointer for a human, never a cited fact.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from ... import settings
from ...sensitivity import is_restricted
from .late_interaction import maxsim

VISUAL_ENV = "RAGSPINE_VISUAL_EMBEDDER"
VISUAL_MODEL_ENV = "RAGSPINE_VISUAL_MODEL"

__all__ = ["VISUAL_ENV", "DeterministicPatchEmbedder", "PageImage", "VisualEmbedder",
           "VisualEmbedderUnavailable", "VisualPageIndex", "make_visual_embedder", "render_pdf_pages"]


class VisualEmbedderUnavailable(RuntimeError):
    """The visual embedder cannot run here; the message says what is missing."""


@runtime_checkable
class VisualEmbedder(Protocol):
    """Multi-vector embeddings: patches of a page image, tokens of a query (one width)."""

    def embed_pages(self, images: Sequence[np.ndarray]) -> list[np.ndarray]: ...

    def embed_query(self, query: str) -> np.ndarray: ...


@dataclass
class PageImage:
    """One rendered page: ``pixels`` is an (H, W) or (H, W, C) uint8 array."""

    doc_id: str
    page: int
    pixels: np.ndarray
    sensitivity: Any = "INTERNAL"
    title: str = ""
    metadata: dict[str, Any] = field(default_factory=dict)


def render_pdf_pages(path: str | os.PathLike[str], *, scale: float = 1.0, doc_id: str = "",
                     sensitivity: Any = "INTERNAL") -> list[PageImage]:
    """Every page of a PDF as a grey-scale ``PageImage`` (pypdfium2; the [colpali] extra)."""
    try:
        import pypdfium2 as pdfium  # lazy: pypdfium2, the optional [colpali] extra
    except ImportError:
        raise VisualEmbedderUnavailable("rendering pages needs pypdfium2 (pip install "
                                        "'ragspine-pipeline[colpali]')") from None
    pdf = pdfium.PdfDocument(str(path))
    try:
        pages = []
        for i in range(len(pdf)):
            img = pdf[i].render(scale=scale, grayscale=True).to_numpy()
            pages.append(PageImage(doc_id or Path(path).stem, i + 1, np.asarray(img)[..., 0]
                                   if np.asarray(img).ndim == 3 else np.asarray(img), sensitivity))
        return pages
    finally:
        pdf.close()


class DeterministicPatchEmbedder:
    """Test/demo embedder (not a trained model): a page is cut into ``grid`` x ``grid``
    patches whose vectors are a fixed random projection of the patch's pixel histogram;
    query tokens map to the vector of the patch an ``ink:<level>`` token names, other
    words to hashed unit vectors. Deterministic, so end-to-end tests know the answer."""

    def __init__(self, dim: int = 16, grid: int = 4, bins: int = 8, seed: int = 0) -> None:
        self.dim, self.grid, self.bins = dim, grid, bins
        self._proj = np.random.default_rng(seed).normal(size=(bins, dim)).astype(np.float32)
        self.model_id = f"deterministic-patches-{dim}x{grid}"

    def _hist_vec(self, hist: np.ndarray) -> np.ndarray:
        v = hist.astype(np.float32) @ self._proj
        return v / max(float(np.linalg.norm(v)), 1e-12)

    def embed_pages(self, images: Sequence[np.ndarray]) -> list[np.ndarray]:
        out = []
        for img in images:
            a = np.asarray(img)
            if a.ndim == 3:
                a = a.mean(axis=2)
            if a.ndim != 2 or a.shape[0] < self.grid or a.shape[1] < self.grid:
                raise ValueError(f"page image must be at least {self.grid}x{self.grid} pixels (got {a.shape})")
            rows = []
            for band in np.array_split(a, self.grid, axis=0):
                for patch in np.array_split(band, self.grid, axis=1):
                    hist, _ = np.histogram(patch, bins=self.bins, range=(0, 256))
                    rows.append(self._hist_vec(hist / max(patch.size, 1)))
            out.append(np.stack(rows))
        return out

    def embed_query(self, query: str) -> np.ndarray:
        rows = []
        for tok in re.findall(r"\S+", query.lower()):
            m = re.fullmatch(r"ink:(\d+)", tok)
            if m:  # a patch filled with grey level N
                hist = np.zeros(self.bins)
                hist[min(int(m.group(1)) * self.bins // 256, self.bins - 1)] = 1.0
                rows.append(self._hist_vec(hist))
            else:
                seed = int.from_bytes(hashlib.sha256(tok.encode()).digest()[:8], "little")
                v = np.random.default_rng(seed).normal(size=self.dim).astype(np.float32)
                rows.append(v / np.linalg.norm(v))
        return np.stack(rows) if rows else np.zeros((0, self.dim), np.float32)


def make_visual_embedder(spec: str | None = None) -> VisualEmbedder | None:
    """``RAGSPINE_VISUAL_EMBEDDER``: none (default) | deterministic | colpali | colqwen2."""
    raw = spec if spec is not None else settings.get(VISUAL_ENV)
    name = str(raw).strip().lower()
    if name in ("", "none", "off"):
        return None
    if name == "deterministic":
        return DeterministicPatchEmbedder()
    if name in ("colpali", "colqwen2", "colqwen"):
        folder = (settings.get(VISUAL_MODEL_ENV) or "").strip()
        missing = []
        if not folder or not Path(folder).is_dir():
            missing.append(f"the {name} weights ({VISUAL_MODEL_ENV}=<local folder>; no package here "
                           "ships them and nothing is downloaded)")
        try:
            # lazy: torch (heavy, the operator's for ColPali), only to say whether a GPU is there
            import torch
            gpu = bool(torch.cuda.is_available())
        except ImportError:
            gpu = False
            missing.append("torch")
        if not gpu:
            missing.append("a CUDA GPU")
        if missing:
            raise VisualEmbedderUnavailable(f"visual embedder {name!r} cannot run here: missing "
                                            + "; ".join(missing))
        raise VisualEmbedderUnavailable(f"visual embedder {name!r}: weights and a GPU are present, but "
                                        "the ColPali loader is not wired yet (the GPU check of issue 14)")
    raise ValueError(f"unknown visual embedder {raw!r}; use one of: none, deterministic, colpali, colqwen2")


class VisualPageIndex:
    """Page patch embeddings of one library; RESTRICTED pages never enter it."""

    def __init__(self, pages: Sequence[PageImage], embedder: VisualEmbedder) -> None:
        if not callable(getattr(embedder, "embed_pages", None)) or not callable(getattr(embedder, "embed_query", None)):
            raise TypeError(f"{type(embedder).__name__} is not a VisualEmbedder")
        self.embedder = embedder
        kept = [p for p in pages if not is_restricted(p.sensitivity)]
        self.restricted_excluded = len(pages) - len(kept)
        self.pages = kept  # restricted pixels are never embedded, stored or scored
        self._patches = embedder.embed_pages([p.pixels for p in kept]) if kept else []

    @classmethod
    def from_embeddings(cls, pages: Sequence[PageImage], patches: Sequence[np.ndarray],
                        embedder: VisualEmbedder) -> VisualPageIndex:
        """An index over patch matrices embedded earlier (the ``page_images`` asset);
        RESTRICTED pages are dropped here too (defence in depth)."""
        if len(pages) != len(patches):
            raise ValueError("pages and patches must align")
        idx = cls([], embedder)
        keep = [i for i, p in enumerate(pages) if not is_restricted(p.sensitivity)]
        idx.restricted_excluded = len(pages) - len(keep)
        idx.pages = [pages[i] for i in keep]
        idx._patches = [np.asarray(patches[i], dtype=np.float32) for i in keep]
        return idx

    def __len__(self) -> int:
        return len(self.pages)

    def search(self, query: str, top_k: int = 5) -> list[dict[str, Any]]:
        """Page references by MaxSim, best first (ties by doc_id, page)."""
        if not isinstance(query, str):
            raise TypeError(f"query must be a string (got {type(query).__name__})")
        if top_k <= 0 or not self.pages:
            return []
        q = self.embedder.embed_query(query)
        scored = sorted(((maxsim(q, m), p) for m, p in zip(self._patches, self.pages, strict=True)),
                        key=lambda sp: (-sp[0], sp[1].doc_id, sp[1].page))
        return [{"rank": r, "doc_id": p.doc_id, "page": p.page, "title": p.title, "sensitivity": p.sensitivity,
                 "scores": {"visual": round(s, 6)}, "is_visual": True, "citable": False,
                 **({"source_path": p.metadata["source_path"]} if "source_path" in p.metadata else {})}
                for r, (s, p) in enumerate(scored[:top_k], start=1)]
