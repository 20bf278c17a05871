"""Refresh segments (#27 item 1): a refresh publishes a stack of immutable segments with
live rows, answers as one index over the same chunks would, and folds back into one file
under its merge policy. Damaged stack files are errors naming them."""

from __future__ import annotations

import json
import os
import zlib
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from test_bm25_merge import _corpus, _docs

from ragspine_pipeline.retrieval.lexical.format.file import CorruptIndexError, IndexFormatError
from ragspine_pipeline.retrieval.lexical.index.filter import PackedFilter
from ragspine_pipeline.retrieval.lexical.index.mapped import open_index
from ragspine_pipeline.retrieval.lexical.refresh.stack import STACK_FILE, StackedBM25, open_stack
from ragspine_pipeline.warehouse import served_refresh
from ragspine_pipeline.warehouse.lexical_files import (
    BM25_FILE,
    merge_bm25_file,
    open_bm25_file,
    write_bm25_file,
)
from ragspine_pipeline.warehouse.lexical_stack import StackPolicy

DEEP = StackPolicy(max_segments=8, max_churn=0.25, min_docs=0)  # stacks at any size, up to 8 deep

QUERIES = [["t1"], ["t2", "t7"], ["t3", "t3", "t40"], ["only_new"], ["changed_term", "t5"], ["營收"],
           ["t11", "t12", "t13", "t14", "t150"], ["nosuchterm"], ["t0", "nosuchterm"]]


def _tokens(corpus: dict[str, list[str]], ids: list[str]) -> pa.Array:
    return pa.array([corpus[i] for i in ids], pa.list_(pa.string()))


def _refresh(old: dict, seed: int, frac: float = 0.01) -> tuple[dict, list[str]]:
    """A small refresh: ~frac removed, added and re-analyzed."""
    rng = np.random.default_rng(seed)
    new = dict(old)
    ids = sorted(old)
    m = max(1, int(len(ids) * frac))
    for cid in rng.choice(ids, m, replace=False).tolist():
        new.pop(cid)
    for i, d in enumerate(_docs(rng, m)):
        new[f"r{seed}-{i:04d}"] = d
    new[f"r{seed}-only"] = ["only_new", "t2"]
    changed = [c for c in rng.choice(sorted(new), m, replace=False).tolist() if c in old]
    for cid in changed:
        new[cid] = new[cid] + ["changed_term"]
    return new, changed


def _publish(vdir: Path, prev: Path | None, corpus: dict, changed=None, **kw) -> dict:
    ids = sorted(corpus)[::-1]  # any order, as the served table gives them
    return merge_bm25_file(vdir, prev, pa.array(ids), _tokens(corpus, ids), changed=changed, **kw)


def _assert_same(stack, ref, n_docs: int) -> None:
    """Same top-k ids and scores to 1e-9, unfiltered and under filters of every form."""
    rng = np.random.default_rng(4)
    masks = [rng.random(n_docs) < f for f in (1.0, 0.5, 0.05, 0.003)]
    forms = [None]
    for m in masks:
        forms += [m, np.flatnonzero(m), PackedFilter.from_mask(m)]
    reused = forms[-1]
    forms.append(reused)  # a reused packed filter: its per-segment filters are remembered
    for q in QUERIES:
        for k in (1, 10):
            for f in forms:
                x = stack.search(q, k, candidates=f)
                y = ref.search(q, k, candidates=None if f is None else (
                    f if not isinstance(f, PackedFilter) else f.to_mask(n_docs)))
                assert np.array_equal(x.ids, y.ids), (q, k)
                np.testing.assert_allclose(x.scores, y.scores, rtol=1e-9, atol=0)


