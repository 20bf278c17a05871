"""Where the package's own files are, and where a warehouse goes by default.

Why one module: the demo corpus ships inside the package (package data, so an installed
wheel has it), and the default warehouse depends on whether we run from a source
checkout or from an install. Every door (the CLI, the Dagster resources, the benchmarks)
asks here, so the answer cannot drift between them. It sits at the bottom of the house
beside ``settings``: nothing here imports the rest of the package, and nothing is read
from the environment at import time.

- In a checkout (the package folder sits beside ``pyproject.toml`` and
  ``definitions.py``), the default warehouse is ``data/warehouse`` at the repository
  root (gitignored), as it always was.
- In an install (a wheel in site-packages), it is ``./ragspine-warehouse`` in the
  current directory: a warehouse is user data and never goes inside site-packages.
- ``RAGSPINE_WAREHOUSE`` (read at call time) wins over both.
"""

from __future__ import annotations

from pathlib import Path

from . import settings

PACKAGE_ROOT = Path(__file__).resolve().parent
DEMO_ROOT = PACKAGE_ROOT / "demo_corpus"
"""The embedded demo corpus: one folder per library, plus ``glossary.json``,
``golden_queries.json`` and ``quality_floor.json``."""
DEMO_GLOSSARY = DEMO_ROOT / "glossary.json"
DEMO_GOLDEN = DEMO_ROOT / "golden_queries.json"
DEMO_QUALITY_FLOOR = DEMO_ROOT / "quality_floor.json"
SHIPPED_DIMENSIONS = PACKAGE_ROOT / "graph" / "dimensions.json"
"""The relation graph's controlled dimensions of the demo corpus (ACME entities, metrics)."""
CORPUS_GLOSSARY = "glossary.json"
CORPUS_DIMENSIONS = "dimensions.json"
"""A corpus root's own glossary and graph dimensions (``PATH/glossary.json``, ``PATH/dimensions.json``)."""
INSTALLED_WAREHOUSE_DIR = "ragspine-warehouse"
"""The default warehouse folder name (in the current directory) outside a checkout."""
_CHECKOUT_MARKERS = ("pyproject.toml", "definitions.py")


def checkout_root(package_root: Path = PACKAGE_ROOT) -> Path | None:
    """The source checkout the package runs from (editable install, PYTHONPATH), or None
    when it runs from an install. A checkout is recognised by the files that sit beside
    the package only there: ``pyproject.toml`` and the Dagster ``definitions.py``."""
    root = package_root.parent
    return root if all((root / name).is_file() for name in _CHECKOUT_MARKERS) else None


def default_warehouse(package_root: Path = PACKAGE_ROOT) -> Path:
    """``$RAGSPINE_WAREHOUSE``; else ``data/warehouse`` at the checkout's root; else
    ``./ragspine-warehouse`` (absolute, from the current directory). Read at call time."""
    explicit = settings.get("RAGSPINE_WAREHOUSE")
    if explicit:
        return Path(explicit)
    root = checkout_root(package_root)
    if root is not None:
        return root / "data" / "warehouse"
    return Path.cwd() / INSTALLED_WAREHOUSE_DIR


def default_corpus_root() -> Path:
    """``$RAGSPINE_CORPUS_ROOT``, else the embedded demo corpus. Read at call time."""
    return Path(settings.get("RAGSPINE_CORPUS_ROOT") or DEMO_ROOT)


def _is_demo(corpus_root: Path) -> bool:
    try:
        return Path(corpus_root).resolve() == DEMO_ROOT.resolve()
    except OSError:
        return False


def corpus_glossary(corpus_root: str | Path) -> Path | None:
    """The glossary that belongs to a corpus: its own ``glossary.json``, else none. Why not
    the demo's: its ACME synonyms would rewrite every query of an unrelated corpus (the
    demo glossary is the demo corpus's own file, so the demo keeps it)."""
    path = Path(corpus_root) / CORPUS_GLOSSARY
    return path if path.is_file() else None


def corpus_dimensions(corpus_root: str | Path) -> Path | None:
    """The graph dimensions that belong to a corpus: its own ``dimensions.json``, else none
    (the shipped ACME dimensions belong to the demo corpus only: a SciFact build must not
    get the demo's entities and metrics)."""
    path = Path(corpus_root) / CORPUS_DIMENSIONS
    if path.is_file():
        return path
    return SHIPPED_DIMENSIONS if _is_demo(Path(corpus_root)) else None


def definitions_file() -> Path | None:
    """The Dagster code location (``definitions.py``), which only a checkout has."""
    root = checkout_root()
    return None if root is None else root / "definitions.py"


__all__ = ["CORPUS_DIMENSIONS", "CORPUS_GLOSSARY", "DEMO_GLOSSARY", "DEMO_GOLDEN", "DEMO_QUALITY_FLOOR", "DEMO_ROOT",
           "INSTALLED_WAREHOUSE_DIR", "PACKAGE_ROOT", "SHIPPED_DIMENSIONS", "checkout_root", "corpus_dimensions",
           "corpus_glossary", "default_corpus_root", "default_warehouse", "definitions_file"]
