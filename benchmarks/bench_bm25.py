"""BM25 benchmarks: the index against the plain reference, and against peers, in one run.

    python benchmarks/bench_bm25.py reference            # index vs bm25_scores (spine issue)
    python benchmarks/bench_bm25.py peers                # vs bm25s (numpy, numba) and tantivy
    python benchmarks/bench_bm25.py peers --sizes 10000,100000   # fewer synthetic sizes

Peers come from the ``[bench]`` extra only (``pip install -e '.[bench]'``). Every engine
is fed the same token lists (our analyzer's output), the same queries (empty ones
skipped) and the same k, with the same k1 and b (tantivy's fixed k1=1.2: those rows run
ragspine at 1.2 too). Each peer runs at its documented defaults and in its fastest mode
(bm25s: numpy and numba backends, default n_threads; batched at n_threads 0 and -1).
Lucene runs at the same k1 and b when a JDK 21+ and Anserini's fat jar are found
(``RAGSPINE_JAVA`` / ``RAGSPINE_ANSERINI_JAR``, else a ``java`` >= 21 on PATH or under
/usr/lib/jvm and the jar inside an installed pyserini): ``benchmarks/lucene/LuceneBench.java``
indexes the same tokens and times Lucene's own search loop after a JIT warm-up.
Imports and first-call JIT are timed apart from build and queries. Each (engine, corpus)
runs in its own subprocess (``nice -n 5``) so build memory is a real resident-set peak
(VmHWM, reset before the build). Results are ratios to the best peer per row.
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
# Each engine: (label, k1). "ragspine" runs at the row's k1; tantivy's BM25 is fixed at
# k1=1.2, b=0.75, so its rows (k1=1.2) also run ragspine at 1.2.
ENGINES_MAIN = ("ragspine", "bm25s_numpy", "bm25s_numba")
ENGINES_TANTIVY = ("ragspine", "tantivy")
TANTIVY_K1 = 1.2
FILTER_FRACTIONS = (0.5, 0.05, 0.001)


def _import_engine(engine: str):
    """Import (and for ragspine, load the compiled kernels) outside the timed build."""
    if engine == "ragspine":
        from ragspine_pipeline.retrieval.lexical import bm25_kernel

        return bm25_kernel.load_kernels()
    if engine.startswith("bm25s"):
        import bm25s

        return bm25s
    if engine == "tantivy":
        import tantivy

        return tantivy
    raise ValueError(engine)


def _java_major(java: str) -> int:
    """Major version of a java binary (0 when it does not run or says something odd)."""
    try:
        return int(_java_version(java).split('"')[1].split(".")[0])
    except (IndexError, ValueError):
        return 0


def lucene_setup() -> tuple[str, str] | str:
    """(java, fat jar) for the Lucene row, or why it is skipped."""
    import glob
    import shutil

    javas = [os.environ["RAGSPINE_JAVA"]] if os.environ.get("RAGSPINE_JAVA") else (
        [j for j in [shutil.which("java")] if j] + sorted(glob.glob("/usr/lib/jvm/*/bin/java"), reverse=True))
    java = next((j for j in javas if _java_major(j) >= 21), None)
    if java is None:
        return "skipped: needs a JDK 21+ (found: " + _java_version() + ")"
    jar = os.environ.get("RAGSPINE_ANSERINI_JAR")
    if not jar:
        import site

        found = [p for d in site.getsitepackages() for p in glob.glob(f"{d}/pyserini/resources/jars/anserini-*-fatjar.jar")]
        jar = found[0] if found else None
    if not jar or not Path(jar).is_file():
        return ("skipped: needs Anserini's fat jar (RAGSPINE_ANSERINI_JAR; it sits in the pyserini sdist at "
                "pyserini/resources/jars/)")
    return java, jar


def _lucene_worker(spec: dict, docs, queries) -> dict:
    """Lucene's own index + search loop in a JVM (see LuceneBench.java), same tokens and k."""
    import tempfile

    java, jar = spec["lucene"]
    javac = str(Path(java).with_name("javac"))
    with tempfile.TemporaryDirectory(prefix="lucene_bench_") as tmp:
        t = Path(tmp)
        subprocess.run([javac, "-nowarn", "-cp", jar, "-d", str(t), str(ROOT / "benchmarks/lucene/LuceneBench.java")],
                       check=True, capture_output=True, text=True)
        (t / "docs.txt").write_text("\n".join(" ".join(d) for d in docs) + "\n")
        (t / "queries.txt").write_text("\n".join(" ".join(q) for q in queries) + "\n")
        t0 = time.perf_counter()
        p = subprocess.run([java, "-Xms2g", "-Xmx8g", "-cp", f"{jar}:{t}", "LuceneBench", str(t / "docs.txt"),
                            str(t / "queries.txt"), spec["ids_path"], str(spec["k1"]), str(B), str(min(spec["k"], len(docs)))],
                           check=True, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        out = json.loads(p.stdout.strip().splitlines()[-1])
    return {"engine": "lucene", "corpus": spec["corpus"], "k1": float(spec["k1"]), "b": B, "k": min(spec["k"], len(docs)),
            "docs": len(docs), "queries": len(queries), "tokens": int(sum(len(d) for d in docs)),
            "import_s": None, "warmup_s": out["warmup_s"], "build_s": out["build_s"], "qps": out["qps"],
            "p50_ms": out["p50_ms"], "p95_ms": out["p95_ms"], "peak_build_mib": None, "resident_mib": None,
            "jvm_wall_s": wall}


def _build(engine: str, docs, k1: float):
    if engine == "ragspine":
        return BM25Index(docs, k1=k1, b=B)
    if engine.startswith("bm25s"):
        import bm25s

        backend = "numba" if engine == "bm25s_numba" else "numpy"
        r = bm25s.BM25(k1=k1, b=B, method="lucene", backend=backend)
        r.index(docs, show_progress=False)
        return r
    if engine == "tantivy":
        import tantivy

        sb = tantivy.SchemaBuilder()
        sb.add_text_field("body", tokenizer_name="whitespace", index_option="freq")
        sb.add_unsigned_field("id", stored=True)
        schema = sb.build()
        ix = tantivy.Index(schema)
        w = ix.writer(heap_size=200_000_000, num_threads=1)
        for i, d in enumerate(docs):
            w.add_document(tantivy.Document(body=" ".join(d), id=i))
        w.commit()
        w.wait_merging_threads()
        ix.reload()
        return (ix, schema)
    raise ValueError(engine)


def _single_fn(engine: str, idx, k: int):
    """One query -> an opaque result (converted to doc ids outside the timed loop)."""
    if engine == "ragspine":
        return lambda q: idx.search(q, k=k)
    if engine.startswith("bm25s"):
        # bm25s's documented default: n_threads=0 (no pool); numba backend picks its kernel.
        return lambda q: idx.retrieve([q], k=k, show_progress=False)
    if engine == "tantivy":
        import tantivy

        ix, schema = idx
        searcher = ix.searcher()
        occ = tantivy.Occur.Should

        def run(q):
            query = tantivy.Query.boolean_query([(occ, tantivy.Query.term_query(schema, "body", t)) for t in q])
            return searcher.search(query, k, count=False).hits
        return run
    raise ValueError(engine)


def _ids(engine: str, idx, res) -> list[int]:
    if engine == "ragspine":
        return res.ids.tolist()
    if engine.startswith("bm25s"):
        docs, sc = res
        return [int(d) for d, s in zip(docs[0], sc[0], strict=True) if s > 0]
    ix, _schema = idx
    searcher = ix.searcher()
    return [int(searcher.doc(addr)["id"][0]) for _s, addr in res]


def _batch(engine: str, idx, queries, k: int, n_threads: int):
    """One call for all queries; (seconds, ids per query)."""
    if engine == "ragspine":
        # The array form, as bm25s's retrieve returns arrays; lists are made outside the timing.
        t0 = time.perf_counter()
        ids, _sc, cnt = idx.search_batch_arrays(queries, k, threads=n_threads or None)
        dt = time.perf_counter() - t0
        return dt, [row[:c].tolist() for row, c in zip(ids, cnt.tolist(), strict=True)]
    t0 = time.perf_counter()
    docs, sc = idx.retrieve(queries, k=k, show_progress=False, n_threads=n_threads)
    dt = time.perf_counter() - t0
    return dt, [[int(d) for d, s in zip(dr, sr, strict=True) if s > 0] for dr, sr in zip(docs, sc, strict=True)]


def _load(corpus: str):
    if corpus.startswith("synthetic:"):
        docs, queries = synthetic_corpus(int(corpus.split(":")[1]))
        return None, None, docs, None, queries
    ds, doc_ids, _texts, docs, qids, queries = eval_corpus(corpus, "english")
    return ds, doc_ids, docs, qids, queries


def worker(spec: dict) -> dict:
    """One engine on one corpus at one k1, in a fresh process; writes its ranked ids."""
    engine, corpus, k1, k = spec["engine"], spec["corpus"], float(spec["k1"]), int(spec["k"])
    ds, doc_ids, docs, qids, queries = _load(corpus)
    # Every engine gets the same queries: tokens absent from the corpus dropped (bm25s
    # rejects them), queries left empty skipped and not counted.
    vocab = set()
    for d in docs:
        vocab.update(d)
    keep = [i for i, q in enumerate(queries) if any(t in vocab for t in q)]
    queries = [[t for t in queries[i] if t in vocab] for i in keep]
    del vocab
    if engine == "lucene":
        out = _lucene_worker(spec, docs, queries)
        if ds is not None:
            ranked = json.loads(Path(spec["ids_path"]).read_text())
            runs = {qids[i]: [doc_ids[j] for j in r] for i, r in zip(keep, ranked, strict=True)}
            out["ndcg@10"] = mean_metrics(runs, {qids[i]: ds.qrels[qids[i]] for i in keep})["ndcg@10"]
        return out
    t0 = time.perf_counter()
    _import_engine(engine)
    import_s = time.perf_counter() - t0
    n = len(docs)
    reset_ok = _reset_peak()
    base = _rss_kib()
    t0 = time.perf_counter()
    idx = _build(engine, docs, k1)
    build_s = time.perf_counter() - t0
    peak_build = _hwm_kib() - base if reset_ok else None
    resident = _rss_kib() - base
    kk = min(k, n)
    single = _single_fn(engine, idx, kk)
    t0 = time.perf_counter()
    single(queries[0])  # first call: numba JIT for bm25s-numba (reported, not timed below)
    warmup_s = time.perf_counter() - t0
    lat, raw = [], []
    t_all = time.perf_counter()
    for qt in queries:
        t1 = time.perf_counter()
        raw.append(single(qt))
        lat.append(time.perf_counter() - t1)
    total = time.perf_counter() - t_all
    ranked = [_ids(engine, idx, r) for r in raw]
    del raw
    out = {
        "engine": engine, "corpus": corpus, "k1": k1, "b": B, "k": kk, "docs": n, "queries": len(queries),
        "tokens": int(sum(len(d) for d in docs)), "import_s": import_s, "warmup_s": warmup_s,
        "build_s": build_s, "qps": len(queries) / total, "p50_ms": 1000 * statistics.median(lat),
        "p95_ms": 1000 * float(np.percentile(lat, 95)),
        "peak_build_mib": None if peak_build is None else peak_build / 1024, "resident_mib": resident / 1024,
    }
    if engine == "ragspine":
        import copy

        out["kernel"] = idx.kernel
        # The compiled kernel against the numpy path (itself tested against the reference).
        ref = copy.copy(idx)
        ref._kernels = None
        same = 0
        for qt, got in zip(queries[:50], ranked[:50], strict=False):
            r = ref.search(qt, k=kk)
            same += r.ids.tolist() == got
        out["numpy_kernel_identical"] = f"{same}/{min(50, len(queries))}"
    if engine != "tantivy":
        modes = {"ragspine": (0, 1), "bm25s_numpy": (0,), "bm25s_numba": (0, -1)}[engine]
        out["batch"] = {}
        for nt in modes:
            _batch(engine, idx, queries[:2], kk, nt)  # warm-up (numba parallel JIT)
            dt, b_ids = _batch(engine, idx, queries, kk, nt)
            out["batch"][str(nt)] = {"qps": len(queries) / dt, "identical_to_single": b_ids == ranked}
        out["batch_qps"] = max(v["qps"] for v in out["batch"].values())
    if spec.get("filters") and engine in ("ragspine", "bm25s_numba"):
        out["filtered"] = _filtered(engine, idx, queries, kk, n, spec["ids_path"])
    if ds is not None:
        runs = {qids[i]: [doc_ids[j] for j in r] for i, r in zip(keep, ranked, strict=True)}
        out["ndcg@10"] = mean_metrics(runs, {qids[i]: ds.qrels[qids[i]] for i in keep})["ndcg@10"]
    Path(spec["ids_path"]).write_text(json.dumps(ranked))
    return out


def _filtered(engine: str, idx, queries, k: int, n: int, ids_path: str) -> dict:
    """Filtered top-k for filters keeping 50%, 5%, 0.1% of the chunks (fixed random masks)."""
    out = {}
    qs = queries[:100]
    for frac in FILTER_FRACTIONS:
        mask = np.random.default_rng(int(frac * 1e6)).random(n) < frac
        if engine == "ragspine":
            def run(q, mask=mask):
                return idx.search(q, k=k, candidates=mask).ids.tolist()
        else:
            wm = mask.astype(np.float32)

            def run(q, wm=wm):
                docs, sc = idx.retrieve([q], k=k, show_progress=False, weight_mask=wm)
                return [int(d) for d, s in zip(docs[0], sc[0], strict=True) if s > 0]
        run(qs[0])
        lat, ranked = [], []
        for q in qs:
            t1 = time.perf_counter()
            ranked.append(run(q))
            lat.append(time.perf_counter() - t1)
        out[str(frac)] = {"survivors": int(mask.sum()), "queries": len(qs), "p50_ms": 1000 * statistics.median(lat),
                          "mean_ms": 1000 * float(np.mean(lat)), "ids": ranked}
    return out


def run_worker(spec: dict, timeout: int = 3600) -> dict:
    p = subprocess.run(["nice", "-n", "5", sys.executable, __file__, "_worker", json.dumps(spec)],
                       capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        return {**spec, "error": p.stderr.strip().splitlines()[-1] if p.stderr.strip() else f"rc={p.returncode}"}
    return json.loads(p.stdout.strip().splitlines()[-1])


# --------------------------------------------------------------------------- reports
def machine() -> dict:
    import numba

    return {"cpu_count": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform(),
            "numpy": np.__version__, "numba": numba.__version__, "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
            "java": _java_version()}


def _java_version(java: str = "java") -> str:
    try:
        p = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30)
        return (p.stderr or p.stdout).splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        return "none"


def _f(x, nd=3):
    return "—" if x is None else (f"{x:.{nd}f}" if isinstance(x, float) else str(x))


def _overlap(a: list[list[int]], b: list[list[int]]) -> dict:
    same = sum(x == y for x, y in zip(a, b, strict=True))
    ov = [len(set(x) & set(y)) / max(len(y), 1) for x, y in zip(a, b, strict=True)]
    return {"identical_topk": same / max(len(a), 1), "mean_overlap": float(np.mean(ov)) if ov else None}


def _progress(total: int, desc: str):
    """tqdm on stderr, only when stderr is a terminal and --json is off."""
    from ragspine_pipeline.eval.runner import progress_enabled

    if not progress_enabled(json_output=False):
        return None
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, file=sys.stderr, unit="run")


