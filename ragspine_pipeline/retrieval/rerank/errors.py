"""The one error every reranker factory raises when a reranker cannot be built here."""

from __future__ import annotations


class RerankerUnavailable(RuntimeError):
    """The named reranker cannot be built here; the message says what is missing."""
