"""The one shape of a ``ragspine`` command-line error: ``ragspine: error: [<command>: ]<option>: <what>``
on one line of stderr, exit code 2.

It lives here, not in ``cli.py``, because the commands that parse their own options
(``serve``, ``mcp``, ``keys``, ``config``) must not import the CLI (the import-linter
contract "nothing imports the CLI"), yet a user or a script grepping stderr should see the
same prefix whichever command failed.
"""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn

ERROR_PREFIX = "ragspine: error: "
WARNING_PREFIX = "ragspine: warning: "
INPUT_ERROR_EXIT = 2


def error_line(command: str | None, message: str) -> str:
    """``ragspine: error: <command>: <message>`` (no command: the top-level CLI's own errors)."""
    return f"{ERROR_PREFIX}{command + ': ' if command else ''}{message}"


def fail(command: str | None, message: str) -> int:
    """Print the error line on stderr and return the input-error exit code (2)."""
    print(error_line(command, message), file=sys.stderr)
    return INPUT_ERROR_EXIT


def warn(command: str | None, message: str) -> None:
    """A warning line on stderr with the same shape (``ragspine: warning: <command>: ...``)."""
    print(f"{WARNING_PREFIX}{command + ': ' if command else ''}{message}", file=sys.stderr)


class OneLineParser(argparse.ArgumentParser):
    """argparse whose input error is one line in the shape above (no usage block), exit 2;
    ``command`` is the subcommand word (``serve``), taken from ``prog`` when not given."""

    def __init__(self, *args, command: str | None = None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.command = command if command is not None else self.prog.partition(" ")[2].split(" ")[0] or None

    def error(self, message: str) -> NoReturn:
        self.exit(INPUT_ERROR_EXIT, error_line(self.command, message) + "\n")


__all__ = ["ERROR_PREFIX", "INPUT_ERROR_EXIT", "OneLineParser", "WARNING_PREFIX", "error_line", "fail", "warn"]
