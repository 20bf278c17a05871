"""Cited retrieval: NarrativeIndex, NarrativeIndexRetriever (exit #2), builders."""

from .narrative_link import (
    NarrativeIndex,
    NarrativeIndexRetriever,
    Postprocessor,
    build_narrative_retriever,
    build_snippet,
)

__all__ = ["NarrativeIndex", "NarrativeIndexRetriever", "Postprocessor",
           "build_narrative_retriever", "build_snippet"]
