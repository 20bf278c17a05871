"""benchmarks/bench_bm25.py peers-large: the synthetic data, the Lucene docs text, the row
schema and the resume logic (a re-run measures only missing rows), at tiny sizes.

Why: the 10M run takes most of a session and is meant to be stopped and resumed; a resume that
silently re-measures (or silently keeps an error row) would cost a whole session to notice.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import types
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
# Where to find Java and the Anserini jar, read before conftest clears every RAGSPINE_ variable.
LUCENE_ENV = {v: os.environ[v] for v in ("RAGSPINE_JAVA", "RAGSPINE_ANSERINI_JAR") if v in os.environ}


@pytest.fixture()
def bench(tmp_path, monkeypatch) -> types.ModuleType:
    """The benchmark module with its cache, results and heavy lock in tmp_path."""
    monkeypatch.setattr(sys, "argv", ["bench_bm25.py", "peers-large"])
    spec = importlib.util.spec_from_file_location("bench_bm25_under_test", ROOT / "benchmarks" / "bench_bm25.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    monkeypatch.setattr(mod, "CACHE", tmp_path / "cache")
    monkeypatch.setattr(mod, "RESULTS", tmp_path / "results")
    monkeypatch.setattr(mod, "HEAVY_LOCK", tmp_path / "heavy.lock")
    return mod


def _one_shot(n: int, seed: int = 7) -> dict[str, np.ndarray]:
    """The generator as synthetic_corpus first wrote it: every token in one rng.choice call."""
    rng = np.random.default_rng(seed)
    p = 1.0 / np.arange(1, 200_001) ** 1.1
    p /= p.sum()
    lens = np.maximum(rng.poisson(60, n), 1)
    toks = rng.choice(200_000, size=int(lens.sum()), p=p).astype(np.int32)
    q_lens = rng.integers(2, 6, 200)
    q_toks = np.concatenate([rng.choice(200_000, size=k, p=p) for k in q_lens]).astype(np.int32)
    return {"lens": lens, "toks": toks, "q_lens": q_lens, "q_toks": q_toks}


def test_streamed_generation_equals_one_shot(bench, monkeypatch):
    monkeypatch.setattr(bench, "GEN_STEP", 997)  # many slices, one of them partial
    got = bench.synthetic_arrays(400)
    want = _one_shot(400)
    for name, arr in want.items():
        assert got[name].dtype == arr.dtype
        assert np.array_equal(got[name], arr), name
    assert isinstance(got["toks"], np.memmap)  # never loaded whole
    with np.load(bench.CACHE / "synthetic_400_7.npz") as z:  # a plain npz for every other reader
        assert np.array_equal(z["toks"], want["toks"])


def test_docs_text_is_one_line_per_document(bench, monkeypatch):
    arrs = bench.synthetic_arrays(250)
    docs, _queries = bench.synthetic_corpus(250)
    monkeypatch.setattr(bench, "DOC_STEP", 60)  # several batches, the last one partial
    lines = bench._docs_text(250, arrs).read_text().split("\n")
    assert lines[-1] == "" and len(lines) == 251
    assert lines[:-1] == [" ".join(d) for d in docs]
    batches = list(bench._batches(arrs, bench._vocab_strings()))
    assert [len(b) for b in batches] == [60, 60, 60, 60, 10]
    assert [d for b in batches for d in b] == docs


def test_filter_masks_match_the_bits_file(bench):
    prefix = bench._mask_prefix(1000)
    for frac in bench.LARGE_FILTERS:
        mask = bench.filter_mask(1000, frac)
        bits = np.unpackbits(np.fromfile(f"{prefix}{frac}.bits", np.uint8), bitorder="little")[:1000]
        assert np.array_equal(bits.astype(bool), mask)
    assert bench.filter_mask(1000, 0.5).sum() > 400


def _args(bench, **kw):
    ns = types.SimpleNamespace(sizes="300", engines="ragspine", k=10, ragspine_build="memory", layout="plain",
                               memory_build_max=2_000_000, no_filters=False, force=False,
                               remeasure=False)
    ns.__dict__.update(kw)
    return ns


def test_peers_large_rows_and_resume(bench, monkeypatch):
    monkeypatch.setattr(bench, "lucene_setup", lambda: "skipped: not in this test")
    bench.peers_large(_args(bench, engines="ragspine,lucene"))
    report = json.loads((bench.RESULTS / "bm25_peers.json").read_text())
    rows = {r["engine"]: r for r in report["rows"]}
    rs = rows["ragspine"]
    for field in bench.ROW_FIELDS:
        assert field in rs and rs[field] is not None, field
    assert rs["docs"] == 300 and rs["variant"] == "memory/plain" and rs["layout"] == "plain"
    assert rs["agreement_with_reference"]["identical_topk"] == 1.0
    assert rs["index_bytes"] == (bench.CACHE / "large" / "ragspine_300_memory_plain.bm25").stat().st_size
    assert rows["lucene"]["error"].startswith("skipped") and rows["lucene"]["qps"] is None
    filt = [f for f in report["filtered"] if f["engine"] == "ragspine"]
    assert sorted(f["filter_keeps"] for f in filt) == sorted(bench.LARGE_FILTERS)
    for f in filt:
        assert f["p50_ms"] > 0 and f["unfiltered_p50_ms"] > 0 and f["docs"] == 300
        assert f["identical_topk_vs_spec"] == 1.0
    md = (bench.RESULTS / "bm25_peers.md").read_text()
    assert "## Large corpora" in md and "ratio to unfiltered" in md

    # A re-run keeps the measured row (same timestamp, nothing rebuilt) and retries the error row.
    built = (bench.CACHE / "large" / "ragspine_300_memory_plain.bm25.build.json").read_text()
    calls = []
    monkeypatch.setitem(bench.LARGE_RUNNERS, "ragspine", lambda *a: calls.append(a))
    bench.peers_large(_args(bench, engines="ragspine,lucene"))
    assert calls == []
    assert (bench.CACHE / "large" / "ragspine_300_memory_plain.bm25.build.json").read_text() == built
    again = json.loads((bench.RESULTS / "bm25_peers.json").read_text())
    assert [r for r in again["rows"] if r["engine"] == "ragspine"] == [rs]


@pytest.mark.slow
def test_peers_large_force_measures_again(bench, monkeypatch):
    bench.peers_large(_args(bench))
    build_record = bench.CACHE / "large" / "ragspine_300_memory_plain.bm25.build.json"
    built_at = build_record.stat().st_mtime_ns
    calls = []
    real = bench.LARGE_RUNNERS["ragspine"]
    monkeypatch.setitem(bench.LARGE_RUNNERS, "ragspine", lambda *a: calls.append(a) or real(*a))
    bench.peers_large(_args(bench, remeasure=True))  # measured again on the index already built
    assert len(calls) == 1 and build_record.stat().st_mtime_ns == built_at
    bench.peers_large(_args(bench, force=True))
    assert len(calls) == 2 and build_record.stat().st_mtime_ns != built_at
    forced = json.loads((bench.RESULTS / "bm25_peers.json").read_text())
    assert len([r for r in forced["rows"] if r["engine"] == "ragspine"]) == 1
    assert len([f for f in forced["filtered"] if f["engine"] == "ragspine"]) == len(bench.LARGE_FILTERS)


def test_bm25s_projection_writes_a_did_not_fit_row(bench):
    report = {"rows": [{"engine": "bm25s_numba", "docs": 1_000_000, "tokens": 60_000_000, "peak_build_mib": 2155.0}]}
    row, filtered = bench._large_bm25s(10_000_000, _args(bench), {"report": report, "tokens": 600_000_000})
    assert filtered == [] and row["qps"] is None
    assert row["projected_peak_mib"] == pytest.approx(21550.0)
    assert "did not fit" in row["skipped"] and "22.6 GB" in row["skipped"] and "12 GB cap" in row["skipped"]


def _lucene_ready(bench) -> bool:
    return not isinstance(bench.lucene_setup(), str)


@pytest.mark.slow
def test_lucene_large_rows_resume(bench, monkeypatch):
    for var, value in LUCENE_ENV.items():
        monkeypatch.setenv(var, value)
    if not _lucene_ready(bench):
        pytest.skip("needs a JDK 21+ and Anserini's fat jar (RAGSPINE_JAVA / RAGSPINE_ANSERINI_JAR)")
    bench.peers_large(_args(bench, engines="ragspine,lucene"))
    report = json.loads((bench.RESULTS / "bm25_peers.json").read_text())
    luc = next(r for r in report["rows"] if r["engine"] == "lucene")
    for field in bench.ROW_FIELDS:
        assert luc[field] is not None, field
    assert luc["segments"] == 1 and luc["batch_threads"] == 2
    assert (bench.CACHE / "lucene_300").is_dir()
    lf = [f for f in report["filtered"] if f["engine"] == "lucene"]
    assert sorted(f["filter_keeps"] for f in lf) == sorted(bench.LARGE_FILTERS)
    # Same kept documents as ragspine's filters.
    rf = {f["filter_keeps"]: f["survivors"] for f in report["filtered"] if f["engine"] == "ragspine"}
    assert {f["filter_keeps"]: f["survivors"] for f in lf} == rf
    record = bench.CACHE / "lucene_300.build.json"
    built = record.read_text()
    bench.peers_large(_args(bench, engines="lucene", force=False))
    assert record.read_text() == built


def test_rows_of_other_runs_are_kept(bench):
    """Two runs writing rows (a 10M Lucene run beside a ragspine one) never drop each other's."""
    bench.RESULTS.mkdir(parents=True)
    small = {"engine": "ragspine", "corpus": "scifact", "docs": 5183, "k1": 1.5}
    (bench.RESULTS / "bm25_peers.json").write_text(json.dumps({"rows": [small], "filtered": []}))
    meta = {"large_command": "x"}
    luc = bench._row("lucene", 10, "", qps=5.0)
    rs = bench._row("ragspine", 10, "stream/auto", qps=7.0)
    frows = [{"suite": "large", "engine": "ragspine", "variant": "stream/auto", "docs": 10, "filter_keeps": 0.5,
              "survivors": 5, "p50_ms": 1.0, "unfiltered_p50_ms": 1.0, "ratio_to_unfiltered": 1.0, "statistics": "s"}]
    bench._store_large(bench._key(luc), luc, [], meta)
    bench._store_large(bench._key(rs), rs, frows, meta)
    bench._store_large(bench._key(rs), {**rs, "qps": 8.0}, frows, meta)
    report = bench.load_results()
    assert [(r["engine"], r.get("suite"), r["qps"]) for r in report["rows"]] == [
        ("ragspine", None, None), ("lucene", "large", 5.0), ("ragspine", "large", 8.0)]
    assert len(report["filtered"]) == 1 and report["large_command"] == "x"
