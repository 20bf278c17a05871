"""What a setting is: its declaration record, its typed error and the value parsers.

A parser turns the text of a ``RAGSPINE_*`` variable (or of an explicit argument that
stands for it) into the value the code uses, and says in one phrase what it accepts.
The phrase is what the error, ``ragspine config`` and the generated configuration table
print, so the three can never disagree. Parsers keep the leniency the code had before
the registry existed (the ``*_ALIASES`` spellings, ``1``/``true``/``yes`` for on) so no
working configuration starts failing; only values the code already refused are errors.

This module imports nothing from the package: every layer may import the settings.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

# The spellings the code has always read as off / on for a switch.
OFF_WORDS: tuple[str, ...] = ("0", "off", "false", "no", "none")
ON_WORDS: tuple[str, ...] = ("1", "on", "true", "yes")


class SettingsError(ValueError):
    """A ``RAGSPINE_*`` value (from the environment or an argument) is not accepted.

    One message names the variable, the value and what is accepted; ``name``, ``value``,
    ``accepted`` and ``source`` carry the same for programs."""

    def __init__(self, name: str, value: str, accepted: str, *, noun: str = "", detail: str = "",
                 source: str = "environment") -> None:
        self.name, self.value, self.accepted, self.source = name, value, accepted, source
        what = f"unknown {noun}; " if noun else ""
        extra = f" ({detail})" if detail else ""
        super().__init__(f"{name}={value!r}: {what}use {accepted}{extra}")


class Invalid(ValueError):
    """Raised by a parser; the registry turns it into a SettingsError naming the variable."""


def _alternatives(values: tuple[str, ...]) -> str:
    if len(values) == 1:
        return values[0]
    if len(values) == 2:
        return f"{values[0]} or {values[1]}"
    return "one of " + ", ".join(values)


@dataclass(frozen=True)
class Text:
    """Any text (a URL, a model name, a path): the code that uses it checks it."""

    kind: str = "str"
    accepted: str = "any text"

    def __call__(self, text: str) -> str:
        return text


@dataclass(frozen=True)
class Choice:
    """One of ``values`` (case-folded unless ``fold=False``); ``aliases`` are older
    spellings still read the same. Returns the value as written, folded and stripped."""

    values: tuple[str, ...]
    aliases: tuple[str, ...] = ()
    fold: bool = True
    kind: str = "choice"

    @property
    def accepted(self) -> str:
        return _alternatives(self.values)

    def __call__(self, text: str) -> str:
        key = text.strip().lower() if self.fold else text
        if key not in self.values + self.aliases:
            raise Invalid("")
        return key


@dataclass(frozen=True)
class Switch:
    """on / off. ``otherwise``: what a word in neither list reads as, for the variables the
    code always read leniently (None: such a word is an error)."""

    on: tuple[str, ...] = ON_WORDS
    off: tuple[str, ...] = OFF_WORDS
    otherwise: bool | None = None
    kind: str = "bool"
    accepted: str = "on or off"

    def __call__(self, text: str) -> bool:
        key = text.strip().lower()
        if key in self.on:
            return True
        if key in self.off:
            return False
        if self.otherwise is None:
            raise Invalid("")
        return self.otherwise


@dataclass(frozen=True)
class Integer:
    minimum: int | None = None
    kind: str = "int"

    @property
    def accepted(self) -> str:
        return "an integer" if self.minimum is None else f"an integer >= {self.minimum}"

    def __call__(self, text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise Invalid("not an integer") from None
        if self.minimum is not None and value < self.minimum:
            raise Invalid(f"below {self.minimum}")
        return value


@dataclass(frozen=True)
class Number:
    """A float; with ``bounds`` (inclusive) a value outside them, or NaN, is refused."""

    bounds: tuple[float, float] | None = None
    kind: str = "float"

    @property
    def accepted(self) -> str:
        return "a number" if self.bounds is None else f"a number in [{self.bounds[0]:g}, {self.bounds[1]:g}]"

    def __call__(self, text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise Invalid("not a number") from None
        if self.bounds is not None and not self.bounds[0] <= value <= self.bounds[1]:  # NaN fails too
            raise Invalid("out of range")
        return value


@dataclass(frozen=True)
class Spec:
    """A factory spec ``NAME[:ARG...]`` (``sep=","``: a comma list of them). Only the names
    are checked here; each factory checks its arguments. Returns the text stripped, case
    kept (arguments may be paths)."""

    heads: tuple[str, ...]
    aliases: tuple[str, ...] = ()
    sep: str | None = None
    head_end: str = ":"
    shown: str = ""  # the grammar as documented, when the names alone say too little
    kind: str = "spec"

    @property
    def accepted(self) -> str:
        if self.shown:
            return self.shown
        names = _alternatives(self.heads)
        return f"a comma list of {names}" if self.sep else names

    def __call__(self, text: str) -> str:
        items = text.split(self.sep) if self.sep else [text]
        for item in items:
            head = item.strip().lower()
            for ch in self.head_end:
                head = head.partition(ch)[0]
            if (head or not self.sep) and head not in self.heads + self.aliases:
                raise Invalid(f"{head!r} is not a known name")
        return text.strip()


@dataclass(frozen=True)
class Names:
    """A comma list of free names (library ids, competitor names); empty items dropped."""

    kind: str = "list"
    accepted: str = "a comma list of names"

    def __call__(self, text: str) -> tuple[str, ...]:
        return tuple(n.strip() for n in text.split(",") if n.strip())


@dataclass(frozen=True)
class Labels:
    """The sensitivity labels, least restrictive first; the list must name RESTRICTED."""

    kind: str = "list"
    accepted: str = "a comma list of labels that includes RESTRICTED"

    def __call__(self, text: str) -> str:
        # The same rule as sensitivity.known_labels (the reader that decides): each label
        # written plainly (no invisible, combining or compatibility characters), ASCII
        # letters compared upper-cased, and RESTRICTED among them.
        labels = [p.strip(" \t\r\n") for p in text.split(",")]
        for label in filter(None, labels):
            odd = [ch for ch in label if unicodedata.category(ch)[0] in "CZM" and ch != " "]
            if odd or unicodedata.normalize("NFKC", label) != label:
                raise Invalid(f"label {ascii(label)} has invisible, combining or compatibility characters")
        if "RESTRICTED" not in [lab.strip(" ").upper() if lab.isascii() else lab for lab in labels]:
            raise Invalid("RESTRICTED is missing")
        return text


@dataclass(frozen=True)
class Cron:
    """A five-field cron expression (or an ``@daily``-style macro)."""

    kind: str = "cron"
    accepted: str = "a cron expression of five fields, e.g. '0 3 * * *'"

    def __call__(self, text: str) -> str:
        value = text.strip()
        if value.startswith("@") and value[1:] in ("yearly", "annually", "monthly", "weekly", "daily",
                                                   "midnight", "hourly"):
            return value
        fields = value.split()
        if len(fields) != 5 or any(not all(c.isalnum() or c in "*/,-?" for c in f) for f in fields):
            raise Invalid("not a cron expression")
        return value


@dataclass(frozen=True)
class TimeZone:
    kind: str = "timezone"
    accepted: str = "an IANA time zone name, e.g. UTC or Europe/Paris"

    def __call__(self, text: str) -> str:
        try:
            ZoneInfo(text.strip())
        except (ZoneInfoNotFoundError, ValueError):
            raise Invalid("unknown time zone") from None
        return text.strip()


Parser = Callable[[str], Any]


@dataclass(frozen=True)
class Setting:
    """One ``RAGSPINE_*`` variable, declared once.

    ``default`` is the text the variable behaves as when unset (None: unset means "not
    configured"); ``default_doc`` describes a default the reading code computes (the
    usable CPUs, a path inside the checkout). ``spec`` is the spec section the variable
    comes from, ``"—"`` for a project extension. ``noun`` names what an unknown value is
    (``"graph store"``) in the error."""

    name: str
    parser: Any
    doc: str
    group: str
    default: str | None = None
    default_doc: str = ""
    spec: str = "—"
    secret: bool = False
    noun: str = ""
    aliases_doc: str = ""

    @property
    def kind(self) -> str:
        return str(getattr(self.parser, "kind", "str"))

    @property
    def accepted(self) -> str:
        text = str(getattr(self.parser, "accepted", "any text"))
        return f"{text} (also {self.aliases_doc})" if self.aliases_doc else text

    @property
    def default_text(self) -> str:
        if self.default_doc:
            return self.default_doc
        return "(unset)" if self.default is None else (self.default or "(empty)")
