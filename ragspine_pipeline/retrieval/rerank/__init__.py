"""Rerankers: listwise LLM judge (exit #1 guarded); local rerankers plug in via Reranker."""

from .cross_encoder import RerankerUnavailable, make_reranker, reranker_from_env
from .listwise_rerank import (
    ListwiseJudge,
    ListwiseReranker,
    ProviderListwiseJudge,
    Reranker,
    build_listwise_prompt,
    guarded_rerank,
    listwise_rerank,
    parse_listwise_response,
)

__all__ = [
    "ListwiseJudge", "ListwiseReranker", "ProviderListwiseJudge", "Reranker",
    "RerankerUnavailable", "build_listwise_prompt", "guarded_rerank", "listwise_rerank", "make_reranker",
    "parse_listwise_response", "reranker_from_env",
]