@pytest.mark.parametrize("layout", ["plain", "packed"])
def test_refreshes_stack_segments_and_answer_as_one_index(tmp_path, layout):
    v = [tmp_path / f"v{i}" for i in range(5)]
    corpus = _corpus(n=1500)
    first = _publish(v[0], None, corpus, layout=layout)
    assert first["bm25_build"] == "full"
    for i in range(1, 4):
        corpus, changed = _refresh(corpus, seed=i)
        meta = _publish(v[i], v[i - 1], corpus, changed=changed, layout=layout, stack=DEEP)
        assert meta["bm25_build"] == "stacked", meta
        assert meta["bm25_segments"] == i + 1 and meta["bm25_docs"] == len(corpus)
        # Only what changed is written. (A third, not a quarter, since format 3: the per-term
        # idf and bit rows left the files, which shrank the large base more than the delta.)
        assert meta["bm25_bytes_written"] < meta["bm25_bytes"] / 3
        stack = open_bm25_file(v[i], sorted(corpus))
        assert isinstance(stack, StackedBM25) and stack.n_docs == len(corpus)
        ids = sorted(corpus)
        write_bm25_file(tmp_path / f"fresh{i}", ids, [corpus[c] for c in ids], layout=layout)
        _assert_same(stack, open_index(tmp_path / f"fresh{i}" / BM25_FILE), len(corpus))
        assert stack.doc_ids([0, len(corpus) - 1]) == [ids[0], ids[-1]]
    # The base file is shared, not copied: a hard link to the first version's bytes.
    assert os.stat(v[3] / BM25_FILE).st_ino == os.stat(v[0] / BM25_FILE).st_ino
    # The served-ids check: other ids are not this index.
    assert open_bm25_file(v[3], sorted(corpus)[1:]) is None
    # Past max_segments the small segments fold into the new one: base + one segment.
    corpus, changed = _refresh(corpus, seed=9)
    meta = _publish(v[4], v[3], corpus, changed=changed, layout=layout, stack=StackPolicy(max_segments=3, max_churn=0.25,
                                                                                      min_docs=0))
    assert meta["bm25_build"] == "stacked" and meta["bm25_stack_folded"] and meta["bm25_segments"] == 2, meta
    assert os.stat(v[4] / BM25_FILE).st_ino == os.stat(v[0] / BM25_FILE).st_ino  # the base stays linked
    ids = sorted(corpus)
    write_bm25_file(tmp_path / "fresh4", ids, [corpus[c] for c in ids], layout=layout)
    fresh = open_index(tmp_path / "fresh4" / BM25_FILE)
    _assert_same(open_bm25_file(v[4], ids), fresh, len(corpus))
    # max_segments=1: the policy merges the stack back into one file, the one a fresh build writes.
    meta = _publish(tmp_path / "v5", v[3], corpus, changed=changed, layout=layout, stack=StackPolicy(max_segments=1, min_docs=0))
    assert meta["bm25_build"] == "merged" and "segments" in meta["bm25_merge_reason"]
    assert not (tmp_path / "v5" / STACK_FILE).exists()
    merged = open_index(tmp_path / "v5" / BM25_FILE)
    for q in QUERIES:
        x, y = merged.search(q, 10), fresh.search(q, 10)
        assert np.array_equal(x.ids, y.ids) and np.array_equal(x.scores, y.scores)


