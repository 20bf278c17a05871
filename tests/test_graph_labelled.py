"""The hand-labelled metric-fact set and the extraction benchmark over it."""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import bench_graph  # noqa: E402
from ragspine_pipeline.graph import Extractor  # noqa: E402
from ragspine_pipeline.graph.step import resolve_dimensions  # noqa: E402


def test_labelled_set_is_large_bilingual_and_well_formed():
    rows = bench_graph.load_labelled()
    assert len(rows) >= 100 and len({r["id"] for r in rows}) == len(rows)
    langs = {lang: sum(r["lang"] == lang for r in rows) for lang in ("zh", "en")}
    assert langs["zh"] >= 50 and langs["en"] >= 50
    dims = resolve_dimensions()
    ents, mets = {e.id for e in dims.entities}, {m.id for m in dims.metrics}
    negatives = [r for r in rows if not r["facts"]]
    assert len(negatives) >= 20  # targets, shares, per-share amounts, numbers of no metric
    for r in rows:
        for f in r["facts"]:
            assert f["entity"] in ents and f["metric"] in mets and f["kind"] in ("value", "change")
            assert f["unit"] in ("CNY", "USD", "EUR", "%", "pp") and f["period"][:2] == "20"


def test_rules_extractor_floor_and_beats_the_baseline():
    ext = bench_graph.extraction(bench_graph.load_labelled())
    rules, base = ext["rules"]["scores"]["all"], ext["baseline"]["scores"]["all"]
    assert rules["precision"] >= 0.95 and rules["recall"] >= 0.85, rules
    assert rules["precision"] > base["precision"] and rules["f1"] > base["f1"]


def test_fixed_period_and_forward_looking_defects():
    """Used to fail: 'H1 2024' read as 2024; 'is expected to recover to 29%' extracted as a fact."""
    x = Extractor(resolve_dimensions())
    got = [(f.metric, f.kind, f.period) for f in x.text_facts("Revenue in H1 2024 was RMB 2.59 billion, up 4.8%.",
                                                              entity="ACME_CN", period="2024H1")]
    assert got == [("revenue", "value", "2024H1"), ("revenue", "change", "2024H1")]
    assert x.text_facts("Gross margin is expected to recover to 29%.", entity="ACME_CN", period="2023") == []


def test_benchmark_writes_where_told(tmp_path, capsys):
    assert bench_graph.main(["--out", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "graph.json").read_text(encoding="utf-8"))
    assert data["command"].startswith("python benchmarks/bench_graph.py")
    assert all(s["identical_answers"] for s in data["stores"])
    assert "precision" in (tmp_path / "graph.md").read_text(encoding="utf-8")
    assert bench_graph.main(["--labelled", str(tmp_path / "none.jsonl"), "--out", str(tmp_path)]) == 2
