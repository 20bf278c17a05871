"""Lexical channel: analyzer, BM25, fusion, glossary rewriting, predicates, HybridRetriever."""

from .kernel_cache import ensure_fresh

# Before any kernel is loaded from numba's cache: drop cached kernels older than the sources.
ensure_fresh()
