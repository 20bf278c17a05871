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
import fcntl
import json
import os
import platform
import statistics
import struct
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.common import add_io_args, data_root, out_dir, require_sets, say_written, use_data  # noqa: E402
from ragspine_pipeline.eval.beir import load_beir  # noqa: E402
from ragspine_pipeline.eval.metrics import mean_metrics  # noqa: E402
from ragspine_pipeline.retrieval.lexical.analysis.analyzer import make_analyzer  # noqa: E402
from ragspine_pipeline.retrieval.lexical.index.bm25 import BM25Index, bm25_scores  # noqa: E402

SHARED_EVAL = data_root()  # --data / RAGSPINE_BENCH_DATA (workers inherit it)
RESULTS = ROOT / "benchmarks" / "out"  # set from --out in main()
CACHE = ROOT / "benchmarks" / ".cache"
SETS = ("scifact", "cranfield", "cmrc2018-trial")
K1, B = 1.5, 0.75
VOCAB = 200_000
SYNTH_ARRAYS = ("lens", "toks", "q_lens", "q_toks")
GEN_STEP = 20_000_000  # tokens drawn per slice when generating a synthetic corpus
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


def _zipf_p() -> np.ndarray:
    p = 1.0 / np.arange(1, VOCAB + 1) ** 1.1
    return p / p.sum()


def _npz_put(z: zipfile.ZipFile, name: str, arr: np.ndarray) -> None:
    with z.open(f"{name}.npy", "w", force_zip64=True) as f:
        np.lib.format.write_array(f, np.ascontiguousarray(arr))


def _generate_npz(n_docs: int, seed: int, path: Path) -> None:
    """Write ``synthetic_corpus``'s arrays as an (uncompressed) npz, streaming the tokens.

    The draws are the one-shot ones (lengths, all tokens, query lengths, query tokens, from
    one generator): ``Generator.choice`` with ``p`` draws one uniform per sample, so slices
    of ``GEN_STEP`` tokens give the same tokens as one call, without holding 600M of them.
    Written under a temporary name and renamed, so a half-written file is never read.
    """
    rng = np.random.default_rng(seed)
    p = _zipf_p()
    lens = np.maximum(rng.poisson(60, n_docs), 1)
    total = int(lens.sum())
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_STORED, allowZip64=True) as z:
        _npz_put(z, "lens", lens)
        with z.open("toks.npy", "w", force_zip64=True) as f:
            np.lib.format.write_array_header_2_0(f, {"descr": np.lib.format.dtype_to_descr(np.dtype(np.int32)),
                                                     "fortran_order": False, "shape": (total,)})
            for lo in range(0, total, GEN_STEP):
                f.write(rng.choice(VOCAB, size=min(GEN_STEP, total - lo), p=p).astype(np.int32).tobytes())
        q_lens = rng.integers(2, 6, 200)
        # Queries mix head and tail terms, like real keyword queries.
        _npz_put(z, "q_lens", q_lens)
        _npz_put(z, "q_toks", np.concatenate([rng.choice(VOCAB, size=n, p=p) for n in q_lens]).astype(np.int32))
    os.replace(tmp, path)


def _npz_member(path: Path, name: str) -> np.ndarray:
    """One array of an npz, memory-mapped when stored uncompressed (10M docs: 2.4 GB of tokens)."""
    with zipfile.ZipFile(path) as z:
        info = z.getinfo(f"{name}.npy")
    if info.compress_type != zipfile.ZIP_STORED:
        with np.load(path) as zf:
            return zf[name]
    with open(path, "rb") as f:
        f.seek(info.header_offset)
        n_name, n_extra = struct.unpack("<HH", f.read(30)[26:30])
        f.seek(info.header_offset + 30 + n_name + n_extra)
        version = np.lib.format.read_magic(f)
        reader = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, fortran, dtype = reader(f)
        offset = f.tell()
    if fortran or 0 in shape:
        with np.load(path) as zf:
            return zf[name]
    return np.memmap(path, dtype=dtype, mode="r", offset=offset, shape=shape)


def _npz_complete(path: Path) -> bool:
    try:
        with zipfile.ZipFile(path) as z:
            return {f"{m}.npy" for m in SYNTH_ARRAYS} <= set(z.namelist())
    except (OSError, zipfile.BadZipFile):
        return False


