"""What the multi-library strength gate does to answer quality: fusion of every library
(the spec's default) against ``min_relative_strength`` (``RAGSPINE_LIBRARY_MIN_STRENGTH``).

BM25 over each library, fused with RRF by ``MultiIndexRetriever``; nDCG@10 and
Recall@100 at document level (a document counts at its best chunk), and how many queries
get nothing from a library that holds one of their relevant documents. Sets:

* ``demo_golden``: the demo corpus's two libraries (reports, policies) and its golden
  questions with their filters, router ``none`` (every library) and ``rules`` (the
  serving default), with the demo glossary as the engine-only path uses it;
* ``scifact+cranfield``: two libraries on different subjects (each query's relevant
  documents sit in its own set's library; the other library is noise for it), the
  queries of both sets;
* ``scifact/2 shards``: one collection split into two libraries by document order (the
  relevant documents are spread over both: the gate can only lose them).

A single index over the same documents is the reference line. Gate values: 0 (off, the
default), 0.25, 0.5 (the former default), 0.75.

    python benchmarks/bench_library_gate.py --out benchmarks/results
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import add_io_args, out_dir, require_sets, say_written, use_data  # noqa: E402
from ragspine_pipeline.cli import build_demo_store  # noqa: E402
from ragspine_pipeline.corpus import DEMO_ROOT, ingest_documents  # noqa: E402
from ragspine_pipeline.eval.beir import load_beir  # noqa: E402
from ragspine_pipeline.eval.metrics import dedupe_keep_best, ndcg_at_k, recall_at_k  # noqa: E402
from ragspine_pipeline.eval.runner import EvalConfig, _chunker, beir_documents  # noqa: E402
from ragspine_pipeline.retrieval.chunking.chunk_store import ChunkStore  # noqa: E402
from ragspine_pipeline.retrieval.lexical.analysis.glossary import GlossaryQueryRewriter  # noqa: E402
from ragspine_pipeline.retrieval.link.multi_index import MultiIndexRetriever  # noqa: E402
from ragspine_pipeline.retrieval.link.narrative_link import NarrativeIndex, NarrativeIndexRetriever  # noqa: E402
from ragspine_pipeline.retrieval.link.routing import make_router  # noqa: E402

GATES = (0.0, 0.25, 0.5, 0.75)
DEPTH = 100
Query = tuple[str, Any, dict[str, float]]  # text, filters, qrels (doc id -> gain)


@dataclasses.dataclass
class Case:
    """One multi-library setup: chunks per library, the queries, the routers to try."""

    name: str
    libraries: dict[str, list[Any]]
    queries: list[Query]
    analyzer: str | None = None
    rewriter: GlossaryQueryRewriter | None = None
    routers: Sequence[str] = ("none",)
    doc_key: Callable[[str], str] = str  # the qrels id of a snippet's doc_id (identity by default)


def demo_case() -> Case:
    with tempfile.TemporaryDirectory() as tmp:
        build_demo_store(Path(tmp), quiet=True)
        with ChunkStore(Path(tmp) / "chunks.duckdb", read_only=True) as store:
            chunks = list(store.iter_chunks())
    libraries: dict[str, list[Any]] = {}
    for c in chunks:
        libraries.setdefault(c.doc_id.split("/", 1)[0], []).append(c)
    golden = json.loads((DEMO_ROOT / "golden_queries.json").read_text(encoding="utf-8"))
    queries = [(g["query"], g.get("filters"), {d: 1.0 for d in g["relevant"]}) for g in golden]
    return Case("demo_golden", libraries, queries, rewriter=GlossaryQueryRewriter.from_file(
        DEMO_ROOT / "glossary.json"), routers=("none", "rules"), doc_key=lambda d: d.rsplit("/", 1)[-1])


def beir_chunks(folder: Path, prefix: str) -> tuple[list[Any], Any]:
    """A BEIR set's chunks with doc ids ``<prefix>/<id>`` (sets share no ids then)."""
    ds = load_beir(folder)
    docs = [dataclasses.replace(d, doc_id=f"{prefix}/{d.doc_id}") for d in beir_documents(ds)]
    with ChunkStore(":memory:") as store:
        ingest_documents(store, docs, scope_prefix="", chunker=_chunker(EvalConfig()))
        return list(store.iter_chunks()), ds


def beir_queries(ds: Any, prefix: str) -> list[Query]:
    return [(ds.queries[q], None, {f"{prefix}/{d}": float(g) for d, g in ds.qrels[q].items()})
            for q in ds.judged_queries]


