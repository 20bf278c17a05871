"""Sensitivity labels: one normaliser, and one fail-closed test for RESTRICTED.

Both exits (before a reranker/LLM prompt, and before a snippet is built), the served
index builder, the catalog and every metadata preview import this module, so there is
exactly one definition of what "restricted" means.

The rule fails closed. A label is normalised once (NFKC, format and control characters
removed, surrounding whitespace stripped, casefolded) and must then equal one of the
known labels (``PUBLIC``, ``INTERNAL``, ``CONFIDENTIAL``, ``RESTRICTED`` by default,
configurable with ``RAGSPINE_SENSITIVITY_LABELS``, least restrictive first). Anything
else — a zero-width space inside the word, a Cyrillic ``Е``, a list, a dict, ``1``,
``True``, a missing label where one is required — counts as RESTRICTED: a typo must
never make a document *more* visible.
"""

from __future__ import annotations

import os
import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache

RESTRICTED_SENSITIVITY = "RESTRICTED"
DEFAULT_LABELS: tuple[str, ...] = ("PUBLIC", "INTERNAL", "CONFIDENTIAL", RESTRICTED_SENSITIVITY)
LABELS_ENV = "RAGSPINE_SENSITIVITY_LABELS"
REDACTED = "[redacted: restricted]"


class LabelConfigError(ValueError):
    """``RAGSPINE_SENSITIVITY_LABELS`` is malformed (it must list RESTRICTED)."""


def _fold(text: str) -> str:
    text = unicodedata.normalize("NFKC", text)
    text = "".join(ch for ch in text if unicodedata.category(ch) not in ("Cf", "Cc"))
    return text.strip().casefold()


def known_labels() -> tuple[str, ...]:
    """The configured labels, least restrictive first (RESTRICTED is always the last)."""
    raw = os.environ.get(LABELS_ENV, "")
    if not raw.strip():
        return DEFAULT_LABELS
    labels = [_fold(p).upper() for p in raw.split(",") if _fold(p)]
    if RESTRICTED_SENSITIVITY not in labels:
        raise LabelConfigError(f"{LABELS_ENV}={raw!r} must include {RESTRICTED_SENSITIVITY}")
    labels = [x for x in dict.fromkeys(labels) if x != RESTRICTED_SENSITIVITY]
    return (*labels, RESTRICTED_SENSITIVITY)


@dataclass(frozen=True)
class LabelVerdict:
    """A resolved label: the canonical name, and why it was forced to RESTRICTED (if it was)."""

    label: str
    problem: str = ""

    @property
    def restricted(self) -> bool:
        return self.label == RESTRICTED_SENSITIVITY


def normalize_label(value: object, labels: Sequence[str] | None = None) -> str | None:
    """The canonical known label ``value`` spells, or None when it spells none of them."""
    if not isinstance(value, str):
        return None
    return _lookup(value, tuple(labels) if labels else known_labels())


@lru_cache(maxsize=8192)
def _lookup(value: str, labels: tuple[str, ...]) -> str | None:
    # Cached: the exits and the index builder ask this for every chunk, with few distinct labels.
    folded = _fold(value)
    for label in labels:
        if folded == label.casefold():
            return label
    return None


def resolve_label(values: Iterable[object], *, default: str | None, labels: Sequence[str] | None = None
                  ) -> LabelVerdict:
    """One label from every value the metadata sources gave (sidecar, front matter, HTML meta).

    No value: ``default`` (None means the library requires a label: RESTRICTED). Any
    value that is not a known label: RESTRICTED, with the reason. Several values: the most
    restrictive wins.
    """
    labels = tuple(labels or known_labels())
    vals = list(values)
    if not vals:
        if default is None:
            return LabelVerdict(RESTRICTED_SENSITIVITY, "no sensitivity label (the library requires one)")
        return LabelVerdict(normalize_label(default, labels) or RESTRICTED_SENSITIVITY)
    rank = {lab: i for i, lab in enumerate(labels)}
    best, problems = -1, []
    for v in vals:
        lab = normalize_label(v, labels)
        if lab is None:
            problems.append(f"unknown sensitivity label {v!r:.60}" if isinstance(v, str)
                            else f"sensitivity label is a {type(v).__name__}, not a string")
            lab = RESTRICTED_SENSITIVITY
        best = max(best, rank[lab])
    return LabelVerdict(labels[best], "; ".join(problems))


def effective_label(value: object, default: str) -> str:
    """The label a record carries: ``default`` when none was given (None), else the
    canonical spelling of ``value`` — or RESTRICTED when it is not a known label."""
    if value is None:
        return normalize_label(default) or RESTRICTED_SENSITIVITY
    return normalize_label(value) or RESTRICTED_SENSITIVITY


def is_restricted(sensitivity: object) -> bool:
    """True unless ``sensitivity`` normalises to a known label other than RESTRICTED.

    Fails closed: None, an unknown word, a look-alike spelling or a non-string all count
    as RESTRICTED.
    """
    label = normalize_label(sensitivity)
    return label is None or label == RESTRICTED_SENSITIVITY


def redact(text: str, sensitivity: object) -> str:
    """``text`` for display in metadata/logs, or a fixed marker when it is restricted."""
    return REDACTED if is_restricted(sensitivity) else text
