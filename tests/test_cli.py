import json
import os
import subprocess
import sys
from pathlib import Path

from ragspine_pipeline.cli import main, parse_filter_args

SHARED = Path(__file__).resolve().parents[2] / "shared" / "eval"


def test_parse_filter_args():
    assert parse_filter_args(["entity=ACME_CN", "period>=2023", "topic:in=risk,policy"]) == {
        "entity": {"eq": "ACME_CN"}, "period": {"gte": "2023"}, "topic": {"in": ["risk", "policy"]}}
    assert parse_filter_args(None) is None


def test_query_json_prints_snippet_dicts(tmp_path, capsys):
    rc = main(["query", "为什么营收下滑", "--filter", "entity=ACME_CN", "--top-k", "5", "--json",
               "--warehouse", str(tmp_path)])
    assert rc == 0
    snippets = json.loads(capsys.readouterr().out)
    assert len(snippets) == 5 and all(s["entity"] == "ACME_CN" for s in snippets)
    assert all(s["sensitivity"] != "RESTRICTED" for s in snippets)


def test_query_text_output_and_bad_filter(tmp_path, capsys):
    assert main(["query", "why close the Lyon plant", "--warehouse", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "[1]" in out and "cite:" in out and "chars" in out
    assert main(["query", "x", "--filter", "colour=red", "--warehouse", str(tmp_path)]) == 2
    assert "colour" in capsys.readouterr().err


def test_demo_is_incremental(tmp_path, capsys):
    assert main(["demo", "--engine-only", "--warehouse", str(tmp_path), "--questions", "1"]) == 0
    first = capsys.readouterr().out
    assert "26 new" in first and "Q: 为什么营收下滑" in first
    assert main(["demo", "--engine-only", "--warehouse", str(tmp_path), "--questions", "1"]) == 0
    assert "26 unchanged" in capsys.readouterr().out


def test_eval_json_on_shared_set():
    if not (SHARED / "cmrc2018-trial").exists():
        import pytest

        pytest.skip("../shared/eval not present")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    p = subprocess.run([sys.executable, "-m", "ragspine_pipeline.cli", "eval", str(SHARED / "cmrc2018-trial"),
                        "--mode", "bm25", "--json", "--limit", "200"], capture_output=True, text=True, env=env,
                       timeout=300)
    assert p.returncode == 0, p.stderr
    res = json.loads(p.stdout)
    assert {"ndcg@10", "recall@100", "mrr@10", "mode", "dataset", "counts", "timings_s"} <= res.keys()
    assert res["ndcg@10"] > 0.95 and res["counts"]["queries"] == 200


def test_engine_never_imports_dagster():
    """The engine package is usable with no Dagster: no module of it imports dagster."""
    import re

    pkg = Path(__file__).resolve().parents[1] / "ragspine_pipeline"
    offenders = [str(p) for p in pkg.rglob("*.py")
                 if re.search(r"^\s*(import dagster|from dagster)", p.read_text(encoding="utf-8"), re.M)]
    assert offenders == []
