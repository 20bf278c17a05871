"""``hybrid_retrievers``: the ``HybridRetriever``\\ (s) a served retriever wraps.

Why here, beside the retriever: the query layers (``retrieval/query``), the filter
input (``filter_input``), the service and scale all look through a one-library
retriever (its ``index.retriever``) or a multi-library one (its ``retrievers``) for the
hybrid retrievers that hold the chunks, the glossary rewriter and the vectors. The walk
goes by attribute, so this module imports no wrapper and every layer above can use it
(the query layers without importing ``filter_input``, which sits above retrieval).
"""

from __future__ import annotations

from typing import Any

from .retriever import HybridRetriever


def hybrid_retrievers(retriever: Any) -> list[HybridRetriever]:
    """The HybridRetriever(s) behind a NarrativeIndexRetriever or a MultiIndexRetriever."""
    if hasattr(retriever, "retrievers"):
        return [h for r in retriever.retrievers.values() for h in hybrid_retrievers(r)]
    index = getattr(retriever, "index", None)
    inner = getattr(index, "retriever", None)
    return [inner] if isinstance(inner, HybridRetriever) else []


__all__ = ["hybrid_retrievers"]
