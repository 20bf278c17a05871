"""Input limits of the query path.

A query is analyzed into tokens (CJK: every unigram and bigram), expanded into glossary
variants and, with a dense backend, embedded: a 1-2M-character query took 12-19 s of a
server's time. Queries longer than ``RAGSPINE_MAX_QUERY_CHARS`` (default 4,000
characters, far beyond any question a person types) are refused with a clear error
instead of being cut silently. A query holding a lone surrogate (a JSON ``"\\ud800"``, an
argv byte that is not UTF-8) or a NUL is refused too: it cannot be encoded for a model
and was a 500 in hybrid mode.
"""

from __future__ import annotations

import re

from .. import settings

MAX_QUERY_CHARS_ENV = "RAGSPINE_MAX_QUERY_CHARS"
DEFAULT_MAX_QUERY_CHARS = 4000


_INVALID = re.compile("[\ud800-\udfff\x00]")


class QueryTooLong(ValueError):
    """The query is longer than the configured maximum."""


class InvalidText(ValueError):
    """Text holding a lone surrogate or a NUL (not encodable as UTF-8 / not text)."""


def check_text(text: str, what: str = "query") -> str:
    """``text`` unchanged, or InvalidText naming the first bad character's position."""
    bad = _INVALID.search(text)
    if bad is not None:
        raise InvalidText(f"{what} holds an invalid character at position {bad.start()} "
                          f"(U+{ord(bad.group()):04X}: a lone surrogate or NUL is not text)")
    return text


def max_query_chars() -> int:
    """``RAGSPINE_MAX_QUERY_CHARS`` (read per query), else DEFAULT_MAX_QUERY_CHARS."""
    return settings.get(MAX_QUERY_CHARS_ENV)


def check_query(query: object) -> str:
    """``query`` as a string within the length limit, valid text; TypeError / QueryTooLong /
    InvalidText otherwise."""
    if not isinstance(query, str):
        raise TypeError(f"query must be a string, not {type(query).__name__}")
    limit = max_query_chars()
    if len(query) > limit:
        raise QueryTooLong(f"query is {len(query)} characters; the maximum is {limit} ({MAX_QUERY_CHARS_ENV})")
    return check_text(query)
