"""Reading a setting at call time, and reporting where every effective value came from.

Nothing here runs at import: each call reads ``os.environ`` afresh, so a test's
``monkeypatch.setenv`` and a long-lived service that re-reads its settings both see the
current value. The order is the one STYLE.md asks for: an explicit argument (a run
config field, a CLI option) -> the ``RAGSPINE_*`` variable -> the declared default. A
blank value (unset, empty or spaces) counts as not given, as the code always read it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .model import Invalid, Setting, SettingsError
from .registry import GROUPS, REGISTRY

ARGUMENT, ENVIRONMENT, DEFAULT = "argument", "environment", "default"
MASK = "********"


def setting(name: str) -> Setting:
    """The declaration of ``name``; a KeyError for a variable nobody declared (a read of an
    undeclared variable is a bug the registry exists to prevent)."""
    try:
        return REGISTRY[name]
    except KeyError:
        raise KeyError(f"{name} is not declared in ragspine_pipeline.settings") from None


def raw(name: str) -> str | None:
    """The environment's exact text for ``name`` (None when unset), for the few readers
    whose semantics depend on the unparsed text (an alias pair, "set but empty")."""
    setting(name)
    return os.environ.get(name)


@dataclass(frozen=True)
class Resolved:
    """One effective setting: its parsed value, the text it came from and where from."""

    name: str
    value: Any
    text: str | None
    source: str
    secret: bool = False
    error: str = ""

    @property
    def shown(self) -> str:
        """The value as a report prints it; a secret that is set is masked whole."""
        if self.error:
            return "INVALID"
        if self.secret and self.text:
            return MASK
        if self.text is None:
            return REGISTRY[self.name].default_text
        return self.text


def _given(value: object) -> bool:
    return value is not None and not (isinstance(value, str) and not value.strip())


def resolve(name: str, value: Any = None) -> Resolved:
    """``value`` (an explicit argument) when given, else the environment, else the default,
    parsed; a SettingsError naming the variable and the accepted values when it is bad."""
    s = setting(name)
    if _given(value):
        text, source = value, ARGUMENT
    elif _given(env := os.environ.get(name)):
        text, source = env, ENVIRONMENT
    else:
        text, source = s.default, DEFAULT
    if text is None:
        return Resolved(name, None, None, source, s.secret)
    if not isinstance(text, str):  # a typed argument (an int, a bool) is already parsed
        return Resolved(name, text, str(text), source, s.secret)
    try:
        parsed = s.parser(text)
    except Invalid as exc:
        shown = MASK if s.secret else text
        raise SettingsError(name, shown, s.accepted, noun=s.noun, detail=str(exc), source=source) from None
    return Resolved(name, parsed, text, source, s.secret)


def get(name: str, value: Any = None, *, error: type[Exception] | None = None) -> Any:
    """The effective value of ``name``: ``value`` when given, else ``$name``, else the
    default (None when the variable has none). ``error``: the caller's own error class to
    raise instead of SettingsError (same message), for factories whose callers catch it."""
    try:
        return resolve(name, value).value
    except SettingsError as exc:
        if error is None:
            raise
        raise error(str(exc)) from exc


def report(overrides: Mapping[str, Any] | None = None, *, group: str | None = None) -> list[Resolved]:
    """Every declared setting (of ``group``) as it resolves now; ``overrides`` act as
    explicit arguments. A bad value is reported in its row (``error``), not raised, so
    one report shows every problem."""
    overrides = dict(overrides or {})
    for name in overrides:
        setting(name)
    rows = []
    for name, s in REGISTRY.items():
        if group is not None and s.group != group:
            continue
        try:
            rows.append(resolve(name, overrides.get(name)))
        except SettingsError as exc:
            rows.append(Resolved(name, None, None, exc.source, s.secret, str(exc)))
    return rows


def format_report(rows: list[Resolved], *, changed_only: bool = False) -> str:
    """The report as aligned text: one line per variable (name, value, source), grouped."""
    shown = [r for r in rows if not changed_only or r.source != DEFAULT or r.error]
    if not shown:
        return "every setting is at its default\n"
    width = max(len(r.name) for r in shown)
    vwidth = min(40, max(len(r.shown) for r in shown))
    lines: list[str] = []
    for group in GROUPS:
        members = [r for r in shown if REGISTRY[r.name].group == group]
        if not members:
            continue
        lines.append(f"[{group}]")
        for r in members:
            lines.append(f"  {r.name:<{width}}  {r.shown:<{vwidth}}  ({r.source})")
            if r.error:
                lines.append(f"    error: {r.error}")
        lines.append("")
    return "\n".join(lines)