def test_churn_past_the_policy_merges_and_a_deletion_only_refresh_stacks(tmp_path):
    corpus = _corpus(n=800)
    _publish(tmp_path / "a", None, corpus)
    big, changed = _refresh(corpus, seed=2, frac=0.2)
    meta = _publish(tmp_path / "b", tmp_path / "a", big, changed=changed, stack=StackPolicy(min_docs=0))
    assert meta["bm25_build"] == "merged" and "churn" in meta["bm25_merge_reason"]
    # Under the default policy's min_docs a refresh merges: one file queries fastest.
    meta = _publish(tmp_path / "b2", tmp_path / "a", big, changed=changed)
    assert meta["bm25_build"] == "merged" and "chunks <" in meta["bm25_merge_reason"], meta
    fewer = dict(corpus)
    for cid in sorted(corpus)[::50]:
        fewer.pop(cid)
    same = _publish(tmp_path / "s", tmp_path / "a", corpus)  # nothing changed: the file itself
    assert same["bm25_build"] == "linked" and same["bm25_bytes_written"] == 0
    assert open_index(tmp_path / "s" / BM25_FILE).same_doc_ids(sorted(corpus))
    assert not (tmp_path / "s" / STACK_FILE).exists()
    meta = _publish(tmp_path / "c", tmp_path / "a", fewer, stack=StackPolicy(min_docs=0))
    assert meta["bm25_build"] == "stacked" and meta["bm25_docs_added"] == 0 and meta["bm25_segments"] == 1
    ids = sorted(fewer)
    write_bm25_file(tmp_path / "fresh", ids, [fewer[c] for c in ids])
    fresh = open_index(tmp_path / "fresh" / BM25_FILE)
    _assert_same(open_bm25_file(tmp_path / "c"), fresh, len(fewer))
    # Ray serving's layout of a version in hash buckets takes a stack's live documents.
    from ragspine_pipeline.retrieval.lexical.refresh.segments import open_segments
    from ragspine_pipeline.scale.layout import write_layout

    segs = open_segments(write_layout(tmp_path / "b2", open_bm25_file(tmp_path / "c"), ids, 2))
    for q in QUERIES:
        x, y = segs.search(q, 10), fresh.search(q, 10)
        assert np.array_equal(x.ids, y.ids)
        np.testing.assert_allclose(x.scores, y.scores, rtol=1e-9, atol=0)


def test_damaged_stack_files_are_errors_naming_them(tmp_path):
    corpus = _corpus(n=400)
    _publish(tmp_path / "a", None, corpus)
    new, changed = _refresh(corpus, seed=3)
    _publish(tmp_path / "b", tmp_path / "a", new, changed=changed, stack=DEEP)
    good = tmp_path / "b"

    def damaged(name: str) -> Path:
        d = tmp_path / f"d{len(list(tmp_path.iterdir()))}"
        d.mkdir()
        for f in good.iterdir():
            (d / f.name).write_bytes(f.read_bytes())
        return d

    d = damaged("rows")
    rows = d / "bm25-rows-000.i32"
    rows.write_bytes(rows.read_bytes()[:-4])
    with pytest.raises(CorruptIndexError, match="bm25-rows-000"):
        open_stack(d)
    d = damaged("flip")
    rows = d / "bm25-rows-001.i32"
    raw = bytearray(rows.read_bytes())
    raw[0] ^= 0x01
    rows.write_bytes(bytes(raw))
    with pytest.raises(CorruptIndexError, match="bm25-rows-001"):
        open_stack(d)
    d = damaged("newer")
    man = json.loads((d / STACK_FILE).read_text())
    man["format"] = 99
    (d / STACK_FILE).write_text(json.dumps(man))
    with pytest.raises(IndexFormatError, match="99.*1"):
        open_stack(d)
    d = damaged("rows-permuted")  # a CRC-valid rows file that breaks the row rules
    man = json.loads((d / STACK_FILE).read_text())
    rows = d / man["segments"][0]["rows"]
    r = np.frombuffer(rows.read_bytes(), "<i4").copy()
    live = np.flatnonzero(r >= 0)
    r[live[0]], r[live[1]] = r[live[1]], r[live[0]]
    rows.write_bytes(r.tobytes())
    man["segments"][0]["rows_crc32"] = zlib.crc32(r.tobytes())
    (d / STACK_FILE).write_text(json.dumps(man))
    with pytest.raises(CorruptIndexError, match="ascending"):
        open_stack(d)
    d = damaged("missing")
    man = json.loads((d / STACK_FILE).read_text())
    (d / man["segments"][-1]["file"]).unlink()
    with pytest.raises(FileNotFoundError, match="segment missing"):
        open_stack(d)
    d = damaged("escape")  # a manifest naming a file outside its folder opens nothing
    man = json.loads((d / STACK_FILE).read_text())
    man["segments"][0]["file"] = "../a/" + man["segments"][0]["file"]
    (d / STACK_FILE).write_text(json.dumps(man))
    with pytest.raises(CorruptIndexError, match="not a file here"):
        open_stack(d)
    d = damaged("manifest")
    (d / STACK_FILE).write_text("{not json")
    with pytest.raises(CorruptIndexError, match=STACK_FILE):
        open_stack(d)