def beir_cases(root: Path) -> list[Case]:
    sci, sci_ds = beir_chunks(root / "scifact", "scifact")
    cran, cran_ds = beir_chunks(root / "cranfield", "cranfield")
    mixed = Case("scifact+cranfield", {"scifact": sci, "cranfield": cran},
                 beir_queries(sci_ds, "scifact") + beir_queries(cran_ds, "cranfield"), analyzer="english")
    order = {d: i for i, d in enumerate(sorted({c.doc_id for c in sci}))}
    shards = {"shard_a": [c for c in sci if order[c.doc_id] % 2 == 0],
              "shard_b": [c for c in sci if order[c.doc_id] % 2 == 1]}
    split = Case("scifact/2 shards", shards, beir_queries(sci_ds, "scifact"), analyzer="english")
    return [mixed, split]


def score(retriever: Any, case: Case, doc_library: dict[str, str] | None) -> dict[str, Any]:
    """Mean metrics over the case's queries. ``doc_library`` (document -> library; None
    for the single index) counts the queries whose answer holds nothing from a library
    that has one of their relevant documents."""
    ndcg, recall, missing = [], [], 0
    t0 = time.perf_counter()
    for text, filters, qrels in case.queries:
        out = retriever.retrieve(text, filters=filters, top_k=DEPTH)
        ranked = dedupe_keep_best([case.doc_key(s["doc_id"]) for s in out])
        ndcg.append(ndcg_at_k(ranked, qrels, 10))
        recall.append(recall_at_k(ranked, qrels, DEPTH))
        if doc_library is not None:
            wanted = {doc_library[d] for d, g in qrels.items() if g > 0 and d in doc_library}
            missing += bool(wanted - {s["library_id"] for s in out})
    n = len(case.queries)
    return {"ndcg@10": round(sum(ndcg) / n, 4), f"recall@{DEPTH}": round(sum(recall) / n, 4),
            "missing_library": missing if doc_library is not None else None, "queries": n,
            "ms_per_query": round((time.perf_counter() - t0) * 1000 / n, 2)}


def run(case: Case) -> list[dict[str, Any]]:
    retrievers = {lib: NarrativeIndexRetriever(NarrativeIndex.from_chunks(
        chunks, analyzer=case.analyzer, rewriter=case.rewriter, library_id=lib))
        for lib, chunks in case.libraries.items()}
    single = NarrativeIndexRetriever(NarrativeIndex.from_chunks(
        [c for chunks in case.libraries.values() for c in chunks], analyzer=case.analyzer, rewriter=case.rewriter))
    doc_library = {case.doc_key(c.doc_id): lib for lib, chunks in case.libraries.items() for c in chunks}
    rows = [{"set": case.name, "router": "-", "gate": "single index", **score(single, case, None)}]
    for router_name in case.routers:
        router = make_router(router_name, retrievers, glossary=DEMO_ROOT / "glossary.json")
        for gate in GATES:
            multi = MultiIndexRetriever(retrievers, router=router, min_relative_strength=gate)
            rows.append({"set": case.name, "router": router_name, "gate": gate, **score(multi, case, doc_library)})
            print(json.dumps(rows[-1]), file=sys.stderr)
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_io_args(ap)
    args = ap.parse_args(argv)
    root = use_data(args.data)
    require_sets(root, ["scifact", "cranfield"])
    out = out_dir(args.out)
    rows = run(demo_case())
    for case in beir_cases(root):
        rows += run(case)
    cmd = "python benchmarks/bench_library_gate.py" + (f" --out {args.out}" if args.out else "")
    (out / "library_gate.json").write_text(json.dumps({"command": cmd, "rows": rows}, indent=2), encoding="utf-8")
    lines = ["# Multi-library fusion: every library (default) vs the strength gate\n",
             f"Command: `{cmd}`. BM25 per library, RRF across libraries; document-level metrics. "
             "`gate` is `min_relative_strength` (`RAGSPINE_LIBRARY_MIN_STRENGTH`; 0 = off, the default); "
             "*missing library*: queries whose answer holds nothing from a library that has one of their "
             "relevant documents.\n",
             f"| set | router | gate | nDCG@10 | Recall@{DEPTH} | missing library | ms/query |",
             "|---|---|---|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['set']} | {r['router']} | {r['gate']} | {r['ndcg@10']:.4f} | {r[f'recall@{DEPTH}']:.4f} | "
                     f"{'-' if r['missing_library'] is None else r['missing_library']}/{r['queries']} | "
                     f"{r['ms_per_query']} |")
    (out / "library_gate.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines))
    say_written([out / "library_gate.json", out / "library_gate.md"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
