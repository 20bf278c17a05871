"""BM25 benchmarks: the index against the plain reference, and against peers, in one run.

    python benchmarks/bench_bm25.py reference            # index vs bm25_scores (spine issue)
    python benchmarks/bench_bm25.py peers                # vs bm25s and rank-bm25 (eval issue)
    python benchmarks/bench_bm25.py peers --sizes 10000,100000   # fewer synthetic sizes

Peers come from the ``[bench]`` extra only (``pip install -e '.[bench]'``). Every engine
is fed the same token lists (our analyzer's output) with the same k1 and b; bm25s is also
run with its own English analyzer. Each (engine, corpus) runs in its own subprocess so
build memory is a real resident-set peak (VmHWM, reset before the build). Results are
ratios to bm25s: absolute times on shared machines are noise.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.common import add_io_args, data_root, out_dir, require_sets, say_written, use_data  # noqa: E402
from ragspine_pipeline.eval.beir import load_beir  # noqa: E402
from ragspine_pipeline.eval.metrics import mean_metrics  # noqa: E402
from ragspine_pipeline.retrieval.lexical.analyzer import make_analyzer  # noqa: E402
from ragspine_pipeline.retrieval.lexical.bm25 import BM25Index, bm25_scores  # noqa: E402

SHARED_EVAL = data_root()  # --data / RAGSPINE_BENCH_DATA (workers inherit it)
RESULTS = ROOT / "benchmarks" / "out"  # set from --out in main()
CACHE = ROOT / "benchmarks" / ".cache"
SETS = ("scifact", "cranfield", "cmrc2018-trial")
K1, B = 1.5, 0.75
START = time.time()


# --------------------------------------------------------------------------- memory
def _rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def _hwm_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return 0


def _reset_peak() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


# --------------------------------------------------------------------------- corpora
def eval_corpus(name: str, analyzer: str = "english"):
    ds = load_beir(SHARED_EVAL / name)
    an = make_analyzer(analyzer)
    doc_ids = list(ds.corpus)
    texts = [f"{ds.corpus[d].title}\n\n{ds.corpus[d].text}" for d in doc_ids]
    qids = ds.judged_queries
    return ds, doc_ids, texts, [an(t) for t in texts], qids, [an(ds.queries[q]) for q in qids]


def synthetic_corpus(n_docs: int, seed: int = 7):
    """Zipf-distributed vocabulary (s=1.1, 200k terms), Poisson(60) lengths; cached as npz."""
    CACHE.mkdir(parents=True, exist_ok=True)
    path = CACHE / f"synthetic_{n_docs}_{seed}.npz"
    if not path.exists():
        rng = np.random.default_rng(seed)
        v = 200_000
        p = 1.0 / np.arange(1, v + 1) ** 1.1
        p /= p.sum()
        lens = np.maximum(rng.poisson(60, n_docs), 1)
        toks = rng.choice(v, size=int(lens.sum()), p=p).astype(np.int32)
        q_lens = rng.integers(2, 6, 200)
        # Queries mix head and tail terms, like real keyword queries.
        q_toks = np.concatenate([rng.choice(v, size=n, p=p) for n in q_lens]).astype(np.int32)
        np.savez(path, lens=lens, toks=toks, q_lens=q_lens, q_toks=q_toks)
    z = np.load(path)
    vocab = [f"w{i}" for i in range(200_000)]

    def split(lens, toks):
        out, pos = [], 0
        flat = [vocab[t] for t in toks.tolist()]
        for n in lens.tolist():
            out.append(flat[pos:pos + n])
            pos += n
        return out

    return split(z["lens"], z["toks"]), split(z["q_lens"], z["q_toks"])


# --------------------------------------------------------------------------- engines
def _build(engine: str, docs):
    if engine == "ragspine":
        return BM25Index(docs, k1=K1, b=B)
    if engine.startswith("bm25s"):
        import bm25s

        r = bm25s.BM25(k1=K1, b=B, method="lucene")
        r.index(docs, show_progress=False)
        return r
    if engine == "rank_bm25":
        from rank_bm25 import BM25Okapi

        # epsilon=0 floor is irrelevant: our idf is always positive, rank-bm25's can be
        # negative; BM25Okapi is the closest Okapi variant it has.
        return BM25Okapi(docs, k1=K1, b=B)
    raise ValueError(engine)


def _query_fn(engine: str, idx, n_docs: int, k: int):
    if engine == "ragspine":
        return lambda q: idx.search(q, k=k).ids.tolist()
    if engine.startswith("bm25s"):
        kk = min(k, n_docs)

        def run(q):
            if not q:
                return []
            res, sc = idx.retrieve([q], k=kk, show_progress=False, n_threads=1)
            return [int(d) for d, s in zip(res[0], sc[0], strict=True) if s > 0]
        return run
    if engine == "rank_bm25":
        def run(q):
            s = idx.get_scores(q)
            top = np.argsort(-s, kind="stable")[:k]
            return [int(i) for i in top if s[i] > 0]
        return run
    raise ValueError(engine)


def _bm25s_batch(idx, queries, k, n_docs):
    # bm25s's placeholder empty token fails its own id check; empty queries match nothing.
    qs = [q for q in queries if q]
    t0 = time.perf_counter()
    idx.retrieve(qs, k=min(k, n_docs), show_progress=False, n_threads=1)
    return time.perf_counter() - t0


def worker(spec: dict) -> dict:
    """One engine on one corpus, in a fresh process."""
    engine, corpus = spec["engine"], spec["corpus"]
    if corpus.startswith("synthetic:"):
        docs, queries = synthetic_corpus(int(corpus.split(":")[1]))
        ds = doc_ids = qids = None
    else:
        analyzer = "bm25s-default" if engine == "bm25s_default_analyzer" else spec.get("analyzer", "english")
        if analyzer == "bm25s-default":
            import bm25s
            import Stemmer

            ds = load_beir(SHARED_EVAL / corpus)
            doc_ids = list(ds.corpus)
            texts = [f"{ds.corpus[d].title}\n\n{ds.corpus[d].text}" for d in doc_ids]
            qids = ds.judged_queries
            stem = Stemmer.Stemmer("english")
            tok = bm25s.tokenize(texts, stopwords="en", stemmer=stem, show_progress=False, return_ids=False)
            docs = [list(t) for t in tok]
            queries = [list(t) for t in bm25s.tokenize([ds.queries[q] for q in qids], stopwords="en",
                                                        stemmer=stem, show_progress=False, return_ids=False)]
        else:
            ds, doc_ids, _texts, docs, qids, queries = eval_corpus(corpus, analyzer)
    max_q = spec.get("max_queries")
    if max_q:
        queries = queries[:max_q]
        if qids is not None:
            qids = qids[:max_q]
    n = len(docs)
    reset_ok = _reset_peak()
    base = _rss_kib()
    t0 = time.perf_counter()
    idx = _build(engine, docs)
    build_s = time.perf_counter() - t0
    peak_build = _hwm_kib() - base if reset_ok else None
    resident = _rss_kib() - base
    k = 100 if ds is not None else 10
    if engine.startswith("bm25s"):
        # bm25s maps raw strings to ids and rejects unknown ones; drop them up front, as
        # bm25s.tokenize does against an index vocabulary (not timed).
        vocab = idx.vocab_dict
        queries = [[t for t in qt if t in vocab] for qt in queries]
    q = _query_fn(engine, idx, n, k)
    for warm in queries[:3]:
        q(warm)
    lat, runs = [], {}
    t_all = time.perf_counter()
    for i, qt in enumerate(queries):
        t1 = time.perf_counter()
        ranked = q(qt)
        lat.append(time.perf_counter() - t1)
        if ds is not None:
            runs[qids[i]] = [doc_ids[j] for j in ranked]
    total = time.perf_counter() - t_all
    out = {
        "engine": engine, "corpus": corpus, "docs": n, "queries": len(queries),
        "tokens": int(sum(len(d) for d in docs)),
        "build_s": build_s, "query_total_s": total, "qps": len(queries) / total if total else None,
        "p50_ms": 1000 * statistics.median(lat), "p95_ms": 1000 * float(np.percentile(lat, 95)),
        "peak_build_mib": None if peak_build is None else peak_build / 1024, "resident_mib": resident / 1024,
    }
    if engine.startswith("bm25s"):
        bt = _bm25s_batch(idx, queries, 10, n)
        out["batch_qps"] = len(queries) / bt if bt else None
    if ds is not None:
        out.update(mean_metrics(runs, {qq: ds.qrels[qq] for qq in qids}))
    return out


def run_worker(spec: dict, timeout: int = 1800) -> dict:
    p = subprocess.run([sys.executable, __file__, "_worker", json.dumps(spec)], capture_output=True,
                       text=True, timeout=timeout)
    if p.returncode != 0:
        return {**spec, "error": p.stderr.strip().splitlines()[-1] if p.stderr.strip() else f"rc={p.returncode}"}
    return json.loads(p.stdout.strip().splitlines()[-1])


# --------------------------------------------------------------------------- reports
def machine() -> dict:
    return {"cpu_count": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform(),
            "numpy": np.__version__, "date": time.strftime("%Y-%m-%d %H:%M:%S %Z")}


def _f(x, nd=3):
    return "—" if x is None else (f"{x:.{nd}f}" if isinstance(x, float) else str(x))


def peers(args) -> None:
    sizes = [int(s) for s in args.sizes.split(",") if s]
    engines_eval = ["ragspine", "bm25s", "bm25s_default_analyzer", "rank_bm25"]
    rows = []
    for name in args.sets.split(","):
        if not name:
            continue
        for eng in engines_eval:
            spec = {"engine": eng, "corpus": name}
            r = run_worker(spec)
            rows.append(r)
            print(json.dumps(r), file=sys.stderr, flush=True)
    for n in sizes:
        for eng in ("ragspine", "bm25s", "rank_bm25"):
            if eng == "rank_bm25" and n > args.rank_bm25_max:
                continue
            spec = {"engine": eng, "corpus": f"synthetic:{n}",
                    "max_queries": 50 if eng == "rank_bm25" else None}
            r = run_worker(spec)
            rows.append(r)
            print(json.dumps(r), file=sys.stderr, flush=True)
    by = {(r["corpus"], r["engine"]): r for r in rows}
    for r in rows:
        ref = by.get((r["corpus"], "bm25s"))
        if ref and "error" not in r and "error" not in ref:
            r["ratio_vs_bm25s"] = {
                "qps": r["qps"] / ref["qps"],
                "qps_vs_bm25s_batch": r["qps"] / ref["batch_qps"] if ref.get("batch_qps") else None,
                "build_time": r["build_s"] / ref["build_s"],
                "peak_build_mem": (r["peak_build_mib"] / ref["peak_build_mib"]
                                   if r.get("peak_build_mib") and ref.get("peak_build_mib") else None),
                "resident_mem": (r["resident_mib"] / ref["resident_mib"] if ref["resident_mib"] > 0 else None),
                "ndcg@10": (r["ndcg@10"] / ref["ndcg@10"] if "ndcg@10" in r and ref.get("ndcg@10") else None),
            }
    cmd = "python benchmarks/bench_bm25.py " + " ".join(sys.argv[1:])
    report = {"command": cmd, "machine": machine(), "k1": K1, "b": B, "rows": rows}
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "bm25_peers.json").write_text(json.dumps(report, indent=2))
    lines = ["# BM25 peer benchmark\n", f"Command: `{cmd}`  ", f"Machine: {report['machine']}  ",
             f"k1={K1}, b={B}; ragspine, bm25s and rank_bm25 get the same tokens (ragspine 'english' analyzer); "
             "bm25s_default_analyzer tokenizes with bm25s's own English stemmer + stop words.\n",
             "| corpus | engine | docs | nDCG@10 | R@100 | build s | qps | p50 ms | p95 ms | peak build MiB | "
             "qps / bm25s | qps / bm25s batch | build / bm25s | peak mem / bm25s |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['corpus']} | {r['engine']} | error: {r['error']} |")
            continue
        ra = r.get("ratio_vs_bm25s", {})
        lines.append(
            f"| {r['corpus']} | {r['engine']} | {r['docs']} | {_f(r.get('ndcg@10'), 4)} | {_f(r.get('recall@100'), 4)} | "
            f"{_f(r['build_s'])} | {_f(r['qps'], 1)} | {_f(r['p50_ms'])} | {_f(r['p95_ms'])} | "
            f"{_f(r['peak_build_mib'], 1)} | {_f(ra.get('qps'), 2)} | {_f(ra.get('qps_vs_bm25s_batch'), 2)} | "
            f"{_f(ra.get('build_time'), 2)} | {_f(ra.get('peak_build_mem'), 2)} |")
    (RESULTS / "bm25_peers.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    plot(rows)


def plot(rows) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("(matplotlib not installed: no plot)", file=sys.stderr)
        return
    fig, ax = plt.subplots(figsize=(6.4, 4.2), dpi=110)
    for eng, style in (("ragspine", "o-"), ("bm25s", "s--"), ("rank_bm25", "^:")):
        pts = sorted((r["docs"], r["p50_ms"]) for r in rows
                     if r.get("engine") == eng and str(r.get("corpus", "")).startswith("synthetic") and "error" not in r)
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], style, label=eng)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("corpus size (chunks)")
    ax.set_ylabel("p50 query latency (ms)")
    ax.set_title("BM25 query latency vs corpus size (2 cores, 1 thread)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(RESULTS / "bm25_latency_vs_size.png")


def reference(args) -> None:
    """Index vs the plain reference scorer: latency ratio and max score difference."""
    from ragspine_pipeline.corpus import DEMO_ROOT, list_libraries, load_library

    corpora = []
    an = make_analyzer("english")
    demo_docs = []
    for lib in list_libraries(DEMO_ROOT):
        demo_docs += load_library(DEMO_ROOT / lib)[0]
    golden = json.loads((DEMO_ROOT / "golden_queries.json").read_text(encoding="utf-8"))
    corpora.append(("demo", [an(d.text) for d in demo_docs], [an(g["query"]) for g in golden] * 5))
    for name in args.sets.split(","):
        if name:
            _ds, _ids, _t, docs, _q, queries = eval_corpus(name)
            corpora.append((name, docs, queries[: args.reference_queries]))
    rows = []
    for name, docs, queries in corpora:
        idx = BM25Index(docs, k1=K1, b=B)
        t0 = time.perf_counter()
        for q in queries:
            idx.get_scores(q)
        t_idx = time.perf_counter() - t0
        t0 = time.perf_counter()
        ref = [bm25_scores(q, docs, k1=K1, b=B) for q in queries]
        t_ref = time.perf_counter() - t0
        diff = max(float(np.max(np.abs(idx.get_scores(q) - np.asarray(r)))) if len(r) else 0.0
                   for q, r in zip(queries, ref, strict=True))
        rows.append({"corpus": name, "docs": len(docs), "queries": len(queries),
                     "index_ms_per_query": 1000 * t_idx / len(queries),
                     "reference_ms_per_query": 1000 * t_ref / len(queries),
                     "speedup": t_ref / t_idx, "max_abs_score_diff": diff})
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    cmd = "python benchmarks/bench_bm25.py " + " ".join(sys.argv[1:])
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "bm25_reference.json").write_text(json.dumps({"command": cmd, "machine": machine(), "rows": rows}, indent=2))
    lines = ["# BM25 index vs plain reference (`bm25_scores`)\n", f"Command: `{cmd}`  ", f"Machine: {machine()}\n",
             "| corpus | docs | queries | index ms/query | reference ms/query | speedup | max abs score diff |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['corpus']} | {r['docs']} | {r['queries']} | {r['index_ms_per_query']:.3f} | "
                     f"{r['reference_ms_per_query']:.2f} | {r['speedup']:.0f}× | {r['max_abs_score_diff']:.1e} |")
    (RESULTS / "bm25_reference.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def main() -> None:
    if len(sys.argv) >= 2 and sys.argv[1] == "_worker":
        print(json.dumps(worker(json.loads(sys.argv[2]))))
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("reference")
    r.add_argument("--sets", default=",".join(SETS))
    r.add_argument("--reference-queries", type=int, default=60)
    add_io_args(r)
    r.set_defaults(func=reference)
    p = sub.add_parser("peers")
    p.add_argument("--sets", default=",".join(SETS))
    p.add_argument("--sizes", default="10000,100000,1000000")
    p.add_argument("--rank-bm25-max", type=int, default=100_000)
    add_io_args(p)
    p.set_defaults(func=peers)
    args = ap.parse_args()
    global SHARED_EVAL, RESULTS
    SHARED_EVAL = use_data(args.data)
    require_sets(SHARED_EVAL, [s for s in args.sets.split(",") if s])
    RESULTS = out_dir(args.out)
    args.func(args)
    say_written(sorted(p for p in RESULTS.glob("bm25_*") if p.stat().st_mtime >= START))


if __name__ == "__main__":
    main()
