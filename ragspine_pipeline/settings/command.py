"""``ragspine config``: the effective settings, where each came from, secrets masked.

``config_main(argv)`` is the whole command so the CLI only routes to it. Exit status 0
when every value is accepted, 2 when one is not (each bad value printed as its one
error line on stderr), so a deploy script can run it as a check.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import NoReturn

from .model import SettingsError
from .registry import GROUPS
from .resolve import format_report, report


class _Parser(argparse.ArgumentParser):
    """An input error is one line with the prefix every ``ragspine`` error has, exit code 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"ragspine: error: config: {message}\n")


def build_parser(prog: str = "ragspine config") -> argparse.ArgumentParser:
    p = _Parser(prog=prog, description="Print the effective RAGSPINE_* settings and where "
                                "each value came from (default, environment, argument); secrets are masked.")
    p.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                   help="check a value as an explicit argument would give it (repeatable)")
    p.add_argument("--group", choices=GROUPS, default=None, help="only this group")
    p.add_argument("--changed", action="store_true", help="only the values not at their default")
    p.add_argument("--json", action="store_true", help="one JSON object per variable")
    return p


def _overrides(pairs: list[str]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        name, eq, value = pair.partition("=")
        if not eq:
            raise ValueError(f"--set {pair!r}: use NAME=VALUE")
        out[name.strip()] = value
    return out


def config_main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        rows = report(_overrides(args.set), group=args.group)
    except (KeyError, ValueError) as exc:  # an undeclared --set name, a malformed pair
        print(f"ragspine: error: config: {str(exc).strip(chr(39))}", file=sys.stderr)
        return 2
    if args.changed:
        rows = [r for r in rows if r.source != "default" or r.error]
    if args.json:
        print(json.dumps([{"name": r.name, "value": r.shown, "source": r.source, "secret": r.secret,
                           **({"error": r.error} if r.error else {})} for r in rows], ensure_ascii=False, indent=1))
    else:
        print(format_report(rows), end="")
    errors = [r.error for r in rows if r.error]
    for e in errors:
        print(f"ragspine: error: config: {e}", file=sys.stderr)
    return 2 if errors else 0


__all__ = ["SettingsError", "build_parser", "config_main"]
