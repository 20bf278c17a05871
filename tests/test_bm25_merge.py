"""Incremental BM25 refresh by merging the previous version's file (#27 item 1).

A merged index must be the fresh build of the new corpus in everything a query sees: the
same postings per term (term ids may differ), the same document lengths, and once
published the same scores bit for bit, the same top-k and ties, filtered or not, in both
layouts. A document that left the corpus (deleted, RESTRICTED now) must leave the index.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from ragspine_pipeline.retrieval.lexical.index.mapped import open_index
from ragspine_pipeline.retrieval.lexical.refresh.merge import (
    index_in,
    merge_index_file,
    merge_postings,
    plan_merge,
)
from ragspine_pipeline.retrieval.lexical.refresh.stack import StackedBM25
from ragspine_pipeline.retrieval.lexical.refresh.stream_build import build_index_file, count_stream
from ragspine_pipeline.warehouse import pipeline as P
from ragspine_pipeline.warehouse.lexical_files import (
    BM25_FILE,
    merge_bm25_file,
    open_bm25_file,
    write_bm25_file,
)
from ragspine_pipeline.warehouse.versioned import VersionedTables

K1, B = 1.2, 0.75
LAYOUTS = ["plain", "packed"]
KERNELS = ["numpy", "auto"]


def _docs(rng: np.random.Generator, n: int, vocab: int = 300, max_len: int = 30) -> list[list[str]]:
    p = 1.0 / np.arange(1, vocab + 1) ** 1.1
    p /= p.sum()
    return [[f"t{t}" for t in rng.choice(vocab, size=int(rng.integers(0, max_len)), p=p)] for _ in range(n)]


def _corpus(seed: int = 0, n: int = 1500) -> dict[str, list[str]]:
    rng = np.random.default_rng(seed)
    docs = _docs(rng, n)
    docs[3] = ["only_old", "t1"]  # its only document is removed below
    docs[10] = []
    return {f"c{int(x):06d}": d for x, d in zip(rng.choice(10**6, n, replace=False), docs, strict=True)}


def _edit(old: dict[str, list[str]], seed: int = 1) -> tuple[dict[str, list[str]], list[str]]:
    """0.5%-style edits, exaggerated: ~5% removed, ~5% added, ~3% re-analyzed under a kept id."""
    rng = np.random.default_rng(seed)
    ids = sorted(old)
    new = dict(old)
    last_of_its_term = [c for c, d in old.items() if "only_old" in d]
    for cid in [*last_of_its_term, *rng.choice(ids, len(ids) // 20, replace=False).tolist()]:
        new.pop(cid, None)
    added = _docs(rng, len(ids) // 20)
    added[0] = ["only_new", "t2", "only_new"]
    added[1] = ["營收", "Ωmega", ""]
    for i, d in enumerate(added):
        new[f"n{i:05d}"] = d  # sorts after every c... id: appended
        new[f"c{int(rng.integers(10**6)):06d}x"] = d[::-1]  # between kept ids
    changed = [c for c in rng.choice(sorted(new), len(new) // 30, replace=False).tolist() if c in old]
    for cid in changed:
        new[cid] = new[cid] + ["changed_term"]
    return new, changed


def _build(path: Path, corpus: dict[str, list[str]], layout: str) -> Path:
    ids = sorted(corpus)
    build_index_file([[corpus[i] for i in ids]], path, k1=K1, b=B, doc_ids=ids, layout=layout)
    return path


def _merge(prev_path: Path, path: Path, corpus: dict[str, list[str]], layout: str, kernel: str,
           changed: list[str] | None = None):
    ids = sorted(corpus)
    prev = open_index(prev_path, kernel="numpy")
    plan = plan_merge(prev, ids, changed)
    added = [[corpus[ids[p]] for p in plan.added_pos.tolist()]]
    return merge_index_file(prev, path, plan, added, k1=K1, b=B, doc_ids=ids, layout=layout, kernel=kernel)


def _queries(seed: int = 5, n: int = 150) -> list[list[str]]:
    rng = np.random.default_rng(seed)
    qs = [d[:5] for d in _docs(rng, n, vocab=320, max_len=8)]
    return [*qs, ["only_new"], ["only_old", "t1"], ["changed_term", "t3"], ["營收", "t1"], [""], []]


def assert_same_answers(a, b, n_docs: int, queries: list[list[str]] | None = None) -> None:
    """Same ids and bit-identical scores, unfiltered and under random candidate masks
    (scores to 1e-9 when ``a`` is a refresh stack: its segments sum in their own order)."""
    exact = not isinstance(a, StackedBM25)
    rng = np.random.default_rng(9)
    masks = [None, *(rng.random(n_docs) < f for f in (0.01, 0.3, 0.9))]
    for q in queries or _queries():
        for k in (1, 10):
            for mask in masks:
                x, y = a.search(q, k, candidates=mask), b.search(q, k, candidates=mask)
                assert np.array_equal(x.ids, y.ids), (q, k)
                if exact:
                    assert np.array_equal(x.scores, y.scores), (q, k)
                np.testing.assert_allclose(x.scores, y.scores, rtol=1e-9, atol=0)


def assert_same_raw(raw, ref) -> None:
    """Postings equal term by term (by text), document lengths equal."""
    assert np.array_equal(np.asarray(raw.doc_len), np.asarray(ref.doc_len))
    assert sorted(raw.terms) == sorted(ref.terms)
    at = {t: i for i, t in enumerate(raw.terms)}
    for j, term in enumerate(ref.terms):
        i = at[term]
        s, e = raw.indptr[i], raw.indptr[i + 1]
        rs, re_ = ref.indptr[j], ref.indptr[j + 1]
        assert np.array_equal(raw.indices[s:e], ref.indices[rs:re_]), term
        assert np.array_equal(np.asarray(raw.tf[s:e], np.int64), np.asarray(ref.tf[rs:re_], np.int64)), term


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("prev_layout", LAYOUTS)
def test_merged_postings_equal_a_fresh_count(tmp_path, kernel, prev_layout):
    old = _corpus()
    new, changed = _edit(old)
    prev = open_index(_build(tmp_path / "old.rsbm25", old, prev_layout), kernel="numpy")
    ids = sorted(new)
    plan = plan_merge(prev, ids, changed)
    assert plan.kept + plan.removed == len(old) and plan.kept + plan.added == len(new)
    assert plan.removed > len(changed) > 0
    raw, _t, _runs = merge_postings(prev, plan, [[new[ids[p]] for p in plan.added_pos.tolist()]],
                             tmp_dir=tmp_path / "m", kernel=kernel)
    ref, _vocab = count_stream([[new[i] for i in ids]], tmp_dir=tmp_path / "f")
    assert_same_raw(raw, ref)
    assert "only_new" in raw.terms and "only_old" not in raw.terms and "changed_term" in raw.terms


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("prev_layout", LAYOUTS)
def test_a_merged_file_answers_exactly_as_a_fresh_build(tmp_path, kernel, layout, prev_layout):
    old = _corpus()
    new, changed = _edit(old)
    rep = _merge(_build(tmp_path / "old.rsbm25", old, prev_layout), tmp_path / "m.rsbm25", new, layout, kernel,
                 changed)
    assert (rep.layout, rep.docs, rep.kept + rep.added) == (layout, len(new), len(new))
    merged, fresh = open_index(tmp_path / "m.rsbm25"), open_index(_build(tmp_path / "f.rsbm25", new, layout))
    assert merged.n_docs == fresh.n_docs and merged.n_terms == fresh.n_terms
    assert merged.same_doc_ids(sorted(new)) and merged.total_len == fresh.total_len
    assert_same_answers(merged, fresh, len(new))


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("case", ["identical", "only_added", "all_removed", "all_replaced", "to_empty"])
def test_edge_cases_of_what_stays(tmp_path, layout, case):
    old = _corpus(n=400)
    extra = {f"z{i:04d}": d for i, d in enumerate(_docs(np.random.default_rng(4), 60))}
    new = {"identical": old, "only_added": {**old, **extra}, "all_removed": extra,
           "all_replaced": {c: d + ["x"] for c, d in old.items()}, "to_empty": {}}[case]
    changed = sorted(old) if case == "all_replaced" else None
    prev = _build(tmp_path / "old.rsbm25", old, layout)
    for kernel in KERNELS:
        rep = _merge(prev, tmp_path / f"m-{kernel}.rsbm25", new, layout, kernel, changed)
        assert rep.kept == (0 if case in ("all_removed", "all_replaced", "to_empty") else len(old))
        if not new:
            assert open_index(tmp_path / f"m-{kernel}.rsbm25").n_docs == 0
            continue
        assert_same_answers(open_index(tmp_path / f"m-{kernel}.rsbm25"),
                            open_index(_build(tmp_path / "f.rsbm25", new, layout)), len(new), _queries(n=40))


def _lengths_corpus(distinct: int, n: int, seed: int) -> dict[str, list[str]]:
    rng = np.random.default_rng(seed)
    return {f"d{seed}-{i:05d}": [f"t{t}" for t in rng.integers(0, 50, i % distinct)] for i in range(n)}


@pytest.mark.parametrize("grow", [True, False])
def test_length_code_widths_and_tf_widths_follow_the_new_corpus(tmp_path, grow):
    """uint8 length codes (<= 256 distinct lengths) <-> uint16, and a uint8 tf column that
    a new document's tf of 300 widens."""
    small, large = _lengths_corpus(200, 600, 1), _lengths_corpus(400, 600, 2)
    large["d99999"] = ["x"] * 300 + ["t1"]
    old, new = (small, {**small, **large}) if grow else ({**small, **large}, small)
    prev = _build(tmp_path / "old.rsbm25", old, "packed")
    for kernel in KERNELS:
        _merge(prev, tmp_path / f"m-{kernel}.rsbm25", new, "packed", kernel)
        merged, fresh = open_index(tmp_path / f"m-{kernel}.rsbm25"), open_index(_build(tmp_path / "f.rsbm25", new,
                                                                                       "packed"))
        codes = merged._file.arrays.get("doc_code")
        assert codes is not None and codes.dtype == fresh._file.arrays["doc_code"].dtype
        assert codes.dtype == (np.uint16 if grow else np.uint8)
        assert_same_answers(merged, fresh, len(new), [["x"], ["t1", "x"], ["t3", "t4"], ["t7"]])


