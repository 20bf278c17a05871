"""Which metadata keys the reader knows, and which keys only *look* like one of them.

A known key is matched as written: ASCII letters in any case, surrounding ASCII spaces
allowed (``Sensitivity`` and ``SENSITIVITY`` are ``sensitivity``). A key that is not
that but reads the same to a person — a zero-width space, soft hyphen, BOM or NUL inside,
full-width or look-alike letters (Unicode's confusables data: Cyrillic, Greek, Cherokee,
Lisu, small capitals), ``sensitivity_`` — is *misspelt*: the document reader makes such a
document RESTRICTED and reports it, for every known key, not only ``sensitivity`` (a
misspelt ``entity`` would otherwise slip out of the entity filter, and a misspelt label
key would drop the label).

A label key (``sensitivity``) is guarded further, because a dropped label opens the
document: a key whose skeleton is within ``LABEL_KEY_DISTANCE`` edits of it
(``sensitivty``, ``sensitivitys``, ``s\\u1d07nsitivity``), whose last namespace part
is (``DC.sensitivity``, ``og:sensitivity``, ``x/sensitivity``), that is spelt in tag
characters, or that has no visible character at all, is misspelt too. A key that only
*contains* a label key (``sensitivity_label``, ``doc-sensitivity``) is read by
``label_word_in`` together with its value (see ``documents.merge_metadata``).

Sidecars are a closed schema: only ``declared_keys()`` (the known keys plus
``RAGSPINE_METADATA_KEYS``) may appear there. Kept apart from ``documents.py`` so the
HTML parser can ask it without an import cycle.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .. import settings
from ..sensitivity import edit_distance, near_substring, skeleton, untag

KNOWN_KEYS = ("title", "entity", "period", "geography", "topic", "language", "sensitivity")
SENSITIVITY_KEY = "sensitivity"
LABEL_KEYS = (SENSITIVITY_KEY,)
# Edits (insert, delete, substitute, swap) between a key's skeleton and a label key's
# that still read as that key: two catches every one- and two-letter typo of the
# 11-letter ``sensitivity`` while no ordinary metadata name comes that close.
LABEL_KEY_DISTANCE = 2
METADATA_KEYS_ENV = "RAGSPINE_METADATA_KEYS"
_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")
_BY_SKELETON = {skeleton(k): k for k in KNOWN_KEYS}
_LABEL_SKELETONS = {skeleton(k): k for k in LABEL_KEYS}
# Namespace separators of HTML/RDF-style keys (``DC.x``, ``og:x``, ``schema/x``) and their
# full-width and look-alike forms once NFKC-folded.
_NAMESPACE = re.compile(r"[.:/\\\uff0e\uff1a\uff0f\u2024\u2236\u02d0\u0589\u05c3\u16ec\ua789]")


@dataclass(frozen=True)
class KeyMatch:
    """``known``: the known key ``key`` spells or imitates ("" for any other key);
    ``exact``: whether it is written as that key (False: a misspelling)."""

    known: str
    exact: bool

    @property
    def misspelt(self) -> bool:
        return bool(self.known) and not self.exact


def plain_key(key: str) -> str:
    """``key`` with surrounding ASCII spaces removed and ASCII letters lower-cased."""
    return key.strip(" ").translate(_ASCII_LOWER)


def match_key(key: str) -> KeyMatch:
    """How the document reader treats metadata key ``key``."""
    plain = plain_key(key)
    if plain in KNOWN_KEYS:
        return KeyMatch(plain, True)
    known = _BY_SKELETON.get(skeleton(key), "")
    if known:
        return KeyMatch(known, False)
    return KeyMatch(_imitated_label_key(key), False)


def _imitated_label_key(key: str) -> str:
    """The label key ``key`` reads as (by distance, namespace or tag characters), or ""."""
    if key.strip(" ") and not skeleton(key) and not skeleton(untag(key)):
        return SENSITIVITY_KEY  # only invisible characters: whatever it names, it is no plain key
    forms = {skeleton(key), skeleton(untag(key))}
    for raw in (key, untag(key)):
        parts = [p for p in _NAMESPACE.split(raw) if p.strip()]
        if len(parts) > 1:
            forms.add(skeleton(parts[-1]))
    for form in filter(None, forms):
        for label_skel, label_key in _LABEL_SKELETONS.items():
            if edit_distance(form, label_skel, LABEL_KEY_DISTANCE) <= LABEL_KEY_DISTANCE:
                return label_key
    return ""


def label_word_in(text: str) -> str:
    """The label key ``text`` contains, as a skeleton within ``LABEL_KEY_DISTANCE`` edits
    (``sensitivity_label``, ``Sensitivity level``, ``docsensitivty``), or ""."""
    for form in {skeleton(text), skeleton(untag(text))}:
        for label_skel, label_key in _LABEL_SKELETONS.items():
            if form and near_substring(form, label_skel, LABEL_KEY_DISTANCE):
                return label_key
    return ""


def declared_keys() -> frozenset[str]:
    """The keys a ``.meta.json`` sidecar may hold (lower-cased): the known keys and those
    declared in ``RAGSPINE_METADATA_KEYS``."""
    extra = settings.get(METADATA_KEYS_ENV) or ()
    return frozenset(KNOWN_KEYS) | {plain_key(str(k)) for k in extra}
