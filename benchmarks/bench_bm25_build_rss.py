"""BM25 build peak RSS against Lucene's at 3M documents, phase by phase (issue 47 item 4).

    python benchmarks/bench_bm25_build_rss.py --size 3000000 --seed 3 --engines lucene,packed --label after

The corpus is ``bench_bm25_lucene_vocab``'s (~2M-term Zipf vocabulary, lognormal lengths;
generated there and cached). Each build runs in a fresh process under ``nice -n 10``,
``prlimit --as`` and the machine's heavy lock (``bench_bm25._run_measured``); its peak is
the process's ``ru_maxrss`` from ``wait4``, Lucene's included (``LuceneBench build``: 256 MB
RAM buffer, one merged segment, ``-Xmx6g``). The ragspine build also samples its own
``/proc/self/status`` every 0.1 s and marks the build's phases (count, spill, merge, the
writer's steps, the verify of the written file), so the table says which phase and which
kind of memory (anonymous, or file pages mapped into the process) makes the peak. The
written file's sha256 is recorded: a memory change must leave the bytes as they were.

Results: ``benchmarks/results/<--name>.json`` + ``.md``, keyed by size/seed/engine/label
(resumable: a key already measured is kept unless ``--force``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import resource
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import bench_bm25_lucene_vocab as bv  # noqa: E402
from benchmarks.bench_bm25 import HEAVY_FROM, OURS_AS_CAP, _run_measured, lucene_setup, machine  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
STATUS_KEYS = ("VmRSS", "VmHWM", "RssAnon", "RssFile")


def _status() -> dict[str, float]:
    """This process's resident set now, in MiB, by kind."""
    out = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, val = line.partition(":")
        if key in STATUS_KEYS:
            out[key] = int(val.split()[0]) / 1024
    return out


