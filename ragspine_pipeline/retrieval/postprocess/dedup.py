"""Duplicate passages collapse to one answer (issue 43, item 3).

Why: two files that share a passage (a licence pasted into two READMEs, a policy saved
as PDF and DOCX) index the same text twice, and both copies score alike, so the same
words filled two or three of the top five. Here each group of copies keeps its best-ranked
member; the others are listed on it as ``duplicates`` (``doc_id``, ``chunk_id``,
``source_locator``, ``library_id`` when known), so every file holding the passage can still
be cited.

Two chunks are duplicates when

* their normalised texts are equal (Unicode NFKC, case-folded, runs of white space as one
  space, trimmed), or
* near-identical: the Jaccard similarity of their sets of word 3-grams (shingles of the
  normalised text: runs of letters and digits; a CJK character counts as a word) is at least
  ``NEAR_DUPLICATE_JACCARD`` = 0.9. One changed word changes up to three shingles, so
  near-identical needs long texts: a one-word difference collapses only from about 77
  words, and short texts collapse only when equal ("policy number 1" and "policy
  number 2" stay apart). Cheap: a pair is compared only when their shingle counts allow
  the threshold (a necessary condition: min/max >= 0.9 of the shingle positions); its
  64-hash MinHash signatures then screen it (estimate >= 0.75), and only a screened pair
  has its exact Jaccard computed, which decides.

Only items the caller passes are compared, and callers pass only what passed both
RESTRICTED exits, so a duplicates list can never name a restricted chunk. The first item
of a group (the caller's order: best-scored first) is the one kept.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import numpy as np

NEAR_DUPLICATE_JACCARD = 0.9
SHINGLE_WORDS = 3
_CJK_CHARS = "\u3040-\u30ff\u3400-\u9fff\uf900-\ufaff\uac00-\ud7af"
_WORD = re.compile(f"[{_CJK_CHARS}]|[^\\W{_CJK_CHARS}]+")
_SIGNATURE = 64
_SCREEN = 0.75  # MinHash estimate that sends a pair to the exact check (64 hashes: sd ~0.04 at 0.9)
_rng = np.random.default_rng(20240143)
_A = _rng.integers(1, 2**63, _SIGNATURE, dtype=np.uint64) | np.uint64(1)
_B = _rng.integers(0, 2**63, _SIGNATURE, dtype=np.uint64)
_P = np.uint64(1_000_003)

T = TypeVar("T")


def normalised(text: str) -> str:
    """The text two copies share: NFKC, case-folded, white space collapsed, trimmed."""
    return " ".join(unicodedata.normalize("NFKC", text).casefold().split())


def _words(norm: str) -> list[str]:
    return _WORD.findall(norm)


def shingles(norm: str) -> np.ndarray:
    """Sorted unique 64-bit hashes of the word 3-grams of a normalised text (fewer than 3
    words: one gram); words are runs of letters and digits, a CJK character counts as a
    word. Hashes are compared within one process only."""
    return _grams(_words(norm))


def _grams(words: list[str]) -> np.ndarray:
    w = np.fromiter(map(hash, words), np.int64, count=len(words)).view(np.uint64)
    if len(w) < SHINGLE_WORDS:
        w = np.concatenate([w, np.zeros(SHINGLE_WORDS - len(w), np.uint64)])
    n = len(w) - SHINGLE_WORDS + 1
    h = w[:n].copy()
    with np.errstate(over="ignore"):
        for j in range(1, SHINGLE_WORDS):
            h = h * _P + w[j: j + n]
    return np.unique(h)


def _signature(sh: np.ndarray) -> np.ndarray:
    """MinHash signature of a shingle hash array."""
    with np.errstate(over="ignore"):
        return (np.multiply.outer(_A, sh) + _B[:, None]).min(axis=1)


def jaccard(a: np.ndarray, b: np.ndarray) -> float:
    """Exact Jaccard of two sorted unique shingle arrays."""
    inter = len(np.intersect1d(a, b, assume_unique=True))
    union = len(a) + len(b) - inter
    return inter / union if union else 1.0


@dataclass
class Group(Generic[T]):
    """One kept item and the copies collapsed into it, in the caller's order."""

    kept: T
    copies: list[T] = field(default_factory=list)


