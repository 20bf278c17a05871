"""BM25 against Lucene on a generated corpus with a ~2M-term vocabulary, per query class (issue 47 item 4).

    python benchmarks/bench_bm25_lucene_vocab.py --sizes 1000000 --seeds 1,2,3
    python benchmarks/bench_bm25_lucene_vocab.py --sizes 3000000 --seeds 1 --passes 2

Why a workload of its own: the synthetic corpus of ``bench_bm25`` has a 200k-term Zipf
vocabulary and Poisson lengths, the one the kernels were tuned on. An independent workload
(~2M terms, lognormal lengths) found a class of queries where the packed layout lost to
Lucene: short queries made only of mid-frequency terms (each in 0.1-10% of the documents).
Here each seed generates its own corpus:

- vocabulary: ``VOCAB`` terms ``w<rank>``, drawn Zipf(``ZIPF_S``) per token (about 1.9M
  distinct terms at 1M documents), document lengths lognormal(``LEN_MU``, ``LEN_SIGMA``),
  clipped to [1, ``LEN_MAX``];
- queries: ``mid`` -- 2-3 distinct terms, each with df in [0.1%, 10%] of N (drawn uniformly
  in log df, so the whole band is covered), and ``mixed`` -- 2-5 distinct Zipf draws, as
  ``bench_bm25``'s queries.

Every engine gets the same tokens: ragspine builds its published file (packed and plain
layouts, ``bm25_stream_build`` over Arrow ``list<string>`` batches), Lucene indexes the same
lines (``LuceneBench build``: DOCS_AND_FREQS, one merged segment) and answers through
``benchmarks/lucene/LuceneClasses.java`` (``RAGSPINE_JAVA`` / ``RAGSPINE_ANSERINI_JAR`` as in
``bench_bm25``). ragspine's top-10 is checked against a numpy reference computed here from
the generated token ids (scores to 1e-9 relative, ids where scores are not tied); Lucene's
one-byte lengths make its lists differ from the exact formula, so only its overlap is shown.

Timing: every query's fastest of ``--rounds`` passes after a warm-up, per engine in its own
process, and the engines run one after the other ``--passes`` times (Lucene, packed, plain,
Lucene, ...), each query keeping its fastest pass: the ratios come from one run,
interleaved, on a shared box. Results are written after every step to
``benchmarks/results/bm25_lucene_vocab.json`` (keyed by seed, size, engine: a stopped run
resumes where it stopped; ``--force`` redoes a key).

First query after open (issue 47 item 4), ``--first-query``: fresh processes, each opening
a built index and answering one query first (run i takes query i of ``FIRST_QUERIES``, both
classes), ``--first-runs`` times per combination of the open (``bare``: ``open_index`` alone,
the CLI's one-shot query; ``served``: then the serving warm-up,
``retrieval.link.assembly_warm.warm_index``, what a serving process runs before it says
ready) and the page cache (``warm``: as the box left it; ``cold``: the file's pages
dropped first, ``posix_fadvise(DONTNEED)``). Written per engine under ``first_query``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.bench_bm25 import (  # noqa: E402
    HEAVY_FROM,
    OURS_AS_CAP,
    _run_measured,
    lucene_setup,
    machine,
    write_token_lines,
)

CACHE = ROOT / "benchmarks" / ".cache" / "lucene_vocab"
RESULTS = ROOT / "benchmarks" / "results"
NAME = "bm25_lucene_vocab"
K1, B, K = 1.5, 0.75, 10
VOCAB = 2_000_000
ZIPF_S = 1.0
LEN_MU, LEN_SIGMA, LEN_MAX = 4.2, 0.9, 4000
GEN_STEP = 10_000_000  # tokens drawn per slice
DOC_STEP = 100_000  # documents per build batch / text slice
MID_DF = (0.001, 0.1)
N_MID, N_MIXED = 50, 100
ENGINES = ("lucene", "packed", "plain")
LUCENE_XMX = "6g"
FIRST_QUERIES = (0, 30, 60, 90, 120, 15, 45, 75, 105, 135)  # mid below N_MID, mixed above


# --------------------------------------------------------------------------- corpus
def _cdf() -> np.ndarray:
    p = 1.0 / np.arange(1, VOCAB + 1, dtype=np.float64) ** ZIPF_S
    c = np.cumsum(p)
    return c / c[-1]


def corpus(n: int, seed: int) -> dict[str, np.ndarray]:
    """lens (int32) and toks (int32 ranks, memory-mapped) of seed's corpus, generated once."""
    folder = CACHE / f"corpus_{n}_{seed}"
    done = folder / "done"
    if not done.exists():
        folder.mkdir(parents=True, exist_ok=True)
        rng = np.random.default_rng(seed)
        lens = np.clip(np.rint(rng.lognormal(LEN_MU, LEN_SIGMA, n)), 1, LEN_MAX).astype(np.int32)
        np.save(folder / "lens.npy", lens)
        total = int(lens.sum(dtype=np.int64))
        cdf = _cdf()
        toks = np.lib.format.open_memmap(folder / "toks.npy", mode="w+", dtype=np.int32, shape=(total,))
        for lo in range(0, total, GEN_STEP):
            hi = min(total, lo + GEN_STEP)
            toks[lo:hi] = np.searchsorted(cdf, rng.random(hi - lo), side="right").clip(0, VOCAB - 1)
        toks.flush()
        del toks
        done.write_text("ok")
    return {"lens": np.load(folder / "lens.npy"), "toks": np.load(folder / "toks.npy", mmap_mode="r")}


