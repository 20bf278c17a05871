"""One registry of every ``RAGSPINE_*`` variable, read at call time.

Sits at the bottom of the house beside ``sensitivity.py``: it imports nothing else from
the package, so every layer (engine, resources, assets, CLI, benchmarks) may import it.

    from ragspine_pipeline import settings

    mode = settings.get("RAGSPINE_RETRIEVAL_MODE")            # env, else "auto"
    mode = settings.get("RAGSPINE_RETRIEVAL_MODE", cli_mode)  # an explicit argument wins
    settings.report()                                          # every value + its source

A bad value is one ``SettingsError`` (a ValueError) naming the variable and the accepted
values. ``config_main(argv)`` is the ``ragspine config`` command; ``markdown_table()``
generates the configuration table of docs/configuration.md and the README.
"""

from .command import config_main
from .markdown import configuration_markdown, markdown_table
from .model import Setting, SettingsError
from .registry import GROUPS, REGISTRY, SETTINGS
from .resolve import (
           ARGUMENT,
           DEFAULT,
           ENVIRONMENT,
           MASK,
           Resolved,
           format_report,
           get,
           raw,
           report,
           resolve,
           setting,
)

__all__ = ["ARGUMENT", "DEFAULT", "ENVIRONMENT", "GROUPS", "MASK", "REGISTRY", "SETTINGS", "Resolved", "Setting",
           "SettingsError", "config_main", "configuration_markdown", "format_report", "get", "markdown_table", "raw",
           "report", "resolve", "setting"]
