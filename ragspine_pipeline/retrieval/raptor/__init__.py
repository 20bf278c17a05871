"""RAPTOR: a tree of extractive (or LLM) syntheses over a library's chunks, and retrieval
over its leaves, internal nodes or the collapsed tree."""

from .retriever import (
    MODES,
    RaptorRetriever,
    make_raptor_retriever,
    raptor_enabled,
    raptor_settings,
)
from .tree import RaptorError, RaptorNode, RaptorTree, build_raptor_tree, provider_summarizer

__all__ = ["MODES", "RaptorError", "RaptorNode", "RaptorRetriever", "RaptorTree", "build_raptor_tree",
           "make_raptor_retriever", "provider_summarizer", "raptor_enabled", "raptor_settings"]
