"""Bytes of the packed BM25 file per array, before and after a format change (issue 47 item 4).

Why: the plan to bring the packed file to <= 1.2x Lucene's bytes (/tmp notes of #47,
steps T1-T3) is measured array by array, and a format change must keep the answers. On the
cached generated corpus of ``bench_bm25_lucene_vocab`` (~2M-term vocabulary, lognormal
lengths), this builds the packed file twice, each in a fresh process: with the code of
``--before`` (a source tree, e.g. a clone of the commit before the change) and with this
tree; then lists each file's arrays from its table of contents, and answers the
benchmark's 150 queries with: the old code on the old file, this code on the old file
(older formats must still answer) and this code on the new file. All three must agree
exactly (ids and scores), and with the numpy reference (``agrees``, 150/150).

Usage::

    nice -n 10 prlimit --as=14000000000 .venv/bin/python benchmarks/bench_bm25_bytes.py \
        --before /tmp/h1/base --sizes 1000000 --seeds 1

Writes ``benchmarks/results/bm25_lucene_vocab_bytes.json`` / ``.md`` after every step
(a stopped run resumes; ``--force`` redoes the builds). The built files stay in the
corpus's cache folder (``bytes_before.bm25`` / ``bytes_after.bm25``). ``--name X`` writes
``X.json``/``.md`` and ``bytes_before_X.bm25``/``bytes_after_X.bm25`` instead (steps
measured side by side do not overwrite each other).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.bench_bm25_lucene_vocab import CACHE, RESULTS, K, agrees  # noqa: E402

NAME = "bm25_lucene_vocab_bytes"
_BUILD = """
import json, sys, time
sys.path.insert(0, {tree!r})
from benchmarks.bench_bm25_lucene_vocab import B, K1, arrow_batches, corpus
from ragspine_pipeline.retrieval.lexical.refresh.stream_build import build_index_file
t0 = time.perf_counter()
build_index_file(arrow_batches(corpus({n}, {seed})), {path!r}, k1=K1, b=B, layout="packed")
print(json.dumps({{"build_s": time.perf_counter() - t0}}))
"""
_QUERY = """
import json, sys
import numpy as np
sys.path.insert(0, {tree!r})
from ragspine_pipeline.retrieval.lexical.index.mapped import open_index
qs = json.load(open({queries!r}))
ix = open_index({path!r})
out = []
for q in qs:
    r = ix.search(q, k={k})
    out.append({{"ids": np.asarray(r.ids).tolist(), "scores": np.asarray(r.scores).tolist()}})
print(json.dumps(out))
"""


def _run(code: str, tree: Path) -> object:
    env = dict(os.environ, PYTHONPATH=str(tree))
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False)
    if done.returncode:
        raise RuntimeError(done.stderr[-3000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def arrays_of(path: Path) -> tuple[dict[str, int], int]:
    """({array: bytes}, format version) from the file's table of contents."""
    from ragspine_pipeline.retrieval.lexical.format.file import read_toc

    buf = np.memmap(path, np.uint8, mode="r")
    toc = read_toc(path, buf)
    return {n: a.nbytes for n, a in toc.arrays.items()}, toc.version


def run(n: int, seed: int, before: Path, force: bool, report: dict, name: str = NAME) -> None:
    folder = CACHE / f"corpus_{n}_{seed}"
    key = f"{n}/{seed}"
    rec = report["runs"].setdefault(key, {})
    lucene = json.loads((folder / "build_lucene.json").read_text())["index_bytes"]
    rec["lucene_bytes"] = lucene
    tag = "" if name == NAME else f"_{name}"
    sides = {"before": (before, folder / f"bytes_before{tag}.bm25"),
             "after": (ROOT, folder / f"bytes_after{tag}.bm25")}
    for side, (tree, path) in sides.items():
        if force or side not in rec.get("builds", {}) or not path.exists():
            print(f"[{key}] building {side} with {tree}", flush=True)
            built = _run(_BUILD.format(tree=str(tree), n=n, seed=seed, path=str(path)), tree)
            arrays, version = arrays_of(path)
            rec.setdefault("builds", {})[side] = {**built, "bytes": path.stat().st_size, "arrays": arrays,
                                                  "format_version": version}
            save(report, name)
    if force or "answers" not in rec:
        ref = json.loads((folder / "reference.json").read_text())
        queries = str(folder / "queries_tokens.json")
        runs = {"old code, old file": (before, sides["before"][1]), "new code, old file": (ROOT, sides["before"][1]),
                "new code, new file": (ROOT, sides["after"][1])}
        got = {name: _run(_QUERY.format(tree=str(tree), queries=queries, path=str(path), k=K), tree)
               for name, (tree, path) in runs.items()}
        first = got["old code, old file"]
        rec["answers"] = {name: {"agree_with_reference": sum(agrees(r["ids"], r["scores"], f)
                                                             for r, f in zip(res, ref, strict=True)),
                                 "identical_to_old": res == first, "queries": len(ref)}
                          for name, res in got.items()}
        save(report, name)


def save(report: dict, name: str = NAME) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(report, indent=1))
    (RESULTS / f"{name}.md").write_text(markdown(report, name))


def markdown(report: dict, title: str = NAME) -> str:
    lines = [f"# Packed BM25 file bytes per array ({title})", "", f"Command: `{report['command']}`", "",
             "Generated corpus of `bench_bm25_lucene_vocab` (~2M-term vocabulary, lognormal lengths); "
             "`before` built by the code of the commit before the change, `after` by this tree.", ""]
    for key, rec in report["runs"].items():
        b = rec.get("builds", {})
        if "before" not in b or "after" not in b:
            continue
        lu = rec["lucene_bytes"]
        bb, ab = b["before"], b["after"]
        lines += [f"## {key} (docs/seed)", "",
                  f"| file | format | bytes | x Lucene ({lu:,}) |", "|---|---|---|---|",
                  f"| before | {bb['format_version']} | {bb['bytes']:,} | {bb['bytes'] / lu:.3f} |",
                  f"| after | {ab['format_version']} | {ab['bytes']:,} | {ab['bytes'] / lu:.3f} |", "",
                  "| array | before | after | saved |", "|---|---|---|---|"]
        names = list(dict.fromkeys([*bb["arrays"], *ab["arrays"]]))
        for nm in names:
            x, y = bb["arrays"].get(nm, 0), ab["arrays"].get(nm, 0)
            lines.append(f"| {nm} | {x:,} | {y:,} | {x - y:,} |")
        lines.append("")
        for name, a in rec.get("answers", {}).items():
            lines.append(f"- {name}: {a['agree_with_reference']}/{a['queries']} agree with the reference, "
                         f"{'identical' if a['identical_to_old'] else 'DIFFERENT'} ids and scores vs old code "
                         "on the old file")
        lines.append("")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--before", type=Path, required=True, help="source tree of the code before the change")
    ap.add_argument("--sizes", default="1000000")
    ap.add_argument("--seeds", default="1")
    ap.add_argument("--force", action="store_true")
    ap.add_argument("--name", default=NAME, help="results and built files named for one step")
    args = ap.parse_args()
    path = RESULTS / f"{args.name}.json"
    report = json.loads(path.read_text()) if path.exists() else {"runs": {}}
    report["command"] = "python benchmarks/bench_bm25_bytes.py " + " ".join(sys.argv[1:])
    for n in (int(x) for x in args.sizes.split(",")):
        for seed in (int(x) for x in args.seeds.split(",")):
            run(n, seed, args.before.resolve(), args.force, report, args.name)


if __name__ == "__main__":
    main()