# ----------------------------------------------------------------- pipeline
def test_pipeline_refreshes_stack_and_a_restricted_relabel_merges_its_text_out(tmp_path, monkeypatch):
    from test_bm25_merge import LIB, _word_docs, _write
    from test_bm25_merge import _refresh as refresh

    from ragspine_pipeline.warehouse import pipeline as P
    from ragspine_pipeline.warehouse.versioned import VersionedTables

    monkeypatch.setattr(served_refresh, "DEFAULT_POLICY", DEEP)  # a small library that stacks
    corpus = tmp_path / "corpus"
    _word_docs(corpus, 40, "doc{i:02d}")
    wh = VersionedTables(tmp_path / "wh")
    assert refresh(wh, corpus).metadata["bm25_build"] == "full"
    _write(corpus, "doc01", "# Doc 1\n\nrewritten body with brandnew words\n")
    (corpus / LIB / "doc02.md").unlink()
    (corpus / LIB / "doc02.meta.json").unlink()
    lex = refresh(wh, corpus)
    assert lex.metadata["bm25_build"] == "stacked", lex.metadata
    from ragspine_pipeline.retrieval.link.narrative_link import NarrativeIndexRetriever

    index = P.load_snapshot_index(wh, LIB)
    assert isinstance(index.retriever.index, StackedBM25)
    served = NarrativeIndexRetriever(index)
    hits = served.retrieve("brandnew rewritten", top_k=3)
    assert hits and hits[0]["doc_id"].endswith("/doc01")
    assert all(not h["doc_id"].endswith("/doc02") for h in served.retrieve("marker2", top_k=5))
    # A relabel to RESTRICTED: the refresh merges, and no file of the version holds its words.
    secret = "zqxsecretword"
    _write(corpus, "doc03", (corpus / LIB / "doc03.md").read_text(encoding="utf-8").replace(
        "marker3", f"marker3 {secret}"), label="PUBLIC")
    assert refresh(wh, corpus).metadata["bm25_build"] == "stacked"
    _write(corpus, "doc03", (corpus / LIB / "doc03.md").read_text(encoding="utf-8"), label="RESTRICTED")
    lex = refresh(wh, corpus)
    meta = lex.metadata
    assert meta["bm25_build"] == "merged" and "RESTRICTED" in meta["bm25_stack_off"], meta
    for f in lex.published.path.iterdir():
        assert b"zqxsecret" not in f.read_bytes(), f.name  # the word, or its stem
    assert not any(h["doc_id"].endswith("/doc03") for h in
                   NarrativeIndexRetriever(P.load_snapshot_index(wh, LIB)).retrieve(f"marker3 {secret}", top_k=10))


def test_small_merges_order_as_the_numpy_merge(monkeypatch):
    """The Python merge of a few candidates (a stack's top-k lists) orders exactly as the
    numpy one: near-ties (within TIE_REL, chained) by position, zero scores dropped."""
    from ragspine_pipeline.retrieval.lexical.index import topk as T

    rng = np.random.default_rng(1)
    for _ in range(500):
        n = int(rng.integers(0, 60))
        sc = rng.choice([1.0, 2.5, 3.0, 0.0, -1.0], n) * (1 + rng.choice([0, 1e-15, -1e-15, 3e-13, 1e-9], n))
        ids, k = rng.permutation(1000)[:n].astype(np.int64), int(rng.integers(0, 12))
        monkeypatch.setattr(T, "MERGE_SMALL", 10**9)
        a = T.merge_top_k(ids, sc, k)
        monkeypatch.setattr(T, "MERGE_SMALL", -1)
        b = T.merge_top_k(ids, sc, k)
        assert np.array_equal(a.ids, b.ids) and np.array_equal(a.scores, b.scores)
