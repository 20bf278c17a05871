"""Glossary multi-query on and off: nDCG@10 on the demo golden set and every eval set.

Issue #28 item 5: with the demo glossary on (the served default) the English query
"revenue" ranked ten Chinese reports above "ACME US revenue grew ...", because each of its
three Chinese synonyms made a ranking that voted as much as the user's own words. The fix
weighs the variants (``retrieval/lexical/analysis/glossary.py``: original 1, same-language variant 1,
cross-language 0.5, all variants together at most 0.5). Three runs per set, one index:

* ``off``    -- no rewriter;
* ``before`` -- the glossary's variants, each weighing 1 (plain RRF: the old behaviour);
* ``after``  -- the same variants with their weights (the default rewriter).

"Glossary on" is the demo glossary (``demo_corpus/glossary.json``) everywhere: it is what
``ragspine query`` and ``ragspine eval`` apply unless ``RAGSPINE_GLOSSARY`` says otherwise,
and the eval sets have no glossary of their own, so on them it must be harmless (the table
counts the queries it rewrites at all). The demo golden set is scored three ways: each
library on its own (what the Dagster quality check scores) and both libraries in one index.
The "revenue" rows list the languages of the top 10 ("EN*": an English ACME US revenue
report). Dense modes need a local model (``--embedding e5``); the default is BM25.

    python benchmarks/bench_glossary.py [--data DIR] [--embedding e5] [--out benchmarks/results]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.common import add_io_args, out_dir, require_sets, say_written, use_data  # noqa: E402
from ragspine_pipeline.eval.metrics import dedupe_keep_best, mean_metrics  # noqa: E402
from ragspine_pipeline.paths import DEMO_GLOSSARY, DEMO_ROOT  # noqa: E402
from ragspine_pipeline.retrieval.lexical.analysis.glossary import GlossaryQueryRewriter  # noqa: E402

SETS = ("scifact", "cranfield", "cmrc2018-trial", "xquad-de", "xquad-ru", "xquad-ar", "xquad-th")
DEMO_LIBRARIES = ("acme_reports", "acme_policies")
RUNS = ("off", "before", "after")
REVENUE_MARK = ("ACME US revenue", "ACME US grew revenue")


def engine_applies_weights() -> bool:
    """Whether the hybrid retriever's fusion honours variant weights: a variant of
    weight 0 (budget 0) must find nothing that the original query does not."""
    from ragspine_pipeline.retrieval.chunking.chunking import chunk_document
    from ragspine_pipeline.retrieval.hybrid.retriever import HybridRetriever
    from ragspine_pipeline.retrieval.lexical.analysis.glossary import GlossaryGroup

    chunks = chunk_document("revenue grew", doc_id="en") + chunk_document("sales grew", doc_id="other")
    rw = GlossaryQueryRewriter(groups=[GlossaryGroup(("revenue", "sales"))], variant_budget=0.0)
    return [h.chunk.doc_id for h in HybridRetriever(chunks, rewriter=rw).search("revenue", top_k=5)] == ["en"]


def rewriters() -> dict[str, GlossaryQueryRewriter | None]:
    """The three runs' rewriters; ``before`` gives every variant weight 1 (a budget no
    variant list reaches, cross-language weight 1): the unweighted multi-query."""
    weighted = GlossaryQueryRewriter.from_file(DEMO_GLOSSARY)
    equal = GlossaryQueryRewriter.from_file(DEMO_GLOSSARY, variant_budget=float(weighted.max_queries),
                                            cross_language_weight=1.0)
    return {"off": None, "before": equal, "after": weighted}


def retriever_for(chunks, backend, library: str):
    """One index, built once; the runs swap its rewriter (the index does not depend on it)."""
    from ragspine_pipeline.retrieval.link.narrative_link import (
        NarrativeIndex,
        NarrativeIndexRetriever,
    )

    channels = ("bm25", "dense") if backend is not None else ("bm25",)
    index = NarrativeIndex.from_chunks(chunks, embedding_backend=backend, channels=channels, library_id=library)
    return NarrativeIndexRetriever(index)


def run_each(retriever, score) -> dict[str, float]:
    """``score(retriever)`` with each run's rewriter in place."""
    out = {}
    for name, rw in rewriters().items():
        retriever.index.retriever.rewriter = rw
        out[name] = round(score(retriever), 4)
    return out


def rewritten(queries: list[str]) -> int:
    rw = rewriters()["after"]
    return sum(len(rw.rewrite(q)) > 1 for q in queries)


def demo_chunks(libraries) -> list:
    from ragspine_pipeline.corpus import ingest_folder
    from ragspine_pipeline.retrieval.chunking.chunk_store import ChunkStore

    store = ChunkStore(":memory:")
    for lib in libraries:
        ingest_folder(store, DEMO_ROOT / lib)
    chunks = list(store.iter_chunks())
    store.close()
    return chunks


def golden_score(golden: list[dict], doc_ids: set[str]):
    """nDCG@10 of the golden questions judged in ``doc_ids`` (library-prefixed ids), top 30
    snippets deduplicated by document -- the Dagster quality check's scoring."""
    judged = [(str(i), g, {d: 1 for d in doc_ids if d.split("/", 1)[1] in g["relevant"]})
              for i, g in enumerate(golden)]
    judged = [(i, g, rel) for i, g, rel in judged if rel]

    def score(retriever) -> float:
        runs = {i: dedupe_keep_best([s["doc_id"] for s in retriever.retrieve(g["query"], filters=g.get("filters"),
                                                                              top_k=30)])
                for i, g, _ in judged}
        return mean_metrics(runs, {i: rel for i, _, rel in judged})["ndcg@10"]
    return score, [g["query"] for _, g, _ in judged]


