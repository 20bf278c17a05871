"""The A/B harness's own logic (benchmarks/bench_ab.py): verdicts, answer digests, the
report, the clones and the shared inputs. The benchmarks themselves are not run here (a
cold numba compile per clone takes minutes); ``bench_ab.py run --profile tiny`` is the
end-to-end check."""

from __future__ import annotations

import json
import subprocess
import sys
from argparse import Namespace
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import bench_ab  # noqa: E402


class _Res:
    def __init__(self, ids: list[int], scores: list[float]) -> None:
        self.ids, self.scores = np.asarray(ids), np.asarray(scores)


def test_verdict_within_noise_when_the_change_is_inside_a_spread() -> None:
    v = bench_ab.verdict([1.0, 1.2, 0.9], [1.1, 1.15, 1.05], "s")
    assert v["a"] == 1.0 and v["b"] == 1.1
    assert v["noise_a"] == pytest.approx(0.3) and v["noise"] == pytest.approx(0.3)
    assert v["verdict"] == "within noise"


def test_noise_is_the_larger_spread_of_the_two_sides() -> None:
    v = bench_ab.verdict([1.0, 1.01, 0.99], [1.0, 1.3, 1.15], "s")  # A tight, B spread out
    assert v["noise_a"] == pytest.approx(0.02) and v["noise_b"] == pytest.approx(0.3 / 1.15, abs=1e-4)
    assert v["verdict"] == "within noise"
    assert bench_ab.spread([2.0]) == 0.0


def test_verdict_floor_is_five_percent_and_direction_follows_the_unit() -> None:
    assert bench_ab.verdict([1.0, 1.0], [1.04, 1.04], "ms")["verdict"] == "within noise"
    assert bench_ab.verdict([1.0, 1.0], [1.2, 1.2], "ms")["verdict"] == "B slower"
    assert bench_ab.verdict([1.0, 1.0], [0.8, 0.8], "s")["verdict"] == "B faster"
    assert bench_ab.verdict([100.0, 100.0], [80.0, 80.0], "qps")["verdict"] == "B slower"
    assert bench_ab.verdict([100.0, 100.0], [120.0, 120.0], "qps")["verdict"] == "B faster"


def test_digest_ignores_last_bits_but_not_ids_or_real_score_changes() -> None:
    a = [_Res([3, 1], [2.5, 1.25]), _Res([], [])]
    same = [_Res([3, 1], [2.5 * (1 + 1e-13), 1.25]), _Res([], [])]
    assert bench_ab.digest(a) == bench_ab.digest(same)
    assert bench_ab.digest(a) != bench_ab.digest([_Res([1, 3], [2.5, 1.25]), _Res([], [])])
    assert bench_ab.digest(a) != bench_ab.digest([_Res([3, 1], [2.5001, 1.25]), _Res([], [])])
    # (ids, scores) pairs and ids-only lists (a benchmark that keeps no scores)
    assert bench_ab.digest([([3, 1], [2.5, 1.25]), ([], [])]) == bench_ab.digest(a)
    assert bench_ab.digest([[3, 1]]) != bench_ab.digest([[1, 3]])


def _report() -> dict:
    def side(qps: float, ans: str) -> dict:
        return {"metrics": {"qps": [qps, "qps"], "p50 ms": [1.0, "ms"]}, "answers": {"top-10": ans},
                "files": {"file": "f"}}

    rounds = [{"A": side(100.0, "x"), "B": side(101.0, "x")}, {"B": side(99.0, "x"), "A": side(98.0, "x")}]
    other = [{"A": side(100.0, "x"), "B": side(100.0, "y")}]
    before = {"short": "a4909a8", "subject": "before", "sha": "a" * 40, "rev": "a4909a8"}
    return {"command": "bench_ab.py run --profile tiny", "commands": [],
            "config": {"before": before, "after": before, "profile": "tiny", "rounds": 2,
                       "sizes": {"packed": 20_000, "large": 20_000}},
            "units": {"packed": {"rounds": rounds, "prepare": {}}, "large": {"rounds": other, "prepare": {}}}}


