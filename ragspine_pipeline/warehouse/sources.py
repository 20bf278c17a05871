"""What a warehouse records about where its libraries came from (``ragspine index``).

Every door that serves a warehouse asks this module which glossary the warehouse's own
corpora bring, so a folder indexed by a user never gets the demo's ACME glossary, at the
CLI, the Python API, the Dagster resource and the service alike.
"""

from __future__ import annotations

import os
from pathlib import Path

from .. import settings

SOURCES_FILE = "libraries.json"
"""Under the warehouse: library -> the folder it was indexed from, its glossary and dimensions."""
WAREHOUSE_GLOSSARY = "glossary.json"
"""Under the warehouse: the glossary groups of every indexed library (absent: none has one)."""


def warehouse_glossary(warehouse: str | os.PathLike[str]) -> Path | bool | None:
    """The glossary a query of ``warehouse`` uses: None when ``RAGSPINE_GLOSSARY`` is set or
    nothing was recorded (the default chain decides: a demo warehouse keeps the demo
    glossary); else the warehouse's own (``ragspine index`` wrote it), or False when none
    of its libraries has one."""
    wh = Path(warehouse)
    if settings.raw("RAGSPINE_GLOSSARY") is not None or not (wh / SOURCES_FILE).is_file():
        return None
    own = wh / WAREHOUSE_GLOSSARY
    return own if own.is_file() else False