def revenue_top(retriever) -> dict[str, str]:
    out = {}
    for name, rw in rewriters().items():
        retriever.index.retriever.rewriter = rw
        top = retriever.retrieve("revenue", top_k=10)
        out[name] = " ".join(s["language"].upper() + ("*" if any(m in s["text"] for m in REVENUE_MARK) else "")
                             for s in top)
    return out


def demo_rows(backend, mode: str) -> tuple[list[dict], dict]:
    golden = json.loads((DEMO_ROOT / "golden_queries.json").read_text(encoding="utf-8"))
    rows = []
    revenue = {}
    for name, libs in [(lib, (lib,)) for lib in DEMO_LIBRARIES] + [("demo (both libraries)", DEMO_LIBRARIES)]:
        chunks = demo_chunks(libs)
        retriever = retriever_for(chunks, backend, "demo")
        score, queries = golden_score(golden, {c.doc_id for c in chunks})
        rows.append({"set": f"golden: {name}", "mode": mode, "queries": len(queries),
                     "rewritten": rewritten(queries), **run_each(retriever, score)})
        if len(libs) > 1:
            revenue = revenue_top(retriever)
    return rows, revenue


def eval_row(name: str, backend, mode: str) -> dict:
    from benchmarks.bench_dense import load_set

    ds, chunks = load_set(name)
    retriever = retriever_for(chunks, backend, name)
    qids = ds.judged_queries

    def score(r) -> float:
        runs = {q: r.ranked_doc_ids(ds.queries[q], chunk_depth=300, depth=100) for q in qids}
        return mean_metrics(runs, {q: ds.qrels[q] for q in qids})["ndcg@10"]
    return {"set": name, "mode": mode, "queries": len(qids), "rewritten": rewritten([ds.queries[q] for q in qids]),
            **run_each(retriever, score)}


def render(report: dict) -> str:
    lines = ["# Glossary multi-query: nDCG@10 off / before / after the weighted variants (issue #28 item 5)\n",
             f"Command: `{report['command']}`\n",
             "Glossary on = the demo glossary (`demo_corpus/glossary.json`, the served default). `before`: every "
             "variant weighs 1 in the fusion (the old multi-query); `after`: original 1, same-language variant 1, "
             "cross-language 0.5, the variants together at most 0.5 (`retrieval/lexical/analysis/glossary.py`). "
             "`rewritten`: queries the glossary expands at all (the eval sets have no glossary of their own). "
             f"Engine applies the weights: {'yes' if report['weights_applied'] else 'NO (after = before)'}.\n",
             "| set | mode | queries | rewritten | off | before | after | after − off |",
             "|---|---|---|---|---|---|---|---|"]
    for r in report["rows"]:
        lines.append(f"| {r['set']} | {r['mode']} | {r['queries']} | {r['rewritten']} | {r['off']:.4f} | "
                     f"{r['before']:.4f} | {r['after']:.4f} | {r['after'] - r['off']:+.4f} |")
    lines += ["", "Top 10 of \"revenue\" over both demo libraries in one index (EN* = an English \"ACME US revenue\" "
              "report). Served as two libraries (`ragspine query`), the libraries are fused by rank, so the policies "
              "library's second hit, a Chinese policy only a variant finds, can come third there.\n",
              "| mode | off | before | after |", "|---|---|---|---|"]
    for mode, top in report["revenue"].items():
        lines.append(f"| {mode} | {top['off']} | {top['before']} | {top['after']} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_io_args(ap)
    ap.add_argument("--embedding", default=None, help="also run the hybrid mode with this local model (e.g. e5)")
    ap.add_argument("--sets", default=",".join(SETS), help="comma list of eval sets (default: all)")
    args = ap.parse_args()
    root = use_data(args.data)
    sets = [s for s in args.sets.split(",") if s]
    require_sets(root, sets)
    modes: list[tuple[str, object]] = [("bm25", None)]
    if args.embedding:
        from ragspine_pipeline.retrieval.vector.embedding_backends import make_embedding_backend

        modes.append((f"hybrid {args.embedding}", make_embedding_backend(args.embedding)))
    rows, revenue = [], {}
    t0 = time.perf_counter()
    for mode, backend in modes:
        demo, revenue[mode] = demo_rows(backend, mode)
        rows += demo
        for name in sets:
            rows.append(eval_row(name, backend, mode))
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    cmd = "python benchmarks/bench_glossary.py " + " ".join(sys.argv[1:])
    report = {"command": cmd.strip(), "weights_applied": engine_applies_weights(), "rows": rows, "revenue": revenue,
              "seconds": round(time.perf_counter() - t0, 1)}
    out = out_dir(args.out)
    (out / "glossary.json").write_text(json.dumps(report, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    (out / "glossary.md").write_text(render(report), encoding="utf-8")
    print(render(report))
    say_written([out / "glossary.json", out / "glossary.md"])


if __name__ == "__main__":
    main()
