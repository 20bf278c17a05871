"""Rerankers: the listwise LLM judge and the local model rerankers (cross-encoder, late
interaction, SPLADE), all behind one ``Reranker`` seam and exit #1 (``guarded_rerank``),
both in ``base``.

The model modules load lazily (``make_reranker`` imports what it builds), so importing
this package needs neither onnxruntime nor any model file.
"""

from .base import Reranker, annotate_snippet, guarded_rerank
from .cross_encoder import (
    CrossEncoderReranker,
    RerankerUnavailable,
    make_reranker,
    reranker_from_env,
)
from .listwise_rerank import (
    ListwiseJudge,
    ListwiseReranker,
    ProviderListwiseJudge,
    build_listwise_prompt,
    listwise_rerank,
    parse_listwise_response,
)
from .scoring import DEFAULT_RERANK_TOP_N, RerankScores, ScoringReranker

__all__ = [
    "DEFAULT_RERANK_TOP_N", "CrossEncoderReranker", "ListwiseJudge", "ListwiseReranker",
    "ProviderListwiseJudge", "RerankScores", "Reranker", "RerankerUnavailable", "ScoringReranker",
    "annotate_snippet", "build_listwise_prompt", "guarded_rerank", "listwise_rerank", "make_reranker",
    "parse_listwise_response", "reranker_from_env",
]