def _ends(lens: np.ndarray) -> np.ndarray:
    return np.cumsum(lens, dtype=np.int64)


def arrow_batches(c: dict[str, np.ndarray]):
    """The corpus as Arrow ``list<string>`` batches of DOC_STEP documents (``w<rank>`` tokens).

    The token ids are read from ``toks.npy`` a slice at a time (``pread``), not through its
    memory map: the build's peak RSS is measured on this process, and every page of the
    map read would stay in it (1.2 GB at 3M documents) where Lucene reads its input lines
    through the page cache."""
    import pyarrow as pa

    from ragspine_pipeline.retrieval.lexical.refresh.spill_io import NpyReader

    vocab = pa.array([f"w{i}" for i in range(VOCAB)])
    lens, ends = c["lens"], _ends(c["lens"])
    toks_file = NpyReader(c["toks"].filename)
    for d0 in range(0, len(lens), DOC_STEP):
        d1 = min(len(lens), d0 + DOC_STEP)
        t0 = int(ends[d0 - 1]) if d0 else 0
        toks = toks_file.read(t0, int(ends[d1 - 1]))
        offs = np.concatenate([[0], np.cumsum(lens[d0:d1], dtype=np.int64)]).astype(np.int32)
        yield pa.ListArray.from_arrays(pa.array(offs), vocab.take(pa.array(toks)))


def docs_text(n: int, seed: int, c: dict[str, np.ndarray]) -> Path:
    """Lucene's input: one document per line, tokens separated by one space, written once."""
    path = CACHE / f"corpus_{n}_{seed}" / "docs.txt"
    if path.exists():
        return path
    write_token_lines(path, c["lens"], c["toks"], VOCAB)
    return path


# --------------------------------------------------------------------------- queries and reference
def _df_all(c: dict[str, np.ndarray]) -> np.ndarray:
    """Exact df of every rank (a term counted once per document), in slices of documents."""
    df = np.zeros(VOCAB, np.int64)
    lens, ends = c["lens"], _ends(c["lens"])
    n = len(lens)
    for d0 in range(0, n, DOC_STEP):
        d1 = min(n, d0 + DOC_STEP)
        t0 = int(ends[d0 - 1]) if d0 else 0
        t = np.asarray(c["toks"][t0:int(ends[d1 - 1])]).astype(np.int64)
        doc = np.repeat(np.arange(d0, d1, dtype=np.int64), lens[d0:d1])
        key = np.unique(doc * VOCAB + t)
        df += np.bincount(key % VOCAB, minlength=VOCAB)
    return df


