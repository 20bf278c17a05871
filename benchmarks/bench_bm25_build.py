"""BM25 build time and peak memory: the in-memory build against the streaming build.

    python benchmarks/bench_bm25_build.py generate --docs 10000000      # cache the synthetic corpus
    prlimit --as=14000000000 python benchmarks/bench_bm25_build.py run --sizes 1000000,10000000
    python benchmarks/bench_bm25_build.py buckets --docs 1000000         # qps: 1 vs 8 vs 16 segments

The corpus is ``bench_bm25.synthetic_corpus``'s (Zipf s=1.1 over 200k terms, Poisson(60)
lengths, seed 7), cached as ``benchmarks/.cache/synthetic_<n>_7.npz`` (int32 term ids +
lengths; the same file ``bench_bm25`` reads, written here in slices so 600M tokens never
need more than a few GB). Each build runs in a fresh subprocess so its peak RSS is its own
(``ru_maxrss``). The streaming build is fed what a real corpus gives it: batches of 100k
documents of token strings ``w<id>``, as an Arrow list<string> array (what the
warehouse's Parquet tokens column reads as); the time to make those batches is measured
apart (``feed_s``) and is not in ``build_s``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CACHE = ROOT / "benchmarks" / ".cache"
RESULTS = ROOT / "benchmarks" / "results"
VOCAB, SEED, K1, B = 200_000, 7, 1.5, 0.75
SLICE_TOKENS = 50_000_000  # tokens drawn per slice while generating (~0.8 GB of temporaries)
BATCH_DOCS = 100_000


# --------------------------------------------------------------------------- corpus
def corpus_path(n_docs: int, seed: int = SEED) -> Path:
    return CACHE / f"synthetic_{n_docs}_{seed}.npz"


def generate(n_docs: int, seed: int = SEED) -> Path:
    """Write ``synthetic_corpus``'s npz for ``n_docs`` (unless present), drawing in slices.

    ``Generator.choice(p=...)`` draws one uniform double per sample, so drawing the tokens
    in consecutive slices yields exactly the array one call would (checked by the tests of
    this script's caller, ``bench_bm25.synthetic_corpus``, on small sizes), and the query
    draws that follow see the same generator state.
    """
    path = corpus_path(n_docs, seed)
    if path.exists():
        return path
    CACHE.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    p = 1.0 / np.arange(1, VOCAB + 1) ** 1.1
    p /= p.sum()
    lens = np.maximum(rng.poisson(60, n_docs), 1)
    total = int(lens.sum())
    toks = np.empty(total, np.int32)
    for lo in range(0, total, SLICE_TOKENS):
        hi = min(total, lo + SLICE_TOKENS)
        toks[lo:hi] = rng.choice(VOCAB, size=hi - lo, p=p)
    q_lens = rng.integers(2, 6, 200)
    q_toks = np.concatenate([rng.choice(VOCAB, size=n, p=p) for n in q_lens]).astype(np.int32)
    tmp = path.with_name(f".{path.stem}.tmp-{os.getpid()}.npz")
    np.savez(tmp, lens=lens, toks=toks, q_lens=q_lens, q_toks=q_toks)
    os.replace(tmp, path)  # another process checking for the file sees all of it or nothing
    return path


def _npz_member(path: Path, name: str) -> tuple[int, np.dtype, tuple[int, ...]]:
    """(byte offset, dtype, shape) of an uncompressed npz member, so it can be read in slices."""
    with zipfile.ZipFile(path) as zf:
        info = zf.getinfo(f"{name}.npy")
    if info.compress_type != zipfile.ZIP_STORED:
        raise ValueError(f"{path}: {name} is compressed")
    with open(path, "rb") as f:
        f.seek(info.header_offset)
        local = f.read(30)
        f.seek(info.header_offset + 30 + int.from_bytes(local[26:28], "little") + int.from_bytes(local[28:30], "little"))
        version = np.lib.format.read_magic(f)
        read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, _fortran, dtype = read(f)
        return f.tell(), dtype, shape


def load_small(path: Path, name: str) -> np.ndarray:
    with np.load(path) as z:
        return z[name]


class Feed:
    """The corpus as Arrow list<string> batches of ``BATCH_DOCS`` documents, read from the
    npz a slice at a time (never all 600M tokens); ``seconds`` is the time spent making them."""

    def __init__(self, n_docs: int) -> None:
        self.path = corpus_path(n_docs)
        self.lens = load_small(self.path, "lens")
        self.tok_off, dtype, _shape = _npz_member(self.path, "toks")
        if dtype != np.int32:
            raise ValueError(f"{self.path}: toks are {dtype}, not int32")
        self.names = pa.array([f"w{i}" for i in range(VOCAB)])
        self.seconds = 0.0

    def _slices(self) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """(lengths, term ids) of each batch, read from the file."""
        with open(self.path, "rb") as f:
            tok = 0
            for lo in range(0, len(self.lens), BATCH_DOCS):
                lens = self.lens[lo:lo + BATCH_DOCS]
                n = int(lens.sum())
                f.seek(self.tok_off + 4 * tok)
                tok += n
                yield lens, np.fromfile(f, np.int32, n)

    def __iter__(self) -> Iterator[pa.Array]:
        t0 = time.perf_counter()
        for lens, ids in self._slices():
            offs = np.zeros(len(lens) + 1, np.int32)
            np.cumsum(lens, out=offs[1:])
            batch = pa.ListArray.from_arrays(pa.array(offs), self.names.take(pa.array(ids)))
            self.seconds += time.perf_counter() - t0
            yield batch
            t0 = time.perf_counter()

    def python_batches(self) -> Iterator[list[list[str]]]:
        """Batches of Python token lists sharing one string object per term (as
        ``bench_bm25``'s peers build is fed: made while the build runs, not in ``seconds``)."""
        names = [f"w{i}" for i in range(VOCAB)]
        for lens, ids in self._slices():
            flat = [names[t] for t in ids.tolist()]
            bounds = np.concatenate(([0], np.cumsum(lens))).tolist()
            yield [flat[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]

    def python_docs(self) -> list[list[str]]:
        """Every document as a Python token list (the old build's input)."""
        t0 = time.perf_counter()
        docs = [d for batch in self.python_batches() for d in batch]
        self.seconds += time.perf_counter() - t0
        return docs

    def queries(self) -> list[list[str]]:
        q_lens, q_toks = load_small(self.path, "q_lens"), load_small(self.path, "q_toks")
        out, pos = [], 0
        for n in q_lens.tolist():
            out.append([f"w{t}" for t in q_toks[pos:pos + n].tolist()])
            pos += n
        return out


# --------------------------------------------------------------------------- one build
def build_one(n_docs: int, build: str, layout: str, memory_mib: int | None, feed_kind: str = "arrow") -> dict:
    """One build in this (fresh) process: its time, size and peak RSS (``feed_kind``
    python: the stream build is fed ``Feed.python_batches``, their making timed with it)."""
    from ragspine_pipeline.retrieval.lexical.refresh import stream_build as sb

    CACHE.mkdir(parents=True, exist_ok=True)
    out = CACHE / f"bm25_build_{n_docs}_{build}.rsbm25"
    feed = Feed(n_docs)
    with tempfile.TemporaryDirectory(dir=CACHE) as warm:  # compile (or load) the kernels untimed
        sb.count_stream([[["a", "b"], ["a"]]], tmp_dir=warm)
        for lay in ("plain", "packed"):  # and the writers' (a base revision's first run compiles them)
            sb.build_index_file([[["a", "b"], ["a"]]], Path(warm) / f"{lay}.rsbm25", k1=K1, b=B, layout=lay)
    row: dict = {"docs": n_docs, "build": build, "tokens": int(feed.lens.sum())}
    t0 = time.perf_counter()
    if build == "stream":
        batches = feed.python_batches() if feed_kind == "python" else feed
        rep = sb.build_index_file(batches, out, k1=K1, b=B, layout=layout, memory_mib=memory_mib, tmp_dir=None)
        total = time.perf_counter() - t0
        row.update(layout=rep.layout, postings=rep.postings, terms=rep.terms, bytes=rep.bytes, runs=rep.runs,
                   count_s=round(rep.count_seconds - feed.seconds, 2), write_s=round(rep.seconds - rep.count_seconds, 2))
    else:
        from ragspine_pipeline.retrieval.lexical.index.bm25 import BM25Index
        from ragspine_pipeline.retrieval.lexical.refresh.publish import write_index

        docs = feed.python_docs()  # what the old build needed: every token list in memory
        t0 = time.perf_counter()
        index = BM25Index(docs, k1=K1, b=B, kernel="numpy")
        t_count = time.perf_counter() - t0
        write_index(index, out)
        total = time.perf_counter() - t0 + feed.seconds  # build_s below subtracts feed.seconds
        row.update(layout="plain", postings=int(index.indptr[-1]), terms=len(index.vocab), bytes=out.stat().st_size,
                   runs=0, count_s=round(t_count, 2), write_s=round(time.perf_counter() - t0 - t_count, 2))
    row.update(build_s=round(total - feed.seconds, 2), feed_s=round(feed.seconds, 2), load=round(os.getloadavg()[0], 1),
               peak_rss_mib=round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
               memory_mib=memory_mib)
    if feed_kind != "arrow":
        row["feed"] = feed_kind
    with open(out, "rb") as f:
        row["sha256"] = hashlib.file_digest(f, "sha256").hexdigest()[:16]
    out.unlink()
    return row


def ab(n_docs: int, base: str, feeds: list[str], rounds: int, layout: str | None) -> Iterator[dict]:
    """The stream build of the engine at git revision ``base`` and of this checkout, in
    fresh processes alternating base/head per round and feed (so load hits both alike)."""
    rev = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", base], capture_output=True, text=True,
                         check=True).stdout.strip()
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()
    with tempfile.TemporaryDirectory(prefix="bm25-ab-") as tmp:
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "ragspine_pipeline"], capture_output=True,
                                 check=True).stdout
        subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
        for r in range(rounds):
            for feed in feeds:
                for engine, root in ((f"base {rev}", tmp), (f"head {head}", str(ROOT))):
                    cmd = [sys.executable, __file__, "one", "--docs", str(n_docs), "--build", "stream", "--feed", feed,
                           "--engine", root] + (["--layout", layout] if layout else [])
                    done = subprocess.run(cmd, capture_output=True, text=True, check=True)
                    row = json.loads(done.stdout.strip().splitlines()[-1])
                    yield {**row, "kind": "ab", "engine": engine, "feed": feed, "round": r}