class Phases:
    """Marks entered phases (by wrapping the build's functions) while a thread samples
    ``/proc/self/status``; per phase the largest sample of each kind of memory."""

    def __init__(self) -> None:
        self.t0 = time.perf_counter()
        self.now = "start"
        self.marks: list[dict] = []
        self.peak: dict[str, dict[str, float]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.is_set():
            self._note(self.now, _status())
            time.sleep(0.1)

    def _note(self, phase: str, st: dict[str, float]) -> None:
        p = self.peak.setdefault(phase, {})
        for k in ("VmRSS", "RssAnon", "RssFile"):
            p[k] = round(max(p.get(k, 0.0), st[k]), 1)

    def mark(self, phase: str) -> None:
        st = _status()
        self._note(self.now, st)
        self.now = phase
        self.marks.append({"t": round(time.perf_counter() - self.t0, 2), "phase": phase,
                           **{k: round(v, 1) for k, v in st.items()}})

    def wrap(self, owner, attr: str, phase: str, *, restore: bool = True) -> None:
        """``owner.attr`` marks ``phase`` when called (and the phase before when it returns)."""
        fn = getattr(owner, attr)
        outer = self

        def marked(*a, **kw):
            before = outer.now
            outer.mark(phase)
            try:
                return fn(*a, **kw)
            finally:
                if restore:
                    outer.mark(before)

        setattr(owner, attr, marked)

    def __enter__(self) -> Phases:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def build_step(spec: dict) -> dict:
    """One ragspine build in this (fresh) process, its phases marked and sampled."""
    from ragspine_pipeline.retrieval.lexical.refresh import publish
    from ragspine_pipeline.retrieval.lexical.refresh import stream_build as sb

    n, seed, out = spec["n"], spec["seed"], Path(spec["out"])
    c = bv.corpus(n, seed)
    with Phases() as ph:
        for owner, attr, name in [(sb.StreamCounter, "consume", "count"), (sb.StreamCounter, "_spill", "spill"),
                                  (sb.StreamCounter, "_merge", "merge"), (publish, "encode", "write: setup"),
                                  (publish, "bitsets", "write: bitsets"), (publish, "vocab_arrays", "write: vocab"),
                                  (publish, "_raw_vocab", "write: vocab"), (publish, "write_file", "write: file")]:
            if hasattr(owner, attr):
                ph.wrap(owner, attr, name)
        # open_index returns at once and the verify (every block of the written file read)
        # follows it in publish._publish: "verify" lasts until the build returns.
        ph.wrap(publish, "open_index", "verify", restore=False)
        ph.mark("build")
        t0 = time.perf_counter()
        rep = sb.build_index_file(bv.arrow_batches(c), out, k1=bv.K1, b=bv.B, layout=spec["layout"])
        build_s = time.perf_counter() - t0
        ph.mark("done")
    sha = hashlib.sha256()
    with open(out, "rb") as f:
        while chunk := f.read(1 << 24):
            sha.update(chunk)
    return {"build_s": build_s, "index_bytes": out.stat().st_size, "sha256": sha.hexdigest(),
            "postings": rep.postings, "terms": rep.terms, "runs": rep.runs, "count_s": rep.count_seconds,
            "self_ru_maxrss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "phase_peak_mib": ph.peak, "marks": ph.marks}


def measure(engine: str, n: int, seed: int, out_dir: Path, lucene) -> dict:
    if engine == "lucene":
        java, cp = lucene
        docs = bv.docs_text(n, seed, bv.corpus(n, seed))
        target = out_dir / f"lucene_{n}_{seed}"
        if target.exists():
            import shutil

            shutil.rmtree(target)
        cmd = [java, f"-Xmx{bv.LUCENE_XMX}", "-cp", cp, "LuceneBench", "build", str(docs), str(target)]
        rec = _run_measured(cmd, heavy=n >= HEAVY_FROM)
        if "error" not in rec:
            rec["index_bytes"] = sum(p.stat().st_size for p in target.rglob("*") if p.is_file())
            import shutil

            shutil.rmtree(target)
        return rec
    out = out_dir / f"ragspine_{engine}_{n}_{seed}.bm25"
    spec = {"n": n, "seed": seed, "layout": engine, "out": str(out)}
    rec = _run_measured([sys.executable, __file__, "_build", json.dumps(spec)], heavy=n >= HEAVY_FROM,
                        cap=OURS_AS_CAP)
    out.unlink(missing_ok=True)
    return rec


def markdown(report: dict) -> str:
    lines = [f"# {report['name']}: BM25 build peak RSS, ragspine vs Lucene (issue 47 item 4)", "",
             "Peak = the build process's `ru_maxrss` (`wait4`), fresh process each. Lucene: `LuceneBench build` "
             "(256 MB RAM buffer, forceMerge(1), -Xmx6g). ragspine: `build_index_file` (packed layout, default "
             "`RAGSPINE_BM25_BUILD_MEMORY_MIB`), the corpus read as Arrow batches of 100k documents. "
             "Corpus: `bench_bm25_lucene_vocab`'s (Zipf over 2M terms, lognormal lengths).", ""]
    lines += [f"- `{k}`: `{v}`" for k, v in sorted(report.get("commands", {}).items())]
    lines += ["", "| docs | seed | engine | label | build s | peak MiB | peak / Lucene's lowest | index bytes | "
              "sha256 (12) |", "|---|---|---|---|---|---|---|---|---|"]
    runs = report["runs"]
    for key in sorted(runs, key=lambda k: (int(k.split("/")[0]), int(k.split("/")[1]), k)):
        r = runs[key]
        luc = min((v["peak_rss_mib"] for v in runs.values() if v["engine"] == "lucene" and v["n"] == r["n"]
                   and v["seed"] == r["seed"] and "peak_rss_mib" in v), default=None)
        ratio = f"{r['peak_rss_mib'] / luc:.2f}" if luc and "peak_rss_mib" in r else "-"
        if "error" in r:
            lines.append(f"| {r['n']:,} | {r['seed']} | {r['engine']} | {r['label']} | {r['error']} | | | | |")
            continue
        lines.append(f"| {r['n']:,} | {r['seed']} | {r['engine']} | {r['label']} | {r.get('build_s', 0):.1f} | "
                     f"{r.get('peak_rss_mib', 0):,.0f} | {ratio} | {r.get('index_bytes', 0):,} | "
                     f"{r.get('sha256', '-')[:12]} |")
    for key in report.get("phase_rows") or sorted(runs):  # the rows whose phases are shown (default: all)
        r = runs[key]
        if not r.get("phase_peak_mib"):
            continue
        lines += ["", f"Phases of `{key}` (largest sample per phase, MiB; `RssFile`: file pages mapped in the "
                  "process):", "", "| phase | VmRSS | RssAnon | RssFile |", "|---|---|---|---|"]
        lines += [f"| {ph} | {v['VmRSS']:,.0f} | {v['RssAnon']:,.0f} | {v['RssFile']:,.0f} |"
                  for ph, v in r["phase_peak_mib"].items()]
    lines += [""] + [f"- {x}" for x in report.get("notes", [])]
    return "\n".join(lines) + "\n"


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "_build":
        print(json.dumps(build_step(json.loads(sys.argv[2]))))
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", type=int, default=3_000_000)
    ap.add_argument("--seed", type=int, default=3)
    ap.add_argument("--engines", default="lucene,packed")
    ap.add_argument("--label", default="now", help="names this code's rows (before / after a change)")
    ap.add_argument("--name", default="bm25_build_3m")
    ap.add_argument("--force", action="store_true")
    args = ap.parse_args()
    path = RESULTS / f"{args.name}.json"
    report = json.loads(path.read_text()) if path.exists() else {"name": args.name, "runs": {}}
    lucene = None
    out_dir = bv.CACHE / f"corpus_{args.size}_{args.seed}"
    for eng in args.engines.split(","):
        key = f"{args.size}/{args.seed}/{eng}/{args.label}"
        if key in report["runs"] and not args.force:
            continue
        if eng == "lucene" and lucene is None:
            lucene = lucene_setup()
            lucene = lucene if isinstance(lucene, str) else (lucene[0], bv._lucene_classes(*lucene))
        rec = ({"error": lucene} if eng == "lucene" and isinstance(lucene, str)
               else measure(eng, args.size, args.seed, out_dir, lucene))
        rec.update(n=args.size, seed=args.seed, engine=eng, label=args.label, machine=machine(),
                   measured=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()))
        report["runs"][key] = rec
        report.setdefault("commands", {})[key] = "python " + " ".join(sys.argv)
        path.write_text(json.dumps(report, indent=1))
        (RESULTS / f"{args.name}.md").write_text(markdown(report))
    print(markdown(report))


if __name__ == "__main__":
    main()
