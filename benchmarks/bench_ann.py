"""Dense ANN at 1M/3M vectors: this project's path beside faiss HNSW, faiss IVF-PQ and usearch (#47 item 3).

Every engine answers the same 384-d unit vectors and the same queries, one engine per
worker process (its peak RSS is the worker's), built with 2 threads and searched with
**one** thread (faiss: ``omp_set_num_threads(1)``; usearch: ``threads=1``; numpy/BLAS:
``OPENBLAS_NUM_THREADS=1``), one query per call. Recall@10 is against an exact top-10
(numpy float32 matmul over all vectors, or over the survivors for filtered rows). Each
engine's search knob is swept and the row "at recall 0.95" is the cheapest swept
setting whose recall@10 >= 0.95.

* ``ragspine``: ``retrieval.vector.ann`` as published (faiss HNSW over 6-bit scalar-quantised
  storage, M=16, efConstruction=80) with the index file memory-mapped, plus the caller's exact
  rescoring of the returned candidates (float64 dot products over the float32 vectors) --
  the latency includes it. Filtered queries use its ``allowed`` pre-filter, or the
  caller's exact survivor scan when it answers None. ``ragspine_sq8`` and ``ragspine_flat``:
  the same with the storages published before (``build_ann(storage="sq8")``: 8-bit codes,
  M=32; ``"flat"``: float32 rows, M=32), for before/after.
* serving memory (``ragspine*`` rows, ``serve``): a fresh process opens the index file as
  a server does, answers the 200 queries at the row's operating ``efSearch`` with the
  candidates' rows read by ``pread`` from the vector file (as ``PublishedVectors.unit_rows``
  reads them) and reports VmRSS, VmHWM and ``/proc/self/smaps_rollup`` (Rss, Pss, USS =
  private clean + dirty, anonymous) minus what the bare interpreter with numpy and faiss
  imported held before the open (``*_base``).
* ``faiss_hnsw``: ``IndexHNSWFlat(d, 32, METRIC_INNER_PRODUCT)``, efConstruction 40 (the
  faiss default and its wiki's HNSW32 setting), efSearch swept; filters via
  ``SearchParametersHNSW(sel=IDSelectorBitmap)``.
* ``faiss_ivfpq``: ``IVF{4*sqrt(n)},PQ48,RFlat`` (48 sub-quantizers of 8 dims, 8 bits,
  exact refine of ``k_factor*k`` candidates), trained on 40*nlist samples, (nprobe, k_factor) swept;
  filters via ``SearchParametersIVF(sel=...)``. Resumable like usearch: the trained index and then
  every ``IVFPQ_CKPT`` added rows are saved under the cache (``ivfpq_<n>/``), ``build_s`` sums the runs.
* ``usearch``: ``Index(metric="cos", dtype="i8", connectivity=16, expansion_add=128)``
  (its README's defaults with int8 quantization), added with ``threads=os.cpu_count()``
  in slices of ``USEARCH_STEP`` rows, the index saved after each slice under the cache
  (``usearch_<n>/``): a stopped build resumes from its last slice and ``build_s`` sums
  the runs. expansion_search swept, its results
  rescored exactly like ours (i8 scores are lossy). Its Python API has no pre-filter, so
  filtered rows over-fetch ``min(4096, ceil(2k/kept))`` and drop the rest (post-filter).
* ``exact``: a BLAS scan of every vector per query (the fallback's cost).

Data: no shipped 384-d model embeds a million passages in minutes on two cores (the
static tier is 256-d), so the vectors are a documented clustered synthetic set -- a
4096-component Gaussian mixture (Zipf 0.7 weights) in a 48-d latent space, lifted to 384-d
by a fixed random map with a tanh, plus isotropic noise at 0.5x the signal RMS, unit
normalised -- whose neighbour structure is comparable to sentence embeddings' (mean top-1
cosine 0.63, median pair cosine ~0; HNSW32 recall@10 0.92 at efSearch 16 at 200k) and is
*not* uniform random. Queries are fresh draws of the same mixture. Vectors are cached
under ~/.cache/ragspine/ann-bench/.

Filters: a seeded uniform random mask keeps 50%, 5% and 0.1% of positions.

    nice -n 10 prlimit --as=14000000000 .venv/bin/python benchmarks/bench_ann.py --size 1000000 \
        --out benchmarks/results --name ann_1m

Resumable: each engine x size row is written to ``<name>.json`` / ``.md`` when done; a
rerun skips rows already there (``--redo ENGINE`` to measure one again); rows another run
wrote meanwhile are kept.

Side by side (``--paired LABEL=INDEX_FILE``, repeated): the given index files -- ours opened
with ``ann.open_ann``, a label starting with ``faiss_hnsw`` a faiss ``IndexHNSWFlat``,
``faiss_ivfpq`` the IVF-PQ row's saved index, ``usearch`` the usearch row's saved index -- are
searched in one process, query by query, every index and setting in turn on the same query,
3 passes, so a shared box's load falls on every row alike (``paired`` in the JSON, "Side by
side" in the page, with faiss HNSW's p50 interpolated at each row's recall):

    nice -n 10 prlimit --as=14000000000 .venv/bin/python benchmarks/bench_ann.py --size 1000000 \
        --out benchmarks/results --name ann_1m --paired ragspine_sq6_m16=SQ6.index \
        --paired ragspine_sq8_m32=SQ8.index --paired faiss_hnsw32_flat=FAISS.index

The whole dense side's memory (``--serve-dense VECTOR_FILE``): a fresh process opens a
published vector file with the ``vectors.ann`` beside it as serving does and answers the
queries at depth 100 through ``PublishedVectors.top`` (``serve_dense`` in the JSON).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
CACHE = Path.home() / ".cache" / "ragspine" / "ann-bench"
ENGINES = ("ragspine", "faiss_hnsw", "exact", "faiss_ivfpq", "usearch", "ragspine_sq8", "ragspine_flat")
STORAGE = {"ragspine": "sq6", "ragspine_sq8": "sq8", "ragspine_flat": "flat"}
USEARCH_STEP = 100_000
IVFPQ_CKPT = 4 * 262_144  # faiss_ivfpq: rows between checkpoints (each writes the whole index)
FRACTIONS = (0.5, 0.05, 0.001)
DIM, K, TARGET = 384, 10, 0.95
SWEEPS = {
    "ragspine": (32, 48, 64, 80, 96, 128, 160, 192, 204, 256, 320),  # 204: ef_search at 3M
    "ragspine_sq8": (16, 24, 32, 40, 48, 64, 96, 128),
    "ragspine_flat": (16, 24, 32, 48, 64, 96, 128),
    "faiss_hnsw": (16, 24, 32, 48, 56, 64, 96, 128, 192, 256),
    "faiss_ivfpq": ((8, 8), (16, 8), (32, 8), (32, 16), (64, 16), (128, 16), (128, 32), (256, 32)),
    "usearch": (16, 24, 32, 48, 64, 96, 128, 192, 256),
    "exact": (0,),
}


def clustered(n: int, *, start: int = 0, seed: int = 0, dim: int = DIM, latent: int = 48,
              clusters: int = 4096, noise: float = 0.5):
    """Rows ``start .. start+n`` of the clustered synthetic set (see the module docstring)."""
    import numpy as np

    rs = np.random.default_rng(seed)
    centers = rs.standard_normal((clusters, latent)).astype(np.float32)
    weights = 1.0 / np.arange(1, clusters + 1) ** 0.7
    weights /= weights.sum()
    spread = rs.uniform(0.4, 1.0, clusters).astype(np.float32)
    w1 = rs.standard_normal((latent, dim)).astype(np.float32) / np.sqrt(latent)
    w2 = rs.standard_normal((dim, dim)).astype(np.float32) / np.sqrt(dim)
    out = np.empty((n, dim), np.float32)
    for a in range(0, n, 100_000):
        b = min(n, a + 100_000)
        r = np.random.default_rng([seed, start + a])
        c = r.choice(clusters, size=b - a, p=weights)
        z = centers[c] + spread[c, None] * r.standard_normal((b - a, latent)).astype(np.float32)
        h = np.tanh(z @ w1)
        x = h @ w2 + noise * np.sqrt((h * h).mean()) * r.standard_normal((b - a, dim)).astype(np.float32)
        out[a:b] = x / np.linalg.norm(x, axis=1, keepdims=True)
    return out


def _paths(n: int) -> dict[str, Path]:
    d = CACHE / f"clustered_{n}_{DIM}"
    return {"dir": d, "x": d / "vectors.npy", "q": d / "queries.npy", "gt": d / "truth.npz"}


def prepare(n: int, queries: int) -> dict[str, Path]:
    """Vectors, queries, filter masks' seeds and exact top-10s, cached (built once per size)."""
    import numpy as np

    p = _paths(n)
    p["dir"].mkdir(parents=True, exist_ok=True)
    if not p["x"].exists():
        t = time.perf_counter()
        tmp = p["x"].with_suffix(".tmp.npy")
        mm = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.float32, shape=(n, DIM))
        for a in range(0, n, 500_000):
            b = min(n, a + 500_000)
            mm[a:b] = clustered(b - a, start=a)
        mm.flush()
        del mm
        os.replace(tmp, p["x"])
        print(f"vectors {n}: {time.perf_counter() - t:.1f}s", flush=True)
    if not p["gt"].exists():
        t = time.perf_counter()
        q = clustered(queries, start=10**12)
        np.save(p["q"], q)
        x = np.load(p["x"], mmap_mode="r")
        masks = {f: _mask(n, f) for f in FRACTIONS}
        best = {f: np.full((queries, K), -np.inf, np.float32) for f in (1.0, *FRACTIONS)}
        ids = {f: np.zeros((queries, K), np.int64) for f in best}
        for a in range(0, n, 200_000):
            s = q @ np.asarray(x[a:a + 200_000]).T
            for f in best:
                sf = s if f == 1.0 else np.where(masks[f][a:a + s.shape[1]], s, -np.inf)
                cat_s = np.concatenate([best[f], sf], axis=1)
                cat_i = np.concatenate([ids[f], np.broadcast_to(np.arange(a, a + s.shape[1]), sf.shape)], axis=1)
                top = np.argpartition(-cat_s, K, axis=1)[:, :K]
                best[f] = np.take_along_axis(cat_s, top, 1)
                ids[f] = np.take_along_axis(cat_i, top, 1)
        np.savez(p["gt"], **{f"f{f}": ids[f] for f in ids})
        print(f"truth {n}: {time.perf_counter() - t:.1f}s", flush=True)
    return p


