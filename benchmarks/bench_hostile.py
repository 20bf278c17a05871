"""Peak memory of the engine's steps on hostile documents (issue 9, item 8).

    python benchmarks/bench_hostile.py                  # writes benchmarks/results/hostile_files.{json,md}
    python benchmarks/bench_hostile.py --out /tmp/h     # anywhere else

Each case runs in a fresh subprocess (so ``ru_maxrss`` is that case's own peak): one
library holding one generated file, built raw_documents -> chunks -> lexical_index ->
retrieval_snapshot and served (the index loaded and one query answered), embeddings off.
Cases: a 50 MB English document in paragraphs, a 50 MB document whose first line is
54 KB (the title once overflowed Arrow's 32-bit offsets), and a 2M-character single-line
CJK file (it once used 21.5 GB: the whole line was the title of every chunk). The
baseline row is the same process with an empty library, so the figure is the growth
over the interpreter and imports.
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
MB = 1024 * 1024


def _make(case: str, folder: Path) -> int:
    folder.mkdir(parents=True, exist_ok=True)
    if case == "baseline":
        (folder / "tiny.md").write_text("zebra", encoding="utf-8")
    elif case == "50mb_paragraphs":
        para = ("Revenue fell because energy costs tripled at the Lyon plant and the tariff on imported "
                "components rose; management moved production and cut the dividend. ") * 3
        with open(folder / "big.md", "w", encoding="utf-8") as fh:
            i = 0
            while fh.tell() < 50 * MB:
                fh.write(f"{para} (section {i})\n\n")
                i += 1
    elif case == "50mb_54kb_first_line":
        with open(folder / "wide.md", "w", encoding="utf-8") as fh:
            fh.write("headline " * 6000 + "\n\n")
            while fh.tell() < 50 * MB:
                fh.write("The plant closed after the energy costs tripled and orders moved to Asia. " * 6 + "\n\n")
    elif case == "2m_char_cjk_line":
        (folder / "line.txt").write_text("营收下滑的原因是能源成本上涨" * (2_000_000 // 14), encoding="utf-8")
    else:
        raise SystemExit(f"unknown case {case!r}")
    return sum(p.stat().st_size for p in folder.iterdir())


def _child(case: str) -> None:
    sys.path.insert(0, str(ROOT))
    from ragspine_pipeline.serving import open_published_retriever
    from ragspine_pipeline.warehouse import pipeline as P
    from ragspine_pipeline.warehouse.versioned import VersionedTables

    with tempfile.TemporaryDirectory() as tmp:
        corpus = Path(tmp) / "corpus"
        size = _make(case, corpus / "lib")
        wh = VersionedTables(Path(tmp) / "wh")
        t0 = time.perf_counter()
        steps = {}
        for name, fn in (("raw_documents", lambda: P.build_raw_documents(wh, corpus, "lib")),
                         ("chunks", lambda: P.build_chunks(wh, "lib")),
                         ("lexical_index", lambda: P.build_lexical_index(wh, "lib")),
                         ("retrieval_snapshot", lambda: P.publish_snapshot(wh, "lib"))):
            fn()
            steps[name] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
        served = open_published_retriever(wh.root, "lib", mode="bm25", glossary=False)  # as every door serves it
        hits = served.retrieve("energy costs 营收", top_k=5)
        steps["served"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
        raw = wh.read(P.RAW, "lib", "documents")
        print(json.dumps({"case": case, "file_mb": round(size / MB, 2), "peak_rss_mb_after": steps,
                          "title_chars": max(len(t) for t in raw.column("title").to_pylist()),
                          "chunks": P.snapshot_summary(wh, "lib")["chunks"], "hits": len(hits),
                          "seconds": round(time.perf_counter() - t0, 2)}))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=RESULTS, help="folder for hostile_files.{json,md}")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        _child(args.child)
        return 0
    rows = []
    for case in ("baseline", "50mb_paragraphs", "50mb_54kb_first_line", "2m_char_cjk_line"):
        out = subprocess.run([sys.executable, __file__, "--child", case], capture_output=True, text=True,
                             env={"RAGSPINE_EMBEDDING": "none", "PATH": "/usr/bin:/bin"})
        if out.returncode != 0:
            print(out.stderr[-2000:], file=sys.stderr)
            return 1
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
        print(rows[-1], flush=True)
    base = rows[0]["peak_rss_mb_after"]["served"]
    for r in rows:
        r["growth_over_baseline_mb"] = r["peak_rss_mb_after"]["served"] - base
    args.out.mkdir(parents=True, exist_ok=True)
    cmd = "python benchmarks/bench_hostile.py" + (f" --out {args.out}" if args.out != RESULTS else "")
    payload = {"command": cmd, "python": sys.version.split()[0], "machine": platform.machine(), "rows": rows}
    (args.out / "hostile_files.json").write_text(json.dumps(payload, indent=2), encoding="utf-8")
    lines = [f"# Peak RSS on hostile documents\n\n`{cmd}` (each case in its own process; embeddings off)\n",
             "| case | file MB | chunks | title chars | peak RSS MB (served) | growth over baseline MB | s |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['case']} | {r['file_mb']} | {r['chunks']} | {r['title_chars']} | "
                     f"{r['peak_rss_mb_after']['served']} | {r['growth_over_baseline_mb']} | {r['seconds']} |")
    (args.out / "hostile_files.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
