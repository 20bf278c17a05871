"""BM25 quality per script: the index analyzer against bm25s's default tokenizer, in one run.

    python benchmarks/bench_quality.py                      # every set in ../shared/eval
    python benchmarks/bench_quality.py --sets xquad-ru,cmrc2018-trial --max-queries 200

For every BEIR set under ``../shared/eval`` (one per script: English, Chinese, German,
Russian, Arabic, Thai) it reports nDCG@10 / Recall@100 / MRR@10 of

* ``ragspine``: the product's default analyzer (``unicode``) through the product's own
  path (``evaluate_dataset``: chunk store -> NarrativeIndex -> retriever), k1=1.5 b=0.75;
* ``ragspine english``: the previous default (spec tokens + English stem/stop), the
  no-regression baseline;
* ``ragspine pinned``: the set's language pinned (``unicode:<language>``, what
  ``RAGSPINE_ANALYZER`` does) and ``ragspine metadata``: the documents carry
  ``language=<code>`` and queries are stemmed both ways (``analyze_query``), the route a
  mixed library takes; both on the BM25 index directly;
* ``bm25s default``: bm25s 0.3.16 as a user runs it — ``bm25s.tokenize`` with its defaults
  (``\\w\\w+`` regex, English stop words, no stemmer) and ``BM25(method="lucene")``.

and the tokenization throughput of each analyzer on the set's corpus (tokens/s, best of
three) next to ``bm25s.tokenize``. A check that the index equals the reference formula on
the new tokens runs on a sample of queries per set. Results go to
``benchmarks/results/bm25_quality_scripts.{json,md}`` with the command line.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ragspine_pipeline.eval.beir import load_beir  # noqa: E402
from ragspine_pipeline.eval.metrics import mean_metrics  # noqa: E402
from ragspine_pipeline.eval.runner import EvalConfig, evaluate_dataset  # noqa: E402
from ragspine_pipeline.retrieval.lexical.analysis.analyzer import make_analyzer  # noqa: E402
from ragspine_pipeline.retrieval.lexical.index.bm25 import BM25Index, bm25_scores  # noqa: E402

SHARED_EVAL = ROOT.parent / "shared" / "eval"
RESULTS = ROOT / "benchmarks" / "results"
K1, B = 1.5, 0.75
# The language of each set (its documents' ``language`` metadata in the "metadata" run).
SET_LANGUAGES = {"scifact": "en", "cranfield": "en", "cmrc2018-trial": "zh", "xquad-de": "de",
                 "xquad-ru": "ru", "xquad-ar": "ar", "xquad-th": "th"}


def available_sets() -> list[str]:
    return sorted(p.name for p in SHARED_EVAL.iterdir() if (p / "corpus.jsonl").exists()) if SHARED_EVAL.is_dir() else []


def load_set(name: str, max_queries: int | None = None):
    ds = load_beir(SHARED_EVAL / name)
    doc_ids = list(ds.corpus)
    texts = [f"{ds.corpus[d].title}\n\n{ds.corpus[d].text}" if ds.corpus[d].title else ds.corpus[d].text
             for d in doc_ids]
    qids = ds.judged_queries[:max_queries] if max_queries else ds.judged_queries
    return ds, doc_ids, texts, qids


def index_metrics(ds, doc_ids, qids, docs_tokens, query_tokens) -> dict:
    """nDCG@10 etc. of our BM25 index over given token lists."""
    idx = BM25Index(docs_tokens, k1=K1, b=B)
    runs = {}
    for q, qt in zip(qids, query_tokens, strict=True):
        hits = idx.search(qt, k=100)
        runs[q] = [doc_ids[i] for i in hits.ids]
    return mean_metrics(runs, {q: ds.qrels[q] for q in qids})


def reference_check(docs_tokens, query_tokens, n: int = 5) -> float:
    """Max |index - reference| score over the first ``n`` queries (whole corpus)."""
    idx = BM25Index(docs_tokens, k1=K1, b=B)
    worst = 0.0
    for qt in query_tokens[:n]:
        ref = np.asarray(bm25_scores(qt, docs_tokens, K1, B))
        got = np.asarray(idx.get_scores(qt))
        worst = max(worst, float(np.max(np.abs(ref - got))) if len(ref) else 0.0)
    return worst


def bm25s_default(ds, doc_ids, texts, qids) -> tuple[dict, list[list[str]]]:
    import bm25s

    corpus = bm25s.tokenize(texts, show_progress=False)
    model = bm25s.BM25(method="lucene", k1=K1, b=B)
    model.index(corpus, show_progress=False)
    qtok = bm25s.tokenize([ds.queries[q] for q in qids], show_progress=False, return_ids=False)
    vocab = corpus.vocab
    runs = {}
    k = min(100, len(doc_ids))
    for q, toks in zip(qids, qtok, strict=True):
        ids = [vocab[t] for t in toks if t in vocab]
        if not ids:
            runs[q] = []
            continue
        res, _scores = model.retrieve([ids], k=k, show_progress=False, n_threads=1)
        runs[q] = [doc_ids[i] for i in res[0]]
    return mean_metrics(runs, {q: ds.qrels[q] for q in qids}), [list(t) for t in qtok]


def throughput(fn, texts: list[str], repeats: int = 3) -> tuple[float, int]:
    """(tokens per CPU second, tokens) of ``fn(texts) -> token lists``, best of ``repeats``.

    CPU time of this process, not wall time: the benchmark machine is shared.
    """
    best, n_tok = float("inf"), 0
    for _ in range(repeats):
        t0 = time.process_time()
        out = fn(texts)
        dt = time.process_time() - t0
        best = min(best, dt)
        n_tok = sum(len(t) for t in out)
    return (n_tok / best if best else 0.0), n_tok


def bench_set(name: str, max_queries: int | None, skip_product: bool) -> dict:
    import bm25s

    ds, doc_ids, texts, qids = load_set(name, max_queries)
    queries = [ds.queries[q] for q in qids]
    lang = SET_LANGUAGES.get(name)
    row: dict = {"set": name, "language": lang, "docs": len(doc_ids), "queries": len(qids), "ndcg@10": {},
                 "recall@100": {}, "mrr@10": {}, "analyzer": {}, "tokens_per_s": {}}

    def put(col: str, m: dict, analyzer: str) -> None:
        row["ndcg@10"][col], row["recall@100"][col], row["mrr@10"][col] = m["ndcg@10"], m["recall@100"], m["mrr@10"]
        row["analyzer"][col] = analyzer

    default = make_analyzer("unicode")
    if not skip_product:
        res = evaluate_dataset(str(SHARED_EVAL / name), EvalConfig(analyzer=default.name, limit=max_queries,
                                                                    progress=False))
        put("ragspine", res, res["analyzer"])
    docs_tok = [default(t) for t in texts]
    q_tok = [default(q) for q in queries]
    put("ragspine index", index_metrics(ds, doc_ids, qids, docs_tok, q_tok), default.name)
    row["max_abs_diff_vs_reference"] = reference_check(docs_tok, q_tok)
    eng = make_analyzer("english")
    put("ragspine english", index_metrics(ds, doc_ids, qids, [eng(t) for t in texts], [eng(q) for q in queries]),
        eng.name)
    from ragspine_pipeline.retrieval.lexical.analysis.analyzer import resolve_language

    snow = resolve_language(lang) if lang else None
    if snow is not None:
        pinned = make_analyzer(f"unicode:{snow}")
        put("ragspine pinned", index_metrics(ds, doc_ids, qids, [pinned(t) for t in texts],
                                             [pinned(q) for q in queries]), pinned.name)
        put("ragspine metadata", index_metrics(ds, doc_ids, qids, [default.analyze(t, lang) for t in texts],
                                               [default.analyze_query(q, [lang]) for q in queries]),
            f"{default.name} + language={lang}")
    m, _ = bm25s_default(ds, doc_ids, texts, qids)
    put("bm25s default", m, "bm25s.tokenize defaults")
    tp = row["tokens_per_s"]
    tp["ragspine (unicode)"], n1 = throughput(lambda ts: [default(t) for t in ts], texts)
    tp["ragspine english"], _ = throughput(lambda ts: [eng(t) for t in ts], texts)
    tp["bm25s.tokenize"], n2 = throughput(
        lambda ts: bm25s.tokenize(ts, show_progress=False, return_ids=False), texts)
    stem_lang = default.language_rule(lang).get(_main_script(default, texts))
    if stem_lang:
        import Stemmer

        stemmer = Stemmer.Stemmer(stem_lang)
        tp["bm25s.tokenize + stemmer"], _ = throughput(
            lambda ts: bm25s.tokenize(ts, stemmer=stemmer, show_progress=False, return_ids=False), texts)
        row["bm25s_stemmer"] = stem_lang
    row["tokens"] = {"ragspine (unicode)": n1, "bm25s.tokenize": n2}
    row["throughput_ratio_vs_bm25s"] = tp["ragspine (unicode)"] / tp["bm25s.tokenize"] if tp["bm25s.tokenize"] else None
    return row


def _main_script(analyzer, texts: list[str]) -> str:
    """The kind of most word runs of a corpus sample (which stemmer bm25s gets)."""
    from collections import Counter

    from ragspine_pipeline.retrieval.lexical.analysis.analyzer import unicode_runs

    kinds = Counter(kind for t in texts[:200] for _run, kind in unicode_runs(t))
    return kinds.most_common(1)[0][0] if kinds else "latin"


COLUMNS = ("ragspine", "ragspine index", "ragspine pinned", "ragspine metadata", "ragspine english", "bm25s default")


def _f(x, nd: int = 4) -> str:
    return "—" if x is None else f"{x:.{nd}f}"


def report(rows: list[dict], cmd: str) -> str:
    lines = ["# BM25 quality per script\n", f"Command: `{cmd}`  ",
             f"Machine: {os.cpu_count()} cores, Python {platform.python_version()}, {time.strftime('%Y-%m-%d %H:%M %Z')}  ",
             f"BM25 k1={K1}, b={B}; nDCG@10 (Recall@100 in the JSON). `ragspine` = the default `unicode` analyzer "
             "through `evaluate_dataset` (product path); `index` = same tokens on the BM25 index directly; "
             "`pinned` = `unicode:<set language>`; `metadata` = documents with `language` metadata, queries "
             "stemmed in the rule's and the documents' languages; `english` = the previous default; "
             "`bm25s default` = `bm25s.tokenize` defaults + `BM25(method='lucene')`.\n",
             "| set | " + " | ".join(COLUMNS) + " | ragspine − bm25s |", "|---|" + "---|" * (len(COLUMNS) + 1)]
    for r in rows:
        n = r["ndcg@10"]
        best = n.get("ragspine", n.get("ragspine index"))
        delta = None if best is None or "bm25s default" not in n else best - n["bm25s default"]
        lines.append(f"| {r['set']} | " + " | ".join(_f(n.get(c)) for c in COLUMNS) + f" | {_f(delta, 3)} |")
    lines += ["", "Tokenization throughput on each set's corpus (tokens per CPU second, best of 3, one thread):\n",
              "| set | ragspine unicode | ragspine english | bm25s.tokenize (no stemmer) | bm25s.tokenize + Snowball "
              "stemmer | unicode ÷ bm25s | unicode ÷ bm25s + stemmer | index vs reference max abs diff |",
              "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        t = r["tokens_per_s"]
        st = t.get("bm25s.tokenize + stemmer")
        st_cell = "—" if st is None else f"{st:,.0f} ({r['bm25s_stemmer']})"
        lines.append(f"| {r['set']} | {t['ragspine (unicode)']:,.0f} | {t['ragspine english']:,.0f} | "
                     f"{t['bm25s.tokenize']:,.0f} | {st_cell} | "
                     f"{_f(r['throughput_ratio_vs_bm25s'], 2)} | {_f(t['ragspine (unicode)'] / st if st else None, 2)} | "
                     f"{r['max_abs_diff_vs_reference']:.1e} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sets", default=",".join(available_sets()))
    ap.add_argument("--max-queries", type=int, default=None)
    ap.add_argument("--skip-product", action="store_true", help="index-only (no evaluate_dataset run)")
    ap.add_argument("--out", default=str(RESULTS / "bm25_quality_scripts"), help="output path without suffix")
    args = ap.parse_args()
    rows = []
    for name in [s for s in args.sets.split(",") if s]:
        t0 = time.perf_counter()
        rows.append(bench_set(name, args.max_queries, args.skip_product))
        rows[-1]["seconds"] = round(time.perf_counter() - t0, 1)
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    cmd = "python benchmarks/bench_quality.py " + " ".join(sys.argv[1:])
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps({"command": cmd, "k1": K1, "b": B, "rows": rows}, indent=2))
    md = report(rows, cmd)
    out.with_suffix(".md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
