"""Third-party parser logs kept out of the project's logs while a file is parsed.

pypdf logs what it finds wrong with a file *with the bytes around it* (``Invalid
parent xref., rebuild xref``, object streams, broken strings); python-docx, lxml and
BeautifulSoup warn about markup. Those messages would carry a RESTRICTED document's
text into the CLI's stderr, the Dagster event log and its compute logs. While a parser
runs, its libraries' loggers are detached from the root logger (``propagate = False``)
and their records are counted, never formatted; Python warnings raised meanwhile are
not shown either (counted). The count is what a caller may report (``parser_log_records``).

Detaching is reference-counted under a lock, so concurrent parses (the pipeline's thread
pool) keep the loggers detached until the last one ends and then restore them as found.
"""

from __future__ import annotations

import logging
import threading
import warnings
from collections.abc import Iterator
from contextlib import contextmanager

PARSER_LOGGERS = ("pypdf", "PyPDF2", "docx", "lxml", "bs4", "charset_normalizer", "chardet", "PIL")


class _Counter(logging.Handler):
    """Counts records without formatting them (formatting would build the message)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records = 0

    def handle(self, record: logging.LogRecord) -> bool:  # no lock, no format: a count
        self.records += 1
        return True

    def emit(self, record: logging.LogRecord) -> None:  # pragma: no cover - handle() never calls it
        pass


_LOCK = threading.Lock()
_DEPTH = 0
_SAVED: dict[str, tuple[bool, list[logging.Handler]]] = {}
_COUNTER = _Counter()
_SHOWWARNING: list = []


def _drop_warning(*args: object, **kwargs: object) -> None:
    _COUNTER.records += 1


def parser_log_records() -> int:
    """How many parser-library log records were swallowed in this process so far."""
    return _COUNTER.records


@contextmanager
def quiet_parser_logs() -> Iterator[None]:
    """Detach the parser libraries' loggers (and drop warnings) for the duration."""
    global _DEPTH
    with _LOCK:
        if _DEPTH == 0:
            for name in PARSER_LOGGERS:
                lg = logging.getLogger(name)
                _SAVED[name] = (lg.propagate, list(lg.handlers))
                for h in list(lg.handlers):
                    lg.removeHandler(h)
                lg.addHandler(_COUNTER)
                lg.propagate = False
            # Not warnings.catch_warnings: it is not thread-safe (two overlapping parses
            # could restore each other's state); the display hook is swapped once instead.
            _SHOWWARNING.append(warnings.showwarning)
            warnings.showwarning = _drop_warning
        _DEPTH += 1
    try:
        yield
    finally:
        with _LOCK:
            _DEPTH -= 1
            if _DEPTH == 0:
                for name, (propagate, handlers) in _SAVED.items():
                    lg = logging.getLogger(name)
                    lg.removeHandler(_COUNTER)
                    for h in handlers:
                        lg.addHandler(h)
                    lg.propagate = propagate
                _SAVED.clear()
                warnings.showwarning = _SHOWWARNING.pop()