def queries(n: int, seed: int, c: dict[str, np.ndarray]) -> dict:
    """The two classes' queries (term ranks), drawn from seed's own generator, cached."""
    path = CACHE / f"corpus_{n}_{seed}" / "queries.json"
    if path.exists():
        return json.loads(path.read_text())
    df = _df_all(c)
    rng = np.random.default_rng(seed + 10_000)
    lo, hi = MID_DF[0] * n, MID_DF[1] * n
    band = np.flatnonzero((df >= lo) & (df <= hi))
    order = band[np.argsort(df[band], kind="stable")]
    logdf = np.log(df[order])
    mid = []
    while len(mid) < N_MID:
        m = int(rng.integers(2, 4))
        picks = np.searchsorted(logdf, rng.uniform(logdf[0], logdf[-1], m)).clip(0, len(order) - 1)
        q = sorted({int(order[i]) for i in picks})
        if len(q) == m:
            mid.append(q)
    cdf = _cdf()
    mixed = []
    while len(mixed) < N_MIXED:
        m = int(rng.integers(2, 6))
        q = sorted({int(x) for x in np.searchsorted(cdf, rng.random(m), side="right")})
        if len(q) == m and all(df[t] > 0 for t in q):
            mixed.append(q)
    out = {"mid": mid, "mixed": mixed, "df": {str(t): int(df[t]) for q in mid + mixed for t in q},
           "distinct_terms": int((df > 0).sum()), "tokens": int(c["lens"].sum(dtype=np.int64))}
    path.write_text(json.dumps(out))
    return out


def all_queries(qs: dict) -> list[list[str]]:
    return [[f"w{t}" for t in q] for q in qs["mid"] + qs["mixed"]]