def peers(args) -> None:
    import tempfile

    sizes = [int(s) for s in args.sizes.split(",") if s]
    corpora = [s for s in args.sets.split(",") if s] + [f"synthetic:{n}" for n in sizes]
    lucene = lucene_setup()
    args.lucene_status = lucene if isinstance(lucene, str) else f"Lucene via {Path(lucene[1]).name} on {lucene[0]}"
    plan = []
    for c in corpora:
        plan += [(c, K1, e) for e in ENGINES_MAIN + (("lucene",) if not isinstance(lucene, str) else ())]
        plan += [(c, TANTIVY_K1, e) for e in ENGINES_TANTIVY]
    tmp = Path(tempfile.mkdtemp(prefix="bench_bm25_"))
    rows = []
    bar = _progress(len(plan), "bm25 peers")
    for i, (corpus, k1, eng) in enumerate(plan):
        big = corpus == f"synthetic:{max(sizes)}" if sizes else False
        spec = {"engine": eng, "corpus": corpus, "k1": k1, "k": args.k, "ids_path": str(tmp / f"{i}.json"),
                "filters": bool(big and k1 == K1 and not args.no_filters)}
        if eng == "lucene":
            spec["lucene"] = list(lucene)
        r = run_worker(spec)
        r["_ids_path"] = spec["ids_path"]
        rows.append(r)
        _report(rows, sizes, args, final=False)
        if bar is not None:
            bar.update(1)
            bar.set_postfix_str(f"{corpus} {eng} k1={k1}")
        else:
            print(json.dumps({x: y for x, y in r.items() if x not in ("filtered",)}), file=sys.stderr, flush=True)
    if bar is not None:
        bar.close()
    _report(rows, sizes, args, final=True)