def synthetic_arrays(n_docs: int, seed: int = 7) -> dict[str, np.ndarray]:
    """``lens``, ``toks`` (int32 term ids, memory-mapped), ``q_lens``, ``q_toks`` of a
    synthetic corpus: Zipf vocabulary (s=1.1, 200k terms), Poisson(60) lengths.

    Generated once into ``benchmarks/.cache/synthetic_<n>_<seed>.npz`` (another benchmark
    writing the same file with the same generator is reused; a lock keeps two of ours from
    generating it at once).
    """
    CACHE.mkdir(parents=True, exist_ok=True)
    path = CACHE / f"synthetic_{n_docs}_{seed}.npz"
    if not _npz_complete(path):
        with open(CACHE / f".synthetic_{n_docs}_{seed}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not _npz_complete(path):
                _generate_npz(n_docs, seed, path)
    return {m: _npz_member(path, m) for m in SYNTH_ARRAYS}


def _vocab_strings() -> list[str]:
    return [f"w{i}" for i in range(VOCAB)]


def split_tokens(lens: np.ndarray, toks: np.ndarray, vocab: list[str]) -> list[list[str]]:
    """Token lists (``w<id>`` strings) of consecutive documents of lengths ``lens``."""
    out, pos = [], 0
    flat = [vocab[t] for t in np.asarray(toks).tolist()]
    for n in np.asarray(lens).tolist():
        out.append(flat[pos:pos + n])
        pos += n
    return out


def synthetic_corpus(n_docs: int, seed: int = 7):
    """(docs, queries) as token lists of ``synthetic_arrays(n_docs, seed)``."""
    z = synthetic_arrays(n_docs, seed)
    vocab = _vocab_strings()
    return split_tokens(z["lens"], z["toks"], vocab), split_tokens(z["q_lens"], z["q_toks"], vocab)


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
        from ragspine_pipeline.retrieval.lexical.kernels import loader as bm25_kernel

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
        subprocess.run([javac, "-nowarn", "-cp", jar, "-d", str(t), *map(str, sorted((ROOT / "benchmarks/lucene").glob("*.java")))],
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
    global CACHE
    CACHE = Path(spec.get("cache", CACHE))
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
    old = load_results()  # the peers-large rows stay
    report["rows"] = rows + [r for r in old["rows"] if r.get("suite") == "large"]
    report["filtered"] = old["filtered"]
    report.update({key: old[key] for key in ("large_command", "large_machine") if key in old})
    write_results(report)
    plot(rows)
    if final:
        print(_markdown(report))



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
    """The small-set sections (``peers``); ``_large_markdown`` adds the large corpora."""
    if "summary" not in report:
        return "# BM25 peer benchmark\n"
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
        if r.get("suite") == "large":
            continue
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


# --------------------------------------------------------------------------- large corpora (peers-large)
# 1M and 10M synthetic documents, ragspine's published file against Lucene's index, resumable:
# the corpus npz, Lucene's docs text and index folder and ragspine's index file stay in
# benchmarks/.cache; each engine's row is written to the results as soon as it is measured, and a
# re-run measures only the rows the results lack (--force: all of them again).
LARGE_FILTERS = (0.5, 0.05, 0.001, 0.0001)
LARGE_ROUNDS = 3  # timed passes over the queries (qps: the median pass; latencies: all samples)
DOC_STEP = 100_000  # documents per batch fed to a streaming build / written as text
HEAVY_LOCK = "/tmp/heavy.lock"  # the machine-wide lock every >2 GB process holds (common rules)
HEAVY_FROM = 250_000  # corpus size from which a step may pass 2 GB and takes HEAVY_LOCK
OURS_AS_CAP = 14_000_000_000  # prlimit --as of ragspine's build and query processes
BM25S_CAP = 12_000_000_000  # bm25s runs only under this address-space cap, or is skipped
LUCENE_XMX = "6g"


def _batches(arrs: dict[str, np.ndarray], vocab: list[str], lo: int = 0, hi: int | None = None):
    """Token lists of documents lo..hi in batches of DOC_STEP (never the whole corpus at once)."""
    lens = np.asarray(arrs["lens"])
    ends = np.cumsum(lens)
    hi = len(lens) if hi is None else hi
    for d0 in range(lo, hi, DOC_STEP):
        d1 = min(hi, d0 + DOC_STEP)
        t0 = int(ends[d0 - 1]) if d0 else 0
        yield split_tokens(lens[d0:d1], arrs["toks"][t0:int(ends[d1 - 1])], vocab)


def _docs_text(n: int, arrs: dict[str, np.ndarray]) -> Path:
    """Lucene's input (one document per line, ``w<id>`` tokens), written once, streaming."""
    path = CACHE / f"lucene_docs_{n}_7.txt"
    if not path.exists():
        write_token_lines(path, np.asarray(arrs["lens"]), arrs["toks"], VOCAB)
    return path


def write_token_lines(path: Path, lens: np.ndarray, toks: np.ndarray, vocab: int) -> None:
    """``w<id>`` tokens of consecutive documents of lengths ``lens``, one document a line,
    under a temporary name then renamed (a file at ``path`` is always whole).

    Each token becomes a fixed-width row (``w<id>`` + a space, zero-padded) taken from a
    table; a document's last separator becomes a newline and the padding is dropped.
    """
    width = len(f"w{vocab - 1} ")
    tab = np.array([f"w{i} ".encode() for i in range(vocab)], dtype=f"S{width}").view(np.uint8).reshape(vocab, width)
    sep = (tab != 0).sum(axis=1) - 1
    ends = np.cumsum(lens, dtype=np.int64)
    n = len(lens)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as f:
        for d0 in range(0, n, DOC_STEP):
            d1 = min(n, d0 + DOC_STEP)
            t0 = int(ends[d0 - 1]) if d0 else 0
            t = np.asarray(toks[t0:int(ends[d1 - 1])])
            rows = tab[t]
            last = ends[d0:d1] - 1 - t0
            rows[last, sep[t[last]]] = ord("\n")
            flat = rows.ravel()
            f.write(flat[flat != 0].tobytes())
    os.replace(tmp, path)


def _large_queries(arrs: dict[str, np.ndarray]) -> list[list[str]]:
    """The corpus's queries, tokens absent from it dropped and empty queries skipped (as ``worker``)."""
    present = np.zeros(VOCAB, bool)
    toks = arrs["toks"]
    for lo in range(0, len(toks), GEN_STEP):
        present[np.unique(np.asarray(toks[lo:lo + GEN_STEP]))] = True
    vocab = _vocab_strings()
    qs = split_tokens(arrs["q_lens"], arrs["q_toks"], vocab)
    return [q for q in ([t for t in q if present[int(t[1:])]] for q in qs) if q]


def filter_mask(n: int, frac: float) -> np.ndarray:
    """The fixed random filter keeping ``frac`` of n documents (the same for every engine)."""
    return np.random.default_rng(int(round(frac * 1e6))).random(n) < frac


def _mask_prefix(n: int) -> str:
    """Filters as packed bits (little bit order) for the JVM: ``<prefix><frac>.bits``."""
    prefix = str(_large_dir() / f"mask_{n}_")
    for frac in LARGE_FILTERS:
        path = Path(f"{prefix}{frac}.bits")
        if not path.exists():
            np.packbits(filter_mask(n, frac), bitorder="little").tofile(path)
    return prefix


def _run_measured(cmd: list[str], *, heavy: bool, cap: int | None = None, timeout: int = 7200) -> dict:
    """Run ``cmd`` under ``nice -n 10`` (and the heavy lock and an address-space cap), returning
    its last stdout JSON line plus ``peak_rss_mib``: the process's ru_maxrss from ``wait4``."""
    import tempfile

    wrap = ["nice", "-n", "10"]
    if cap:
        wrap = ["prlimit", f"--as={cap}"] + wrap
    if heavy:
        wrap = ["flock", str(HEAVY_LOCK)] + wrap
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        p = subprocess.Popen(wrap + cmd, stdout=out, stderr=err)
        t0 = time.monotonic()
        while True:
            pid, status, usage = os.wait4(p.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() - t0 > timeout:
                p.kill()
                pid, status, usage = os.wait4(p.pid, 0)
                break
            time.sleep(0.2)
        p.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read().decode(), err.read().decode()
    if p.returncode != 0:
        tail = stderr.strip().splitlines()[-3:] or [f"rc={p.returncode}"]
        return {"error": " | ".join(tail), "rc": p.returncode}
    res = json.loads(stdout.strip().splitlines()[-1])
    res["peak_rss_mib"] = usage.ru_maxrss / 1024
    return res


def _large_step(spec: dict) -> dict:
    """One ragspine step in a fresh process: ``build``, ``open`` or ``query``."""
    from ragspine_pipeline.retrieval.lexical.index.mapped import open_index
    from ragspine_pipeline.retrieval.lexical.kernels import loader as bm25_kernel

    global CACHE
    CACHE = Path(spec["cache"])
    path, n, k = Path(spec["path"]), int(spec["docs"]), int(spec["k"])
    if spec["step"] == "build":
        return _ragspine_build(spec, path, n)
    bm25_kernel.load_kernels(mapped=True)  # imports and JIT load (a mapped file's signatures): not part of the open
    t0 = time.perf_counter()
    ix = open_index(path)
    open_s = time.perf_counter() - t0
    queries = json.loads(Path(spec["queries"]).read_text())
    t0 = time.perf_counter()
    ix.search(queries[0], k=k)
    first_ms = 1000 * (time.perf_counter() - t0)
    if spec["step"] == "open":
        return {"open_s": open_s, "first_query_ms": first_ms, "layout": type(ix).__name__}
    for q in queries:  # warm-up pass: the page cache and the kernels, as Lucene's JIT warm-up
        ix.search(q, k=k)
    lat, qps = [], []
    for _ in range(LARGE_ROUNDS):
        t_all = time.perf_counter()
        ranked = []
        for q in queries:
            t1 = time.perf_counter()
            ranked.append(ix.search(q, k=k))
            lat.append(time.perf_counter() - t1)
        qps.append(len(queries) / (time.perf_counter() - t_all))
    ranked = [r.ids.tolist() for r in ranked]
    Path(spec["ids"]).write_text(json.dumps(ranked))
    batch = {}
    for threads in (1, 2):
        ix.search_batch_arrays(queries, k, threads=threads)
        runs = []
        for _ in range(LARGE_ROUNDS):
            t0 = time.perf_counter()
            ids, _sc, cnt = ix.search_batch_arrays(queries, k, threads=threads)
            runs.append(len(queries) / (time.perf_counter() - t0))
        same = [row[:c].tolist() for row, c in zip(ids, cnt.tolist(), strict=True)] == ranked
        batch[str(threads)] = {"qps": statistics.median(runs), "identical_to_single": same}
    best = max(batch, key=lambda t: batch[t]["qps"])
    out = {"open_s": open_s, "first_query_ms": first_ms, "index_class": type(ix).__name__,
           "queries": len(queries), "qps": statistics.median(qps), "p50_ms": 1000 * statistics.median(lat),
           "p95_ms": 1000 * float(np.percentile(lat, 95)), "qps_best_of_rounds": _best_of_rounds(lat, len(queries)),
           "batch": batch, "batch_qps": batch[best]["qps"],
           "batch_threads": int(best), "filtered": {}}
    for frac in spec["filters"]:
        out["filtered"][str(frac)] = _interleaved(ix, queries, k, filter_mask(n, frac), f"{spec['ids']}.{frac}")
    return out


def _best_of_rounds(lat: list[float], nq: int) -> float:
    """qps from each query's fastest pass: on a shared 2-core box a preempted query costs a
    scheduler slice (~10 ms), so this is the figure that noise from other processes leaves alone."""
    return nq / float(np.asarray(lat).reshape(-1, nq).min(axis=0).sum())


def _interleaved(ix, queries, k: int, mask: np.ndarray, ids_path: str) -> dict:
    """Filtered and unfiltered top-k alternating in one loop over the same queries.

    The filter is built once and reused by every query (``PackedFilter.from_mask``), as
    LuceneLarge builds its FixedBitSet once and reuses it, and as ``HybridRetriever`` keeps
    each filter expression's; a reused filter remembers its survivor statistics per index.
    The same loop also times the filter handed over as a bool mask on every query (packed
    and counted each time: what a one-off filter costs), as ``mask_p50_ms``.
    """
    from ragspine_pipeline.retrieval.lexical.index.filter import PackedFilter

    filt = PackedFilter.from_mask(mask)
    ranked = []
    for q in queries:  # warm-up pass of each
        ix.search(q, k=k)
        ranked.append(ix.search(q, k=k, candidates=filt).ids.tolist())
        if ix.search(q, k=k, candidates=mask).ids.tolist() != ranked[-1]:
            raise AssertionError("a reused filter and a bool mask gave different answers")
    f, u, m = [], [], []
    for _ in range(LARGE_ROUNDS):
        for q in queries:
            t0 = time.perf_counter()
            ix.search(q, k=k)
            t1 = time.perf_counter()
            ix.search(q, k=k, candidates=filt)
            t2 = time.perf_counter()
            ix.search(q, k=k, candidates=mask)
            t3 = time.perf_counter()
            u.append(t1 - t0)
            f.append(t2 - t1)
            m.append(t3 - t2)
    Path(ids_path).write_text(json.dumps(ranked))
    return {"survivors": int(mask.sum()), "p50_ms": 1000 * statistics.median(f),
            "unfiltered_p50_ms": 1000 * statistics.median(u), "mean_ms": 1000 * float(np.mean(f)),
            "filter_as": "PackedFilter built once, reused", "mask_p50_ms": 1000 * statistics.median(m),
            "mask_mean_ms": 1000 * float(np.mean(m))}


def _ragspine_build(spec: dict, path: Path, n: int) -> dict:
    """Build and publish ragspine's index of the synthetic corpus; time and bytes of the file.

    ``memory``: token lists -> ``BM25Index`` -> ``write_index`` (the token lists are made
    before the clock starts, as in ``peers``); ``stream``: ``bm25_stream_build.build_index_file``
    over batches of DOC_STEP documents (their token strings made inside the timed build, as a
    real corpus hands them over).
    """
    arrs = synthetic_arrays(n)
    vocab = _vocab_strings()
    k1 = float(spec["k1"])
    out: dict = {"build": spec["build"], "layout_asked": spec["layout"]}
    if spec["build"] == "stream":
        from ragspine_pipeline.retrieval.lexical.refresh.stream_build import build_index_file

        t0 = time.perf_counter()
        rep = build_index_file(_batches(arrs, vocab), path, k1=k1, b=B, layout=spec["layout"])
        out["build_s"] = time.perf_counter() - t0
        out["report"] = {f: getattr(rep, f) for f in getattr(rep, "__dataclass_fields__", {})}
        out["layout"] = out["report"].get("layout", spec["layout"])
    else:
        from ragspine_pipeline.retrieval.lexical.format.raw import PLAIN, choose_layout
        from ragspine_pipeline.retrieval.lexical.refresh import publish as bm25_publish

        docs = [d for batch in _batches(arrs, vocab) for d in batch]
        t0 = time.perf_counter()
        if hasattr(bm25_publish, "write_layout"):  # the layouts' one pair of writers
            from ragspine_pipeline.retrieval.lexical.index.postings import count_postings

            raw, _terms = count_postings(docs)
            layout = choose_layout(raw.n_postings, spec["layout"])
            bm25_publish.write_layout(raw, path, layout=layout, k1=k1, b=B)
        else:
            idx = BM25Index(docs, k1=k1, b=B)
            layout = choose_layout(int(idx.postings().indptr[-1]), spec["layout"])
            if layout != PLAIN:
                raise RuntimeError(f"layout {layout!r} needs bm25_publish.write_layout (not in this checkout)")
            bm25_publish.write_index(idx, path)
        out["build_s"] = time.perf_counter() - t0
        out["layout"] = layout
    out["index_bytes"] = _bytes(path)
    return out


def _bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.is_dir() else path.stat().st_size


def _large_dir() -> Path:
    d = CACHE / "large"
    d.mkdir(parents=True, exist_ok=True)
    return d


def _ids_file(engine: str, n: int, variant: str, frac: float | None = None) -> Path:
    name = f"ids_{engine}_{n}_{variant.replace('/', '-') or 'default'}.json"
    return _large_dir() / (name if frac is None else f"{name}.{frac}")


def _stream_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("ragspine_pipeline.retrieval.lexical.refresh.stream_build") is not None


def _row(engine: str, n: int, variant: str, **fields) -> dict:
    """A large row with every field a script reads (None where not measured)."""
    base = {"suite": "large", "engine": engine, "variant": variant, "corpus": f"synthetic:{n}", "docs": n, "k1": K1,
            "b": B, "qps": None, "batch_qps": None, "build_s": None, "open_s": None, "index_bytes": None,
            "peak_build_mib": None, "p50_ms": None, "p95_ms": None, "load": round(os.getloadavg()[0], 1),
            "measured": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    return {**base, **fields}


def _filtered_rows(engine: str, n: int, variant: str, filtered: dict, stats: str) -> list[dict]:
    return [{"suite": "large", "engine": engine, "variant": variant, "docs": n, "k1": K1, "filter_keeps": float(frac),
             "survivors": v["survivors"], "p50_ms": v["p50_ms"], "unfiltered_p50_ms": v["unfiltered_p50_ms"],
             "ratio_to_unfiltered": v["p50_ms"] / v["unfiltered_p50_ms"], "statistics": stats,
             **{x: v[x] for x in ("filter_as", "mask_p50_ms") if x in v}}
            for frac, v in filtered.items()]


def _large_ragspine(n: int, args, ctx: dict) -> tuple[dict, list[dict]]:
    """Build (once: the file and its build record stay in the cache), open, query.

    Only the build takes the heavy lock: opening and querying map the published file (its
    pages are the page cache's, shared) and hold well under 2 GB of their own.
    """
    variant = ctx["variant"]
    build, layout = variant.split("/")
    path = _large_dir() / f"ragspine_{n}_{build}_{layout}.bm25"
    record = path.with_name(path.name + ".build.json")
    base = {"docs": n, "k": args.k, "k1": K1, "path": str(path), "cache": str(CACHE)}
    if args.force or not (path.exists() and record.exists()):
        if build == "memory" and n > args.memory_build_max:
            return _row("ragspine", n, variant, error=f"an in-memory build of {n} documents does not fit this "
                        f"box (--memory-build-max {args.memory_build_max}); use --ragspine-build stream"), []
        rec = _run_measured([sys.executable, __file__, "_large", json.dumps({**base, "step": "build", "build": build,
                                                                              "layout": layout})],
                            heavy=n >= HEAVY_FROM, cap=OURS_AS_CAP)
        if "error" in rec:
            return _row("ragspine", n, variant, error="build: " + rec["error"]), []
        record.write_text(json.dumps(rec))
    rec = json.loads(record.read_text())
    opened = _run_measured([sys.executable, __file__, "_large", json.dumps({**base, "step": "open",
                                                                             "queries": ctx["queries_json"]})],
                           heavy=False, cap=OURS_AS_CAP)
    q = _run_measured([sys.executable, __file__, "_large", json.dumps({
        **base, "step": "query", "queries": ctx["queries_json"], "ids": str(_ids_file("ragspine", n, variant)),
        "filters": [] if args.no_filters else list(LARGE_FILTERS)})], heavy=False, cap=OURS_AS_CAP)
    for step, res in (("open", opened), ("query", q)):
        if "error" in res:
            return _row("ragspine", n, variant, error=f"{step}: {res['error']}"), []
    row = _row("ragspine", n, variant, build=build, layout=rec.get("layout"), index_class=q["index_class"],
               queries=q["queries"], tokens=ctx["tokens"], k=args.k, qps=q["qps"], p50_ms=q["p50_ms"],
               p95_ms=q["p95_ms"], qps_best_of_rounds=q["qps_best_of_rounds"], batch_qps=q["batch_qps"],
               batch_threads=q["batch_threads"], batch=q["batch"],
               build_s=rec["build_s"], open_s=opened["open_s"], first_query_ms=opened["first_query_ms"],
               open_peak_rss_mib=opened["peak_rss_mib"], index_bytes=rec["index_bytes"],
               bytes_per_token=rec["index_bytes"] / ctx["tokens"], peak_build_mib=rec["peak_rss_mib"],
               build_report=rec.get("report"))
    return row, _filtered_rows("ragspine", n, variant, q["filtered"], "survivors (the spec)")


def _javac(java: str, jar: str) -> Path:
    classes = _large_dir() / "classes"
    classes.mkdir(exist_ok=True)
    subprocess.run([str(Path(java).with_name("javac")), "-nowarn", "-cp", jar, "-d", str(classes),
                    *map(str, sorted((ROOT / "benchmarks/lucene").glob("*.java")))],
                   check=True, capture_output=True, text=True)
    return classes


def _large_lucene(n: int, args, ctx: dict) -> tuple[dict, list[dict]]:
    """Lucene's index built once into benchmarks/.cache/lucene_<n>/ (rebuilt only when missing)."""
    if isinstance(ctx["lucene"], str):
        return _row("lucene", n, "", error=ctx["lucene"]), []
    java, jar = ctx["lucene"]
    cp = f"{jar}:{_javac(java, jar)}"
    folder = CACHE / f"lucene_{n}"
    record = CACHE / f"lucene_{n}.build.json"
    if args.force or not (folder.exists() and record.exists()):
        import shutil

        docs = _docs_text(n, synthetic_arrays(n))
        if folder.exists():
            shutil.rmtree(folder)
        rec = _run_measured([java, f"-Xmx{LUCENE_XMX}", "-cp", cp, "LuceneBench", "build", str(docs), str(folder)],
                            heavy=n >= HEAVY_FROM)
        if "error" in rec:
            return _row("lucene", n, "", error="build: " + rec["error"]), []
        record.write_text(json.dumps(rec))
    rec = json.loads(record.read_text())
    opened = _run_measured([java, "-Xmx1g", "-cp", cp, "LuceneBench", "open", str(folder)], heavy=False)
    cmd = [java, "-Xmx2g", "-cp", cp, "LuceneBench", "query", str(folder), ctx["queries_txt"],
           str(_ids_file("lucene", n, "")), str(K1), str(B), str(args.k), "2"]
    if not args.no_filters:
        cmd += [_mask_prefix(n), ",".join(map(str, LARGE_FILTERS))]
    q = _run_measured(cmd, heavy=n >= HEAVY_FROM)
    for step, res in (("open", opened), ("query", q)):
        if "error" in res:
            return _row("lucene", n, "", error=f"{step}: {res['error']}"), []
    row = _row("lucene", n, "", queries=q["queries"], tokens=ctx["tokens"], k=args.k, qps=q["qps"],
               p50_ms=q["p50_ms"], p95_ms=q["p95_ms"], qps_best_of_rounds=q.get("qps_best_of_rounds"),
               batch_qps=q["batch_qps"], batch_threads=q["batch_threads"],
               build_s=rec["build_s"], open_s=opened["open_s"], index_bytes=rec["index_bytes"],
               bytes_per_token=rec["index_bytes"] / ctx["tokens"], peak_build_mib=rec["peak_rss_mib"],
               segments=rec.get("segments"), warmup_s=q["warmup_s"],
               batch_mode=f"{q['batch_threads']} threads sharing one IndexSearcher, queries split between them")
    return row, _filtered_rows("lucene", n, "", q["filtered"], "whole corpus (Lucene's FILTER clause)")


def _bm25s_reference(report: dict) -> dict | None:
    """bm25s-numba's measured row with the most tokens (its peak RSS grows with the tokens)."""
    rows = [r for r in report.get("rows", []) if r.get("engine") == "bm25s_numba" and r.get("peak_build_mib")
            and r.get("tokens")]
    return max(rows, key=lambda r: r["tokens"], default=None)


def _large_bm25s(n: int, args, ctx: dict) -> tuple[dict, list[dict]]:
    """bm25s-numba under a 12 GB address-space cap, or a row saying why it was not run."""
    ref = _bm25s_reference(ctx["report"])
    if ref is not None:
        projected = ref["peak_build_mib"] * ctx["tokens"] / ref["tokens"]
        if projected * 2**20 > BM25S_CAP:
            return _row("bm25s_numba", n, "", skipped=(
                f"did not fit: peak build RSS projected at {projected * 2**20 / 1e9:.1f} GB (linear in tokens from "
                f"{ref['peak_build_mib']:.0f} MiB at {ref['docs']} docs) passes the {BM25S_CAP / 1e9:.0f} GB cap "
                "(prlimit --as) on this 23 GB box without swap; not run"), projected_peak_mib=projected), []
    import importlib.util

    if importlib.util.find_spec("bm25s") is None:
        return _row("bm25s_numba", n, "", error="bm25s is not installed (pip install -e '.[bench]')"), []
    spec = {"engine": "bm25s_numba", "corpus": f"synthetic:{n}", "k1": K1, "k": args.k, "filters": False,
            "ids_path": str(_ids_file("bm25s_numba", n, "")), "cache": str(CACHE)}
    r = _run_measured([sys.executable, __file__, "_worker", json.dumps(spec)], heavy=n >= HEAVY_FROM, cap=BM25S_CAP)
    if "error" in r:
        return _row("bm25s_numba", n, "", error=r["error"] + f" (under prlimit --as={BM25S_CAP})"), []
    keep = ("queries", "tokens", "k", "qps", "p50_ms", "p95_ms", "batch_qps", "batch", "build_s", "warmup_s")
    return _row("bm25s_numba", n, "", **{f: r.get(f) for f in keep}, peak_build_mib=r["peak_rss_mib"],
                peak_build_growth_mib=r.get("peak_build_mib"),
                open_s_note="bm25s keeps its index in this process (nothing published to open or size)"), []


LARGE_RUNNERS = {"ragspine": _large_ragspine, "lucene": _large_lucene, "bm25s_numba": _large_bm25s}


def _agreement(report: dict) -> None:
    """Each large row's top-k against ragspine's (the exact formula) from the kept id files."""
    for r in report.get("rows", []):
        if r.get("suite") != "large" or r.get("qps") is None:
            continue
        mine = _ids_file(r["engine"], r["docs"], r["variant"])
        refs = sorted(_large_dir().glob(f"ids_ragspine_{r['docs']}_*.json"))
        if mine.exists() and refs:
            r["agreement_with_reference"] = _overlap(json.loads(mine.read_text()), json.loads(refs[0].read_text()))
    for f in report.get("filtered", []):
        mine = _ids_file(f["engine"], f["docs"], f["variant"], f["filter_keeps"])
        refs = sorted(_large_dir().glob(f"ids_ragspine_{f['docs']}_*.json.{f['filter_keeps']}"))
        if mine.exists() and refs:
            f["identical_topk_vs_spec"] = _overlap(json.loads(mine.read_text()),
                                                   json.loads(refs[0].read_text()))["identical_topk"]


def _key(r: dict) -> tuple:
    return (r.get("suite"), r.get("engine"), r.get("docs"), r.get("variant"))


def _store_large(key: tuple, row: dict, frows: list[dict], meta: dict) -> dict:
    """Put one engine's row (and its filtered rows) into the results file, under a lock and
    re-read, so two runs (say the 10M Lucene row and a ragspine row) never drop each other's rows."""
    with open(_large_dir() / "results.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        report = load_results()
        report.update(meta)
        report["rows"] = [r for r in report["rows"] if _key(r) != key] + [row]
        if frows:
            report["filtered"] = [f for f in report["filtered"] if _key(f) != key] + frows
        _agreement(report)
        write_results(report)
    return report


def peers_large(args) -> None:
    """ragspine vs Lucene (and bm25s where it fits) at 1M/10M synthetic docs, resumable."""
    build = args.ragspine_build if args.ragspine_build != "auto" else ("stream" if _stream_available() else "memory")
    lucene = lucene_setup()
    meta = {"large_command": "python benchmarks/bench_bm25.py " + " ".join(sys.argv[1:]), "large_machine": machine(),
            "lucene": lucene if isinstance(lucene, str) else f"Lucene via {Path(lucene[1]).name} on {lucene[0]}"}
    for n in [int(s) for s in args.sizes.split(",") if s]:
        arrs = synthetic_arrays(n)
        queries = _large_queries(arrs)
        tokens = int(np.asarray(arrs["lens"]).sum())
        del arrs  # unmapped: the parent keeps no token pages resident while the engines run
        qj, qt = _large_dir() / f"queries_{n}.json", _large_dir() / f"queries_{n}.txt"
        qj.write_text(json.dumps(queries))
        qt.write_text("\n".join(" ".join(q) for q in queries) + "\n")
        ctx = {"queries_json": str(qj), "queries_txt": str(qt), "lucene": lucene, "tokens": tokens}
        for engine in [e for e in args.engines.split(",") if e]:
            variant = f"{build}/{args.layout}" if engine == "ragspine" else ""
            key = ("large", engine, n, variant)
            report = load_results()  # as another run may have left it
            done = [r for r in report["rows"] if _key(r) == key]
            if done and not (args.force or args.remeasure) and "error" not in done[0]:
                print(f"{engine} {n} {variant}: already in the results (--remeasure / --force to measure again)",
                      file=sys.stderr)
                continue
            t0 = time.time()
            row, frows = LARGE_RUNNERS[engine](n, args, {**ctx, "variant": variant, "report": report})
            row["wall_s"] = time.time() - t0
            report = _store_large(key, row, frows, meta)
            print(json.dumps({x: row.get(x) for x in ("engine", "docs", "variant", "qps", "batch_qps", "build_s",
                                                      "open_s", "index_bytes", "peak_build_mib", "error", "skipped")}),
                  file=sys.stderr, flush=True)
    print(_large_markdown(load_results()))


# --------------------------------------------------------------------------- results file (both commands)
ROW_FIELDS = ("engine", "docs", "k1", "qps", "batch_qps", "build_s", "open_s", "index_bytes", "peak_build_mib")


def load_results() -> dict:
    """The results as written so far (``peers`` and ``peers-large`` each keep the other's rows)."""
    path = RESULTS / "bm25_peers.json"
    report = json.loads(path.read_text()) if path.exists() else {}
    report.setdefault("rows", [])
    report.setdefault("filtered", [])
    return report


def write_results(report: dict) -> None:
    """JSON and Markdown; every row carries ROW_FIELDS (None where a row did not measure one)."""
    for r in report["rows"]:
        for f in ROW_FIELDS:
            r.setdefault(f, None)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "bm25_peers.json").write_text(json.dumps(report, indent=2))
    (RESULTS / "bm25_peers.md").write_text(_markdown(report) + _large_markdown(report))


def _mib(x) -> str:
    return "—" if x is None else f"{x / 2**20:.0f}"


def _ratio(a, b) -> str:
    return "—" if a is None or not b else f"{a / b:.3g}×"


def _large_markdown(report: dict) -> str:
    rows = [r for r in report["rows"] if r.get("suite") == "large"]
    if not rows:
        return ""
    L = ["", "## Large corpora (1M and 10M synthetic documents)\n",
         f"Command: `{report.get('large_command')}`  ", f"Machine: {report.get('large_machine')}  ",
         "Synthetic Zipf corpora (200k terms, s=1.1, Poisson(60) lengths, seed 7; `synthetic_arrays`), generated "
         "once into benchmarks/.cache and reused; each engine's index is built once and kept there (Lucene: "
         "`lucene_<n>/`, ragspine: its published file), so a re-run measures only missing rows. Build, open and "
         "queries each run in a fresh process under `nice -n 10`, holding /tmp/heavy.lock. `build s`: ragspine "
         "from token lists to the verified published file (stream: token strings made inside the timed build); "
         "Lucene from its docs text (one line per document) to the index after `forceMerge(1)` (DOCS_AND_FREQS). "
         "`peak build MiB`: ru_maxrss of the build process (`wait4`). `index MiB`: ragspine's published index "
         "file (postings, lengths, vocabulary, statistics; no chunk records or doc ids), Lucene's index folder. "
         "`open s`: `open_index` / `DirectoryReader.open` + first `IndexSearcher`, in a fresh process after "
         "imports (page cache warm). qps: single queries, the median of 3 passes after a warm-up pass (Lucene: "
         "its JIT warm-up, at least 5 s); batch: ragspine `search_batch_arrays` at 1 and 2 threads (the faster "
         "counted), Lucene 2 threads sharing one IndexSearcher (queries split between them). Top-10, k1=1.5, "
         "b=0.75; `identical top-k`: share of queries whose top-10 equals ragspine's (exact formula; Lucene stores "
         "lengths in one byte, so ties and near-ties differ).\n",
         "`qps best-of-3`: from each query's fastest pass (a query preempted on the shared 2-core box costs a "
         "scheduler slice; `load`: the 1-minute load average when the row was written; rows measured at different "
         "loads can differ by 2× on this shared box, so compare rows of similar load, or re-measure with --force).\n",
         "| engine | variant | docs | queries | qps | qps best-of-3 | p50 ms | p95 ms | batch qps | build s | open s | "
         "index MiB | bytes/token | peak build MiB | identical top-k vs ragspine | load | note |",
         "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in sorted(rows, key=lambda r: (r["docs"], r["engine"] != "ragspine", r["engine"])):
        note = r.get("error") or r.get("skipped") or ""
        ag = (r.get("agreement_with_reference") or {}).get("identical_topk")
        L.append(f"| {r['engine']} | {r.get('variant') or '—'} | {r['docs']} | {_f(r.get('queries'))} | "
                 f"{_f(r.get('qps'), 0)} | {_f(r.get('qps_best_of_rounds'), 0)} | {_f(r.get('p50_ms'), 3)} | "
                 f"{_f(r.get('p95_ms'), 3)} | "
                 f"{_f(r.get('batch_qps'), 0)} | {_f(r.get('build_s'), 1)} | {_f(r.get('open_s'), 3)} | "
                 f"{_mib(r.get('index_bytes'))} | {_f(r.get('bytes_per_token'), 2)} | {_f(r.get('peak_build_mib'), 0)} | "
                 f"{_f(ag, 3)} | {_f(r.get('load'), 1)} | {note} |")
    L += ["", "### ragspine / Lucene\n",
          "Ratios above 1 mean ragspine is faster for qps and batch qps, and bigger or slower for build s, index "
          "bytes and open s. Goals (#27): qps ≥ 1×, index bytes ≤ 1.5×; build s ≤ 1× and peak build ≤ 12 GB.\n",
          "| docs | ragspine variant | qps | qps best-of-3 | batch qps | build s | index bytes | open s | "
          "ragspine peak build MiB | Lucene peak build MiB |", "|---|---|---|---|---|---|---|---|---|---|"]
    ok = [r for r in rows if r.get("qps") is not None]
    for r in sorted((r for r in ok if r["engine"] == "ragspine"), key=lambda r: (r["docs"], r["variant"])):
        luc = next((x for x in ok if x["engine"] == "lucene" and x["docs"] == r["docs"]), None)
        if luc is None:
            continue
        L.append(f"| {r['docs']} | {r['variant']} | {_ratio(r['qps'], luc['qps'])} | "
                 f"{_ratio(r.get('qps_best_of_rounds'), luc.get('qps_best_of_rounds'))} | "
                 f"{_ratio(r['batch_qps'], luc['batch_qps'])} | {_ratio(r['build_s'], luc['build_s'])} | "
                 f"{_ratio(r['index_bytes'], luc['index_bytes'])} | {_ratio(r['open_s'], luc['open_s'])} | "
                 f"{_f(r['peak_build_mib'], 0)} | {_f(luc['peak_build_mib'], 0)} |")
    filt = [f for f in report.get("filtered", []) if f.get("suite") == "large"]
    if filt:
        L += ["", "### Filtered queries, interleaved\n",
              "Per filter, the same queries run unfiltered and filtered alternately in one loop (3 passes after a "
              "warm-up pass); `ratio to unfiltered` = filtered p50 / unfiltered p50 (goal #27: ≤ 1.1). The kept "
              "documents are the same fixed random set for both engines. ragspine computes N, df and avgdl over the "
              "survivors (the spec); Lucene's FILTER clause (a bitset query) keeps the whole corpus's statistics, "
              "so its top-k can differ from the spec's (`identical top-k vs spec`). Both engines are handed a "
              "filter built once and reused by every query (Lucene: a FixedBitSet query, its query cache off; "
              "ragspine: a `PackedFilter`, which remembers its survivor statistics per index); `as a mask per "
              "query`: ragspine handed a bool mask instead, packed and counted on every query (a one-off filter), "
              "in the same loop.\n",
              "| engine | variant | docs | filter keeps | survivors | p50 ms | unfiltered p50 ms | ratio to unfiltered | "
              "as a mask per query: p50 ms (ratio) | statistics | identical top-k vs spec |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
        for f in sorted(filt, key=lambda f: (f["docs"], f["engine"], f.get("variant", ""), -f["filter_keeps"])):
            L.append(f"| {f['engine']} | {f.get('variant') or '—'} | {f['docs']} | {f['filter_keeps']:.2%} | {f['survivors']} | {f['p50_ms']:.3f} | "
                     f"{f['unfiltered_p50_ms']:.3f} | {f['ratio_to_unfiltered']:.2f} | {_mask_cell(f)} | "
                     f"{f['statistics']} | "
                     f"{_f(f.get('identical_topk_vs_spec'), 3)} |")
    return "\n".join(L) + "\n"


def _mask_cell(f: dict) -> str:
    if f.get("mask_p50_ms") is None:
        return "-"
    return f"{f['mask_p50_ms']:.3f} ({f['mask_p50_ms'] / f['unfiltered_p50_ms']:.2f})"


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
    if len(sys.argv) >= 2 and sys.argv[1] == "_large":
        print(json.dumps(_large_step(json.loads(sys.argv[2]))))
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
    g = sub.add_parser("peers-large", help="ragspine vs Lucene (and bm25s where it fits) at 1M/10M, resumable")
    g.add_argument("--sizes", default="1000000,10000000")
    g.add_argument("--engines", default="ragspine,lucene,bm25s_numba")
    g.add_argument("--k", type=int, default=10, help="top-k for every engine and mode (default 10)")
    g.add_argument("--ragspine-build", choices=("auto", "memory", "stream"), default="auto",
                   help="ragspine's build: in-memory BM25Index, or the streaming builder (auto: stream when present)")
    g.add_argument("--layout", choices=("auto", "plain", "packed"), default="auto",
                   help="ragspine's published postings layout (auto: RAGSPINE_BM25_LAYOUT's rule)")
    g.add_argument("--memory-build-max", type=int, default=2_000_000,
                   help="largest corpus an in-memory ragspine build is tried on (default 2,000,000)")
    g.add_argument("--no-filters", action="store_true", help="skip the filtered-query rows")
    g.add_argument("--force", action="store_true", help="rebuild and measure rows already in the results")
    g.add_argument("--remeasure", action="store_true",
                   help="measure rows already in the results again, on the indexes already built (open and queries)")
    add_io_args(g)
    g.set_defaults(func=peers_large, sets="")
    args = ap.parse_args()
    global SHARED_EVAL, RESULTS
    SHARED_EVAL = use_data(args.data)
    require_sets(SHARED_EVAL, [s for s in args.sets.split(",") if s])
    RESULTS = out_dir(args.out)
    args.func(args)
    say_written(sorted(p for p in RESULTS.glob("bm25_*") if p.stat().st_mtime >= START))


if __name__ == "__main__":
    main()