# --------------------------------------------------------------------------- results
def _key(row: dict) -> tuple:
    return (row.get("kind", "build"), row["docs"], str(row.get("build")), str(row.get("layout")),
            row.get("buckets") or 0, str(row.get("feed", "arrow")), row.get("round", 0), str(row.get("engine", "")))


def save(rows: list[dict], command: str) -> None:
    """Merge ``rows`` into results/bm25_build.json (same key replaced) and write the page."""
    path = RESULTS / "bm25_build.json"
    old = json.loads(path.read_text()) if path.exists() else {"rows": []}
    keep = {_key(r): r for r in old["rows"]}
    for r in rows:
        keep[_key(r)] = r
    commands = old.get("commands", {})
    for r in rows:
        kind = r.get("kind", "build")
        listed = commands[kind] if isinstance(commands.get(kind), list) else [commands[kind]] if kind in commands else []
        commands[kind] = listed if command in listed else [*listed, command]
    data = {"commands": commands, "machine": machine(), "rows": sorted(keep.values(), key=_key)}
    RESULTS.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1) + "\n")
    (RESULTS / "bm25_build.md").write_text(markdown(data))


def machine() -> dict:
    return {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
            "mem_gb": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)}


def markdown(data: dict) -> str:
    builds = [r for r in data["rows"] if r.get("kind", "build") == "build"]
    qps = [r for r in data["rows"] if r.get("kind") == "buckets"]
    lines = ["# BM25 build: in-memory vs streaming", "",
             "Synthetic Zipf corpus (s=1.1, 200k terms, Poisson(60) lengths, seed 7). Each build in a fresh",
             "process (`flock /tmp/heavy.lock nice -n 10 prlimit --as=14000000000 ...`); peak RSS is its",
             "`ru_maxrss`; `build_s` excludes `feed_s` (making the Arrow batches of 100k documents, or for",
             "the in-memory build the Python token lists, which it must hold whole). `load`: the machine's",
             "1-minute load average when the row finished (2 cores shared with other work: times are",
             "inflated by about load/2). `count_s`: tokens to counted postings (the in-memory build's",
             "also includes its weights, as `BM25Index` computes them); `write_s`: the rest (weights or",
             "packing, writing, verifying).",
             "", *[f"- {kind}: `{cmd}`" for kind, cmds in sorted(data["commands"].items()) for cmd in cmds],
             "", f"Machine: {data['machine']}", "",
             "| docs | build | layout | build s | count s | write s | feed s | peak RSS MiB | postings | runs | bytes | load |",
             "|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in builds:
        if "error" in r:
            lines.append(f"| {r['docs']:,} | {r['build']} | {r['layout']} | failed: {r['error']} |"
                         + " |" * 7 + f" {r.get('load') or ''} |")
            continue
        lines.append(f"| {r['docs']:,} | {r['build']} | {r['layout']} | {r['build_s']} | {r['count_s']} | "
                     f"{r['write_s']} | {r['feed_s']} | {r['peak_rss_mib']:,.0f} | {r['postings']:,} | {r['runs']} | "
                     f"{r['bytes']:,} | {r.get('load', '')} |")
    if any("error" in r for r in builds):
        lines += ["", "A failed row shows the build's last error line. The plain layout keeps a float64 weight per",
                  "posting in memory while its verify step maps the finished file, so at 10M documents it passes",
                  "a 14 GB address-space cap; the auto layout (packed from 100M postings) is the one for that size."]
    pairs = [r for r in data["rows"] if r.get("kind") == "ab"]
    if pairs:
        lines += ["", "## Before / after: the same stream build, engine at two revisions", "",
                  "`ab`: fresh processes alternating base and head per round and feed, on the same cached corpus.",
                  "`arrow`: Arrow batches as above (feed s excluded); `python`: Python token lists of 100k",
                  "documents made while the build runs (as `bench_bm25`'s peers row feeds it, their making",
                  "included in build s). `sha256`: the published file's first 16 hex digits (same bytes).", "",
                  "| docs | feed | engine | round | build s | count s | write s | peak RSS MiB | sha256 | load |",
                  "|---:|---|---|---:|---:|---:|---:|---:|---|---:|"]
        for r in sorted(pairs, key=lambda r: (r["docs"], r["feed"], r["round"], r["engine"])):
            lines.append(f"| {r['docs']:,} | {r['feed']} | {r['engine']} | {r['round']} | {r['build_s']} | "
                         f"{r['count_s']} | {r['write_s']} | {r['peak_rss_mib']:,.0f} | {r.get('sha256', '')} | "
                         f"{r.get('load', '')} |")
    if qps:
        lines += ["", "## Hash-bucket segments: single-process query throughput", "",
                  "200 queries x rounds, top-10, one thread; segments via `SegmentedBM25`, 1 bucket = one index file.",
                  "", "| docs | buckets | qps (median of rounds) | vs 1 bucket | identical top-10 | load |",
                  "|---:|---:|---:|---:|---|---:|"]
        for r in qps:
            lines.append(f"| {r['docs']:,} | {r['buckets']} | {r['qps']:,.0f} | {r['ratio']:.3f} | {r['identical']} | "
                         f"{r.get('load', '')} |")
        eight = [r for r in qps if r["buckets"] == 8]
        if eight:
            cost = 1 - eight[0]["ratio"]
            lines += ["", f"8 buckets cost {cost:.0%} of single-process qps: RAGSPINE_BM25_BUCKETS "
                          + ("may default to 8 (within 5%)." if cost <= 0.05 else "keeps its default of 1 (the rule: "
                             "8 only if it costs <= 5%); a sharded deployment sets it.")]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- buckets
def bucket_qps(n_docs: int, bucket_counts: list[int], rounds: int) -> list[dict]:
    """Single-process top-10 qps of one index file vs the same corpus as B segments."""
    from ragspine_pipeline.retrieval.lexical.index.mapped import open_index
    from ragspine_pipeline.retrieval.lexical.refresh.segments import (
        open_segments,
        write_segments_stream,
    )
    from ragspine_pipeline.retrieval.lexical.refresh.stream_build import build_index_file

    feed = Feed(n_docs)
    ids = [f"c{i:09d}" for i in range(n_docs)]
    queries = feed.queries()
    opened = {}
    with tempfile.TemporaryDirectory(dir=CACHE) as tmp:
        for nb in bucket_counts:
            if nb == 1:
                build_index_file(feed, Path(tmp) / "one.rsbm25", k1=K1, b=B, doc_ids=ids)
                opened[nb] = open_index(Path(tmp) / "one.rsbm25")
            else:
                write_segments_stream(Path(tmp) / f"seg{nb}", feed, ids, buckets=nb, k1=K1, b=B)
                opened[nb] = open_segments(Path(tmp) / f"seg{nb}")
        answers = {nb: [ix.search(q, 10) for q in queries] for nb, ix in opened.items()}  # warm: pages, kernels
        base = answers[bucket_counts[0]]
        times: dict[int, list[float]] = {nb: [] for nb in opened}
        for _ in range(rounds):  # interleaved, so load on the machine hits every config alike
            for nb, ix in opened.items():
                t0 = time.perf_counter()
                for q in queries:
                    ix.search(q, 10)
                times[nb].append(time.perf_counter() - t0)
        rows = []
        best = len(queries) / float(np.median(times[bucket_counts[0]]))
        for nb in opened:
            same = all(a.ids.tolist() == c.ids.tolist() and np.allclose(a.scores, c.scores, rtol=0, atol=1e-9)
                       for a, c in zip(base, answers[nb], strict=True))
            q = len(queries) / float(np.median(times[nb]))
            rows.append({"kind": "buckets", "docs": n_docs, "buckets": nb, "qps": round(q, 1),
                         "ratio": round(q / best, 3), "identical": same, "rounds": rounds,
                         "load": round(os.getloadavg()[0], 1)})
        del opened
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("generate", help="cache the synthetic corpus of --docs documents")
    g.add_argument("--docs", type=int, required=True)
    o = sub.add_parser("one", help="one build in this process; prints its row as JSON")
    o.add_argument("--docs", type=int, required=True)
    o.add_argument("--build", choices=("memory", "stream"), required=True)
    o.add_argument("--layout", default=None)
    o.add_argument("--memory-mib", type=int, default=None)
    o.add_argument("--feed", choices=("arrow", "python"), default="arrow")
    o.add_argument("--engine", default=None, help="import ragspine_pipeline from this folder (ab's base)")
    a = sub.add_parser("ab", help="stream build of a base revision's engine vs this checkout's, alternating")
    a.add_argument("--docs", type=int, default=1_000_000)
    a.add_argument("--base", required=True, help="git revision of the engine to compare with")
    a.add_argument("--feeds", default="python,arrow")
    a.add_argument("--rounds", type=int, default=2)
    a.add_argument("--layout", default=None)
    r = sub.add_parser("run", help="old and streaming builds, each in a fresh process")
    r.add_argument("--sizes", default="1000000,10000000")
    r.add_argument("--builds", default="memory,stream")
    r.add_argument("--memory-max-docs", type=int, default=1_000_000, help="largest corpus for the old build")
    r.add_argument("--layout", default=None)
    bq = sub.add_parser("buckets", help="single-process qps of 1 vs B hash-bucket segments")
    bq.add_argument("--docs", type=int, default=1_000_000)
    bq.add_argument("--buckets", default="1,8,16")
    bq.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args(argv)
    command = ("flock /tmp/heavy.lock nice -n 10 prlimit --as=14000000000 python benchmarks/bench_bm25_build.py "
               + " ".join(sys.argv[1:] if argv is None else argv))
    if args.cmd == "generate":
        t0 = time.perf_counter()
        path = generate(args.docs)
        print(f"{path} ({path.stat().st_size / 1e9:.2f} GB) in {time.perf_counter() - t0:.1f} s")
    elif args.cmd == "one":
        if args.engine:
            sys.path.insert(0, args.engine)
        print(json.dumps(build_one(args.docs, args.build, args.layout, args.memory_mib, args.feed)))
    elif args.cmd == "ab":
        generate(args.docs)
        for row in ab(args.docs, args.base, args.feeds.split(","), args.rounds, args.layout):
            print(json.dumps(row), flush=True)
            save([row], command)
    elif args.cmd == "run":
        for n in (int(x) for x in args.sizes.split(",")):
            generate(n)
            for build in args.builds.split(","):
                if build == "memory" and n > args.memory_max_docs:
                    continue
                cmd = [sys.executable, __file__, "one", "--docs", str(n), "--build", build]
                cmd += ["--layout", args.layout] if args.layout else []
                done = subprocess.run(cmd, capture_output=True, text=True)
                if done.returncode:
                    print(done.stdout, done.stderr, file=sys.stderr)
                    row = {"docs": n, "build": build, "layout": args.layout or "auto",
                           "error": (done.stderr.strip().splitlines() or ["?"])[-1][-300:],
                           "load": round(os.getloadavg()[0], 1)}
                    print(json.dumps(row))
                    save([row], command)
                    continue
                row = json.loads(done.stdout.strip().splitlines()[-1])
                print(json.dumps(row), flush=True)
                save([row], command)
    elif args.cmd == "buckets":
        rows = bucket_qps(args.docs, [int(x) for x in args.buckets.split(",")], args.rounds)
        for row in rows:
            print(json.dumps(row))
        save(rows, command)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
