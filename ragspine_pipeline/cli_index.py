"""``ragspine index PATH``: the CLI side of indexing a folder (kept out of ``cli.py`` so each
door module stays small).

In a checkout the libraries are materialized through the Dagster code location
(``definitions.index_libraries``: the one import from the engine to the code location,
lazy, and named as the only exception in ``.importlinter``'s engine-without-dagster);
otherwise, or with ``--in-process``, ``indexing.index_in_process`` runs the same engine
steps here and the output says why. Both print the embedding step's progress while it
runs (counts, rate, ETA, at most ``PROGRESS_EVERY_S`` apart; through the code location
from the ``ragspine.progress`` logger, its Dagster console being quiet), one
``LibraryReport`` per library as it finishes, then the summary.

Exit codes (``indexing.EXIT_*``, README): 0 every library built and every check passed;
1 a library failed (the others were built); 2 an input error, nothing indexed (no such
folder, a library name outside the documented rule); 3 every library built but a check
failed (an unreadable file withheld included).
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from . import indexing, paths
from .warehouse.embeddings_step import PROGRESS_LOG


def code_location() -> Any | None:
    """The Dagster code location (``definitions.py`` at the checkout's root) as the module
    ``definitions``, or None when Dagster or the file is not there (an installed wheel has
    no ``definitions.py``: only a checkout does). Import it with the warehouse in
    ``RAGSPINE_WAREHOUSE`` set (what the resources read)."""
    defs_path = paths.definitions_file()
    if importlib.util.find_spec("dagster") is None or defs_path is None or not defs_path.exists():
        return None
    if str(defs_path.parent) not in sys.path:  # the checkout's root, where definitions.py puts assets/ too
        sys.path.insert(0, str(defs_path.parent))
    # The code location exists only in a checkout. An ordinary import so import-linter sees
    # this edge; engine-without-dagster allows it and no other.
    # lazy: the code location imports Dagster, the heavy optional [pipeline] extra
    import definitions

    if Path(definitions.__file__).resolve() != defs_path.resolve():  # another project's module of that name
        return None
    return definitions


def _dagster_root(sources: list[indexing.LibrarySource]) -> Path | None:
    """The corpus root the code location reads ``<root>/<library>`` under, or None when a
    library's folder is named otherwise (``--library NAME`` on a folder not called NAME)."""
    if all(s.default_layout for s in sources):
        return sources[0].corpus_root
    if len(sources) == 1 and sources[0].folder.name == sources[0].name:
        return sources[0].folder.parent
    return None


class _PrintLines(logging.Handler):
    """Prints each record's message on stdout (resolved per line, as ``print`` does)."""

    def emit(self, record: logging.LogRecord) -> None:
        print(record.getMessage(), flush=True)


@contextmanager
def printed_progress() -> Iterator[None]:
    """While the code location runs: the steps' ``ragspine.progress`` lines on stdout."""
    handler, level = _PrintLines(logging.INFO), PROGRESS_LOG.level
    PROGRESS_LOG.addHandler(handler)
    PROGRESS_LOG.setLevel(logging.INFO)
    try:
        yield
    finally:
        PROGRESS_LOG.removeHandler(handler)
        PROGRESS_LOG.setLevel(level)


def _dagster_index(warehouse: Path, sources: list[indexing.LibrarySource]
                   ) -> tuple[list[indexing.LibraryReport] | None, str]:
    """Materialize the libraries through the code location, printing each library as its
    run finishes; (None, why not) when there is none here or it cannot read this layout."""
    root = _dagster_root(sources)
    if root is None:
        return None, (f"--library {sources[0].name}: the code location reads <corpus root>/<library> and "
                      f"{sources[0].folder} is named otherwise")
    with indexing.environment({"RAGSPINE_WAREHOUSE": str(warehouse.resolve()), "RAGSPINE_CORPUS_ROOT": str(root)}):
        module = code_location()
        if module is None:
            return None, ("no Dagster code location: a plain install has no definitions.py, or the [pipeline] "
                          "extra is missing")
        home = os.environ.get("DAGSTER_HOME")
        print(f"materializing every asset of {_libraries(len(sources))} through the Dagster code location"
              + (f"; runs recorded in DAGSTER_HOME={home}" if home else ""))
        reports = []
        with printed_progress():
            runs = iter(module.index_libraries(str(root), [s.name for s in sources], str(warehouse.resolve())))
            for source in sources:  # one run per library, in this order
                print(indexing.building_line(source.name))
                lib, mats, checks, error = next(runs)
                spec = str(mats.get("embeddings", {}).get("spec", ""))
                report = (indexing.LibraryReport(lib, error=error) if error
                          else indexing.report_from_metadata(lib, mats, checks, spec))
                reports.append(report)
                for line in report.lines():
                    print(line)
        return reports, ""


def _libraries(n: int) -> str:
    return f"{n} {'library' if n == 1 else 'libraries'}"


def cmd_index(args: argparse.Namespace) -> int:
    """``ragspine index PATH``: build a folder's libraries into the warehouse, then summarize;
    the exit code says what failed (module docstring). An input error raises
    ``indexing.IndexInputError`` before anything is built (``cli.main``: one line, exit 2)."""
    sources = indexing.plan_libraries(args.path, args.library)
    warehouse = Path(args.warehouse)
    if args.library is None:
        loose = indexing.loose_files(sources[0].corpus_root)
        if loose:
            print(f"(not indexed: {len(loose)} files directly in {sources[0].corpus_root} belong to no subfolder "
                  f"library: {', '.join(loose[:5])}{' …' if len(loose) > 5 else ''}; use --library NAME to index "
                  "the folder as one library)", file=sys.stderr)
    before = indexing.prior_glossary()
    env = indexing.corpus_settings(args.path)
    if args.embedding is not None:
        env["RAGSPINE_EMBEDDING_BACKEND"] = args.embedding
    print(f"RAGSpine index: {_libraries(len(sources))} of {sources[0].corpus_root} into {warehouse} "
          f"({', '.join(s.name for s in sources)}); glossary {env.get('RAGSPINE_GLOSSARY', 'from RAGSPINE_GLOSSARY')}, "
          f"graph dimensions {env.get('RAGSPINE_GRAPH_DIMENSIONS', 'from RAGSPINE_GRAPH_DIMENSIONS')}")
    with indexing.environment(env):
        reports, why = (None, "--in-process given") if args.in_process else _dagster_index(warehouse, sources)
        if reports is None:
            print(f"running the same engine steps in-process ({why})")
            reports = indexing.index_in_process(warehouse, sources, progress=print)
        indexing.record_sources(warehouse, sources, args.path, others_glossary=before)
    for line in indexing.summary_lines(reports, warehouse):
        print(line)
    print(f"ask it: ragspine query --warehouse {warehouse} \"your question\"")
    return indexing.exit_code(reports)


__all__ = ["cmd_index", "code_location", "printed_progress"]
