"""Relation graph: metric-fact extraction precision/recall on the hand-labelled set, and the two stores.

Extraction: ``tests/data/graph_facts/labelled_sentences.jsonl`` (zh and en sentences, each
with its hand-written expected facts: entity, metric, period, kind, value, unit, segment;
the context entity/period stand in for chunk metadata). The rule extractor
(``ragspine_pipeline.graph.extract``) runs side by side with a keyword-proximity baseline
(the nearest metric name before a figure, a change when a change word precedes it: what
a quick regex script would do). A predicted fact counts when every field matches a
labelled one (value within 1e-6 relative); each labelled fact is matched once.

Stores: the demo library's published graph loaded into the in-process store and the
networkx adapter; load time and the time of the golden queries (roll-up, peers, trace),
as a ratio, and whether every answer is identical.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import ROOT, add_io_args, out_dir, say_written  # noqa: E402
from ragspine_pipeline.graph.extract import _FIGURE, Extractor, _alias_re, _figure  # noqa: E402
from ragspine_pipeline.graph.step import resolve_dimensions  # noqa: E402

LABELLED = ROOT / "tests" / "data" / "graph_facts" / "labelled_sentences.jsonl"
FIELDS = ("entity", "metric", "period", "kind", "unit", "segment")
_CHANGE = re.compile(r"(增长|上升|提高|下降|减少|下滑|grew|rose|fell|declined|up|down|increased|decreased)\W{0,3}$",
                     re.IGNORECASE)
_DOWN = re.compile(r"下降|减少|下滑|fell|declined|down|decreased", re.IGNORECASE)


def load_labelled(path: Path = LABELLED) -> list[dict[str, Any]]:
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    for r in rows:
        for f in r["facts"]:
            missing = [k for k in (*FIELDS, "value") if k not in f]
            if missing:
                raise ValueError(f"{path}: {r['id']} has a fact without {missing}")
    return rows


class Baseline:
    """Keyword proximity: the last metric named before a figure; a change word just before it."""

    def __init__(self, dims) -> None:
        self.ent, self.ent_map = _alias_re((a, e.id) for e in dims.entities for a in (*e.aliases, e.name_en) if a)
        self.met, self.met_map = _alias_re((a, m.id) for m in dims.metrics for a in (*m.aliases, m.name_en) if a)

    def facts(self, text: str, entity: str, period: str) -> list[dict[str, Any]]:
        out = []
        for m in _FIGURE.finditer(text):
            before = text[:m.start()]
            mets = list(self.met.finditer(before))
            if not mets:
                continue
            ents = list(self.ent.finditer(before))
            value, unit, _ = _figure(m)
            change = bool(_CHANGE.search(before[-12:]))
            kind = "change" if change and unit in ("%", "pp") else "value"
            if kind == "change" and _DOWN.search(before[-12:]):
                value = -value
            out.append({"entity": self.ent_map[ents[-1].group(0).lower()] if ents else entity,
                        "metric": self.met_map[mets[-1].group(0).lower()], "period": period, "kind": kind,
                        "unit": unit, "segment": "", "value": value})
        return out


def _matches(pred: dict[str, Any], gold: dict[str, Any]) -> bool:
    if any(pred.get(k, "") != gold.get(k, "") for k in FIELDS):
        return False
    return abs(pred["value"] - gold["value"]) <= 1e-6 * max(1.0, abs(gold["value"]))


def score(rows: list[dict[str, Any]], predict) -> dict[str, Any]:
    """Micro precision/recall/F1 over all sentences and per language."""
    counts: dict[str, Counter] = {"all": Counter()}
    errors = []
    for r in rows:
        preds = predict(r)
        left = list(r["facts"])
        tp = 0
        for p in preds:
            hit = next((i for i, g in enumerate(left) if _matches(p, g)), None)
            if hit is None:
                errors.append({"id": r["id"], "false_positive": p})
            else:
                left.pop(hit)
                tp += 1
        errors += [{"id": r["id"], "missed": g} for g in left]
        for key in ("all", r["lang"]):
            c = counts.setdefault(key, Counter())
            c["tp"] += tp
            c["pred"] += len(preds)
            c["gold"] += len(r["facts"])
            c["sentences"] += 1
    out = {}
    for key, c in counts.items():
        p = c["tp"] / c["pred"] if c["pred"] else 1.0
        rc = c["tp"] / c["gold"] if c["gold"] else 1.0
        out[key] = {"sentences": c["sentences"], "gold_facts": c["gold"], "predicted": c["pred"], "correct": c["tp"],
                    "precision": round(p, 4), "recall": round(rc, 4),
                    "f1": round(2 * p * rc / (p + rc), 4) if p + rc else 0.0}
    return {"scores": out, "errors": errors}


def extraction(rows: list[dict[str, Any]]) -> dict[str, Any]:
    dims = resolve_dimensions()
    ex = Extractor(dims)
    base = Baseline(dims)

    def rules(r):
        return [{**{k: getattr(f, k) for k in FIELDS}, "value": f.value}
                for f in ex.text_facts(r["text"], entity=r["entity"], period=r["period"])]

    t0 = time.perf_counter()
    got = score(rows, rules)
    t1 = time.perf_counter()
    got_base = score(rows, lambda r: base.facts(r["text"], r["entity"], r["period"]))
    t2 = time.perf_counter()
    return {"rules": {**got, "ms_per_sentence": round((t1 - t0) * 1000 / len(rows), 3)},
            "baseline": {**got_base, "ms_per_sentence": round((t2 - t1) * 1000 / len(rows), 3)}}


def stores(repeat: int = 20) -> list[dict[str, Any]]:
    from ragspine_pipeline.corpus import DEMO_ROOT
    from ragspine_pipeline.graph import compare_peers, rollup, trace
    from ragspine_pipeline.graph.step import build_relation_graph, load_relation_graph
    from ragspine_pipeline.warehouse import pipeline as P
    from ragspine_pipeline.warehouse.versioned import VersionedTables

    lib = "acme_reports"
    with tempfile.TemporaryDirectory() as tmp:
        wh = VersionedTables(tmp)
        P.build_raw_documents(wh, DEMO_ROOT, lib)
        P.build_chunks(wh, lib)
        t0 = time.perf_counter()
        build_relation_graph(wh, lib)
        build_s = time.perf_counter() - t0
        rows, answers = [], {}
        for name in ("memory", "networkx"):
            t0 = time.perf_counter()
            for _ in range(repeat):
                g = load_relation_graph(wh, lib, store=name)
            load_ms = (time.perf_counter() - t0) * 1000 / repeat
            qs = [lambda g: rollup(g, "ACME_GROUP", "revenue", "2023"),
                  lambda g: compare_peers(g, "ACME_CN", "gross_margin", "2023"),
                  lambda g: trace(g, "ACME_EU", "gross_margin", "2023")]
            t0 = time.perf_counter()
            for _ in range(repeat):
                ans = [q(g) for q in qs]
            query_ms = (time.perf_counter() - t0) * 1000 / (repeat * len(qs))
            answers[name] = ans
            rows.append({"store": name, "nodes": len(g.nodes()), "edges": len(g.edges()),
                         "load_ms": round(load_ms, 3), "query_ms": round(query_ms, 3), "build_s": round(build_s, 3)})
    mem = rows[0]
    for r in rows:
        r["load_ratio"] = round(r["load_ms"] / mem["load_ms"], 2)
        r["query_ratio"] = round(r["query_ms"] / mem["query_ms"], 2)
        r["identical_answers"] = answers[r["store"]] == answers["memory"]
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_io_args(ap, data=False)
    ap.add_argument("--labelled", default=str(LABELLED), help="JSONL of labelled sentences")
    args = ap.parse_args(argv)
    path = Path(args.labelled)
    if not path.is_file():
        print(f"bench_graph.py: error: no labelled set at {path}", file=sys.stderr)
        return 2
    rows = load_labelled(path)
    out = out_dir(args.out)
    ext = extraction(rows)
    st = stores()
    cmd = "python benchmarks/bench_graph.py" + (f" --out {args.out}" if args.out else "")
    (out / "graph.json").write_text(json.dumps({"command": cmd, "labelled": str(path.relative_to(ROOT))
                                                if path.is_relative_to(ROOT) else str(path),
                                                "extraction": ext, "stores": st}, indent=2, ensure_ascii=False),
                                    encoding="utf-8")
    lines = [f"# Relation graph: metric-fact extraction and graph stores\n\nCommand: `{cmd}`\n",
             f"Labelled set: {len(rows)} sentences ({sum(r['lang'] == 'zh' for r in rows)} zh, "
             f"{sum(r['lang'] == 'en' for r in rows)} en), {sum(len(r['facts']) for r in rows)} hand-labelled facts.\n",
             "| extractor | subset | gold | predicted | correct | precision | recall | F1 | ms/sentence |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for name in ("rules", "baseline"):
        for key in ("all", "zh", "en"):
            s = ext[name]["scores"][key]
            lines.append(f"| {name} | {key} | {s['gold_facts']} | {s['predicted']} | {s['correct']} | "
                         f"{s['precision']:.3f} | {s['recall']:.3f} | {s['f1']:.3f} | {ext[name]['ms_per_sentence']} |")
    r, b = ext["rules"]["scores"]["all"], ext["baseline"]["scores"]["all"]
    lines.append(f"\nRules vs baseline: precision ×{r['precision'] / b['precision']:.2f}, "
                 f"recall ×{r['recall'] / b['recall']:.2f}. The rules' misses and false positives are listed "
                 "in graph.json (`extraction.rules.errors`).\n")
    lines += ["| store | nodes | edges | load ms | × memory | query ms | × memory | identical answers |",
              "|---|---:|---:|---:|---:|---:|---:|---|"]
    for s in st:
        lines.append(f"| {s['store']} | {s['nodes']} | {s['edges']} | {s['load_ms']} | {s['load_ratio']} | "
                     f"{s['query_ms']} | {s['query_ratio']} | {s['identical_answers']} |")
    (out / "graph.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines))
    say_written([out / "graph.json", out / "graph.md"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