def _mask(n: int, frac: float):
    import numpy as np

    return np.random.default_rng([7, int(frac * 1e6)]).random(n) < frac


def _rescore(xa, q, cand):
    """The top K of ``cand`` by exact float64 dot products over the float32 rows ``xa``:
    what every approximate engine's candidates go through (ours and usearch's alike)."""
    import numpy as np

    cand = np.sort(cand)  # ascending positions: a forward walk over the mapped file
    s = xa[cand].astype(np.float64) @ q.astype(np.float64)
    return cand[np.argsort(-s, kind="stable")[:K]]


def _recall(found: list, truth) -> float:
    return float(sum(len(set(map(int, f[:K])) & set(map(int, t))) for f, t in zip(found, truth, strict=True)) / (K * len(truth)))


def _time(fn, queries) -> tuple[list, list[float]]:
    for q in queries[:10]:  # warm-up: page in the graph's hot nodes, fill caches
        fn(q)
    out, times = [], []
    for q in queries:
        t = time.perf_counter()
        out.append(fn(q))
        times.append(time.perf_counter() - t)
    return out, times


def _stats(found, times, truth, setting) -> dict:
    import numpy as np

    ms = np.asarray(times) * 1e3
    return {"setting": setting, "recall": round(_recall(found, truth), 4),
            "p50_ms": round(float(np.percentile(ms, 50)), 4), "p95_ms": round(float(np.percentile(ms, 95)), 4)}