def reference(n: int, seed: int, c: dict[str, np.ndarray], qs: dict) -> list[dict]:
    """Exact BM25 top-K of every query by numpy from the token ids (ragspine's formula:
    idf ln(1 + (N - df + .5)/(df + .5)), w = tf (k1+1) / (tf + k1 (1 - b + b len/avgdl))),
    ties by position; cached."""
    path = CACHE / f"corpus_{n}_{seed}" / "reference.json"
    if path.exists():
        return json.loads(path.read_text())
    terms = np.array(sorted({t for q in qs["mid"] + qs["mixed"] for t in q}), np.int64)
    lens, ends = c["lens"], _ends(c["lens"])
    avgdl = float(lens.sum(dtype=np.int64)) / n
    post: dict[int, list[np.ndarray]] = {int(t): [] for t in terms}
    for d0 in range(0, n, DOC_STEP):
        d1 = min(n, d0 + DOC_STEP)
        t0 = int(ends[d0 - 1]) if d0 else 0
        t = np.asarray(c["toks"][t0:int(ends[d1 - 1])]).astype(np.int64)
        hit = np.isin(t, terms)
        doc = np.repeat(np.arange(d0, d1, dtype=np.int64), lens[d0:d1])[hit]
        key, tf = np.unique(t[hit] * n + doc, return_counts=True)
        tid = key // n
        cut = np.flatnonzero(np.diff(tid)) + 1
        for part, f in zip(np.split(key, cut), np.split(tf, cut), strict=True):
            if len(part):
                post[int(part[0] // n)].append(np.stack([part % n, f]))
    post_a = {t: np.concatenate(v, axis=1) if v else np.zeros((2, 0), np.int64) for t, v in post.items()}
    norm = K1 * ((1.0 - B) + B * lens.astype(np.float64) / avgdl)
    out = []
    for q in qs["mid"] + qs["mixed"]:
        acc = np.zeros(n, np.float64)
        for t in q:
            d, f = post_a[t]
            df = len(d)
            idf = np.log1p((n - df + 0.5) / (df + 0.5))
            acc[d] += idf * (f * (K1 + 1.0)) / (f + norm[d])
        top = np.lexsort((np.arange(n), -acc))[:K]
        top = top[acc[top] > 0]
        out.append({"ids": top.tolist(), "scores": acc[top].tolist()})
    path.write_text(json.dumps(out))
    return out


def agrees(ids: list[int], scores: list[float], ref: dict) -> bool:
    """Same scores to 1e-9 (relative) and the same ids, except among tied scores."""
    if len(ids) != len(ref["ids"]):
        return False
    if not np.allclose(scores, ref["scores"], rtol=1e-9, atol=0):
        return False
    rs = np.asarray(ref["scores"])
    for i, (a, b) in enumerate(zip(ids, ref["ids"], strict=True)):
        if a != b and np.sum(np.isclose(rs, rs[i], rtol=1e-12)) < 2:
            return False
    return True


# --------------------------------------------------------------------------- engine steps
def _index_path(n: int, seed: int, layout: str) -> Path:
    return CACHE / f"corpus_{n}_{seed}" / f"ragspine_{layout}.bm25"


def step(spec: dict) -> dict:
    """One ragspine step in a fresh process: ``build`` a layout, or ``query`` it."""
    n, seed, layout = spec["n"], spec["seed"], spec["layout"]
    path = _index_path(n, seed, layout)
    if spec["step"] == "build":
        from ragspine_pipeline.retrieval.lexical.refresh.stream_build import build_index_file

        c = corpus(n, seed)
        t0 = time.perf_counter()
        rep = build_index_file(arrow_batches(c), path, k1=K1, b=B, layout=layout)
        return {"build_s": time.perf_counter() - t0, "index_bytes": path.stat().st_size, "layout": rep.layout,
                "terms": rep.terms, "postings": rep.postings}
    if spec["step"] == "first":
        return first_step(spec, path)
    t0 = time.perf_counter()
    from ragspine_pipeline.retrieval.lexical.index.mapped import open_index
    from ragspine_pipeline.retrieval.lexical.kernels import loader as bm25_kernel

    bm25_kernel.load_kernels(mapped=True)
    import_s = time.perf_counter() - t0
    qs = json.loads(Path(spec["queries"]).read_text())
    t0 = time.perf_counter()
    ix = open_index(path)
    open_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    ix.search(qs[0], k=K)
    first_ms = 1000 * (time.perf_counter() - t0)
    for q in qs:  # warm-up: the page cache
        ix.search(q, k=K)
    best = [float("inf")] * len(qs)
    res = [None] * len(qs)
    for _ in range(spec["rounds"]):
        for i, q in enumerate(qs):
            t1 = time.perf_counter()
            r = ix.search(q, k=K)
            best[i] = min(best[i], time.perf_counter() - t1)
            res[i] = r
    return {"import_and_kernels_s": import_s, "open_s": open_s, "first_query_ms": first_ms,
            "best_ms": [1000 * x for x in best], "ids": [r.ids.tolist() for r in res],
            "scores": [np.asarray(r.scores).tolist() for r in res], "index_class": type(ix).__name__}


def first_step(spec: dict, path: Path) -> dict:
    """One fresh process: the file's pages dropped (``cold``), the index opened, the serving
    warm-up (``served``), then the first query, timed, and the same query again."""
    import os

    if spec["cold"]:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    from ragspine_pipeline.retrieval.lexical.index.mapped import open_index
    from ragspine_pipeline.retrieval.link.assembly_warm import warm_index

    q = json.loads(Path(spec["queries"]).read_text())[spec["query"]]
    t0 = time.perf_counter()
    ix = open_index(path)
    out = {"open_s": time.perf_counter() - t0, "warm_s": None}
    if spec["served"]:
        t0 = time.perf_counter()
        rep = warm_index(ix)
        out.update(warm_s=time.perf_counter() - t0, prefetched_bytes=rep.prefetched_bytes, warm_parts=rep.seconds)
    t0 = time.perf_counter()
    ix.search(q, k=K)
    out["first_query_ms"] = 1000 * (time.perf_counter() - t0)
    t0 = time.perf_counter()
    ix.search(q, k=K)
    out["again_ms"] = 1000 * (time.perf_counter() - t0)
    return out


FIRST_KINDS = [(served, cold) for served in (False, True) for cold in (False, True)]


def first_queries(n: int, seed: int, args, report: dict) -> None:
    """``--first-query``: every built ragspine layout, the four kinds of first query
    interleaved run by run (the same box load for each), saved after each layout."""
    key = f"{n}/{seed}"
    run = report["runs"].setdefault(key, {"n": n, "seed": seed})
    qjson = CACHE / f"corpus_{n}_{seed}" / "queries_tokens.json"
    for eng in (e for e in args.engines if e != "lucene"):
        if not _index_path(n, seed, eng).exists() or not qjson.exists():
            continue
        if run.get("first_query", {}).get(eng) and not args.force:
            continue
        rows: dict[str, list[dict]] = {f"{'served' if sv else 'bare'}/{'cold' if c else 'warm'}": []
                                       for sv, c in FIRST_KINDS}
        for i in range(args.first_runs):
            for sv, c in FIRST_KINDS:
                spec = {"step": "first", "n": n, "seed": seed, "layout": eng, "queries": str(qjson),
                        "query": FIRST_QUERIES[i % len(FIRST_QUERIES)], "served": sv, "cold": c}
                print(f"[{time.strftime('%H:%M:%S')}] {key} first query {eng} run {i} served={sv} cold={c}",
                      flush=True)
                res = _run_measured(_self(spec), heavy=False, cap=OURS_AS_CAP)
                rows[f"{'served' if sv else 'bare'}/{'cold' if c else 'warm'}"].append(res)
        run.setdefault("first_query", {})[eng] = {"measured": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                                                  "machine": machine(), "runs": rows}
        disk = load()  # only this key's first-query figures change (the other runs' commands stay)
        disk["runs"].setdefault(key, {"n": n, "seed": seed})["first_query"] = run["first_query"]
        disk["first_query_command"] = report["first_query_command"] = "python " + " ".join(sys.argv)
        save(disk)


def first_lines(report: dict) -> list[str]:
    """The first-query table (median and worst of the fresh processes per kind)."""
    lines = []
    for key in sorted(report["runs"], key=lambda s: tuple(int(x) for x in s.split("/"))):
        run = report["runs"][key]
        for eng, fq in run.get("first_query", {}).items():
            for kind, rows in fq["runs"].items():
                ok = [r for r in rows if "error" not in r]
                if not ok:
                    continue
                first = [r["first_query_ms"] for r in ok]
                warm = [r["warm_s"] for r in ok if r.get("warm_s") is not None]
                lines.append(f"| {run['n']:,} | {run['seed']} | {eng} | {kind.replace('/', ' | ')} | {len(ok)} | "
                             f"{statistics.median(r['open_s'] for r in ok):.3f} | "
                             f"{f'{statistics.median(warm):.3f}' if warm else '-'} | "
                             f"{statistics.median(first):.1f} | {max(first):.1f} | "
                             f"{statistics.median(r['again_ms'] for r in ok):.2f} |")
    if not lines:
        return []
    return ["", "First query after open (issue 47 item 4; `--first-query`): fresh processes, run i answers query "
            f"{list(FIRST_QUERIES)}[i] first. `bare`: `open_index` alone (the CLI's one-shot query); `served`: then "
            "`assembly_warm.warm_index`, the serving warm-up (the file read once through the page cache, the terms "
            "of 16,384 postings or more checked, one probe query unfiltered and masked). Page cache `cold`: the file's pages dropped before the process "
            "opened it. " + (f"Command: `{report['first_query_command']}`" if report.get("first_query_command")
                             else ""), "",
            "| docs | seed | layout | open | page cache | runs | open s p50 | warm-up s p50 | first query ms p50 | "
            "first query ms max | same query again ms p50 |", "|---|---|---|---|---|---|---|---|---|---|---|",
            *lines]


def _self(spec: dict) -> list[str]:
    return [sys.executable, __file__, "_step", json.dumps(spec)]


def _lucene_classes(java: str, jar: str) -> str:
    classes = CACHE / "classes"
    classes.mkdir(parents=True, exist_ok=True)
    subprocess.run([str(Path(java).with_name("javac")), "-nowarn", "-cp", jar, "-d", str(classes),
                    *map(str, sorted((ROOT / "benchmarks/lucene").glob("*.java")))],
                   check=True, capture_output=True, text=True)
    return f"{jar}:{classes}"


def _bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.is_dir() else path.stat().st_size


def build(engine: str, n: int, seed: int, c: dict[str, np.ndarray], lucene) -> dict:
    """Build an engine's index once (kept in the cache with its build record)."""
    folder = CACHE / f"corpus_{n}_{seed}"
    record = folder / f"build_{engine}.json"
    if record.exists():
        return json.loads(record.read_text())
    heavy = n >= HEAVY_FROM
    if engine == "lucene":
        java, cp = lucene
        docs = docs_text(n, seed, c)
        target = folder / "lucene"
        if target.exists():
            import shutil

            shutil.rmtree(target)
        rec = _run_measured([java, f"-Xmx{LUCENE_XMX}", "-cp", cp, "LuceneBench", "build", str(docs), str(target)],
                            heavy=heavy)
        if "error" not in rec:
            rec["index_bytes"] = _bytes(target)
    else:
        rec = _run_measured(_self({"step": "build", "n": n, "seed": seed, "layout": engine}), heavy=heavy,
                            cap=OURS_AS_CAP)
    if "error" not in rec:
        record.write_text(json.dumps(rec))
    return rec


def query(engine: str, n: int, seed: int, lucene, rounds: int) -> dict:
    folder = CACHE / f"corpus_{n}_{seed}"
    qjson, qtxt = folder / "queries_tokens.json", folder / "queries_tokens.txt"
    if engine == "lucene":
        java, cp = lucene
        out = folder / "lucene_run.json"
        rec = _run_measured([java, "-Xmx2g", "-cp", cp, "LuceneClasses", str(folder / "lucene"), str(qtxt), str(out),
                             str(K1), str(B), str(K), str(rounds)], heavy=False)
        if "error" not in rec:
            rec.update(best_ms=json.loads(out.read_text()), ids=json.loads(Path(f"{out}.ids").read_text()))
        return rec
    return _run_measured(_self({"step": "query", "n": n, "seed": seed, "layout": engine, "queries": str(qjson),
                                "rounds": rounds}), heavy=False, cap=OURS_AS_CAP)


# --------------------------------------------------------------------------- report
def load() -> dict:
    path = RESULTS / f"{NAME}.json"
    return json.loads(path.read_text()) if path.exists() else {"runs": {}}


def save(report: dict, key: str | None = None) -> None:
    """Write the report; with ``key``, only that run is taken from ``report`` and the others
    are re-read from the file (two runs of different sizes may write it in turn)."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    if key is not None:
        disk = load()
        disk["runs"][key] = report["runs"][key]
        disk["command"], disk["machine"] = report.get("command"), report.get("machine")
        disk.setdefault("commands", {})[key] = report.get("command")
        report = disk
    (RESULTS / f"{NAME}.json").write_text(json.dumps(report, indent=1))
    (RESULTS / f"{NAME}.md").write_text(markdown(report))


def class_ratios(run: dict) -> dict:
    """Per class, for each ragspine layout: Lucene's summed time / ours (> 1: we are faster),
    the median per-query ratio, and how many queries were slower than Lucene's."""
    out = {}
    luc = run.get("engines", {}).get("lucene", {}).get("best_ms")
    if not luc:
        return out
    n_mid = run["n_mid"]
    for layout in ("packed", "plain"):
        ours = run.get("engines", {}).get(layout, {}).get("best_ms")
        if not ours:
            continue
        for cls, sl in (("mid", slice(0, n_mid)), ("mixed", slice(n_mid, None)), ("all", slice(None))):
            a, b = np.asarray(luc[sl]), np.asarray(ours[sl])
            out[f"{layout}/{cls}"] = {"ratio_total": float(a.sum() / b.sum()),
                                      "ratio_median": float(np.median(a / b)),
                                      "slower": int((b > a).sum()), "queries": len(a),
                                      "ours_p50_ms": float(np.median(b)), "lucene_p50_ms": float(np.median(a)),
                                      "ours_max_ms": float(b.max()), "lucene_at_our_max_ms": float(a[b.argmax()])}
    return out


def _mib(x) -> str:
    return "-" if x is None else f"{x:,.0f}"


def markdown(report: dict) -> str:
    label = f" ({report['label']})" if report.get("label") else ""
    lines = [f"# {NAME}: ragspine vs Lucene on a ~2M-term vocabulary, per query class{label}", "",
             f"Command: `{report.get('command', '')}`  ", f"Machine: {report.get('machine', {})}", "",
             *[f"- run {k}: `{v}`" for k, v in sorted(report.get("commands", {}).items())], "",
             f"Corpus per seed: Zipf(s={ZIPF_S}) over {VOCAB:,} terms, lengths lognormal({LEN_MU}, {LEN_SIGMA}) "
             f"clipped to [1, {LEN_MAX}]. Classes: `mid` = {N_MID} queries of 2-3 terms, each df in "
             f"{MID_DF[0]:.1%}-{MID_DF[1]:.0%} of N; `mixed` = {N_MIXED} queries of 2-5 Zipf draws. k={K}, "
             f"k1={K1}, b={B}. Each query's fastest of the rounds and passes (engines interleaved in one run). "
             "Ratio = Lucene's time / ragspine's (> 1: ragspine faster).", "",
             "| docs | seed | terms | layout | class | ratio (sum) | median ratio | slower than Lucene | "
             "ours p50 ms | Lucene p50 ms | our worst ms (Lucene's) | exact vs reference |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for key in sorted(report["runs"], key=lambda s: tuple(int(x) for x in s.split("/"))):
        run = report["runs"][key]
        for name, r in class_ratios(run).items():
            layout, cls = name.split("/")
            ex = run.get("engines", {}).get(layout, {}).get("exact")
            lines.append(f"| {run['n']:,} | {run['seed']} | {run.get('distinct_terms', 0):,} | {layout} | {cls} | "
                         f"{r['ratio_total']:.2f} | {r['ratio_median']:.2f} | {r['slower']}/{r['queries']} | "
                         f"{r['ours_p50_ms']:.3f} | {r['lucene_p50_ms']:.3f} | {r['ours_max_ms']:.2f} "
                         f"({r['lucene_at_our_max_ms']:.2f}) | {ex} |")
    lines += ["", "| docs | seed | engine | build s | peak build MiB | index bytes | bytes / Lucene's | open s | "
              "first query ms | import + kernels s |", "|---|---|---|---|---|---|---|---|---|---|"]
    for key in sorted(report["runs"], key=lambda s: tuple(int(x) for x in s.split("/"))):
        run = report["runs"][key]
        lb = run.get("builds", {}).get("lucene", {}).get("index_bytes")
        for eng in ENGINES:
            bd = run.get("builds", {}).get(eng, {})
            q = run.get("engines", {}).get(eng, {})
            ib = bd.get("index_bytes")
            ratio = f"{ib / lb:.2f}" if ib and lb else "-"
            bs = f"{bd['build_s']:.1f}" if bd.get("build_s") else "-"
            op = f"{q['open_s']:.3f}" if q.get("open_s") is not None else "-"
            fq = f"{q['first_query_ms']:.1f}" if q.get("first_query_ms") is not None else "-"
            ik = f"{q['import_and_kernels_s']:.2f}" if q.get("import_and_kernels_s") is not None else "-"
            lines.append(f"| {run['n']:,} | {run['seed']} | {eng} | {bs} | {_mib(bd.get('peak_rss_mib'))} | "
                         f"{_mib(ib)} | {ratio} | {op} | {fq} | {ik} |")
    lines += first_lines(report)
    notes = report.get("notes", [])
    if notes:
        lines += [""] + [f"- {x}" for x in notes]
    return "\n".join(lines) + "\n"


def run_one(n: int, seed: int, args, report: dict, lucene) -> None:
    key = f"{n}/{seed}"
    run = report["runs"].setdefault(key, {"n": n, "seed": seed})
    c = corpus(n, seed)
    qs = queries(n, seed, c)
    run.update(n_mid=len(qs["mid"]), n_mixed=len(qs["mixed"]), distinct_terms=qs["distinct_terms"],
               tokens=qs["tokens"], queries=qs["mid"] + qs["mixed"])
    folder = CACHE / f"corpus_{n}_{seed}"
    toks = all_queries(qs)
    (folder / "queries_tokens.json").write_text(json.dumps(toks))
    (folder / "queries_tokens.txt").write_text("\n".join(" ".join(q) for q in toks) + "\n")
    ref = reference(n, seed, c, qs)
    engines = [e for e in ENGINES if e in args.engines]
    for eng in engines:
        if eng == "lucene" and isinstance(lucene, str):
            run.setdefault("builds", {})[eng] = {"error": lucene}
            continue
        if args.force or "build_s" not in run.get("builds", {}).get(eng, {}):
            run.setdefault("builds", {})[eng] = build(eng, n, seed, c, lucene)
            save(report, key)
    if not (args.force or args.requery) and all(run.get("engines", {}).get(e, {}).get("best_ms") for e in engines):
        return
    fresh: dict[str, dict] = {}
    for p in range(args.passes):
        for eng in engines:
            if eng == "lucene" and isinstance(lucene, str):
                continue
            print(f"[{time.strftime('%H:%M:%S')}] {key} pass {p} {eng}", flush=True)
            res = query(eng, n, seed, lucene, args.rounds)
            if "error" in res:
                fresh[eng] = res
                continue
            prev = fresh.get(eng)
            if prev and "best_ms" in prev:
                res["best_ms"] = [min(a, b) for a, b in zip(prev["best_ms"], res["best_ms"], strict=True)]
                for f in ("open_s", "first_query_ms", "import_and_kernels_s"):
                    if f in prev:
                        res[f] = prev[f]  # the first (cold) pass's
            fresh[eng] = res
        for eng, res in fresh.items():
            if "ids" in res and eng != "lucene":
                ok = [agrees(i, s, r) for i, s, r in zip(res["ids"], res["scores"], ref, strict=True)]
                res["exact"] = f"{sum(ok)}/{len(ok)}"
            if eng == "lucene" and "ids" in res:
                ov = [len(set(a) & set(r["ids"])) / max(1, len(r["ids"])) for a, r in zip(res["ids"], ref, strict=True)]
                res["overlap_with_reference"] = statistics.mean(ov)
            run.setdefault("engines", {})[eng] = {k: v for k, v in res.items() if k not in ("ids", "scores")}
        run["measured"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
        run["ratios"] = class_ratios(run)
        save(report, key)


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "_step":
        print(json.dumps(step(json.loads(sys.argv[2]))))
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="1000000")
    ap.add_argument("--seeds", default="1,2,3")
    ap.add_argument("--engines", default=",".join(ENGINES))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--passes", type=int, default=2)
    ap.add_argument("--force", action="store_true", help="rebuild and re-query")
    ap.add_argument("--requery", action="store_true", help="re-query the built indexes (the code changed)")
    ap.add_argument("--first-query", action="store_true", help="only the first query after open, bare and "
                    "served, page cache warm and cold, on the built indexes")
    ap.add_argument("--first-runs", type=int, default=5, help="fresh processes per kind of first query")
    args = ap.parse_args()
    args.engines = args.engines.split(",")
    report = load()
    if args.first_query:
        for n in map(int, args.sizes.split(",")):
            for seed in map(int, args.seeds.split(",")):
                first_queries(n, seed, args, report)
        print(markdown(report))
        return
    report["command"] = "python " + " ".join(sys.argv)
    report["machine"] = machine()
    lucene = lucene_setup()
    if not isinstance(lucene, str):
        lucene = (lucene[0], _lucene_classes(*lucene))
    for n in map(int, args.sizes.split(",")):
        for seed in map(int, args.seeds.split(",")):
            run_one(n, seed, args, report, lucene)
    print(markdown(report))


if __name__ == "__main__":
    main()
