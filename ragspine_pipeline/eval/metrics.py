"""Ranking metrics, trec_eval conventions (linear gain nDCG, binary recall and MRR).

``ranked`` is a list of doc ids, best first; ``qrels`` maps doc id -> graded gain (gain
<= 0 is not relevant). nDCG@k = DCG@k / IDCG@k with DCG = sum gain_i / log2(i + 1) and
the ideal ranking built from all judged gains of the query.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence


def dcg(gains: Sequence[float]) -> float:
    return sum(g / math.log2(i + 2) for i, g in enumerate(gains))


def ndcg_at_k(ranked: Sequence[str], qrels: Mapping[str, float], k: int) -> float:
    ideal = sorted((g for g in qrels.values() if g > 0), reverse=True)[:k]
    idcg = dcg(ideal)
    if idcg == 0:
        return 0.0
    gains = [max(qrels.get(d, 0), 0) for d in ranked[:k]]
    return dcg(gains) / idcg


def recall_at_k(ranked: Sequence[str], qrels: Mapping[str, float], k: int) -> float:
    rel = {d for d, g in qrels.items() if g > 0}
    if not rel:
        return 0.0
    return len(rel.intersection(ranked[:k])) / len(rel)


def mrr_at_k(ranked: Sequence[str], qrels: Mapping[str, float], k: int) -> float:
    for i, d in enumerate(ranked[:k], start=1):
        if qrels.get(d, 0) > 0:
            return 1.0 / i
    return 0.0


def dedupe_keep_best(ids: Sequence[str]) -> list[str]:
    """Doc ids in first-seen order: a doc split into chunks counts at its best rank."""
    seen: set[str] = set()
    out = []
    for d in ids:
        if d not in seen:
            seen.add(d)
            out.append(d)
    return out


def mean_metrics(runs: Mapping[str, Sequence[str]], qrels: Mapping[str, Mapping[str, float]],
                 *, ndcg_k: int = 10, recall_k: int = 100, mrr_k: int = 10) -> dict[str, float]:
    """Mean nDCG/Recall/MRR over the queries in ``qrels`` (a missing run scores 0)."""
    qids = [q for q, r in qrels.items() if any(g > 0 for g in r.values())]
    if not qids:
        return {f"ndcg@{ndcg_k}": 0.0, f"recall@{recall_k}": 0.0, f"mrr@{mrr_k}": 0.0}
    n = len(qids)
    return {
        f"ndcg@{ndcg_k}": sum(ndcg_at_k(runs.get(q, []), qrels[q], ndcg_k) for q in qids) / n,
        f"recall@{recall_k}": sum(recall_at_k(runs.get(q, []), qrels[q], recall_k) for q in qids) / n,
        f"mrr@{mrr_k}": sum(mrr_at_k(runs.get(q, []), qrels[q], mrr_k) for q in qids) / n,
    }
