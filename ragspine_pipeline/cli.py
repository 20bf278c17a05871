"""``ragspine`` console script: demo, query, eval.

``ragspine demo`` ingests the embedded demo corpus into the warehouse chunk store
(incrementally: unchanged documents keep their version) and answers sample questions
with cited snippets. ``ragspine query`` asks one question; ``ragspine eval`` scores the
retrieval stack on a BEIR-layout dataset.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

from .corpus import DEMO_ROOT, ingest_folder, list_libraries, load_golden
from .modes import RetrievalModeError, resolve_retrieval
from .retrieval.chunking.chunk_store import ChunkStore
from .retrieval.lexical.predicates import FilterError
from .retrieval.link.narrative_link import NarrativeIndex, NarrativeIndexRetriever

DEFAULT_WAREHOUSE = Path(os.environ.get("RAGSPINE_WAREHOUSE", DEMO_ROOT.parent / "warehouse"))
_FILTER_RE = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*(?::(in|nin|between))?\s*(!=|>=|<=|=|>|<)\s*(.*)$")
_OPS = {"=": "eq", "!=": "ne", ">=": "gte", "<=": "lte", ">": "gt", "<": "lt"}


def parse_filter_args(items: list[str] | None) -> dict[str, dict[str, Any]] | None:
    """``field=v``, ``field!=v``, ``field>=v`` …, ``field:in=a,b``, ``field:between=a,b``."""
    if not items:
        return None
    out: dict[str, dict[str, Any]] = {}
    for raw in items:
        m = _FILTER_RE.match(raw)
        if not m:
            raise FilterError(f"cannot parse filter {raw!r}; use field=value, field>=value, field:in=a,b")
        field, listop, op, value = m.groups()
        if listop:
            if op != "=":
                raise FilterError(f"filter {raw!r}: write {field}:{listop}=a,b")
            out.setdefault(field, {})[listop] = [v.strip() for v in value.split(",")]
        else:
            out.setdefault(field, {})[_OPS[op]] = value.strip()
    return out


def _store_path(warehouse: Path) -> Path:
    return warehouse / "chunks.duckdb"


def build_demo_store(warehouse: Path, corpus_root: Path = DEMO_ROOT, *, quiet: bool = False) -> dict[str, Any]:
    """Ingest every library folder of ``corpus_root`` into the warehouse store."""
    summary: dict[str, Any] = {}
    with ChunkStore(_store_path(warehouse)) as store:
        for lib in list_libraries(corpus_root):
            t0 = time.perf_counter()
            rep = ingest_folder(store, corpus_root / lib)
            summary[lib] = {**rep.summary(), "seconds": round(time.perf_counter() - t0, 3)}
            for err in rep.errors:
                print(f"  ! {err.path}: {err.error}", file=sys.stderr)
            if not quiet:
                s = summary[lib]
                print(f"  {lib}: {s['new']} new, {s['changed']} changed, {s['unchanged']} unchanged, "
                      f"{s['withdrawn']} withdrawn, {s['rows_written']} chunk rows written, "
                      f"{s['errors']} unreadable")
    return summary


def open_retriever(warehouse: Path, *, mode: str | None, embedding: str | None,
                   analyzer: str | None = None, glossary: Path | None = None) -> NarrativeIndexRetriever:
    from .retrieval.lexical.glossary import GlossaryQueryRewriter

    backend, channels = resolve_retrieval(mode, embedding)
    gl = glossary if glossary is not None else DEMO_ROOT / "glossary.json"
    if (warehouse / "retrieval_snapshot").is_dir() and analyzer is None:
        # Serve what the pipeline published (read-only, one consistent snapshot per library).
        from .warehouse.pipeline import load_snapshot_index, published_libraries, serving_retriever
        from .warehouse.versioned import VersionedTables

        wh = VersionedTables(warehouse)
        libs = published_libraries(wh)
        if libs:
            return serving_retriever({lib: NarrativeIndexRetriever(load_snapshot_index(  # type: ignore[return-value]
                wh, lib, glossary=gl, embedding_backend=backend, channels=channels)) for lib in libs})
    path = _store_path(warehouse)
    with ChunkStore(path, read_only=True) as store:
        chunks = list(store.iter_chunks())
    rewriter = GlossaryQueryRewriter.from_file(gl) if gl and Path(gl).exists() else None
    index = NarrativeIndex.from_chunks(chunks, analyzer=analyzer, embedding_backend=backend,
                                       rewriter=rewriter, channels=channels)
    return NarrativeIndexRetriever(index)


def format_snippet(s: dict[str, Any], width: int = 220) -> str:
    loc = s["source_locator"]
    text = " ".join(s["text"].split())
    if len(text) > width:
        text = text[:width] + " …"
    sc = s["scores"]
    vec = "" if sc["vector"] is None else f" vector={sc['vector']:.3f}"
    meta = " ".join(f"{k}={s[k]}" for k in ("entity", "period", "topic", "language") if s.get(k))
    return (f"[{s['rank']}] {s['title']}\n"
            f"    cite: {s['doc_id']} chars {loc['start']}-{loc['end']} (v{s['version']}, {s['sensitivity']}; {meta})\n"
            f"    score: fused={sc['fused']:.4f} bm25={sc['bm25']:.3f}{vec}"
            f"{'  [filters relaxed: no match under the filter]' if s.get('filters_relaxed') else ''}\n"
            f"    {text}")


def _dagster_demo() -> int | None:
    """Run the Dagster materialization of the demo (definitions.py at the repo root).

    Loaded by file path on purpose: the engine package never imports Dagster itself; the
    code location does. Returns None when Dagster or the code location is not there.
    """
    import importlib.util

    defs_path = DEMO_ROOT.parents[1] / "definitions.py"
    if importlib.util.find_spec("dagster") is None or not defs_path.exists():
        return None
    spec = importlib.util.spec_from_file_location("ragspine_definitions", defs_path)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return int(module.run_demo())


def cmd_demo(args: argparse.Namespace) -> int:
    if not args.engine_only and args.mode is None and args.embedding is None:
        print("RAGSpine demo: materializing every asset of every demo library in-process (Dagster)")
        rc = _dagster_demo()
        if rc is not None:
            return rc
        print("(Dagster is not installed: install the [pipeline] extra for the asset pipeline; "
              "running the engine-only demo)")
    warehouse = Path(args.warehouse)
    print(f"RAGSpine demo: ingesting {DEMO_ROOT} into {_store_path(warehouse)}")
    build_demo_store(warehouse)
    retriever = open_retriever(warehouse, mode=args.mode, embedding=args.embedding)
    idx = retriever.index.retriever
    print(f"index: {len(idx)} active chunks, analyzer={idx.analyzer.name}, "
          f"dense={'off' if idx.embedding_backend is None else idx.embedding_backend.model_id}, "
          f"restricted chunks indexed but never returned: {int(idx.restricted.sum())}")
    for g in load_golden()[: args.questions]:
        flt = g.get("filters")
        print(f"\nQ: {g['query']}" + (f"   filters={json.dumps(flt, ensure_ascii=False)}" if flt else ""))
        for s in retriever.retrieve(g["query"], filters=flt, top_k=args.top_k):
            print(format_snippet(s))
    return 0


def cmd_query(args: argparse.Namespace) -> int:
    warehouse = Path(args.warehouse)
    if not _store_path(warehouse).exists() and not (warehouse / "retrieval_snapshot").is_dir():
        print(f"(no warehouse at {warehouse}; ingesting the demo corpus first)", file=sys.stderr)
        build_demo_store(warehouse, quiet=True)
    filters = parse_filter_args(args.filter)
    if args.where:
        filters = {**(filters or {}), **json.loads(args.where)}
    retriever = open_retriever(warehouse, mode=args.mode, embedding=args.embedding)
    snippets = retriever.retrieve(args.query, filters=filters, top_k=args.top_k)
    if args.json:
        json.dump(snippets, sys.stdout, ensure_ascii=False, indent=2, default=str)
        sys.stdout.write("\n")
    else:
        if not snippets:
            print("no matching snippets")
        for s in snippets:
            print(format_snippet(s))
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    from .eval.runner import EvalConfig, evaluate_dataset

    cfg = EvalConfig(mode=args.mode or "bm25", embedding=args.embedding, chunker=args.chunker,
                     max_chars=args.max_chars, analyzer=args.analyzer, reranker=args.reranker,
                     limit=args.limit, progress=not args.no_progress)
    res = evaluate_dataset(args.dataset_dir, cfg)
    if args.json:
        json.dump(res, sys.stdout, ensure_ascii=False)
        sys.stdout.write("\n")
    else:
        c, t = res["counts"], res["timings_s"]
        print(f"{'dataset':<16}{'mode':<8}{'chunker':<11}{'analyzer':<10}{'nDCG@10':>9}{'R@100':>8}{'MRR@10':>8}")
        print(f"{res['dataset']:<16}{res['mode']:<8}{res['chunker']:<11}{res['analyzer']:<10}"
              f"{res['ndcg@10']:>9.4f}{res['recall@100']:>8.4f}{res['mrr@10']:>8.4f}")
        print(f"{c['documents']} docs, {c['chunks']} chunks, {c['queries']} queries; "
              f"ingest {t['ingest']}s, index {t['index']}s, {t['per_query_ms']} ms/query")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ragspine", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)

    def common(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--warehouse", default=str(DEFAULT_WAREHOUSE), help="warehouse folder")
        sp.add_argument("--mode", default=None, help="retrieval mode (RAGSPINE_RETRIEVAL_MODE): auto, hybrid, vector, bm25, lexical, economy")
        sp.add_argument("--embedding", default=None, help="embedding backend spec (RAGSPINE_EMBEDDING)")

    d = sub.add_parser("demo", help="ingest the demo corpus and answer sample questions")
    common(d)
    d.add_argument("--questions", type=int, default=4)
    d.add_argument("--engine-only", action="store_true",
                   help="ingest into the DuckDB chunk store without Dagster (no warehouse assets)")
    d.add_argument("--top-k", type=int, default=3)
    d.set_defaults(func=cmd_demo)

    q = sub.add_parser("query", help="ask one question, print cited snippets")
    common(q)
    q.add_argument("query")
    q.add_argument("--filter", action="append", help="metadata filter, repeatable: entity=ACME_CN, period>=2023, topic:in=risk,policy")
    q.add_argument("--where", help="filters as JSON, e.g. '{\"period\": {\"between\": [\"2022\", \"2023\"]}}'")
    q.add_argument("--top-k", type=int, default=5)
    q.add_argument("--json", action="store_true", help="print the snippet dicts as JSON")
    q.set_defaults(func=cmd_query)

    e = sub.add_parser("eval", help="score retrieval on a BEIR-layout dataset")
    e.add_argument("dataset_dir")
    e.add_argument("--mode", default="bm25")
    e.add_argument("--embedding", default=None)
    e.add_argument("--chunker", default="document", choices=["document", "paragraph"])
    e.add_argument("--max-chars", type=int, default=None)
    e.add_argument("--analyzer", default=None, help="spec, stop, stem, english (default)")
    e.add_argument("--reranker", default=None)
    e.add_argument("--limit", type=int, default=None, help="evaluate only the first N judged queries")
    e.add_argument("--json", action="store_true")
    e.add_argument("--no-progress", action="store_true")
    e.set_defaults(func=cmd_eval)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except (FilterError, RetrievalModeError, ValueError, FileNotFoundError, RuntimeError) as exc:
        print(f"ragspine: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
