"""Cited retrieval: NarrativeIndex, NarrativeIndexRetriever (exit #2), builders."""

from .multi_index import MultiIndexRetriever
from .narrative_link import (
    NarrativeIndex,
    NarrativeIndexRetriever,
    Postprocessor,
    build_narrative_retriever,
    build_snippet,
    retriever_for_index,
)
from .published import NoPublishedSnapshot, open_published_retriever

__all__ = ["MultiIndexRetriever", "NarrativeIndex", "NarrativeIndexRetriever", "NoPublishedSnapshot",
           "Postprocessor", "build_narrative_retriever", "build_snippet", "open_published_retriever",
           "retriever_for_index"]
