"""Which metadata keys the reader knows, and which keys only *look* like one of them.

A known key is matched as written: ASCII letters in any case, surrounding ASCII spaces
allowed (``Sensitivity`` and ``SENSITIVITY`` are ``sensitivity``). A key that is not
that but reads the same to a person — a zero-width space, soft hyphen, BOM or NUL inside,
full-width or Cyrillic/Greek look-alike letters, ``sensitivity_`` — is *misspelt*: the
document reader makes such a document RESTRICTED and reports it, for every known key,
not only ``sensitivity`` (a misspelt ``entity`` would otherwise slip out of the entity
filter, and a misspelt label key would drop the label). Kept apart from
``documents.py`` so the HTML parser can ask it without an import cycle.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..sensitivity import skeleton

KNOWN_KEYS = ("title", "entity", "period", "geography", "topic", "language", "sensitivity")
SENSITIVITY_KEY = "sensitivity"
_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")
_BY_SKELETON = {skeleton(k): k for k in KNOWN_KEYS}


@dataclass(frozen=True)
class KeyMatch:
    """``known``: the known key ``key`` spells or imitates ("" for any other key);
    ``exact``: whether it is written as that key (False: a misspelling)."""

    known: str
    exact: bool

    @property
    def misspelt(self) -> bool:
        return bool(self.known) and not self.exact


def match_key(key: str) -> KeyMatch:
    """How the document reader treats metadata key ``key``."""
    plain = key.strip(" ").translate(_ASCII_LOWER)
    if plain in KNOWN_KEYS:
        return KeyMatch(plain, True)
    return KeyMatch(_BY_SKELETON.get(skeleton(key), ""), False)
