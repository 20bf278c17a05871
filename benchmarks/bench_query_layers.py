"""nDCG@10 and latency of the deterministic query layers against the plain path.

Side by side in one run, over one index per set: plain, RAG-Fusion with the glossary
rewriter (no LLM), MMR, CRAG (deterministic grader), auto filters, and the stack
RAG-Fusion + MMR. Sets: the demo corpus golden questions (with the demo glossary, the
golden filters as given; auto filters run on the questions *without* their filters),
Cranfield (English analyzer) and the CMRC 2018 trial from ``../shared/eval``. LLM layers
(HyDE, step-back, decomposition) need a model and are not measured here.

A CRAG refusal counts as an empty run (nDCG 0) and is counted separately; latency is the
mean per query and its ratio to the plain path in the same run.

    python benchmarks/bench_query_layers.py --out benchmarks/results
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import add_io_args, out_dir, require_sets, say_written, use_data  # noqa: E402
from ragspine_pipeline.cli import build_demo_store  # noqa: E402
from ragspine_pipeline.corpus import DEMO_ROOT, ingest_documents  # noqa: E402
from ragspine_pipeline.eval.beir import load_beir  # noqa: E402
from ragspine_pipeline.eval.metrics import dedupe_keep_best, ndcg_at_k  # noqa: E402
from ragspine_pipeline.eval.runner import EvalConfig, _chunker, beir_documents  # noqa: E402
from ragspine_pipeline.retrieval.chunking.chunk_store import ChunkStore  # noqa: E402
from ragspine_pipeline.retrieval.lexical.analysis.glossary import GlossaryQueryRewriter  # noqa: E402
from ragspine_pipeline.retrieval.link.assembly import index_retriever, with_layers  # noqa: E402
from ragspine_pipeline.retrieval.link.narrative_link import NarrativeIndex  # noqa: E402

CONFIGS = {
    "plain": {},
    "rag_fusion(glossary)": {"transform": "rag_fusion"},
    "mmr": {"postprocessor": "mmr"},
    "crag": {"corrective": "on"},
    "auto_filters": {"auto_filters": "on"},
    "rag_fusion+mmr": {"transform": "rag_fusion", "postprocessor": "mmr"},
}
OFF = {"transform": "none", "decompose": "none", "adaptive": "off", "corrective": "off",
       "auto_filters": "off", "postprocessor": "none"}


def demo_set():
    with tempfile.TemporaryDirectory() as tmp:
        build_demo_store(Path(tmp), quiet=True)
        with ChunkStore(Path(tmp) / "chunks.duckdb", read_only=True) as store:
            chunks = list(store.iter_chunks())
    golden = json.loads((DEMO_ROOT / "golden_queries.json").read_text(encoding="utf-8"))
    queries = [(g["query"], g.get("filters"), {d: 1.0 for d in g["relevant"]}) for g in golden]
    rw = GlossaryQueryRewriter.from_file(DEMO_ROOT / "glossary.json")
    return "demo_golden", NarrativeIndex.from_chunks(chunks, rewriter=rw), queries


def beir_set(folder: Path, analyzer: str | None):
    ds = load_beir(folder)
    store = ChunkStore(":memory:")
    ingest_documents(store, beir_documents(ds), scope_prefix="", chunker=_chunker(EvalConfig()))
    chunks = list(store.iter_chunks())
    store.close()
    queries = [(ds.queries[q], None, ds.qrels[q]) for q in ds.judged_queries]
    return ds.name, NarrativeIndex.from_chunks(chunks, analyzer=analyzer), queries


def run(name, index, queries, k=10):
    rows = []
    base = index_retriever(index)  # the serving assembly, with the layers set explicitly per config
    for cfg_name, cfg in CONFIGS.items():
        if ("auto_filters" in cfg_name or "rag_fusion" in cfg_name) and not name.startswith("demo"):
            continue  # the BEIR sets carry no metadata to filter on and have no glossary
        layered = with_layers(base, layers={**OFF, **cfg})
        scores, refused = [], 0
        t0 = time.perf_counter()
        for q, flt, qrels in queries:
            use_flt = None if cfg_name == "auto_filters" else flt
            out = layered.retrieve(q, filters=use_flt, top_k=30)
            if getattr(out, "status", "ok") == "refused_weak_context":
                refused += 1
            # demo doc ids are "<library>/<doc>"; the golden file names the doc
            scores.append(ndcg_at_k(dedupe_keep_best([s["doc_id"].rsplit("/", 1)[-1] for s in out]), qrels, k))
        ms = (time.perf_counter() - t0) * 1000 / len(queries)
        rows.append({"set": name, "config": cfg_name, "ndcg@10": round(sum(scores) / len(scores), 4),
                     "ms_per_query": round(ms, 2), "refused": refused, "queries": len(queries)})
    plain = next(r for r in rows if r["config"] == "plain")
    for r in rows:
        r["latency_ratio"] = round(r["ms_per_query"] / plain["ms_per_query"], 2) if plain["ms_per_query"] else None
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_io_args(ap)
    args = ap.parse_args(argv)
    root = use_data(args.data)
    require_sets(root, ["cranfield", "cmrc2018-trial"])
    out = out_dir(args.out)
    rows = run(*demo_set())
    rows += run(*beir_set(root / "cranfield", "english"))
    rows += run(*beir_set(root / "cmrc2018-trial", None))
    cmd = "python benchmarks/bench_query_layers.py" + (f" --out {args.out}" if args.out else "")
    (out / "query_layers.json").write_text(json.dumps({"command": cmd, "rows": rows}, indent=2), encoding="utf-8")
    lines = [f"# Query layers vs the plain path (nDCG@10, latency)\n\nCommand: `{cmd}`\n",
             "| set | config | nDCG@10 | ms/query | × plain latency | CRAG refusals |",
             "|---|---|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['set']} | {r['config']} | {r['ndcg@10']:.4f} | {r['ms_per_query']} | "
                     f"{r['latency_ratio']} | {r['refused']}/{r['queries']} |")
    (out / "query_layers.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines))
    say_written([out / "query_layers.json", out / "query_layers.md"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