def test_plan_refuses_what_it_cannot_merge(tmp_path):
    old = _corpus(n=50)
    ids = sorted(old)
    build_index_file([[old[i] for i in ids]], tmp_path / "noids.rsbm25", k1=K1, b=B)
    with pytest.raises(ValueError, match="no doc ids"):
        plan_merge(open_index(tmp_path / "noids.rsbm25"), ids)
    prev = open_index(_build(tmp_path / "old.rsbm25", old, "plain"))
    with pytest.raises(ValueError, match="same order"):
        plan_merge(prev, ids[::-1])


def test_a_damaged_previous_file_is_an_error_naming_it(tmp_path):
    old = _corpus(n=300)
    prev = _build(tmp_path / "old.rsbm25", old, "packed")
    raw = bytearray(prev.read_bytes())
    raw[len(raw) // 2] ^= 0x10
    prev.write_bytes(bytes(raw))
    with pytest.raises(Exception, match="old.rsbm25"):
        _merge(prev, tmp_path / "m.rsbm25", old, "packed", "auto")
    assert not (tmp_path / "m.rsbm25").exists()


# ----------------------------------------------------------------- warehouse files
def _versions(tmp_path: Path, old: dict, new: dict) -> tuple[Path, Path]:
    v1, v2 = tmp_path / "v1", tmp_path / "v2"
    ids = list(old)
    write_bm25_file(v1, pa.array(ids), pa.array([old[i] for i in ids], pa.list_(pa.string())))
    return v1, v2


def test_merge_bm25_file_merges_or_says_why_it_built_in_full(tmp_path):
    old = _corpus(n=500)
    new, changed = _edit(old)
    v1, v2 = _versions(tmp_path, old, new)
    ids = list(new)[::-1]  # any order, as the served table gives them
    tokens = pa.array([new[i] for i in ids], pa.list_(pa.string()))
    meta = merge_bm25_file(v2, v1, pa.array(ids), tokens, changed=changed, stack=None)  # the merge itself
    assert meta["bm25_build"] == "merged" and meta["bm25_docs"] == len(new)
    assert meta["bm25_docs_kept"] + meta["bm25_docs_added"] == len(new)
    assert meta["bm25_docs_kept"] + meta["bm25_docs_removed"] == len(old)
    fresh = tmp_path / "fresh"
    write_bm25_file(fresh, ids, [new[i] for i in ids])
    assert_same_answers(open_index(v2 / BM25_FILE), open_index(fresh / BM25_FILE), len(new), _queries(n=40))
    assert json.dumps(meta)  # manifest metadata

    first = merge_bm25_file(tmp_path / "v0", None, ids, [new[i] for i in ids])
    assert first["bm25_build"] == "full" and first["bm25_full_reason"] == "no previous version"
    segmented = merge_bm25_file(tmp_path / "v3", v1, ids, [new[i] for i in ids], buckets=4)
    assert segmented["bm25_build"] == "full" and "4 buckets" in segmented["bm25_full_reason"]

    raw = bytearray((v1 / BM25_FILE).read_bytes())
    raw[-200] ^= 0x01
    (v1 / BM25_FILE).write_bytes(bytes(raw))
    damaged = merge_bm25_file(tmp_path / "v4", v1, ids, [new[i] for i in ids])
    assert damaged["bm25_build"] == "full" and "does not open" in damaged["bm25_full_reason"]
    assert str(v1 / BM25_FILE) in damaged["bm25_full_reason"]
    assert_same_answers(open_index(tmp_path / "v4" / BM25_FILE), open_index(fresh / BM25_FILE), len(new),
                        _queries(n=20))


# ----------------------------------------------------------------- pipeline
LIB = "lib"


def _write(corpus: Path, name: str, text: str, label: str = "PUBLIC") -> None:
    (corpus / LIB).mkdir(parents=True, exist_ok=True)
    (corpus / LIB / f"{name}.md").write_text(text, encoding="utf-8")
    (corpus / LIB / f"{name}.meta.json").write_text(json.dumps({"sensitivity": label}), encoding="utf-8")


def _word_docs(corpus: Path, n: int, name: str = "doc{i}") -> None:
    """``n`` documents of 60 random words from 80 (seed 3), each with its own ``marker<i>``."""
    rng = np.random.default_rng(3)
    words = [f"w{i}" for i in range(80)]
    for i in range(n):
        _write(corpus, name.format(i=i), f"# Doc {i}\n\n" + " ".join(rng.choice(words, 60)) + f" marker{i}\n")


def _refresh(wh: VersionedTables, corpus: Path):
    P.build_raw_documents(wh, corpus, LIB)
    P.build_chunks(wh, LIB)
    lex = P.build_lexical_index(wh, LIB)
    P.publish_snapshot(wh, LIB)
    return lex


def _served_index(wh: VersionedTables):
    lex = wh.latest(P.LEXICAL, LIB)
    return open_bm25_file(lex.path)  # one file, or a refresh stack


def test_a_refresh_merges_and_serves_what_a_fresh_build_serves(tmp_path):
    corpus = tmp_path / "corpus"
    _word_docs(corpus, 12)
    wh = VersionedTables(tmp_path / "wh")
    first = _refresh(wh, corpus)
    assert first.metadata["bm25_build"] == "full"
    before = _served_index(wh)
    doc3 = {c.chunk_id for c in P.load_snapshot_index(wh, LIB).retriever.chunks if c.doc_id.endswith("/doc3")}
    assert doc3 and doc3 <= set(before.doc_ids(range(before.n_docs)))
    # An edit, an addition, a deletion and a relabel to RESTRICTED.
    _write(corpus, "doc1", "# Doc 1\n\nrewritten body with brandnew words\n")
    _write(corpus, "doc_new", "# New\n\nanother brandnew document\n")
    (corpus / LIB / "doc2.md").unlink()
    (corpus / LIB / "doc2.meta.json").unlink()
    _write(corpus, "doc3", (corpus / LIB / "doc3.md").read_text(encoding="utf-8"), label="RESTRICTED")
    lex = _refresh(wh, corpus)
    meta = lex.metadata
    assert meta["bm25_build"] == "merged", meta.get("bm25_full_reason")  # a RESTRICTED relabel merges
    assert meta["bm25_docs_added"] >= 2 and meta["bm25_docs_removed"] >= 3 and meta["bm25_docs_kept"] > 0
    merged = _served_index(wh)
    served = P.load_snapshot_index(wh, LIB).retriever.chunks
    assert merged.same_doc_ids(sorted(c.chunk_id for c in served))
    assert not any(c.doc_id.endswith(("/doc3", "/doc2")) for c in served)
    assert not doc3 & set(merged.doc_ids(range(merged.n_docs)))  # relabelled RESTRICTED: gone (same ids)
    assert merged.n_docs == len(served)
    fresh_wh = VersionedTables(tmp_path / "fresh")
    assert _refresh(fresh_wh, corpus).metadata["bm25_build"] == "full"
    fresh = _served_index(fresh_wh)
    assert fresh.same_doc_ids(merged.doc_ids(range(merged.n_docs)))
    qs = [["marker3"], ["marker4", "w1"], ["brandnew"], ["w5", "w7", "w9"], ["doc"], ["rewritten", "marker1"]]
    assert merged.search(["marker3"], 5).ids.size == 0  # the RESTRICTED chunk's own term is gone
    assert_same_answers(merged, fresh, merged.n_docs, qs)


def test_a_header_change_under_kept_chunk_ids_is_counted_again(tmp_path):
    """Contextual retrieval: a new title re-analyzes chunks whose ids stay; the merge must
    count them again, not keep the old header's counts."""
    corpus = tmp_path / "corpus"
    for i in range(6):
        _write(corpus, f"doc{i}", f"# Doc {i}\n\nplain words here number{i}\n")
    side = corpus / LIB / "doc0.meta.json"
    side.write_text(json.dumps({"sensitivity": "PUBLIC", "title": "Zephyrquill report"}), encoding="utf-8")
    wh = VersionedTables(tmp_path / "wh")

    def refresh(w: VersionedTables):
        P.build_raw_documents(w, corpus, LIB)
        P.build_chunks(w, LIB)
        lex = P.build_lexical_index(w, LIB, contextual="title")
        P.publish_snapshot(w, LIB)
        return lex

    refresh(wh)
    assert _served_index(wh).search(["zephyrquil"], 5).ids.size
    side.write_text(json.dumps({"sensitivity": "PUBLIC", "title": "Quetzalmoor report"}), encoding="utf-8")
    lex = refresh(wh)
    assert lex.metadata["bm25_build"] in ("stacked", "merged") and lex.metadata["bm25_docs_added"] >= 1
    merged = _served_index(wh)
    assert merged.search(["zephyrquil"], 5).ids.size == 0 and merged.search(["quetzalmoor"], 5).ids.size
    fresh_wh = VersionedTables(tmp_path / "fresh")
    refresh(fresh_wh)
    assert_same_answers(merged, _served_index(fresh_wh), merged.n_docs,
                        [["quetzalmoor"], ["report", "plain"], ["number0", "word"], ["doc"]])


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_posting_outside_the_previous_index_is_an_error_not_a_wild_read(tmp_path, kernel, layout):
    from ragspine_pipeline.retrieval.lexical.format.file import CorruptIndexError
    from ragspine_pipeline.retrieval.lexical.refresh.merge import MergePlan

    old = _corpus(n=200)
    prev = open_index(_build(tmp_path / "old.rsbm25", old, layout), kernel="numpy")
    plan = plan_merge(prev, sorted(old))
    short = MergePlan(old_new=plan.old_new[:50], added_pos=plan.added_pos, n_docs=plan.n_docs)
    with pytest.raises(CorruptIndexError, match="outside the index"):
        merge_postings(prev, short, [], tmp_dir=tmp_path / "m", kernel=kernel)


def test_index_in_walks_sorted_ids_and_falls_back_on_anything_else():
    """The compiled merge walk of two id lists equals Arrow's hash look-up: sorted lists
    (with non-ASCII ids, byte prefixes, slices), and the fallback for unsorted or repeated
    ids, nulls and empty lists."""
    import pyarrow.compute as pc

    rng = np.random.default_rng(3)
    words = sorted({"".join(rng.choice(list("abé中\x00z"), rng.integers(0, 6))) for _ in range(400)})
    pool = [w.encode() for w in words]
    pool = sorted(set(pool))  # byte order (UTF-8 keeps code point order)

    def arr(xs):
        return pa.array(xs, pa.large_binary())

    def want(a, b):
        return pc.index_in(a, value_set=b).fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)

    cases = []
    for _ in range(20):
        a = sorted(set(rng.choice(len(pool), rng.integers(0, 300)).tolist()))
        b = sorted(set(rng.choice(len(pool), rng.integers(0, 300)).tolist()))
        cases.append((arr([pool[i] for i in a]), arr([pool[i] for i in b])))
    big = arr(pool)
    cases += [(big.slice(5, 100), big.slice(50, 200)), (arr([]), big), (big, arr([])),
              (arr(pool[::-1]), big), (big, arr(pool[:10] + pool[:10])), (arr([b"a", None]), big),
              (arr([b"ab", b"a"]), arr([b"a", b"ab"]))]
    for a, b in cases:
        got = index_in(a, b)
        assert got.dtype == np.int64 and np.array_equal(got, want(a, b)), (a, b)
