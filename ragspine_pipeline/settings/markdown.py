"""The configuration table, generated from the registry (docs/configuration.md, README).

Generated, never hand-edited: ``python tools/gen_config_table.py`` rewrites the file and
a test fails when the file and the registry disagree, so the documented defaults and
accepted values are the ones the code reads.
"""

from __future__ import annotations

from .model import Setting
from .registry import GROUPS, SETTINGS

COLUMNS = ("Variable", "Type", "Default", "Accepted values", "Description", "Spec section")
HEADER = """# Configuration

Every `RAGSPINE_*` variable RAGSpine reads, generated from the settings registry
(`ragspine_pipeline/settings/registry.py`) by `python tools/gen_config_table.py`; do not
edit by hand. `ragspine config` prints the effective values and where each came from
(default, environment, argument), secrets masked. An explicit argument (a CLI option, a
run or resource config field) overrides the variable, which overrides the default; a
blank variable counts as unset. Values are read when they are used, never at import.
Secrets are marked 🔒.
"""


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _row(s: Setting) -> str:
    name = f"`{s.name}`" + (" 🔒" if s.secret else "")
    cells = (name, s.kind, s.default_text, s.accepted, s.doc, s.spec)
    return "| " + " | ".join(_cell(c) for c in cells) + " |"


def markdown_table(group: str | None = None) -> str:
    """The table of every declared variable (of ``group``), one row each, in declaration order."""
    rows = [_row(s) for s in SETTINGS if group is None or s.group == group]
    head = "| " + " | ".join(COLUMNS) + " |\n|" + "---|" * len(COLUMNS)
    return head + "\n" + "\n".join(rows) + "\n"


def configuration_markdown() -> str:
    """docs/configuration.md: the header, then one table per group."""
    parts = [HEADER]
    for group in GROUPS:
        parts.append(f"## {group.capitalize()}\n\n{markdown_table(group)}")
    return "\n".join(parts)