def test_summary_and_markdown() -> None:
    report = _report()
    summ = bench_ab.summarize(report)
    assert summ["packed"]["rows"]["qps"]["verdict"] == "within noise"
    assert summ["packed"]["rows"]["qps"]["a"] == 99.0 and summ["packed"]["rounds"] == 2
    assert summ["packed"]["checks"]["answers"]["top-10"]["same"] is True
    assert summ["large"]["checks"]["answers"]["top-10"]["same"] is False
    md = bench_ab.markdown(report)
    assert md.splitlines()[2] == "Command: `bench_ab.py run --profile tiny`"
    assert "| bench_bm25_packed (packed) | 20,000 |" in md
    assert "DIFFER: top-10" in md
    assert "| qps (qps) | 99 | 100 | 1.010 | 2.0% | 2.0% | within noise |" in md


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def test_clone_checks_out_each_revision_apart(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    _git(repo, "config", "user.email", "t@example.com")
    _git(repo, "config", "user.name", "t")
    (repo / "f.txt").write_text("one")
    _git(repo, "add", "f.txt")
    _git(repo, "commit", "-qm", "one")
    first = _git(repo, "rev-parse", "HEAD")
    (repo / "f.txt").write_text("two")
    _git(repo, "commit", "-qam", "two")
    monkeypatch.setattr(bench_ab, "ROOT", repo)
    a = bench_ab.clone(tmp_path / "work", "A", first)
    b = bench_ab.clone(tmp_path / "work", "B", first)
    assert a != b and (a / "f.txt").read_text() == "one" == (b / "f.txt").read_text()
    (a / "f.txt").write_text("edited")
    assert bench_ab.clone(tmp_path / "work", "A", first) == a and (a / "f.txt").read_text() == "one"
    assert (a / "benchmarks" / ".cache").is_dir()
    assert bench_ab.resolve("HEAD")["subject"] == "two"


def test_share_inputs_links_corpora_only(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    ca = a / "benchmarks" / ".cache"
    (ca / "lucene_vocab" / "corpus_10_1").mkdir(parents=True)
    (ca / "synthetic_10_7.npz").write_bytes(b"x")
    (ca / "lucene_vocab" / "corpus_10_1" / "toks.npy").write_bytes(b"t")
    (ca / "lucene_vocab" / "corpus_10_1" / "ragspine_packed.bm25").write_bytes(b"engine output")
    (ca / "bm25_filters_10.bm25").write_bytes(b"engine output")
    bench_ab.share_inputs(a, b)
    cb = b / "benchmarks" / ".cache"
    assert (cb / "synthetic_10_7.npz").read_bytes() == b"x"
    assert (cb / "synthetic_10_7.npz").stat().st_ino == (ca / "synthetic_10_7.npz").stat().st_ino
    assert (cb / "lucene_vocab" / "corpus_10_1" / "toks.npy").exists()
    assert not (cb / "lucene_vocab" / "corpus_10_1" / "ragspine_packed.bm25").exists()
    assert not (cb / "bm25_filters_10.bm25").exists()


def test_resume_keeps_rounds_and_restarts_a_unit_whose_size_changed(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    report = _report()
    out = tmp_path / "ab"
    out.with_suffix(".json").write_text(json.dumps(report))
    monkeypatch.setattr(bench_ab, "resolve", lambda rev: report["config"]["before"])
    monkeypatch.setattr(bench_ab, "clone", lambda workdir, side, sha: tmp_path / side)
    args = Namespace(out=str(out), workdir=str(tmp_path), data=str(tmp_path), profile="tiny", sizes="large=30000",
                     units="packed,large", before="a4909a8", after="a4909a8", rounds=2, fresh=False,
                     warmup=1)
    h = bench_ab.Harness(args, "cmd")
    assert len(h.report["units"]["packed"]["rounds"]) == 2
    assert "large" not in h.report["units"] and h.report["config"]["sizes"]["large"] == 30_000
    assert h.report["commands"] == ["cmd"] and h.report["command"] == "cmd"
    fresh = bench_ab.Harness(Namespace(**{**vars(args), "fresh": True}), "cmd2")
    assert fresh.report["units"] == {}


def test_remap_replaces_prepared_files_with_fresh_copies(tmp_path: Path) -> None:
    cache = tmp_path
    (cache / "stack_depth" / "10_packed" / "v1").mkdir(parents=True)
    (cache / "refresh").mkdir()
    old = cache / "refresh" / "old_10_packed.rsbm25"
    old.write_bytes(b"index")
    version = cache / "stack_depth" / "10_packed" / "v1" / "bm25.rsbm25"
    version.hardlink_to(old)
    (cache / "stack_depth" / "10_packed" / "v1" / "step.json").write_text("{}")
    inode = old.stat().st_ino
    assert bench_ab.remap(cache, "stack_depth", 10) == 2
    assert old.read_bytes() == b"index" == version.read_bytes()
    assert old.stat().st_ino != inode and version.stat().st_ino != inode
    assert bench_ab.remap(cache, "packed", 10) == 0