def _report(rows, sizes, args, final: bool) -> None:
    """Write results (also after every worker, so an interrupted run leaves a valid file)."""
    rows = [dict(r) for r in rows]
    for r in rows:
        if r.get("filtered"):
            r["filtered"] = {f: dict(v) for f, v in r["filtered"].items()}
    # Agreement with ragspine's ranking at the same k1 (ragspine = the reference formula).
    ids = {}
    for r in rows:
        if "error" not in r:
            ids[(r["corpus"], r["k1"], r["engine"])] = json.loads(Path(r["_ids_path"]).read_text())
    for r in rows:
        ref = ids.get((r["corpus"], r["k1"], "ragspine"))
        if "error" in r or ref is None:
            continue
        r["agreement_with_reference"] = _overlap(ids[(r["corpus"], r["k1"], r["engine"])], ref)
    # Filtered: bm25s weight_mask keeps global statistics; compare with the spec's semantics.
    filt = {}
    for r in rows:
        if r.get("filtered"):
            filt[r["engine"]] = r
    if "ragspine" in filt and "bm25s_numba" in filt:
        for frac, v in filt["bm25s_numba"]["filtered"].items():
            v["agreement_with_spec"] = _overlap(v["ids"], filt["ragspine"]["filtered"][frac]["ids"])
    for r in rows:
        for v in (r.get("filtered") or {}).values():
            v.pop("ids", None)
        r.pop("_ids_path", None)
    summary = _summary(rows)
    cmd = "python benchmarks/bench_bm25.py " + " ".join(sys.argv[1:])
    report = {"command": cmd, "complete": final, "machine": machine(), "b": B, "k": args.k, "summary": summary, "rows": rows,
              "lucene": getattr(args, "lucene_status", "not run")}
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "bm25_peers.json").write_text(json.dumps(report, indent=2))
    md = _markdown(report)
    (RESULTS / "bm25_peers.md").write_text(md)
    plot(rows)
    if final:
        print(md)



