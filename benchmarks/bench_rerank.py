"""Second-stage rerankers over the fused top 100: nDCG@10 / Recall@100 and rerank latency.

    python benchmarks/bench_rerank.py --out benchmarks/results
    python benchmarks/bench_rerank.py --sets cranfield --rerankers splade --limit 50

For each set the corpus is indexed once (one chunk per document, the ``ragspine eval``
default); the first stage is BM25 and, where ``--hybrid`` lists the set, BM25 + e5 dense
(RRF). Each first stage is then run through the product's query path
(``NarrativeIndexRetriever``) with every available reranker over its top 100 (the model
rerankers' default window), side by side in one run. ``auto`` is whatever
``make_reranker("auto")`` builds here. Latency is the rerank step alone per query (p50 /
p95, ms), measured with the passage cache starting empty, as a service would see it after
a restart; the first queries pay for encoding passages they have not met.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.common import add_io_args, out_dir, require_sets, say_written, use_data  # noqa: E402
from ragspine_pipeline.corpus import ingest_documents  # noqa: E402
from ragspine_pipeline.eval.beir import load_beir  # noqa: E402
from ragspine_pipeline.eval.metrics import dedupe_keep_best, mean_metrics  # noqa: E402
from ragspine_pipeline.eval.runner import EvalConfig, _chunker, beir_documents  # noqa: E402
from ragspine_pipeline.retrieval.chunking.chunk_store import ChunkStore  # noqa: E402
from ragspine_pipeline.retrieval.link.narrative_link import NarrativeIndex, NarrativeIndexRetriever  # noqa: E402
from ragspine_pipeline.retrieval.rerank import RerankerUnavailable, make_reranker  # noqa: E402

DEPTH = 100


class Timed:
    """Delegates to a reranker and records the seconds of each ``rerank`` call."""

    def __init__(self, inner) -> None:
        self.inner, self.seconds = inner, []
        self.name = getattr(inner, "name", type(inner).__name__)
        self.rerank_depth = getattr(inner, "rerank_depth", DEPTH)

    def rerank(self, query, candidates):
        t0 = time.perf_counter()
        try:
            return self.inner.rerank(query, candidates)
        finally:
            self.seconds.append(time.perf_counter() - t0)


def build_index(folder: Path, dense: bool):
    ds = load_beir(folder)
    store = ChunkStore(":memory:")
    ingest_documents(store, beir_documents(ds), scope_prefix="", chunker=_chunker(EvalConfig()))
    chunks = list(store.iter_chunks())
    store.close()
    backend = None
    if dense:
        from ragspine_pipeline.retrieval.vector.embedding_backends import make_embedding_backend

        backend = make_embedding_backend("e5")
    index = NarrativeIndex.from_chunks(chunks, embedding_backend=backend,
                                       channels=("bm25", "dense") if backend else ("bm25",), library_id=ds.name)
    return ds, index


def run(ds, index, qids, reranker) -> tuple[dict, list[float]]:
    timed = Timed(reranker) if reranker is not None else None
    retriever = NarrativeIndexRetriever(index, reranker=timed)
    runs = {q: dedupe_keep_best([s["doc_id"] for s in retriever.retrieve(ds.queries[q], top_k=DEPTH)])[:DEPTH]
            for q in qids}
    return mean_metrics(runs, {q: ds.qrels[q] for q in qids}), (timed.seconds if timed else [])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sets", default="cranfield,cmrc2018-trial,scifact")
    ap.add_argument("--hybrid", default="cranfield,cmrc2018-trial",
                    help="sets that also get a BM25+e5 hybrid first stage (scifact: e5 over 5k abstracts "
                         "takes ~10 min on 2 cores)")
    ap.add_argument("--rerankers", default="splade,colbert,cross_encoder,auto")
    ap.add_argument("--limit", type=int, default=0, help="first N judged queries per set (0: all)")
    add_io_args(ap)
    args = ap.parse_args()
    data = use_data(args.data)
    sets = [s for s in args.sets.split(",") if s]
    require_sets(data, sets)
    results = out_dir(args.out)
    hybrid = set(filter(None, args.hybrid.split(",")))
    wanted = [r for r in args.rerankers.split(",") if r]
    built, unavailable = {}, {}
    for name in wanted:
        try:
            built[name] = make_reranker(name)
        except RerankerUnavailable as exc:
            unavailable[name] = str(exc)
    rows = []
    for name in sets:
        for dense in ([False, True] if name in hybrid else [False]):
            ds, index = build_index(data / name, dense)
            qids = ds.judged_queries[: args.limit] if args.limit else ds.judged_queries
            stage = "hybrid" if dense else "bm25"
            base, _ = run(ds, index, qids, None)
            rows.append({"set": name, "first_stage": stage, "reranker": None, "model": None, **base,
                         "queries": len(qids)})
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
            for rname, r in built.items():
                if r is None:  # auto resolved to no reranking here
                    rows.append({**base, "set": name, "first_stage": stage, "reranker": rname,
                                 "model": "none (auto resolved to no reranker)", "queries": len(qids)})
                    continue
                if hasattr(r, "_cache"):
                    r._cache.clear()  # each run starts cold
                t0 = time.perf_counter()
                metrics, secs = run(ds, index, qids, r)
                ms = np.asarray(secs) * 1000 if secs else np.zeros(1)
                rows.append({"set": name, "first_stage": stage, "reranker": rname,
                             "model": getattr(r, "model_id", type(r).__name__), **metrics, "queries": len(qids),
                             "delta_ndcg@10": metrics["ndcg@10"] - base["ndcg@10"],
                             "ratio_ndcg@10": metrics["ndcg@10"] / base["ndcg@10"] if base["ndcg@10"] else None,
                             "rerank_ms_p50": float(np.percentile(ms, 50)),
                             "rerank_ms_p95": float(np.percentile(ms, 95)),
                             "wall_s": round(time.perf_counter() - t0, 1)})
                print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    cmd = "python benchmarks/bench_rerank.py " + " ".join(sys.argv[1:])
    write_results(results, cmd, rows, unavailable)


def write_results(results: Path, cmd: str, rows: list[dict], unavailable: dict[str, str], note: str = "") -> None:
    """rerank.json + rerank.md (the table the README quotes)."""
    (results / "rerank.json").write_text(json.dumps(
        {"command": cmd, "note": note, "cpu_count": os.cpu_count(), "depth": DEPTH, "rows": rows,
         "unavailable": unavailable},
        indent=2, default=str))
    lines = ["# Second-stage rerankers over the fused top 100\n",
             f"Command: `{cmd}` (cpu_count={os.cpu_count()}; one chunk per document; first stage BM25, or "
             "BM25 + multilingual-e5-small RRF; rerank window 100; latency = the rerank step per query, "
             "passage cache starting empty)\n", *([note + "\n"] if note else []),
             "| set | first stage | reranker | model | nDCG@10 | Δ vs first stage | ratio | R@100 | p50 ms | p95 ms |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r["reranker"] is None or "rerank_ms_p50" not in r:
            lines.append(f"| {r['set']} | {r['first_stage']} | {r['reranker'] or '—'} | {r['model'] or '—'} | "
                         f"{r['ndcg@10']:.4f} | | | {r['recall@100']:.4f} | | |")
        else:
            lines.append(f"| {r['set']} | {r['first_stage']} | {r['reranker']} | {r['model']} | {r['ndcg@10']:.4f} | "
                         f"{r['delta_ndcg@10']:+.4f} | {r['ratio_ndcg@10']:.3f} | {r['recall@100']:.4f} | "
                         f"{r['rerank_ms_p50']:.0f} | {r['rerank_ms_p95']:.0f} |")
    if unavailable:
        lines += ["", "Not run (cannot be built here):", *[f"- `{k}`: {v}" for k, v in unavailable.items()]]
    (results / "rerank.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    say_written([results / "rerank.json", results / "rerank.md"])




if __name__ == "__main__":
    main()
