"""Input limits of the query path.

A query is analyzed into tokens (CJK: every unigram and bigram), expanded into glossary
variants and, with a dense backend, embedded: a 1-2M-character query took 12-19 s of a
server's time. Queries longer than ``RAGSPINE_MAX_QUERY_CHARS`` (default 4,000
characters, far beyond any question a person types) are refused with a clear error
instead of being cut silently.
"""

from __future__ import annotations

from .. import settings

MAX_QUERY_CHARS_ENV = "RAGSPINE_MAX_QUERY_CHARS"
DEFAULT_MAX_QUERY_CHARS = 4000


class QueryTooLong(ValueError):
    """The query is longer than the configured maximum."""


def max_query_chars() -> int:
    """``RAGSPINE_MAX_QUERY_CHARS`` (read per query), else DEFAULT_MAX_QUERY_CHARS."""
    return settings.get(MAX_QUERY_CHARS_ENV)


def check_query(query: object) -> str:
    """``query`` as a string within the length limit; TypeError / QueryTooLong otherwise."""
    if not isinstance(query, str):
        raise TypeError(f"query must be a string, not {type(query).__name__}")
    limit = max_query_chars()
    if len(query) > limit:
        raise QueryTooLong(f"query is {len(query)} characters; the maximum is {limit} ({MAX_QUERY_CHARS_ENV})")
    return query