def _summary(rows) -> list[dict]:
    """Per (corpus, k1): ragspine vs the best peer, single-query and batched."""
    out = []
    keys = sorted({(r["corpus"], r["k1"]) for r in rows if "error" not in r}, key=lambda x: (x[1], x[0]))
    for corpus, k1 in keys:
        grp = {r["engine"]: r for r in rows if r.get("corpus") == corpus and r.get("k1") == k1 and "error" not in r}
        ours = grp.get("ragspine")
        peers_ = {e: r for e, r in grp.items() if e != "ragspine"}
        if not ours or not peers_:
            continue
        best_s = max(peers_, key=lambda e: peers_[e]["qps"])
        row = {"corpus": corpus, "k1": k1, "docs": ours["docs"], "queries": ours["queries"],
               "ragspine_qps": ours["qps"], "best_peer_single": best_s, "best_peer_qps": peers_[best_s]["qps"],
               "single_ratio": ours["qps"] / peers_[best_s]["qps"],
               "single_winner": "ragspine" if ours["qps"] >= peers_[best_s]["qps"] else best_s}
        bpeers = {e: r for e, r in peers_.items() if r.get("batch_qps")}
        if bpeers and ours.get("batch_qps"):
            best_b = max(bpeers, key=lambda e: bpeers[e]["batch_qps"])
            row.update({"ragspine_batch_qps": ours["batch_qps"], "best_peer_batch": best_b,
                        "best_peer_batch_qps": bpeers[best_b]["batch_qps"],
                        "batch_ratio": ours["batch_qps"] / bpeers[best_b]["batch_qps"],
                        "batch_winner": "ragspine" if ours["batch_qps"] >= bpeers[best_b]["batch_qps"] else best_b})
        out.append(row)
    return out


