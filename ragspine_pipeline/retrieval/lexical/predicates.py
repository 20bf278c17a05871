"""Old import path of the metadata predicates; they live in ``retrieval.filters`` now.

The filter language is shared by BM25 and every vector store, so it sits below both
channels. This module re-exports the same objects so existing imports keep working.
"""

from ..filters import OPERATORS, FilterError, Predicate, compile_filters, predicate_mask

__all__ = ["OPERATORS", "FilterError", "Predicate", "compile_filters", "predicate_mask"]
