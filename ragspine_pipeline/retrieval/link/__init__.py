"""Cited retrieval: NarrativeIndex, NarrativeIndexRetriever (exit #2), the layer assembly,
builders. The published warehouse is served from ``ragspine_pipeline.serving`` (above
``retrieval``: this package never imports the warehouse)."""

from .multi_index import MultiIndexRetriever
from .narrative_link import (
    NarrativeIndex,
    NarrativeIndexRetriever,
    Postprocessor,
    build_narrative_retriever,
    build_snippet,
    retriever_for_index,
)

__all__ = ["MultiIndexRetriever", "NarrativeIndex", "NarrativeIndexRetriever", "Postprocessor",
           "build_narrative_retriever", "build_snippet", "retriever_for_index"]
