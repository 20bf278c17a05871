"""Public lexical API (the spec's module path): one import for the default loop."""

from ..vector.embedding_backends import EmbeddingBackend
from .analyzer import Analyzer, make_analyzer, tokenize
from .bm25 import BM25Index, bm25_scores
from .fusion import rrf_fuse
from .glossary import GlossaryQueryRewriter, load_glossary
from .hybrid import FILTER_FIELDS, HybridRetriever, RetrievalHit
from .predicates import FilterError, compile_filters

__all__ = [
    "FILTER_FIELDS", "Analyzer", "BM25Index", "EmbeddingBackend", "FilterError",
    "GlossaryQueryRewriter", "HybridRetriever", "RetrievalHit", "bm25_scores",
    "compile_filters", "load_glossary", "make_analyzer", "rrf_fuse", "tokenize",
]