def _hwm_mib() -> float:
    """This process's peak resident set (VmHWM). Not ``ru_maxrss``: Linux carries that over
    ``exec`` from the parent, so a worker would report the parent's peak."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return round(int(line.split()[1]) / 1024, 1)
    return float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) / 1024


def worker(engine: str, n: int, tmp: Path) -> dict:
    """Build, sweep and filter one engine at one size; returns its result row."""
    import numpy as np

    p = _paths(n)
    x = np.load(p["x"], mmap_mode="r")
    qs = np.load(p["q"])
    truth = dict(np.load(p["gt"]))
    rss0 = _hwm_mib()

    xa = np.asarray(x)  # a plain view of the mapped file: no np.memmap wrapper per gather

    def rescore(q, cand):
        return _rescore(xa, q, cand)

    def exact_over(q, pos):
        s = np.asarray(x[pos]) @ q if pos is not None else np.asarray(x) @ q
        top = np.argpartition(-s, K)[:K] if len(s) > K else np.arange(len(s))
        top = top[np.argsort(-s[top], kind="stable")]
        return pos[top] if pos is not None else top

    row: dict = {"engine": engine, "n": n}
    index_file = tmp / f"{engine}.index"
    build = search = filtered = None
    t0 = time.perf_counter()
    if engine == "exact":
        np.asarray(x).sum()  # page the vectors in, as a serving process would have them
        search = lambda q, s: exact_over(q, None)  # noqa: E731
        filtered = lambda q, s, pos, mask: exact_over(q, pos)  # noqa: E731
    elif engine in STORAGE:
        import faiss

        from ragspine_pipeline.retrieval.vector import ann
        faiss.omp_set_num_threads(2)
        reuse = os.environ.get("RAGSPINE_BENCH_REUSE_INDEX")
        if reuse:  # --reuse-index: search an index built before (same rows), to re-measure at another load
            import shutil
            shutil.copyfile(reuse, index_file)
            row["reused_index"] = reuse
        else:
            ann.build_ann(x, index_file, storage=STORAGE[engine])
            build = time.perf_counter() - t0
        faiss.omp_set_num_threads(1)
        t = time.perf_counter()
        idx = ann.open_ann(index_file)
        row["open_s"] = round(time.perf_counter() - t, 4)
        row["format"] = idx.format
        search = lambda q, s: rescore(q, idx.search(q, K, None, ef=s))  # noqa: E731

        def filtered(q, s, pos, mask):
            cand = idx.search(q, K, mask, ef=s)
            return exact_over(q, pos) if cand is None else rescore(q, cand)
    elif engine == "faiss_hnsw":
        import faiss
        faiss.omp_set_num_threads(2)
        idx = faiss.IndexHNSWFlat(DIM, 32, faiss.METRIC_INNER_PRODUCT)
        idx.hnsw.efConstruction = 40
        for a in range(0, n, 262_144):
            idx.add(np.ascontiguousarray(x[a:a + 262_144]))
        build = time.perf_counter() - t0
        faiss.write_index(idx, str(index_file))
        faiss.omp_set_num_threads(1)

        def search(q, s):
            return idx.search(q[None], K, params=faiss.SearchParametersHNSW(efSearch=s))[1][0]

        def filtered(q, s, pos, mask):
            bits = np.packbits(mask, bitorder="little")  # the selector keeps a pointer: hold the array
            sel = faiss.IDSelectorBitmap(n, faiss.swig_ptr(bits))
            return idx.search(q[None], K, params=faiss.SearchParametersHNSW(efSearch=s, sel=sel))[1][0]
    elif engine == "faiss_ivfpq":
        import faiss
        faiss.omp_set_num_threads(2)
        nlist = int(4 * math.sqrt(n))
        idx = faiss.index_factory(DIM, f"IVF{nlist},PQ48,RFlat", faiss.METRIC_INNER_PRODUCT)
        faiss.downcast_index(faiss.extract_index_ivf(idx)).do_polysemous_training = False  # Hamming pre-filter codes: unused here, ~4 min
        # Resumable (a 3M build outlasts a session on a shared 2-core box): the trained index, then
        # the index every IVFPQ_CKPT rows, saved under the cache with the seconds spent so far.
        ckpt = CACHE / f"ivfpq_{n}"
        ckpt.mkdir(parents=True, exist_ok=True)
        saved, progress = ckpt / "index.faiss", ckpt / "progress.json"
        done = json.loads(progress.read_text()) if progress.exists() and saved.exists() else None
        if done:
            idx = faiss.read_index(str(saved))
            print(f"faiss_ivfpq: resumed at {done['rows']} rows ({done['build_s']:.0f} s so far)", file=sys.stderr, flush=True)
        else:
            sample = np.random.default_rng(3).choice(n, size=min(n, 40 * nlist), replace=False)
            idx.train(np.ascontiguousarray(x[np.sort(sample)]))
            done = {"rows": 0, "build_s": time.perf_counter() - t0}
            done["train_s"] = done["build_s"]
            faiss.write_index(idx, str(saved))  # not timed: the checkpoint
            progress.write_text(json.dumps(done))
            print(f"faiss_ivfpq: trained, {done['build_s']:.0f} s", file=sys.stderr, flush=True)
        for a in range(int(done["rows"]), n, 262_144):
            t = time.perf_counter()
            idx.add(np.ascontiguousarray(x[a:a + 262_144]))
            done = {**done, "rows": min(n, a + 262_144), "build_s": done["build_s"] + time.perf_counter() - t}
            if done["rows"] == n or done["rows"] % IVFPQ_CKPT == 0:
                faiss.write_index(idx, str(saved))  # not timed
                progress.write_text(json.dumps(done))
            print(f"faiss_ivfpq: {done['rows']} rows, {done['build_s']:.0f} s", file=sys.stderr, flush=True)
        build = done["build_s"]
        row["build_note"] = "train + add() summed over every resumed run; checkpoint saves not counted"
        index_file = saved
        faiss.omp_set_num_threads(1)
        row["config"] = f"IVF{nlist},PQ48,RFlat; setting = (nprobe, k_factor)"

        def _params(s, sel=None):
            base = faiss.SearchParametersIVF(nprobe=s[0], sel=sel) if sel is not None else \
                faiss.SearchParametersIVF(nprobe=s[0])
            return faiss.IndexRefineSearchParameters(k_factor=s[1], base_index_params=base)

        def search(q, s):
            return idx.search(q[None], K, params=_params(s))[1][0]

        def filtered(q, s, pos, mask):
            bits = np.packbits(mask, bitorder="little")  # the selector keeps a pointer: hold the array
            sel = faiss.IDSelectorBitmap(n, faiss.swig_ptr(bits))
            return idx.search(q[None], K, params=_params(s, sel))[1][0]
    elif engine == "usearch":
        from usearch.index import Index
        ckpt = CACHE / f"usearch_{n}"
        ckpt.mkdir(parents=True, exist_ok=True)
        saved, progress = ckpt / "index.usearch", ckpt / "progress.json"
        done = json.loads(progress.read_text()) if progress.exists() and saved.exists() else {"rows": 0, "build_s": 0.0}
        idx = Index(ndim=DIM, metric="cos", dtype="i8", connectivity=16, expansion_add=128)
        if done["rows"]:
            idx.load(str(saved))
            print(f"usearch: resumed at {done['rows']} rows ({done['build_s']:.0f} s so far)", file=sys.stderr, flush=True)
        for a in range(int(done["rows"]), n, USEARCH_STEP):
            b = min(n, a + USEARCH_STEP)
            t = time.perf_counter()
            idx.add(np.arange(a, b, dtype=np.uint64), np.ascontiguousarray(x[a:b]), threads=os.cpu_count() or 2)
            done = {"rows": b, "build_s": done["build_s"] + time.perf_counter() - t}
            idx.save(str(saved))  # not timed: the checkpoint that makes the build resumable
            progress.write_text(json.dumps(done))
            print(f"usearch: {b} rows, {done['build_s']:.0f} s", file=sys.stderr, flush=True)
        build = done["build_s"]
        row["build_note"] = "sum of the add() calls over every resumed run; checkpoint saves not counted"
        index_file = saved

        def search(q, s):
            idx.expansion_search = s
            return rescore(q, idx.search(q, max(K, 20), threads=1).keys.astype(np.int64))

        def filtered(q, s, pos, mask):
            frac = len(pos) / n
            count = min(n, 4096, math.ceil(2 * K / frac))
            idx.expansion_search = max(s, count)
            keys = idx.search(q, count, threads=1).keys.astype(np.int64)
            keys = keys[mask[keys]]
            return rescore(q, keys) if len(keys) else keys
    else:
        raise SystemExit(f"unknown engine {engine}")
    if build is not None:
        row["build_s"] = round(build, 2)
    if index_file.exists():
        row["index_bytes"] = index_file.stat().st_size
    sweep = []
    for s in SWEEPS[engine]:
        found, times = _time(lambda q, s=s: search(q, s), qs)
        sweep.append(_stats(found, times, truth["f1.0"], s))
        print(engine, n, sweep[-1], file=sys.stderr, flush=True)
        if sweep[-1]["recall"] >= 0.995:
            break
    row["sweep"] = sweep
    ok = [r for r in sweep if r["recall"] >= TARGET]
    row["at_target"] = ok[0] if ok else None
    op = (ok[0] if ok else sweep[-1])["setting"]
    rows = []
    for f in FRACTIONS:
        mask = _mask(n, f)
        pos = np.flatnonzero(mask)
        found, times = _time(lambda q, pos=pos, mask=mask: filtered(q, op, pos, mask), qs)
        bad = sum(int(not mask[np.asarray(r, dtype=np.int64)[np.asarray(r) >= 0]].all()) for r in found)
        rows.append({"kept": f, "survivors": int(len(pos)), **_stats(found, times, truth[f"f{f}"], op),
                     "non_survivors_returned": bad})
        print(engine, n, rows[-1], file=sys.stderr, flush=True)
    row["filtered"] = rows
    row["operating_setting"] = op
    row["peak_rss_mib"] = _hwm_mib()  # the vectors' mapped pages the engine touched count too
    row["rss_before_mib"] = rss0
    return row


def _rollup_mib() -> dict:
    """VmRSS/VmHWM and the smaps_rollup totals of this process, MiB (USS = private pages)."""
    out = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(("VmRSS:", "VmHWM:")):
            out[line.split(":")[0]] = int(line.split()[1]) / 1024
    roll = {}
    for line in Path("/proc/self/smaps_rollup").read_text().splitlines()[1:]:
        part = line.split()
        if len(part) >= 2 and part[1].isdigit():
            roll[part[0].rstrip(":")] = int(part[1]) / 1024
    out.update(Rss=roll.get("Rss", 0.0), Pss=roll.get("Pss", 0.0), Anonymous=roll.get("Anonymous", 0.0),
               USS=roll.get("Private_Clean", 0.0) + roll.get("Private_Dirty", 0.0))
    return {k: round(v, 1) for k, v in out.items()}


def serve_memory(index_file: Path, vectors: Path, queries: Path, ef: int) -> dict:
    """A fresh serving process's memory after opening ``index_file`` and answering every
    query (see the module docstring); runs ``_serve`` in a subprocess."""
    r = subprocess.run([sys.executable, __file__, "_serve", str(index_file), str(vectors), str(queries), str(ef)],
                       stdout=subprocess.PIPE, text=True, check=True)
    return json.loads(r.stdout.strip().splitlines()[-1])


def serve_worker(index_file: str, vectors: str, queries: str, ef: int) -> dict:
    """``_serve``: open as a server does, answer, measure (rows read by pread, not mapped)."""
    import faiss
    import numpy as np

    from ragspine_pipeline.retrieval.vector import ann

    faiss.omp_set_num_threads(1)
    qs = np.load(queries)
    with open(vectors, "rb") as fh:  # the .npy header's length: rows start after it
        np.lib.format.read_magic(fh)
        np.lib.format.read_array_header_1_0(fh)
        base = fh.tell()
    fd = os.open(vectors, os.O_RDONLY)
    rb = 4 * DIM
    before = _rollup_mib()
    t = time.perf_counter()
    idx = ann.open_ann(Path(index_file))
    open_s = time.perf_counter() - t
    opened = _rollup_mib()
    times = []
    for q in qs:
        t = time.perf_counter()
        cand = np.sort(idx.search(q, K, None, ef=ef))
        rows = np.frombuffer(b"".join(os.pread(fd, rb, base + int(c) * rb) for c in cand), np.float32)
        s = rows.reshape(len(cand), DIM).astype(np.float64) @ q.astype(np.float64)
        cand[np.argsort(-s, kind="stable")[:K]]
        times.append(time.perf_counter() - t)
    after = _rollup_mib()
    return {"queries": len(qs), "ef": ef, "format": idx.format, "open_s": round(open_s, 4),
            "p50_ms": round(float(np.percentile(np.asarray(times) * 1e3, 50)), 4),
            "after_open": {k: round(opened[k] - before[k], 1) for k in before},
            "after_queries": {k: round(after[k] - before[k], 1) for k in before},
            "base": before, "index_bytes": Path(index_file).stat().st_size}


def serve_dense_worker(vectors_file: str, queries: str, depth: int) -> dict:
    """``_serve_dense``: the whole dense side of a serving process -- the published vector file
    (``open_vectors``) with the ANN index beside it attached as serving attaches it
    (``attach_ann_file``) -- answering every query through ``PublishedVectors.top`` at
    ``depth`` (the hybrid channel's 100: graph candidates, exact rescoring from the file's
    rows). Memory as ``_serve``: above the interpreter with every module imported."""
    import faiss
    import numpy as np

    from ragspine_pipeline.retrieval.vector import published_scan
    from ragspine_pipeline.retrieval.vector.published import open_vectors
    from ragspine_pipeline.warehouse.embeddings_step import attach_ann_file

    faiss.omp_set_num_threads(1)
    published_scan.numba_start()
    qs = np.load(queries)
    before = _rollup_mib()
    t = time.perf_counter()
    pv = open_vectors(vectors_file)
    attached = attach_ann_file(pv)
    open_s = time.perf_counter() - t
    opened = _rollup_mib()
    every = np.arange(len(pv))
    every.flags.writeable = False
    times = []
    for q in qs:
        t = time.perf_counter()
        pv.top(q[None], every, depth)
        times.append(time.perf_counter() - t)
    after = _rollup_mib()
    return {"queries": len(qs), "depth": depth, "ann_attached": attached,
            "ann_format": getattr(pv.ann, "format", None), "open_s": round(open_s, 4),
            "p50_ms": round(float(np.percentile(np.asarray(times) * 1e3, 50)), 4),
            "after_open": {k: round(opened[k] - before[k], 1) for k in before},
            "after_queries": {k: round(after[k] - before[k], 1) for k in before}, "base": before}


PAIRED_ROUNDS = 3


def paired_worker(n: int, files: dict[str, str]) -> dict:
    """``_paired``: the given index files searched side by side in one process, query by query
    (every label and swept setting in turn on the same query, ``PAIRED_ROUNDS`` passes), so a
    shared box's load falls on every row alike. A label starting with ``faiss_hnsw`` is a
    faiss ``IndexHNSWFlat`` and one starting with ``faiss_ivfpq`` the ``faiss_ivfpq`` row's
    ``IVF..,PQ48,RFlat`` index, both read into memory (as their rows hold them); ``usearch``
    a usearch index loaded into memory, its candidates rescored exactly as in its row; the
    others open with ``ann.open_ann`` (mapped) and are rescored exactly, as the ``ragspine`` rows."""
    import faiss
    import numpy as np

    from ragspine_pipeline.retrieval.vector import ann

    faiss.omp_set_num_threads(1)
    p = _paths(n)
    xa = np.asarray(np.load(p["x"], mmap_mode="r"))
    qs, truth = np.load(p["q"]), np.load(p["gt"])["f1.0"]
    fns = {}

    def rescored(q, cand):
        return _rescore(xa, q, cand)

    for label, path in files.items():
        if label.startswith("faiss_hnsw"):
            idx = faiss.read_index(path)
            fns[label] = (lambda q, s, idx=idx: idx.search(
                q[None], K, params=faiss.SearchParametersHNSW(efSearch=s))[1][0], SWEEPS["faiss_hnsw"])
        elif label.startswith("faiss_ivfpq"):
            idx = faiss.read_index(path)  # in memory, as its row holds it (the RFlat refine keeps float32 rows)

            def ivf(q, s, idx=idx):
                params = faiss.IndexRefineSearchParameters(
                    k_factor=s[1], base_index_params=faiss.SearchParametersIVF(nprobe=s[0]))
                return idx.search(q[None], K, params=params)[1][0]
            fns[label] = (ivf, SWEEPS["faiss_ivfpq"])
        elif label.startswith("usearch"):
            from usearch.index import Index
            idx = Index.restore(path)  # loaded into memory, as its row holds it after the build

            def us(q, s, idx=idx):
                idx.expansion_search = s
                return rescored(q, idx.search(q, max(K, 20), threads=1).keys.astype(np.int64))
            fns[label] = (us, SWEEPS["usearch"])
        else:
            idx = ann.open_ann(Path(path))

            def one(q, s, idx=idx):
                return rescored(q, idx.search(q, K, None, ef=s))
            fns[label] = (one, SWEEPS["ragspine_sq8" if idx.storage == "sq8" else "ragspine"])
    combos = [(label, s) for label, (_, sweep) in fns.items() for s in sweep]
    for q in qs:  # warm-up: every index's pages the widest setting touches
        for fn, sweep in fns.values():
            fn(q, sweep[-1])
    times = {c: np.zeros((PAIRED_ROUNDS, len(qs))) for c in combos}
    found: dict = {c: [] for c in combos}
    for r in range(PAIRED_ROUNDS):
        for i, q in enumerate(qs):
            for c in combos:
                t = time.perf_counter()
                got = fns[c[0]][0](q, c[1])
                times[c][r, i] = time.perf_counter() - t
                if r == 0:
                    found[c].append(got)
    out: dict = {"rounds": PAIRED_ROUNDS, "files": {k: {"path": v, "bytes": Path(v).stat().st_size}
                                                    for k, v in files.items()}, "sweeps": {}}
    for label in fns:
        rows = []
        for c in combos:
            if c[0] == label:
                ms = times[c] * 1e3
                rows.append({"setting": c[1], "recall": round(_recall(found[c], truth), 4),
                             "p50_ms": round(float(np.percentile(ms, 50)), 4),
                             "p95_ms": round(float(np.percentile(ms, 95)), 4),
                             "best_pass_p50_ms": round(float(np.percentile(ms.min(axis=0), 50)), 4)})
        out["sweeps"][label] = rows
    return out


def _at_recall(sweep: list[dict], recall: float, key: str) -> float | None:
    """``key`` (a p50) interpolated linearly at ``recall`` along a sweep (None: not reached)."""
    pts = sorted((r["recall"], r[key]) for r in sweep)
    for (r0, t0), (r1, t1) in zip(pts, pts[1:], strict=False):
        if r0 <= recall <= r1:
            return t0 if r1 == r0 else t0 + (t1 - t0) * (recall - r0) / (r1 - r0)
    return pts[0][1] if pts and recall <= pts[0][0] else None


def paired_markdown(n: int, pr: dict) -> list[str]:
    """The side-by-side rows: each label's cheapest setting at recall >= 0.95 and faiss HNSW's
    p50 interpolated at that same recall."""
    peer = next((k for k in pr["sweeps"] if k.startswith("faiss_hnsw")), None)
    lines = ["", f"Side by side at {n:,} (`_paired`: one process, query by query, {pr['rounds']} passes; "
             "p50 over every sample, and over each query's fastest pass):", "",
             "| index | bytes | setting @0.95 | recall@10 | p50 ms | fastest-pass p50 ms | faiss HNSW p50 at that "
             "recall (all / fastest) | ratio (all / fastest) |", "|---|---|---|---|---|---|---|---|"]
    for label, sweep in pr["sweeps"].items():
        at = next((r for r in sweep if r["recall"] >= TARGET), None)
        if at is None:
            lines.append(f"| {label} | {pr['files'][label]['bytes']:,} | not reached | | | | | |")
            continue
        ref = [_at_recall(pr["sweeps"][peer], at["recall"], k) if peer else None
               for k in ("p50_ms", "best_pass_p50_ms")]
        ratio = [f"{a / b:.2f}x" if b else "" for a, b in zip((at["p50_ms"], at["best_pass_p50_ms"]), ref, strict=True)]
        refs = " / ".join(f"{v:.3f}" if v else "n/a" for v in ref)
        lines.append(f"| {label} | {pr['files'][label]['bytes']:,} | {at['setting']} | {at['recall']} | "
                     f"{at['p50_ms']} | {at['best_pass_p50_ms']} | {refs} | {' / '.join(ratio)} |")
    lines += ["", "Paired sweeps (setting: recall@10, p50 ms, fastest-pass p50 ms):", ""]
    for label, sweep in pr["sweeps"].items():
        lines.append(f"- {label}: " + "; ".join(f"{r['setting']}: {r['recall']:.3f}, {r['p50_ms']:.3f}, "
                                                 f"{r['best_pass_p50_ms']:.3f}" for r in sweep))
    return lines


def markdown(res: dict) -> str:
    m = res["meta"]
    sizes = ", ".join(f"{n:,}" for n in m["sizes"])
    only_paired = not res["rows"] and res.get("paired")  # a --paired run's own file: no engine rows
    title = (f"# Dense ANN side by side at {sizes} vectors (dim {DIM}): {', '.join(next(iter(res['paired'].values()))['sweeps'])}"
             if only_paired else f"# Dense ANN at {sizes} vectors (dim {DIM}): this project vs faiss and usearch")
    lines = [title, "", f"Command: `{m['command']}`", "",
             f"Machine: {m['machine']}. Data: {m['data']}. Threads: {m['threads']}.", ""]
    if not only_paired:
        lines += ["| engine | n | build s | index bytes | peak RSS MiB | setting @0.95 | recall@10 | p50 ms | p95 ms | "
                  "filtered 50% / 5% / 0.1%: recall, p50 ms |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in res["rows"].values():
        at = r.get("at_target") or {}
        filt = " / ".join(f"{x['recall']:.3f}, {x['p50_ms']:.2f}" for x in r.get("filtered", []))
        lines.append(f"| {r['engine']} | {r['n']:,} | {r.get('build_s', '')} | {r.get('index_bytes', 0):,} | "
                     f"{r['peak_rss_mib']} | {at.get('setting', 'not reached')} | {at.get('recall', '')} | "
                     f"{at.get('p50_ms', '')} | {at.get('p95_ms', '')} | {filt} |")
    lines += ["", "Sweeps (setting: recall@10, p50 ms):", ""] if res["rows"] else []
    for key, r in res["rows"].items():
        lines.append(f"- {key}: " + "; ".join(f"{s['setting']}: {s['recall']:.3f}, {s['p50_ms']:.3f}"
                                               for s in r["sweep"]))
    served = [(key, r) for key, r in res["rows"].items() if r.get("serve")]
    if served:
        lines += ["", "Serving memory: a fresh process opens the index (mapped), answers the queries at the row's "
                  "setting with exact rescoring from the vector file (pread), MiB above the interpreter with numpy "
                  "and faiss imported:", "",
                  "| row | format | index bytes | open s | p50 ms | after open: RSS / USS / PSS | "
                  "after queries: RSS / USS / PSS / anonymous |", "|---|---|---|---|---|---|---|"]
        for key, r in served:
            v, o, a = r["serve"], r["serve"]["after_open"], r["serve"]["after_queries"]
            lines.append(f"| {key} | {v['format']} | {v['index_bytes']:,} | {v['open_s']} | {v['p50_ms']} | "
                         f"{o['Rss']} / {o['USS']} / {o['Pss']} | {a['Rss']} / {a['USS']} / {a['Pss']} / "
                         f"{a['Anonymous']} |")
    for size, v in sorted(res.get("serve_dense", {}).items(), key=lambda kv: int(kv[0])):
        o, a = v["after_open"], v["after_queries"]
        lines += ["", f"Whole dense side at {int(size):,} (`_serve_dense`: a fresh process opens the published vector "
                  f"file and attaches the {v['ann_format']} index beside it as serving does, answers {v['queries']} "
                  f"queries through `PublishedVectors.top` at depth {v['depth']}): MiB above the interpreter, after "
                  f"the open RSS {o['Rss']} / USS {o['USS']} / PSS {o['Pss']}; after the queries RSS {a['Rss']} / "
                  f"USS {a['USS']} / PSS {a['Pss']} / anonymous {a['Anonymous']} "
                  f"({a['Rss'] * 2**20 / 1e9:.3f} GB)."]
    for size, pr in sorted(res.get("paired", {}).items(), key=lambda kv: int(kv[0])):
        lines += paired_markdown(int(size), pr)
    lines += ["", *m.get("notes", [])]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", type=int, action="append", help="vector counts (repeatable; default 1000000)")
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--engines", default=",".join(ENGINES))
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "out"))
    ap.add_argument("--name", default="ann")
    ap.add_argument("--redo", action="append", default=[])
    ap.add_argument("--tmp", default="/tmp/ragspine-ann-bench")
    ap.add_argument("--keep-index", default=None, help="move the ragspine row's index file here (bench_hybrid_1m)")
    ap.add_argument("--reuse-index", default=None,
                    help="ragspine rows: search this index (built before over the same rows) instead of building; "
                         "the row keeps its earlier build_s")
    ap.add_argument("--paired", action="append", default=[], metavar="LABEL=INDEX_FILE",
                    help="search these index files side by side (a label starting with faiss_hnsw: a faiss "
                         "IndexHNSWFlat; faiss_ivfpq / usearch: those rows' saved indexes; others: "
                         "ann.build_ann files) instead of running engines")
    ap.add_argument("--serve-dense", default=None, metavar="VECTOR_FILE",
                    help="measure the whole dense side (this published vector file + the vectors.ann beside it) "
                         "in a fresh process at depth 100, instead of running engines")
    args = ap.parse_args(argv)
    sizes = args.size or [1_000_000]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    jpath = out / f"{args.name}.json"
    res = json.loads(jpath.read_text()) if jpath.exists() else {"rows": {}}
    res["meta"] = {
        "command": "nice -n 10 prlimit --as=14000000000 .venv/bin/python benchmarks/bench_ann.py "
                   + " ".join(sys.argv[1:] if argv is None else argv),
        "sizes": sizes, "queries": args.queries,
        "machine": f"{os.cpu_count()} CPUs, Python {platform.python_version()}",
        "data": "clustered synthetic (48-d Gaussian mixture lifted to 384-d, see the script's docstring); "
                f"{args.queries} queries from the same mixture; filters: seeded uniform random masks",
        "threads": "build 2 threads; search 1 thread for every engine (faiss omp_set_num_threads(1), "
                   "usearch threads=1, OPENBLAS_NUM_THREADS=1), one query per call",
        "notes": res.get("meta", {}).get("notes", []),
    }
    for n in sizes if args.serve_dense else ():
        prepare(n, args.queries)
        r = subprocess.run([sys.executable, __file__, "_serve_dense", args.serve_dense, str(_paths(n)["q"]), "100"],
                           stdout=subprocess.PIPE, text=True, check=True, env=dict(os.environ, OPENBLAS_NUM_THREADS="1"))
        latest = json.loads(jpath.read_text()) if jpath.exists() else {"rows": {}}
        got = json.loads(r.stdout.strip().splitlines()[-1])
        res = {**latest, "meta": res["meta"], "serve_dense": {**latest.get("serve_dense", {}), str(n): got}}
        jpath.write_text(json.dumps(res, indent=1) + "\n")
        (out / f"{args.name}.md").write_text(markdown(res))
        print(f"serve_dense@{n}: {got}", flush=True)
    for n in sizes if args.paired and not args.serve_dense else ():
        prepare(n, args.queries)
        files = dict(item.split("=", 1) for item in args.paired)
        r = subprocess.run([sys.executable, __file__, "_paired", str(n), json.dumps(files)], stdout=subprocess.PIPE,
                           text=True, check=True, env=dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1"))
        latest = json.loads(jpath.read_text()) if jpath.exists() else {"rows": {}}
        res = {**latest, "meta": res["meta"], "paired": {**latest.get("paired", {}),
                                                          str(n): json.loads(r.stdout.strip().splitlines()[-1])}}
        res["paired"][str(n)]["load_avg_after"] = round(os.getloadavg()[0], 2)
        jpath.write_text(json.dumps(res, indent=1) + "\n")
        (out / f"{args.name}.md").write_text(markdown(res))
        print(f"paired@{n}: written", flush=True)
    for n in sizes if not (args.paired or args.serve_dense) else ():
        prepare(n, args.queries)
        for engine in args.engines.split(","):
            key = f"{engine}@{n}"
            if key in res["rows"] and engine not in args.redo:
                continue
            tmp = Path(args.tmp)
            tmp.mkdir(parents=True, exist_ok=True)
            env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="2", MKL_NUM_THREADS="1",
                       OMP_WAIT_POLICY="PASSIVE")  # no spinning OpenMP threads on a shared box
            t = time.perf_counter()
            if args.reuse_index and engine.startswith("ragspine"):
                env["RAGSPINE_BENCH_REUSE_INDEX"] = args.reuse_index
            r = subprocess.run([sys.executable, __file__, "_worker", engine, str(n), str(tmp)], env=env,
                               stdout=subprocess.PIPE, text=True)
            if r.returncode != 0:
                print(f"{key}: worker failed ({r.returncode})", flush=True)
                continue
            row = json.loads(r.stdout.strip().splitlines()[-1])
            index_file = tmp / f"{engine}.index"
            if engine.startswith("ragspine") and index_file.exists():  # the worker has exited: nothing shares its pages
                p = _paths(n)
                row["serve"] = serve_memory(index_file, p["x"], p["q"], row["operating_setting"])
                print(key, "serve", row["serve"], flush=True)
                if args.keep_index:  # bench_hybrid_1m serves this index beside its vector file
                    Path(args.keep_index).parent.mkdir(parents=True, exist_ok=True)
                    os.replace(index_file, args.keep_index)
            row["wall_s"] = round(time.perf_counter() - t, 1)
            row["load_avg_after"] = round(os.getloadavg()[0], 2)
            for f in tmp.glob(f"{engine}.index*"):
                f.unlink()
            if row.get("reused_index") and key in res["rows"]:  # the build was measured with the index
                row["build_s"] = res["rows"][key].get("build_s")
            # Rows, paired runs and notes another run (or an editor) wrote meanwhile are kept:
            # a 3M row can end hours after this process read the file.
            latest = json.loads(jpath.read_text()) if jpath.exists() else {"rows": {}}
            notes = latest.get("meta", {}).get("notes", res["meta"]["notes"])
            res = {**res, **latest, "meta": {**res["meta"], "notes": notes},
                   "rows": {**res["rows"], **latest["rows"], key: row}}
            jpath.write_text(json.dumps(res, indent=1) + "\n")
            (out / f"{args.name}.md").write_text(markdown(res))
            print(f"{key}: written", flush=True)
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "_worker":
        out_row = worker(sys.argv[2], int(sys.argv[3]), Path(sys.argv[4]))
        print(json.dumps(out_row), flush=True)
    elif len(sys.argv) > 1 and sys.argv[1] == "_serve_dense":
        print(json.dumps(serve_dense_worker(sys.argv[2], sys.argv[3], int(sys.argv[4]))), flush=True)
    elif len(sys.argv) > 1 and sys.argv[1] == "_paired":
        print(json.dumps(paired_worker(int(sys.argv[2]), json.loads(sys.argv[3]))), flush=True)
    elif len(sys.argv) > 1 and sys.argv[1] == "_serve":
        print(json.dumps(serve_worker(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]))), flush=True)
    else:
        raise SystemExit(main())