class _Sketch:
    """A text's words, and its shingles and MinHash signature once a comparison needs them."""

    __slots__ = ("_sig", "grams", "n", "words")

    def __init__(self, norm: str) -> None:
        self.words = _words(norm)
        self.n = max(len(self.words) - SHINGLE_WORDS + 1, 1)  # shingle positions
        self.grams: np.ndarray | None = None
        self._sig: np.ndarray | None = None

    def sig(self) -> np.ndarray:
        if self._sig is None:
            self.grams = _grams(self.words)
            self._sig = _signature(self.grams)
        return self._sig


def near_duplicate(a: _Sketch, b: _Sketch, threshold: float = NEAR_DUPLICATE_JACCARD) -> bool:
    """The near rule for one pair: shingle counts within the threshold's ratio, MinHash
    estimate >= 0.75, exact Jaccard >= ``threshold``."""
    if min(a.n, b.n) < threshold * max(a.n, b.n):
        return False
    if (a.sig() == b.sig()).mean() < min(_SCREEN, threshold):
        return False
    assert a.grams is not None and b.grams is not None
    return jaccard(a.grams, b.grams) >= threshold


def collapse(items: Sequence[T], text: Callable[[T], str], *, threshold: float = NEAR_DUPLICATE_JACCARD,
             limit: int | None = None) -> list[Group[T]]:
    """``items`` (best first) grouped by duplicate text; groups in the order of their kept
    (first) member. ``threshold`` > 1 keeps only the exact (normalised) rule. ``limit``:
    once that many groups exist, later items only join them as exact copies (the near
    rule's cost is paid for the items that can still be shown). Shingles and signatures
    are computed only for texts that have a kept text of a fitting length; each new text
    is screened against all fitting kept texts in one array comparison."""
    groups: list[Group[T]] = []
    by_text: dict[str, int] = {}
    near = threshold <= 1.0
    kept: list[_Sketch] = []
    sizes = np.zeros(len(items), np.float64)
    sigs = np.zeros((len(items), _SIGNATURE), np.uint64) if near else np.zeros((0, _SIGNATURE), np.uint64)
    signed = np.zeros(len(items), np.bool_)
    for item in items:
        norm = normalised(text(item))
        g = by_text.get(norm)
        if g is None and limit is not None and len(groups) >= limit:
            continue
        sk = _Sketch(norm) if near else None
        if g is None and sk is not None and groups:
            n = len(groups)
            fits = np.flatnonzero(np.minimum(sizes[:n], sk.n) >= threshold * np.maximum(sizes[:n], sk.n))
            if len(fits):
                for i in fits[~signed[fits]].tolist():
                    sigs[i], signed[i] = kept[i].sig(), True
                est = (sigs[fits] == sk.sig()).mean(axis=1)
                for i in fits[est >= min(_SCREEN, threshold)].tolist():
                    assert kept[i].grams is not None and sk.grams is not None
                    if jaccard(kept[i].grams, sk.grams) >= threshold:
                        g = i
                        break
        if g is not None:
            groups[g].copies.append(item)
            by_text.setdefault(norm, g)
            continue
        by_text[norm] = len(groups)
        if sk is not None:
            sizes[len(groups)] = sk.n
            kept.append(sk)
        groups.append(Group(item))
    return groups


def duplicate_ref(chunk: Any, library_id: str = "") -> dict[str, Any]:
    """What a duplicates list says about one collapsed copy: where else the text is."""
    loc = chunk.source_locator
    ref: dict[str, Any] = {"doc_id": chunk.doc_id, "chunk_id": chunk.chunk_id,
                           "source_locator": loc.to_dict() if hasattr(loc, "to_dict") else dict(loc)}
    if library_id:
        ref["library_id"] = library_id
    return ref


__all__ = ["NEAR_DUPLICATE_JACCARD", "SHINGLE_WORDS", "Group", "collapse", "duplicate_ref", "jaccard",
           "normalised", "shingles"]
