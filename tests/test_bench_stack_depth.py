"""benchmarks/bench_bm25_stack_depth.py at 2k documents: a 3-deep chain of refreshes through
the warehouse call, each depth's stack answering as the single merged file, and the resume.

Why: the 1M run is measured rarely; a chain that stopped stacking (folded by a policy), a
single file of another corpus, or a resume that rebuilds or re-measures would only show
there, after a long run.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks import bench_bm25_build, bench_bm25_refresh  # noqa: E402
from benchmarks import bench_bm25_stack_depth as sd  # noqa: E402

N_DOCS = 2000


@pytest.fixture()
def bench(tmp_path, monkeypatch):
    """The benchmark with its cache and results in tmp_path."""
    cache = tmp_path / "cache"
    monkeypatch.setattr(bench_bm25_build, "CACHE", cache)
    monkeypatch.setattr(bench_bm25_refresh, "CACHE", cache)
    monkeypatch.setattr(sd, "CACHE", cache / "stack_depth")
    monkeypatch.setattr(sd, "RESULTS", tmp_path / "results")
    return sd


def test_chain_of_three_stacks_answers_as_one_file(bench, tmp_path):
    bench.run(N_DOCS, ["packed"], 3, False, "test", fresh=False)
    data = json.loads((tmp_path / "results" / "bm25_stack_depth.json").read_text())
    rows = data["rows"]
    assert [(r["step"], r["segments"]) for r in rows] == [(1, 2), (2, 3), (3, 4)]
    for r in rows:
        assert r["identical"] is True and r["max_rel_diff"] <= 1e-9, r
        assert r["added"] == 2 * int(N_DOCS * sd.FRACTION) == r["removed"], r
        assert 0 < r["churn"] < 0.25 and r["bytes_written"] > 0 and r["fold_counted"] >= r["added"]
    assert rows[-1]["churn"] > rows[0]["churn"]
    md = (tmp_path / "results" / "bm25_stack_depth.md").read_text()
    assert md.count("| 2,000 | packed | 0.005 |") == 6  # the query table and the breakdown
    assert [len(r["breakdown"]["none"]["search_ms"]) for r in rows] == [2, 3, 4]
    # A rerun resumes: nothing recorded again, the finished versions kept as they are.
    before = (bench.CACHE / f"{N_DOCS}_packed" / "v3" / "step.json").stat().st_mtime_ns
    bench.run(N_DOCS, ["packed"], 3, False, "test", fresh=False)
    assert json.loads((tmp_path / "results" / "bm25_stack_depth.json").read_text())["rows"] == rows
    assert (bench.CACHE / f"{N_DOCS}_packed" / "v3" / "step.json").stat().st_mtime_ns == before


def test_policy_series_folds_merges_and_restacks(bench, tmp_path, monkeypatch):
    """The default policy's shape at 2k (min_docs=0: 2k is below the default's 1M): a stack,
    folds while the churn grows ~2% a step, a merge past 10%, a stack again on the merged file."""
    from ragspine_pipeline.warehouse.lexical_stack import StackPolicy

    monkeypatch.setattr(sd, "POLICY_CACHE", tmp_path / "cache" / "stack_policy")
    bench.run_policy(N_DOCS, ["packed"], 7, False, "test", policy=StackPolicy(min_docs=0), fresh=False)
    data = json.loads((tmp_path / "results" / "bm25_stack_policy.json").read_text())
    rows = data["rows"]
    assert [r["action"] for r in rows] == ["stacked", "folded", "folded", "folded", "folded", "merged", "stacked"]
    assert [r["segments"] for r in rows] == [2, 2, 2, 2, 2, 1, 2]
    for r in rows:
        assert r["identical"] is True and r["max_rel_diff"] <= 1e-9, r
        assert r["merge_s"] > 0 and r["merge_bytes"] > 0 and r["bytes_written"] > 0
    assert rows[5]["merge_bytes"] == rows[5]["bytes_written"] and rows[5]["churn"] > 0.10 and "churn" in rows[5]["merge_reason"]
    assert rows[5]["none"] is None and rows[0]["none"]["p50_ratio"] > 0
    assert all(a["churn"] < b["churn"] <= 0.10 for a, b in zip(rows[:4], rows[1:5], strict=True))
    assert rows[4]["counted"] > rows[1]["counted"] > rows[0]["counted"] == rows[0]["added"]  # folds re-count
    md = (tmp_path / "results" / "bm25_stack_policy.md").read_text()
    assert md.count("| 2,000 | packed |") == 8  # seven steps and the summary
    # Resumes: nothing measured again; the always-merge chain keeps only its newest versions.
    bench.run_policy(N_DOCS, ["packed"], 7, False, "test", policy=StackPolicy(min_docs=0), fresh=False)
    assert json.loads((tmp_path / "results" / "bm25_stack_policy.json").read_text())["rows"] == rows
    kept = sorted(p.name for p in sd._policy_folder(N_DOCS, "packed", StackPolicy(min_docs=0)).glob("m*"))
    assert kept == ["m0", "m6", "m7"]
