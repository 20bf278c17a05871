"""Public lexical API (the spec's module path): one import for the default loop.

``DEFAULT_BM25_K1``, ``DEFAULT_BM25_B`` and ``DEFAULT_RRF_K`` are the very objects the
scorers use as defaults (``index.bm25.DEFAULT_K1`` / ``index.bm25.DEFAULT_B`` are aliases of them).
"""

from ..filters import FilterError, compile_filters
from ..hybrid.fusion import DEFAULT_RRF_K, rrf_fuse
from ..hybrid.retriever import FILTER_FIELDS, HybridRetriever, RetrievalHit
from ..vector.embedding_backends import EmbeddingBackend
from .analysis.analyzer import Analyzer, make_analyzer, tokenize
from .analysis.glossary import GlossaryQueryRewriter, load_glossary
from .index.bm25 import DEFAULT_BM25_B, DEFAULT_BM25_K1, BM25Index, bm25_scores

__all__ = [
    "DEFAULT_BM25_B", "DEFAULT_BM25_K1", "DEFAULT_RRF_K", "FILTER_FIELDS", "Analyzer", "BM25Index",
    "EmbeddingBackend", "FilterError", "GlossaryQueryRewriter", "HybridRetriever", "RetrievalHit",
    "bm25_scores", "compile_filters", "load_glossary", "make_analyzer", "rrf_fuse", "tokenize",
]
