"""Labels written where the reader does not read them: found, so they fail closed.

The reader reads a label from a known key only. A user who writes one anywhere else —
under a key that merely *contains* the label key (``sensitivity_label: RESTRICTED``,
``doc-sensitivity``), nested one level down (``meta: {sensitivity: RESTRICTED}``), or as
a line of the document's first lines (``Sensitivity: RESTRICTED`` in a ``.txt``, a
front-matter block the parser could not read) — meant a label; skipping it would serve
the document under the default label. Each such place is a *label problem*: the document
is RESTRICTED and the ``sensitivity_labels_valid`` check names it. Messages never quote
what was written.

Words are compared by skeleton and edit distance (``metadata_keys.label_word_in``), so
look-alike letters and typos are found too. A key that only contains the label key is a
problem when its value reads like a label (a label's skeleton within one edit, a number,
a list or mapping holding one), so ``sensitivity_notes: reviewed by legal`` stays
ordinary metadata.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from ..sensitivity import known_labels, near_substring, normalize_label, skeleton, strictest
from .metadata_keys import SENSITIVITY_KEY, label_word_in, match_key, plain_key

# How far into a document a written-out label is looked for: a cover page or a header.
FIRST_LINES = 20
FIRST_CHARS = 4000
LABEL_VALUE_DISTANCE = 1
MAX_KEY_CHARS = 60  # a key before a separator: longer is prose with a colon
MAX_LABEL_LINE = 120  # a line holding a label without a separator: longer is prose
_LINES = re.compile(r"\r\n|[\n\r\v\f\x1c-\x1e\x85\u2028\u2029]")
# What separates a key from its value on a written line: colon, equals, their full-width
# and look-alike forms, a dash or bar with spaces around it.
_SEPARATOR = re.compile(r"[:=\uff1a\uff1d\u2236\ua789\u02d0\u0589\u05c3\u16ec]|\s[-\u2010-\u2015|]\s")


def looks_like_label(value: Any, depth: int = 0) -> bool:
    """Whether ``value`` reads like a sensitivity label (fail closed: numbers and booleans
    do, a list or mapping does when an item does)."""
    if depth > 8:
        return True
    if value is None:
        return False
    if isinstance(value, str):
        form = skeleton(value)
        return any(near_substring(form, skeleton(lab), LABEL_VALUE_DISTANCE) for lab in known_labels())
    if isinstance(value, dict):
        return any(looks_like_label(v, depth + 1) for v in value.values())
    if isinstance(value, list | tuple | set):
        return any(looks_like_label(v, depth + 1) for v in value)
    return True


def nested_label_keys(value: Any, depth: int = 0) -> bool:
    """Whether a mapping inside ``value`` has a key that is or reads as a label key."""
    if depth > 8:
        return True
    if isinstance(value, dict):
        for k, v in value.items():
            key = str(k)
            if match_key(key).known == SENSITIVITY_KEY or (label_word_in(key) and looks_like_label(v)):
                return True
            if nested_label_keys(v, depth + 1):
                return True
    elif isinstance(value, list | tuple | set):
        return any(nested_label_keys(v, depth + 1) for v in value)
    return False


def free_key_problem(key: str, values: Sequence[Any]) -> str:
    """Why an unknown free-form key (front matter, HTML meta) is a label problem, or ""."""
    if label_word_in(key) and any(looks_like_label(v) for v in values):
        return "a metadata key that contains 'sensitivity' holds a label-like value"
    if any(nested_label_keys(v) for v in values):
        return "a nested metadata mapping has a 'sensitivity' key the reader does not read"
    return ""


def first_lines(text: str) -> list[str]:
    """The first ``FIRST_LINES`` lines of ``text`` (within its first ``FIRST_CHARS``)."""
    return _LINES.split(text[:FIRST_CHARS], maxsplit=FIRST_LINES)[:FIRST_LINES]


def written_label_problem(text: str, label: str) -> str:
    """Why ``text``'s first lines hold a label the reader did not read, or "".

    A line is a written label when a word reading as ``sensitivity`` stands in the key
    before a key separator (``Sensitivity: …``, ``**Sensitivity level** = …``; a key of at
    most ``MAX_KEY_CHARS``), or when a short line (at most ``MAX_LABEL_LINE`` characters:
    a header, not prose) holds such a word and a label look-alike (``Sensitivity
    RESTRICTED``). It is consistent — no problem — only when written plainly as
    ``sensitivity: <LABEL>`` with a known label no stricter than ``label``, the one the
    document already has (a printed header that agrees with its sidecar).
    """
    for line in first_lines(text):
        m = _SEPARATOR.search(line, 0, MAX_KEY_CHARS + 2)
        if m is not None and m.start() <= MAX_KEY_CHARS and label_word_in(line[:m.start()]):
            if _agrees(line[:m.start()], line[m.end():], label):
                continue
            return _WRITTEN
        if len(line) <= MAX_LABEL_LINE and label_word_in(line) and looks_like_label(line):
            return _WRITTEN
    return ""


_WRITTEN = "a sensitivity label is written in the document's first lines, where it is not read"


def _agrees(key: str, value: str, label: str) -> bool:
    written = normalize_label(value.strip(" *_`"))
    return (plain_key(key.strip(" #*_>`")) == SENSITIVITY_KEY and written is not None
            and strictest([written, label]) == label)
