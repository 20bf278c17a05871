"""What one request may cost: the query's tokens, the filters' size, and valid text.

The rate limit counts requests, not their cost, so a request within it could still cost
seconds: a 4,000-character query cost 6.3 s of ONNX in hybrid mode, 2,400 filter triples
3.5 s on 48 chunks. These caps are checked before anything touches an index, and a
request over one is a 400 naming the setting (never cut silently: a truncated question
would be answered as if it were the whole one).

Tokens are counted the way a subword model at least splits text: every CJK character, every
punctuation mark, and every run of letters or digits, a run counting once per 4 characters
(a subword vocabulary's English average). ``RAGSPINE_SERVICE_MAX_QUERY_TOKENS`` (default
256: about 1,000 characters of English) bounds what the embedding model sees; a question a
person types is 5-50 such tokens.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from ..retrieval.limits import InvalidText, check_text
from .errors import BadRequest

_CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff"
RUN_CHARS = 4
_TOKEN = re.compile(rf"[{_CJK}]|[^\W{_CJK}]{{1,{RUN_CHARS}}}|[^\w\s]")


def query_tokens(query: str) -> int:
    return sum(1 for _ in _TOKEN.finditer(query))


def check_query_tokens(query: str, max_tokens: int) -> None:
    n = query_tokens(query)
    if n > max_tokens:
        raise BadRequest(f"query: {n} tokens; the maximum is {max_tokens} (RAGSPINE_SERVICE_MAX_QUERY_TOKENS)")


def check_texts(value: Any, what: str) -> None:
    """Every string inside ``value`` (nested lists and objects, keys included) is text."""
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            try:
                check_text(v, what)
            except InvalidText as exc:
                raise BadRequest(str(exc)) from None
        elif isinstance(v, dict):
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, (list, tuple)):
            stack.extend(v)


def check_filter_size(filters: Any, max_filters: int) -> None:
    """Before parsing: the number of conditions sent (an object's fields, a list's items)."""
    if isinstance(filters, (dict, list)) and len(filters) > max_filters:
        raise BadRequest(f"filters: {len(filters)} conditions; the maximum is {max_filters} "
                         "(RAGSPINE_SERVICE_MAX_FILTERS)")


def check_filter_cost(triples: Sequence[tuple[str, str, Any]], max_filters: int, max_values: int) -> None:
    """After parsing: conditions, and operand values (an in/nin/between list counts each item)."""
    if len(triples) > max_filters:
        raise BadRequest(f"filters: {len(triples)} conditions; the maximum is {max_filters} "
                         "(RAGSPINE_SERVICE_MAX_FILTERS)")
    values = sum(len(op) if isinstance(op, (list, tuple, set, frozenset)) else 1 for _, _, op in triples)
    if values > max_values:
        raise BadRequest(f"filters: {values} operand values; the maximum is {max_values} "
                         "(RAGSPINE_SERVICE_MAX_FILTER_VALUES)")


__all__ = ["check_filter_cost", "check_filter_size", "check_query_tokens", "check_texts", "query_tokens"]