def _markdown(report) -> str:
    L = ["# BM25 peer benchmark\n" + ("" if report.get("complete") else "\n(partial: the run was interrupted)\n"),
         f"Command: `{report['command']}`  ", f"Machine: {report['machine']}  ",
         f"b={B}, k={report['k']} for every engine and mode. All engines get the same tokens (ragspine "
         "'english' analyzer); query tokens absent from the corpus are dropped for every engine and queries "
         "left empty are skipped (not counted). Imports (and loading ragspine's compiled kernels) are timed "
         "apart from the build (`import s`); the first query of each engine is timed apart (`warm-up s`: "
         "bm25s-numba's JIT). bm25s runs at its default n_threads=0; its numba backend is its fastest mode. "
         "Batched: one call for all queries returning arrays (ragspine `search_batch_arrays`, bm25s `retrieve`; bm25s-numba "
         "at n_threads=0 and -1, the faster counted). tantivy 0.27 has BM25 fixed at k1=1.2, b=0.75 "
         "(whitespace tokenizer over our tokens, one-byte document lengths), so its rows run ragspine at "
         f"k1=1.2 too. {report['lucene']}.\n",
         "## Winner per row (ragspine / best peer)\n",
         "| corpus | k1 | docs | queries | ragspine qps | best peer | its qps | ratio | winner | "
         "ragspine batch qps | best peer batch | its qps | ratio | winner |",
         "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for s in report["summary"]:
        L.append(f"| {s['corpus']} | {s['k1']} | {s['docs']} | {s['queries']} | {s['ragspine_qps']:.0f} | "
                 f"{s['best_peer_single']} | {s['best_peer_qps']:.0f} | {s['single_ratio']:.2f}× | **{s['single_winner']}** | "
                 f"{_f(s.get('ragspine_batch_qps'), 0)} | {s.get('best_peer_batch', '—')} | "
                 f"{_f(s.get('best_peer_batch_qps'), 0)} | "
                 + (f"{s['batch_ratio']:.2f}× | **{s['batch_winner']}** |" if "batch_ratio" in s else "— | — |"))
    L += ["", "## All rows\n",
          "| corpus | k1 | engine | docs | nDCG@10 | import s | build s | warm-up s | qps | p50 ms | p95 ms | "
          "batch qps | peak build MiB | identical top-k vs ragspine | mean overlap |",
          "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in report["rows"]:
        if "error" in r:
            L.append(f"| {r['corpus']} | {r['k1']} | {r['engine']} | error: {r['error']} |")
            continue
        ag = r.get("agreement_with_reference", {})
        L.append(f"| {r['corpus']} | {r['k1']} | {r['engine']} | {r['docs']} | {_f(r.get('ndcg@10'), 4)} | "
                 f"{_f(r['import_s'], 2)} | {r['build_s']:.2f} | {r['warmup_s']:.3f} | {r['qps']:.0f} | "
                 f"{r['p50_ms']:.3f} | {r['p95_ms']:.3f} | {_f(r.get('batch_qps'), 0)} | "
                 f"{_f(r['peak_build_mib'], 0)} | {_f(ag.get('identical_topk'), 3)} | {_f(ag.get('mean_overlap'), 3)} |")
    frows = [r for r in report["rows"] if r.get("filtered")]
    if frows:
        L += ["", "## Filtered queries (largest synthetic size, k1=1.5)\n",
              "ragspine computes N, df and avgdl over the filter survivors (the spec); bm25s's `weight_mask` "
              "zeroes non-survivors but keeps the whole corpus's statistics, so its ranking can differ: "
              "`identical top-k vs spec` is the share of queries whose top-k equals the spec's.\n",
              "| engine | filter keeps | survivors | p50 ms | mean ms | unfiltered p50 ms | identical top-k vs spec |",
              "|---|---|---|---|---|---|---|"]
        for r in frows:
            for frac, v in r["filtered"].items():
                ag = v.get("agreement_with_spec", {}).get("identical_topk", 1.0 if r["engine"] == "ragspine" else None)
                L.append(f"| {r['engine']} | {float(frac):.1%} | {v['survivors']} | {v['p50_ms']:.3f} | "
                         f"{v['mean_ms']:.3f} | {r['p50_ms']:.3f} | {_f(ag, 3)} |")
    return "\n".join(L) + "\n"


def plot(rows) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("(matplotlib not installed: no plot)", file=sys.stderr)
        return
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), dpi=110)
    syn = [r for r in rows if "error" not in r and str(r.get("corpus", "")).startswith("synthetic")]
    styles = {("ragspine", K1): "o-", ("bm25s_numpy", K1): "s--", ("bm25s_numba", K1): "D--",
              ("lucene", K1): "v-.", ("ragspine", TANTIVY_K1): "o:", ("tantivy", TANTIVY_K1): "^:"}
    for (eng, k1), style in styles.items():
        for ax, key in zip(axes, ("qps", "batch_qps"), strict=True):
            pts = sorted((r["docs"], r[key]) for r in syn if r["engine"] == eng and r["k1"] == k1 and r.get(key))
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], style, label=f"{eng} (k1={k1})")
    winners = {s["corpus"]: s["single_winner"] for s in _summary(rows) if s["k1"] == K1}
    for ax, title in zip(axes, ("single-query", "batched"), strict=True):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("corpus size (chunks)")
        ax.set_ylabel("queries / s")
        ax.set_title(f"BM25 top-{rows[0].get('k', 10)} throughput, {title}")
        ax.grid(True, which="both", alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    fig.suptitle("single-query winners (k1=1.5): " + ", ".join(f"{c.split(':')[-1]}: {w}" for c, w in winners.items()
                                                            if c.startswith("synthetic")), fontsize=9)
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
    p.add_argument("--k", type=int, default=10, help="top-k for every engine and mode (default 10)")
    p.add_argument("--no-filters", action="store_true", help="skip the filtered-query rows")
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
