"""Sensitivity labels: one strict reader, and one fail-closed test for RESTRICTED.

Both exits (before a reranker/LLM prompt, and before a snippet is built), the served
index builder, the catalog and every metadata preview import this module, so there is
exactly one definition of what "restricted" means.

The rule fails closed and is *strict*: a label opens a document only when it is written
exactly as one of the known labels (``PUBLIC``, ``INTERNAL``, ``CONFIDENTIAL``,
``RESTRICTED`` by default, configurable with ``RAGSPINE_SENSITIVITY_LABELS``, least
restrictive first), ASCII letters in any case, surrounded by ASCII spaces at most.
Every other spelling — a zero-width space, soft hyphen, BOM or NUL inside the word,
full-width letters, an NBSP or TAB around it, a Cyrillic ``Е``, a list, ``1``, ``True``,
a missing label where one is required — counts as RESTRICTED and is reported: a typo (or
a spelling made to look right) must never make a document *more* visible. Nothing is
normalised into an open label; ``skeleton`` folds look-alikes only to *say* which label
an odd spelling imitates, and to recognise misspelt metadata keys.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache

from . import settings

RESTRICTED_SENSITIVITY = "RESTRICTED"
DEFAULT_LABELS: tuple[str, ...] = ("PUBLIC", "INTERNAL", "CONFIDENTIAL", RESTRICTED_SENSITIVITY)
LABELS_ENV = "RAGSPINE_SENSITIVITY_LABELS"
REDACTED = "[redacted: restricted]"

# ASCII-only case mapping: ``str.upper``/``casefold`` map the Kelvin sign to ``k`` and the
# long s to ``s``, which would let a look-alike spell a configured label.
_ASCII_UPPER = str.maketrans("abcdefghijklmnopqrstuvwxyz", "ABCDEFGHIJKLMNOPQRSTUVWXYZ")


class LabelConfigError(ValueError):
    """``RAGSPINE_SENSITIVITY_LABELS`` is malformed (it must list RESTRICTED, in plain spellings)."""


def _canonical_spelling(value: str) -> str:
    """``value`` with surrounding ASCII spaces removed and ASCII letters upper-cased."""
    return value.strip(" ").translate(_ASCII_UPPER)


def _check_config_label(label: str, raw: str) -> str:
    odd = [ch for ch in label if unicodedata.category(ch)[0] in "CZM" and ch != " "]
    if odd or unicodedata.normalize("NFKC", label) != label:
        raise LabelConfigError(f"{LABELS_ENV}={ascii(raw)}: label {ascii(label)} has invisible, "
                               "combining or compatibility characters; write it plainly")
    return label


def known_labels() -> tuple[str, ...]:
    """The configured labels, least restrictive first (RESTRICTED is always the last)."""
    # The exact text, parsed by _parse_labels (stricter than the registry's check, and cached).
    raw = settings.raw(LABELS_ENV)
    if raw is None or not raw.strip():
        return DEFAULT_LABELS
    return _parse_labels(raw)


@lru_cache(maxsize=16)
def _parse_labels(raw: str) -> tuple[str, ...]:
    parts = [_canonical_spelling(p.strip(" \t\r\n")) for p in raw.split(",")]
    labels = [_check_config_label(p, raw) for p in parts if p]
    if RESTRICTED_SENSITIVITY not in labels:
        raise LabelConfigError(f"{LABELS_ENV}={raw!r} must include {RESTRICTED_SENSITIVITY}")
    labels = [x for x in dict.fromkeys(labels) if x != RESTRICTED_SENSITIVITY]
    return (*labels, RESTRICTED_SENSITIVITY)


# Look-alikes of Latin letters (Cyrillic, Greek, Armenian, IPA, small capitals, digits),
# applied after NFKD + casefold, so full-width and mathematical letters are already Latin.
# i, l, 1 and | are one class: they are told apart by serifs only.
_CONFUSABLE_GROUPS = {
    "a": "аɑα⍺", "b": "ьƅ", "c": "сϲᴄ", "d": "ԁ", "e": "еҽ℮ɛεє", "g": "ɡցԍ", "h": "һհ",
    "i": "іιıɩӏǀ׀ߊᛁl1|", "j": "јϳ", "k": "кκĸ", "n": "ոηɴп", "o": "оοօσᴏ0ө", "p": "рρϱ⍴",
    "q": "ԛզ", "r": "гᴦ", "s": "ѕꜱƽ", "t": "тτ", "u": "υսʋᴜ", "v": "νѵᴠ", "w": "ԝѡω",
    "x": "хχ×", "y": "уγүʏყ", "z": "ᴢ",
}
_CONFUSABLES = str.maketrans({ch: base for base, group in _CONFUSABLE_GROUPS.items() for ch in group})
# Dropped before comparing: separators a key or label may be padded or split with, and
# blank letters that render as nothing (Hangul fillers, braille blank).
_DROP_CHARS = frozenset("-_.\u115f\u1160\u3164\uffa0\u2800")


@lru_cache(maxsize=4096)
def skeleton(text: str) -> str:
    """What ``text`` looks like: NFKD, format/control/combining/space characters and
    ``-_.`` removed, casefolded, look-alike letters mapped to Latin ones.

    Two strings with the same skeleton read the same to a person. Used only to *detect*
    a spelling that imitates a known label or key — never to accept one.
    """
    folded = unicodedata.normalize("NFKD", text).casefold()
    kept = "".join(ch for ch in folded if ch not in _DROP_CHARS and unicodedata.category(ch)[0] not in "CMZ")
    return kept.translate(_CONFUSABLES)


@dataclass(frozen=True)
class LabelVerdict:
    """A resolved label: the canonical name, and why it was forced to RESTRICTED (if it was)."""

    label: str
    problem: str = ""

    @property
    def restricted(self) -> bool:
        return self.label == RESTRICTED_SENSITIVITY


def normalize_label(value: object, labels: Sequence[str] | None = None) -> str | None:
    """The known label ``value`` is written as (ASCII case-insensitive, surrounding ASCII
    spaces allowed), or None for every other spelling and every non-string."""
    if not isinstance(value, str):
        return None
    return _lookup(value, tuple(labels) if labels else known_labels())


@lru_cache(maxsize=8192)
def _lookup(value: str, labels: tuple[str, ...]) -> str | None:
    # Cached: the exits and the index builder ask this for every chunk, with few distinct labels.
    spelled = _canonical_spelling(value)
    return spelled if spelled in labels else None


def _odd_label_problem(value: object, labels: tuple[str, ...]) -> str:
    """Why ``value`` is not a label, without echoing an unknown value (it may be a secret)."""
    if not isinstance(value, str):
        return f"sensitivity label is a {type(value).__name__}, not a string"
    imitated = {skeleton(lab): lab for lab in labels}.get(skeleton(value))
    if imitated is not None:
        return f"sensitivity label {ascii(value)[:80]} is not written exactly as {imitated}"
    return f"unknown sensitivity label ({len(value)} characters; known: {', '.join(labels)})"


def resolve_label(values: Iterable[object], *, default: str | None, labels: Sequence[str] | None = None
                  ) -> LabelVerdict:
    """One label from every value the metadata sources gave (sidecar, front matter, HTML meta).

    No value: ``default`` (None means the library requires a label: RESTRICTED). Any
    value that is not a known label as written: RESTRICTED, with the reason. Several
    values: the most restrictive wins.
    """
    labels = tuple(labels or known_labels())
    vals = list(values)
    if not vals:
        if default is None:
            return LabelVerdict(RESTRICTED_SENSITIVITY, "no sensitivity label (the library requires one)")
        return LabelVerdict(normalize_label(default, labels) or RESTRICTED_SENSITIVITY)
    found, problems = [], []
    for v in vals:
        lab = normalize_label(v, labels)
        if lab is None:
            problems.append(_odd_label_problem(v, labels))
            lab = RESTRICTED_SENSITIVITY
        found.append(lab)
    return LabelVerdict(strictest(found, labels), "; ".join(problems))


def strictest(values: Iterable[object], labels: Sequence[str] | None = None) -> str:
    """The most restrictive of ``values`` (anything not a known label counts as RESTRICTED;
    no value at all is RESTRICTED too: there is nothing to open the document with)."""
    labels = tuple(labels or known_labels())
    rank = {lab: i for i, lab in enumerate(labels)}
    ranks = [rank[normalize_label(v, labels) or RESTRICTED_SENSITIVITY] for v in values]
    return labels[max(ranks)] if ranks else RESTRICTED_SENSITIVITY


def effective_label(value: object, default: str) -> str:
    """The label a record carries: ``default`` when none was given (None), else the
    canonical spelling of ``value`` — or RESTRICTED when it is not a known label."""
    if value is None:
        return normalize_label(default) or RESTRICTED_SENSITIVITY
    return normalize_label(value) or RESTRICTED_SENSITIVITY


def is_restricted(sensitivity: object) -> bool:
    """True unless ``sensitivity`` is written as a known label other than RESTRICTED.

    Fails closed: None, an unknown word, a look-alike or invisible-character spelling
    and a non-string all count as RESTRICTED.
    """
    label = normalize_label(sensitivity)
    return label is None or label == RESTRICTED_SENSITIVITY


def redact(text: str, sensitivity: object) -> str:
    """``text`` for display in metadata/logs, or a fixed marker when it is restricted."""
    return REDACTED if is_restricted(sensitivity) else text
