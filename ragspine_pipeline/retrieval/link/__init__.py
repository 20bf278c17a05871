"""Cited retrieval: NarrativeIndex, NarrativeIndexRetriever (exit #2), builders."""

from .multi_index import MultiIndexRetriever
from .narrative_link import (
    NarrativeIndex,
    NarrativeIndexRetriever,
    Postprocessor,
    build_narrative_retriever,
    build_snippet,
)

__all__ = ["MultiIndexRetriever", "NarrativeIndex", "NarrativeIndexRetriever", "Postprocessor",
           "build_narrative_retriever", "build_snippet"]
