"""ONNX Runtime session options on this CPU: which help the embedding tiers (issue 47).

    python benchmarks/bench_ort_options.py --out benchmarks/results [--model minilm] [--rounds 3]

Each configuration is one ``InferenceSession`` over the shipped model folder
(``onnx_backend.prepare_model`` / ``prepare_int8``) with the tokenizer fastembed uses;
the same length-sorted texts (scifact chunks, batches of ``DEFAULT_BATCH_SIZE`` padded to
the batch's longest) go through every configuration in rounds, configurations interleaved
(order alternating per round), so a load spike on this shared machine hits all alike.
Reported: texts/s per configuration and its median ratio to ``base`` -- what fastembed
sets today (ORT_ENABLE_ALL, intra = inter = usable CPUs, sequential, CPU arena on,
spinning on). Results are written after every round (``ort_options.json``/``.md``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.bench_dense import machine  # noqa: E402
from benchmarks.bench_embed_tiers import speed_texts  # noqa: E402
from benchmarks.common import out_dir, say_written  # noqa: E402


def configs(cpus: int) -> dict[str, dict]:
    return {
        "base": {},
        "no_spinning": {"spin": "0"},
        "intra_1": {"intra": 1},
        "parallel_mode": {"parallel": True},
        "arena_off": {"arena": False},
        "opt_extended": {"level": "EXTENDED"},
        "no_spinning+arena_off": {"spin": "0", "arena": False},
    }


def session(path: Path, cpus: int, c: dict):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = getattr(ort.GraphOptimizationLevel, f"ORT_ENABLE_{c.get('level', 'ALL')}")
    so.intra_op_num_threads = c.get("intra", cpus)
    so.inter_op_num_threads = cpus
    if c.get("parallel"):
        so.execution_mode = ort.ExecutionMode.ORT_PARALLEL
    if "arena" in c:
        so.enable_cpu_mem_arena = c["arena"]
    if "spin" in c:
        so.add_session_config_entry("session.intra_op.allow_spinning", c["spin"])
        so.add_session_config_entry("session.inter_op.allow_spinning", c["spin"])
    return ort.InferenceSession(str(path / "model.onnx"), sess_options=so, providers=["CPUExecutionProvider"])


def run(sess, tok, texts: list[str], batch: int) -> float:
    names = {i.name for i in sess.get_inputs()}
    t0 = time.perf_counter()
    for i in range(0, len(texts), batch):
        enc = tok.encode_batch(texts[i: i + batch])
        feed = {"input_ids": np.array([e.ids for e in enc], dtype=np.int64),
                "attention_mask": np.array([e.attention_mask for e in enc], dtype=np.int64)}
        if "token_type_ids" in names:
            feed["token_type_ids"] = np.zeros_like(feed["input_ids"])
        sess.run(None, feed)
    return len(texts) / (time.perf_counter() - t0)


def main(argv: list[str] | None = None) -> None:
    from tokenizers import Tokenizer

    from ragspine_pipeline.cpus import usable_cpus
    from ragspine_pipeline.retrieval.vector.onnx_backend import (
        DEFAULT_BATCH_SIZE,
        MODELS,
        prepare_int8,
    )

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    ap.add_argument("--model", default="minilm", choices=sorted(MODELS))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--n", type=int, default=96, help="texts per configuration per round")
    args = ap.parse_args(argv)
    results = out_dir(args.out)
    cpus = usable_cpus()
    folder, _ = prepare_int8(MODELS[args.model])
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tok.enable_truncation(512)
    tok.enable_padding(pad_id=tok.token_to_id("[PAD]") or tok.token_to_id("<pad>") or 0)
    texts = sorted(speed_texts(args.n * args.rounds), key=len, reverse=True)
    cfgs = configs(cpus)
    sessions = {k: session(folder, cpus, c) for k, c in cfgs.items()}
    for s in sessions.values():
        run(s, tok, texts[:8], DEFAULT_BATCH_SIZE)  # warm-up
    cmd = "python benchmarks/bench_ort_options.py " + " ".join(sys.argv[1:])
    state = {"command": cmd, "machine": machine(), "model": f"{args.model} int8", "cpus": cpus,
             "batch": DEFAULT_BATCH_SIZE, "configs": cfgs, "rounds": []}
    names = list(cfgs)
    for r in range(args.rounds):
        part = texts[r::args.rounds]  # every round: the same length mix
        row = {"round": r, "loadavg": round(os.getloadavg()[0], 2), "texts_per_s": {}}
        for k in names if r % 2 == 0 else names[::-1]:
            row["texts_per_s"][k] = round(run(sessions[k], tok, part, DEFAULT_BATCH_SIZE), 2)
        row["ratio_to_base"] = {k: round(v / row["texts_per_s"]["base"], 3) for k, v in row["texts_per_s"].items()}
        state["rounds"].append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)
        (results / "ort_options.json").write_text(json.dumps(state, indent=1))
        (results / "ort_options.md").write_text(render(state))
    say_written([results / "ort_options.json", results / "ort_options.md"])


def render(state: dict) -> str:
    lines = ["# ONNX Runtime session options on this CPU\n", f"Command: `{state['command']}`  ",
             f"Machine: {state['machine']}\n",
             f"Model: {state['model']}, {state['cpus']} usable CPUs, batches of {state['batch']} length-sorted "
             "scifact chunks; configurations interleaved per round. `base` = what fastembed sets "
             "(ORT_ENABLE_ALL, intra = inter = usable CPUs, sequential, arena on, spinning on). The machine is "
             "shared: read the ratio to base within a round.\n",
             "| configuration | options | median texts/s | median ratio to base | per round |", "|---|---|---|---|---|"]
    for k, c in state["configs"].items():
        rates = [r["texts_per_s"][k] for r in state["rounds"]]
        ratios = [r["ratio_to_base"][k] for r in state["rounds"]]
        lines.append(f"| {k} | {json.dumps(c)} | {statistics.median(rates):.1f} | {statistics.median(ratios):.3f} | "
                     + ", ".join(f"{x:.2f}" for x in ratios) + " |")
    lines.append("\nLoad average per round: " + ", ".join(str(r["loadavg"]) for r in state["rounds"]))
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
