"""benchmarks/bench_chunkers.py: a clear error without data, and a real run on a tiny set."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run(*args):
    return subprocess.run([sys.executable, "benchmarks/bench_chunkers.py", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)


def test_missing_data_is_one_line(tmp_path):
    p = run("--data", str(tmp_path / "none"), "--sets", "tiny", "--out", str(tmp_path / "out"))
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1 and "Traceback" not in p.stderr
    assert not (tmp_path / "out").exists()


def test_tiny_set_gives_every_row_and_a_results_file(tmp_path):
    s = tmp_path / "data" / "tiny"
    (s / "qrels").mkdir(parents=True)
    docs = [("p1", "Canteen", "The canteen opens at eight. Breakfast is served until ten."),
            ("p2", "Canteen", "Lunch costs four euros for staff."),
            ("p3", "Travel", "Train travel is reimbursed in second class."),
            ("p4", "Travel", "Hotels are reimbursed up to the city cap.")]
    (s / "corpus.jsonl").write_text("".join(json.dumps({"_id": i, "title": t, "text": x}) + "\n"
                                            for i, t, x in docs), encoding="utf-8")
    qs = [("q1", "when does the canteen open"), ("q2", "lunch price"), ("q3", "hotel cap")]
    (s / "queries.jsonl").write_text("".join(json.dumps({"_id": i, "text": t}) + "\n" for i, t in qs),
                                     encoding="utf-8")
    (s / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\tp1\t1\nq2\tp2\t1\nq3\tp4\t1\n",
                                          encoding="utf-8")
    p = run("--data", str(tmp_path / "data"), "--sets", "tiny", "--out", str(tmp_path / "out"))
    assert p.returncode == 0, p.stderr
    rows = json.loads((tmp_path / "out" / "chunkers.json").read_text())["rows"]
    kinds = {(r["chunker"].split(":")[0], r["contextual"], r["raptor"]) for r in rows}
    assert {("paragraph", "off", "-"), ("paragraph", "on", "-"), ("layout", "off", "-"), ("parent_child", "off", "-"),
            ("sentence_window", "off", "-"), ("paragraph", "off", "collapsed")} <= kinds
    base = next(r for r in rows if r["chunker"].startswith("paragraph") and r["contextual"] == "off"
                and r["raptor"] == "-")
    assert all(r["queries"] == 3 and 0 < r["ndcg@10"] <= 1 for r in rows) and base["recall@100"] == 1.0
    assert "| tiny | paragraph:480:80 | off | - |" in (tmp_path / "out" / "chunkers.md").read_text()
