"""Second-stage rerankers over the fused top 100: nDCG@10 / Recall@100 and rerank latency.

    python benchmarks/bench_rerank.py --out benchmarks/results
    python benchmarks/bench_rerank.py --sets cranfield --rerankers splade --limit 50
    python benchmarks/bench_rerank.py --rows /tmp/wt24/rerank_rows.jsonl --cache /tmp/wt24/cache

``--rows FILE`` appends each measured row to a JSON-lines file and skips rows already in
it, so a long run over every set can be resumed; ``--cache DIR`` keeps the dense vectors
(``vector_cache``) and the rerankers' passage encodings (``RerankVectorStore``) on disk
between runs — only the encodings are reused, every score is recomputed.

For each set the corpus is indexed once (one chunk per document, the ``ragspine eval``
default); the first stage is BM25 and, where ``--hybrid`` lists the set, BM25 + e5 dense
(RRF). Each first stage is then run through the product's query path
(``NarrativeIndexRetriever``) with every available reranker over its top 100 (the model
rerankers' default window), side by side in one run. ``auto`` is whatever
``make_reranker("auto")`` builds here. Latency is the rerank step alone per query (p50 /
p95, ms). Without ``--cache`` the passage cache starts empty per set, so the first queries
pay for encoding passages they have not met (that is the p95); with a warm ``--cache``
the figures are what a library with precomputed document vectors sees.
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
from ragspine_pipeline.retrieval.link.assembly import index_retriever  # noqa: E402
from ragspine_pipeline.retrieval.link.narrative_link import NarrativeIndex  # noqa: E402
from ragspine_pipeline.retrieval.rerank import RerankerUnavailable, make_reranker  # noqa: E402

DEPTH = 100
LANGUAGE = {"scifact": "en", "cranfield": "en", "cmrc2018-trial": "zh", "xquad-de": "de", "xquad-ru": "ru",
            "xquad-ar": "ar", "xquad-th": "th"}


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


def build_index(folder: Path, dense: bool, cache: Path | None = None):
    ds = load_beir(folder)
    store = ChunkStore(":memory:")
    ingest_documents(store, beir_documents(ds), scope_prefix="", chunker=_chunker(EvalConfig()))
    chunks = list(store.iter_chunks())
    store.close()
    backend = None
    if dense:
        from ragspine_pipeline.retrieval.vector.embedding_backends import make_embedding_backend

        backend = make_embedding_backend("e5")
        if cache is not None:
            # The same per-(model, kind, text) store as bench_dense.py (RAGSPINE_BENCH_VECTORS):
            # passages and queries embedded by either benchmark are reused by the other.
            from ragspine_pipeline.vector_cache import CachingEmbeddingBackend

            backend = CachingEmbeddingBackend(backend, Path(os.environ.get("RAGSPINE_BENCH_VECTORS",
                                                                           cache / "dense")))
    index = NarrativeIndex.from_chunks(chunks, embedding_backend=backend,
                                       channels=("bm25", "dense") if backend else ("bm25",), library_id=ds.name)
    return ds, index


def run(ds, index, qids, reranker) -> tuple[dict, list[float]]:
    timed = Timed(reranker) if reranker is not None else None
    retriever = index_retriever(index, reranker=timed)
    runs = {q: dedupe_keep_best([s["doc_id"] for s in retriever.retrieve(ds.queries[q], top_k=DEPTH)])[:DEPTH]
            for q in qids}
    return mean_metrics(runs, {q: ds.qrels[q] for q in qids}), (timed.seconds if timed else [])


def _key(row: dict) -> tuple:
    return (row["set"], row["first_stage"], row["reranker"])


def load_rows(path: Path | None) -> dict[tuple, dict]:
    """Rows measured by an earlier (interrupted) run of the same command."""
    if path is None or not path.is_file():
        return {}
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return {_key(r): r for r in rows}


def build_rerankers(wanted: list[str], cache: Path | None) -> tuple[dict, dict[str, str]]:
    built, unavailable = {}, {}
    vectors = None
    if cache is not None:
        from ragspine_pipeline.warehouse.rerank_vectors import RerankVectorStore

        vectors = RerankVectorStore(cache / "rerank_vectors.duckdb")
    for name in wanted:
        try:
            r = make_reranker(name)
        except RerankerUnavailable as exc:
            unavailable[name] = str(exc)
            continue
        if r is not None and vectors is not None and hasattr(r, "use_document_vectors"):
            r.use_document_vectors(vectors, write_back=True)  # the disk cache, filled as it goes
        built[name] = r
    return built, unavailable


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sets", default="cranfield,cmrc2018-trial,xquad-de,xquad-ru,xquad-ar,xquad-th,scifact")
    ap.add_argument("--hybrid", default="cranfield,cmrc2018-trial,xquad-de,xquad-ru,xquad-ar,xquad-th",
                    help="sets that also get a BM25+e5 hybrid first stage (scifact: e5 over 5k abstracts "
                         "takes ~10 min on 2 cores)")
    ap.add_argument("--rerankers", default="splade,colbert,cross_encoder,auto")
    ap.add_argument("--limit", type=int, default=0, help="first N judged queries per set (0: all)")
    ap.add_argument("--rows", default=None, help="JSON-lines file of measured rows: appended to, and rows "
                    "already in it are not measured again (resume)")
    ap.add_argument("--cache", default=None, help="folder for on-disk dense vectors and passage encodings")
    ap.add_argument("--note", default="", help="a line for the results file (e.g. what was left out and why)")
    ap.add_argument("--earlier", default=None, help="an earlier rerank.json whose rows are shown in a separate, "
                    "labelled table (e.g. a hybrid run that this one did not repeat)")
    ap.add_argument("--report-only", action="store_true", help="measure nothing: write the results from the rows "
                    "already in --rows (rows not measured are listed as missing)")
    add_io_args(ap)
    args = ap.parse_args()
    data = use_data(args.data)
    sets = [s for s in args.sets.split(",") if s]
    require_sets(data, sets)
    results = out_dir(args.out)
    hybrid = set(filter(None, args.hybrid.split(",")))
    cache = Path(args.cache) if args.cache else None
    rows_path = Path(args.rows) if args.rows else None
    done = load_rows(rows_path)
    built, unavailable = build_rerankers([r for r in args.rerankers.split(",") if r], cache)
    rows = []

    def keep(row: dict) -> None:
        rows.append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)
        if rows_path is not None and _key(row) not in done:
            rows_path.parent.mkdir(parents=True, exist_ok=True)
            with rows_path.open("a") as f:
                f.write(json.dumps(row) + "\n")

    missing = []
    for name in sets:
        for dense in ([False, True] if name in hybrid else [False]):
            stage = "hybrid" if dense else "bm25"
            todo = [None, *built]
            if args.report_only:
                rows.extend(done[(name, stage, r)] for r in todo if (name, stage, r) in done)
                missing += [f"{name}/{stage}/{r or 'first stage'}" for r in todo if (name, stage, r) not in done]
                continue
            if all((name, stage, r) in done for r in todo):
                rows.extend(done[(name, stage, r)] for r in todo)
                continue
            ds, index = build_index(data / name, dense, cache)
            qids = ds.judged_queries[: args.limit] if args.limit else ds.judged_queries
            base = done.get((name, stage, None))
            if base is None:
                base, _ = run(ds, index, qids, None)
                base = {"set": name, "first_stage": stage, "reranker": None, "model": None, **base,
                        "queries": len(qids)}
            keep(base)
            for rname, r in built.items():
                if (name, stage, rname) in done:
                    keep(done[(name, stage, rname)])
                    continue
                if r is None:  # auto resolved to no reranking here
                    keep({**base, "reranker": rname, "model": "none (auto resolved to no reranker)"})
                    continue
                t0 = time.perf_counter()
                metrics, secs = run(ds, index, qids, r)
                ms = np.asarray(secs) * 1000 if secs else np.zeros(1)
                keep({"set": name, "first_stage": stage, "reranker": rname,
                      "model": getattr(r, "model_id", type(r).__name__), **metrics, "queries": len(qids),
                      "delta_ndcg@10": metrics["ndcg@10"] - base["ndcg@10"],
                      "ratio_ndcg@10": metrics["ndcg@10"] / base["ndcg@10"] if base["ndcg@10"] else None,
                      "rerank_ms_p50": float(np.percentile(ms, 50)),
                      "rerank_ms_p95": float(np.percentile(ms, 95)),
                      "wall_s": round(time.perf_counter() - t0, 1)})
    cmd = "python benchmarks/bench_rerank.py " + " ".join(sys.argv[1:])
    earlier = json.loads(Path(args.earlier).read_text()) if args.earlier else None
    note = args.note + (f" Not measured (run stopped for time): {', '.join(missing)}." if missing else "")
    write_results(results, cmd, rows, unavailable, note.strip(), earlier)


def _table(rows: list[dict]) -> list[str]:
    lines = ["| set | lang | queries | first stage | reranker | model | nDCG@10 | Δ vs first stage | ratio | R@100 | "
             "p50 ms | p95 ms |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r["reranker"] is None or "rerank_ms_p50" not in r:
            lines.append(f"| {r['set']} | {LANGUAGE.get(r['set'], '?')} | {r['queries']} | {r['first_stage']} | "
                         f"{r['reranker'] or '—'} | {r['model'] or '—'} | "
                         f"{r['ndcg@10']:.4f} | | | {r['recall@100']:.4f} | | |")
        else:
            lines.append(f"| {r['set']} | {LANGUAGE.get(r['set'], '?')} | {r['queries']} | {r['first_stage']} | "
                         f"{r['reranker']} | {r['model']} | {r['ndcg@10']:.4f} | "
                         f"{r['delta_ndcg@10']:+.4f} | {r['ratio_ndcg@10']:.3f} | {r['recall@100']:.4f} | "
                         f"{r['rerank_ms_p50']:.0f} | {r['rerank_ms_p95']:.0f} |")
    return lines


def write_results(results: Path, cmd: str, rows: list[dict], unavailable: dict[str, str], note: str = "",
                  earlier: dict | None = None) -> None:
    """rerank.json + rerank.md (the table the README quotes)."""
    (results / "rerank.json").write_text(json.dumps(
        {"command": cmd, "note": note, "cpu_count": os.cpu_count(), "depth": DEPTH, "languages": LANGUAGE, "rows": rows,
         "unavailable": unavailable, "earlier": earlier},
        indent=2, default=str))
    lines = ["# Second-stage rerankers over the fused top 100\n",
             f"Command: `{cmd}` (cpu_count={os.cpu_count()}; one chunk per document; first stage BM25, or "
             "BM25 + multilingual-e5-small RRF; rerank window 100; latency = the rerank step per query on a "
             "shared 2-core box; passage encodings come from the --cache store when it holds them, so p50 is "
             "the warm figure and p95 carries the queries that met new passages)\n", *([note + "\n"] if note else []),
             *_table(rows)]
    if unavailable:
        lines += ["", "Not run (cannot be built here):", *[f"- `{k}`: {v}" for k, v in unavailable.items()]]
    if earlier:
        lines += ["", "## Earlier run, not repeated here (separate measurements, shown as they were)", "",
                  f"Command: `{earlier.get('command', '?')}`", "", *_table(earlier["rows"])]
    (results / "rerank.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    written = [results / "rerank.json", results / "rerank.md"]
    if write_plot(results / "rerank.png", rows):
        written.append(results / "rerank.png")
    say_written(written)


def write_plot(path: Path, rows: list[dict]) -> bool:
    """Δ nDCG@10 of each reranker over its first stage, one group of bars per (set, stage)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    measured = [r for r in rows if r["reranker"] and "delta_ndcg@10" in r]
    if not measured:
        return False
    groups = list(dict.fromkeys((r["set"], r["first_stage"]) for r in measured))
    names = list(dict.fromkeys(r["reranker"] for r in measured))
    fig, ax = plt.subplots(figsize=(max(8, 0.9 * len(groups) * len(names)), 4.5))
    width = 0.8 / len(names)
    for j, name in enumerate(names):
        xs, ys = [], []
        for i, g in enumerate(groups):
            hit = [r for r in measured if (r["set"], r["first_stage"]) == g and r["reranker"] == name]
            if hit:
                xs.append(i + (j - (len(names) - 1) / 2) * width)
                ys.append(hit[0]["delta_ndcg@10"])
        ax.bar(xs, ys, width, label=name)
    ax.axhline(0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels([f"{s} ({LANGUAGE.get(s, '?')})\n{st}" for s, st in groups], fontsize=8)
    ax.set_ylabel("Δ nDCG@10 vs first stage")
    ax.set_title("Rerankers over the first stage's top 100 (below 0: the reranker hurts)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True




if __name__ == "__main__":
    main()
