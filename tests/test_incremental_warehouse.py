"""Segmented versions and the incremental steps, without Dagster.

An incremental refresh must write only what changed, and its result must equal a
from-scratch build over the same files; old versions must keep reading as they were.
"""

import os
import shutil
from pathlib import Path

import duckdb
import pyarrow as pa
import pytest

from ragspine_pipeline.corpus import ingest_folder, make_chunker
from ragspine_pipeline.paths import DEMO_ROOT
from ragspine_pipeline.retrieval.chunking.chunk_store import ChunkStore
from ragspine_pipeline.retrieval.lexical.analysis.analyzer import make_analyzer
from ragspine_pipeline.sensitivity import is_restricted
from ragspine_pipeline.warehouse import catalog as C
from ragspine_pipeline.warehouse import pipeline as P
from ragspine_pipeline.warehouse.versioned import Append, Inherit, VersionedTables, WarehouseError

ROOT = Path(__file__).resolve().parents[1]
LIB = "acme_reports"


# ---------------------------------------------------------------- segmented versions
def _t(xs):
    return pa.table({"chunk_id": [str(x) for x in xs], "x": xs})


def test_append_references_parent_segments_and_old_versions_read_as_before(tmp_path):
    wh = VersionedTables(tmp_path)
    v1 = wh.write("a", "lib", {"t": _t([1, 2]), "s": _t([0])})
    v2 = wh.write("a", "lib", {"t": Append(_t([3])), "s": Inherit()}, parent=v1)
    v3 = wh.write("a", "lib", {"t": Append(_t([])), "s": _t([9])}, parent=v2)  # empty append writes nothing
    assert v2.segments("t") == ["v000001/t.parquet", "v000002/t.parquet"]
    assert v3.segments("t") == v2.segments("t") and v3.segments("s") == ["v000003/s.parquet"]
    assert wh.read("a", "lib", "t").column("x").to_pylist() == [1, 2, 3]
    assert wh.read("a", "lib", "t", "v000001").column("x").to_pylist() == [1, 2]
    assert wh.read("a", "lib", "s", "v000002").column("x").to_pylist() == [0]
    assert wh.read("a", "lib", "t", columns=["x"]).column_names == ["x"]
    assert not (tmp_path / "a" / "lib" / "v000002" / "s.parquet").exists()  # inherited, not copied
    with pytest.raises(WarehouseError, match="needs a parent"):
        wh.write("a", "lib", {"t": Append(_t([4]))})


def test_compaction_bounds_segments_and_may_drop_unreachable_rows(tmp_path):
    wh = VersionedTables(tmp_path)
    pub = wh.write("a", "lib", {"t": _t([0])})
    for i in range(1, 6):
        pub = wh.write("a", "lib", {"t": Append(_t([i]), compact=lambda t: t.filter(pa.compute.greater(t["x"], 2)))},
                       parent=pub, max_segments=4)
    # v1..v4 -> 4 segments; v5 compacts to one file holding only x > 2; v6 appends to it.
    assert pub.segments("t") == ["v000005/t.parquet", "v000006/t.parquet"]
    assert wh.read("a", "lib", "t").column("x").to_pylist() == [3, 4, 5]
    assert wh.read("a", "lib", "t", "v000004").column("x").to_pylist() == [0, 1, 2, 3]


def test_prune_keeps_segments_that_kept_versions_reference(tmp_path):
    wh = VersionedTables(tmp_path)
    pub = wh.write("a", "lib", {"t": _t([1])})
    for i in range(2, 6):
        pub = wh.write("a", "lib", {"t": Append(_t([i]))}, parent=pub)
    removed = wh.prune("a", "lib", keep=1, retain_for=0)
    assert removed == ["v000001", "v000002", "v000003", "v000004"]
    assert wh.versions("a", "lib") == ["v000005"]
    assert wh.read("a", "lib", "t").column("x").to_pylist() == [1, 2, 3, 4, 5]  # still whole
    with pytest.raises(WarehouseError):
        wh.get("a", "lib", "v000002")
    # A rewrite whole releases the old segments, and the next prune deletes them.
    wh.write("a", "lib", {"t": _t([7])}, parent=pub)
    wh.prune("a", "lib", keep=1, retain_for=0)
    left = sorted(p.relative_to(tmp_path / "a" / "lib").as_posix() for p in (tmp_path / "a" / "lib").rglob("*.parquet"))
    assert left == ["v000006/t.parquet"]
    # Version numbers are never reused, even for folders pruned away.
    assert wh.write("a", "lib", {"t": _t([8])}).version == "v000007"


# ------------------------------------------------------------------ incremental steps
@pytest.fixture
def corpus(tmp_path):
    root = tmp_path / "corpus"
    shutil.copytree(DEMO_ROOT / LIB, root / LIB)
    return root


def _build(wh, corpus):
    raw = P.build_raw_documents(wh, corpus, LIB)
    ch = P.build_chunks(wh, LIB)
    lex = P.build_lexical_index(wh, LIB)
    return raw, ch, lex


def _state(wh):
    chunks = P.sorted_active_chunks(wh, LIB, wh.latest(P.CHUNKS, LIB).version)
    tok = wh.read(P.LEXICAL, LIB, "tokens")
    tokens = dict(zip(tok.column("chunk_id").to_pylist(), tok.column("tokens").to_pylist(), strict=True))
    # RESTRICTED chunks have no tokens: the lexical index is a published table (docs/security.md).
    assert all((c.chunk_id in tokens) != is_restricted(c.sensitivity) for c in chunks)
    return {c.chunk_id: (c.doc_id, c.text, c.sensitivity, c.start, c.end, tokens.get(c.chunk_id)) for c in chunks}


def _edit(corpus):
    lib = corpus / LIB
    p = lib / "pr_us_datacenter.md"
    p.write_text(p.read_text(encoding="utf-8") + "\n\nUpdate: orders doubled in Q4.\n", encoding="utf-8")
    (lib / "pr_new_item.md").write_text("# New item\n\nACME opened a lab in Osaka.\n", encoding="utf-8")
    (lib / "pr_eu_lyon.md").unlink()
    (lib / "pr_eu_lyon.meta.json").unlink()


def test_refresh_writes_only_the_delta_and_equals_a_full_rebuild(tmp_path, corpus):
    wh = VersionedTables(tmp_path / "wh")
    raw1, ch1, lex1 = _build(wh, corpus)
    assert raw1.metadata["parsed"] == 27 and ch1.metadata["new"] == 27
    assert all(c.passed for c in ch1.checks.values())
    v1 = {c.doc_id: c.version for c in P.active_chunks(wh, LIB)}

    # Nothing changed: every step keeps its published version.
    raw, ch, lex = _build(wh, corpus)
    assert (raw.metadata["reused"], ch.metadata["reused"], lex.metadata["reused"]) == (True, True, True)
    assert raw.metadata["parsed"] == 0

    _edit(corpus)
    raw2, ch2, lex2 = _build(wh, corpus)
    assert raw2.metadata["parsed"] == 2 and raw2.metadata["deleted_files"] == 1
    seg = raw2.published.table_paths("documents")[-1]
    assert pa.parquet.read_table(seg).num_rows == 3  # one changed, one new, one tombstone
    assert (ch2.metadata["new"], ch2.metadata["changed"], ch2.metadata["withdrawn"]) == (1, 1, 1)
    new_rows = pa.parquet.read_table(ch2.published.table_paths("chunks")[-1])
    assert set(new_rows.column("doc_id").to_pylist()) == {f"{LIB}/pr_us_datacenter", f"{LIB}/pr_new_item"}
    assert lex2.metadata["chunks_analyzed"] == new_rows.num_rows - len(
        set(new_rows.column("chunk_id").to_pylist()) & set(wh.read(P.LEXICAL, LIB, "tokens", lex1.published.version)
                                                           .column("chunk_id").to_pylist()))
    assert all(c.passed for c in ch2.checks.values()), ch2.checks
    v2 = {c.doc_id: c.version for c in P.active_chunks(wh, LIB)}
    assert v2[f"{LIB}/pr_us_datacenter"] == v1[f"{LIB}/pr_us_datacenter"] + 1 and f"{LIB}/pr_eu_lyon" not in v2
    assert all(v2[d] == v for d, v in v1.items() if d in v2 and d != f"{LIB}/pr_us_datacenter")
    # The first version still reads as it was (point in time).
    assert f"{LIB}/pr_eu_lyon" in {c.doc_id for c in P.active_chunks(wh, LIB, ch1.published.version)}

    fresh = VersionedTables(tmp_path / "fresh")
    _build(fresh, corpus)
    assert _state(wh) == _state(fresh)
    # The engine's own DuckDB ChunkStore agrees on the active chunk set too.
    with ChunkStore(":memory:") as store:
        ingest_folder(store, corpus / LIB, library=LIB, chunker=make_chunker())
        assert {c.chunk_id for c in store.iter_chunks()} == set(_state(wh))


def test_touched_file_is_compared_by_content_and_publishes_nothing(tmp_path, corpus):
    wh = VersionedTables(tmp_path / "wh")
    _build(wh, corpus)
    p = corpus / LIB / "ir_cn_qa.md"
    st = p.stat()
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns + 10_000_000))
    for _ in range(2):  # the signature differs, the content key does not: never re-parsed (issue 28 item 4)
        raw, ch, lex = _build(wh, corpus)
        assert raw.metadata["parsed"] == 0 and raw.metadata["touched_unchanged"] == 1 and raw.metadata["reused"]
        assert ch.metadata["reused"] and lex.metadata["reused"]


def test_empty_document_does_not_bump_versions_on_every_refresh(tmp_path, corpus):
    wh = VersionedTables(tmp_path / "wh")
    (corpus / LIB / "empty.md").write_text("   \n\n", encoding="utf-8")
    _, ch, _ = _build(wh, corpus)
    _, ch2, _ = _build(wh, corpus)
    assert ch2.metadata["reused"] and ch2.published.version == ch.published.version


def test_new_chunker_rechunks_everything_and_a_rescan_reparses(tmp_path, corpus):
    wh = VersionedTables(tmp_path / "wh")
    _build(wh, corpus)
    ch = P.build_chunks(wh, LIB, "paragraph:200:40")
    assert ch.metadata["unchanged"] + ch.metadata["changed"] == 27 and ch.metadata["changed"] > 0
    assert all(c.passed for c in ch.checks.values())
    raw = P.build_raw_documents(wh, corpus, LIB, rescan=True)
    assert raw.metadata["parsed"] == 27 and len(raw.published.segments("documents")) == 1


def test_catalog_views_derive_active_and_superseded_at(tmp_path, corpus):
    wh = VersionedTables(tmp_path / "wh")
    _build(wh, corpus)
    P.publish_snapshot(wh, LIB)
    first = P.build_catalog(wh, [LIB], tmp_path / "c1.duckdb")
    _edit(corpus)
    _build(wh, corpus)
    P.publish_snapshot(wh, LIB)
    P.build_catalog(wh, [LIB], tmp_path / "c2.duckdb")
    con = duckdb.connect(str(tmp_path / "c2.duckdb"), read_only=True)
    # The default catalog leaves restricted documents out entirely (the rest are all there).
    hidden = C.redacted_doc_ids(wh, LIB, wh.latest(P.SNAPSHOT, LIB).manifest["metadata"])
    active = {r[0] for r in con.execute(f"SELECT chunk_id FROM chunks_{LIB} WHERE active").fetchall()}
    assert hidden and active == {c.chunk_id for c in P.active_chunks(wh, LIB) if c.doc_id not in hidden}
    t0 = con.execute(f"SELECT min(ingested_at) FROM chunks_{LIB}").fetchone()[0]
    then = {r[0] for r in con.execute(
        f"SELECT chunk_id FROM chunks_{LIB} WHERE ingested_at <= ? AND (superseded_at IS NULL OR superseded_at > ?)",
        [t0, t0]).fetchall()}
    v1 = wh.get(P.CHUNKS, LIB, "v000001")
    assert then == {c.chunk_id for c in P.active_chunks(wh, LIB, v1.version) if c.doc_id not in hidden}
    docs = dict(con.execute(f"SELECT doc_id, text FROM documents_{LIB}").fetchall())
    assert f"{LIB}/pr_eu_lyon" not in docs and "orders doubled" in docs[f"{LIB}/pr_us_datacenter"]
    assert len(docs) == 27 - len(hidden) and not set(docs) & hidden
    n_tok = con.execute(f"SELECT count(*) FROM lexical_tokens_{LIB}").fetchone()[0]
    assert n_tok == len(active)
    con.close()
    # The first catalog still answers from its own (immutable) version.
    con = duckdb.connect(str(tmp_path / "c1.duckdb"), read_only=True)
    assert con.execute(f"SELECT count(*) FROM documents_{LIB} WHERE doc_id = ?",
                       [f"{LIB}/pr_eu_lyon"]).fetchone()[0] == 1
    con.close()
    assert first["views"]


def test_a_warehouse_written_by_the_single_file_layout_is_migrated(tmp_path, corpus):
    """Chunks versions written before doc_state existed (stored ``active``) keep their versions."""
    wh = VersionedTables(tmp_path / "wh")
    P.build_raw_documents(wh, corpus, LIB)
    key = make_chunker().key
    with ChunkStore(":memory:") as store:
        ingest_folder(store, corpus / LIB, library=LIB, chunker=make_chunker())
        tables = store.export_arrow()
    wh.write(P.CHUNKS, LIB, tables, {"chunker": key})
    before = {c.chunk_id for c in P.active_chunks(wh, LIB)}
    _edit(corpus)
    P.build_raw_documents(wh, corpus, LIB)
    ch = P.build_chunks(wh, LIB)
    assert (ch.metadata["new"], ch.metadata["changed"], ch.metadata["withdrawn"]) == (1, 1, 1)
    after = {c.doc_id: c.version for c in P.active_chunks(wh, LIB)}
    assert after[f"{LIB}/pr_us_datacenter"] == 2 and after[f"{LIB}/ir_cn_qa"] == 1
    assert before - {c.chunk_id for c in P.active_chunks(wh, LIB)}  # the edited/removed chunks left
    assert make_analyzer(None).name == P.build_lexical_index(wh, LIB).metadata["analyzer"]


def test_many_refreshes_compact_and_still_equal_a_full_rebuild(tmp_path):
    """Past 16 segments the tables compact (raw keeps current rows, tokens keep active
    chunks); consumers that saw the old segment list fall back to a full comparison."""
    corpus = tmp_path / "corpus"
    (corpus / LIB).mkdir(parents=True)
    for name in ("a", "b", "c"):
        (corpus / LIB / f"{name}.md").write_text(f"# {name}\n\nFirst paragraph of {name}.\n", encoding="utf-8")
    wh = VersionedTables(tmp_path / "wh")
    _build(wh, corpus)
    for i in range(20):
        p = corpus / LIB / ("a.md", "b.md", "c.md")[i % 3]
        if p.exists():
            p.write_text(p.read_text(encoding="utf-8") + f"\n\nEdit number {i}.\n", encoding="utf-8")
        if i == 7:
            (corpus / LIB / "c.md").unlink()
        if i == 11:
            (corpus / LIB / "c.md").write_text("# c\n\nBack again.\n", encoding="utf-8")
        raw, ch, lex = _build(wh, corpus)
        assert all(c.passed for c in ch.checks.values()), (i, ch.checks)
    assert len(wh.latest(P.RAW, LIB).segments("documents")) < 16
    cur = P.raw_state(wh.latest(P.RAW, LIB))
    assert sorted(cur.column("doc_id").to_pylist()) == [f"{LIB}/a", f"{LIB}/b", f"{LIB}/c"]
    fresh = VersionedTables(tmp_path / "fresh")
    _build(fresh, corpus)
    assert _state(wh) == _state(fresh)
    versions = {c.doc_id: c.version for c in P.active_chunks(wh, LIB)}
    assert versions[f"{LIB}/a"] == 1 + 7 and versions[f"{LIB}/c"] > 2  # one version per edit; c came back


def test_full_checks_audit_every_chunk_against_the_raw_text(tmp_path, corpus):
    """The default checks cover what a run wrote; the audit re-reads everything and catches
    a warehouse whose stored source text drifted without a new content hash."""
    wh = VersionedTables(tmp_path / "wh")
    _build(wh, corpus)
    raw = wh.latest(P.RAW, LIB)
    t = P.raw_state(raw)
    i = t.column("doc_id").to_pylist().index(f"{LIB}/ir_cn_qa")
    texts = t.column("text").to_pylist()
    texts[i] = "tampered " + texts[i]
    wh.write(P.RAW, LIB, {"documents": t.set_column(t.schema.get_field_index("text"), "text", pa.array(texts))},
             raw.manifest["metadata"])
    quick = P.build_chunks(wh, LIB)
    assert quick.checks["chunk_text_is_source_substring"].passed  # nothing new to check
    audit = P.build_chunks(wh, LIB, full_checks=True)
    check = audit.checks["chunk_text_is_source_substring"]
    assert not check.passed and check.metadata["scope"] == "every active chunk"
    assert all(e.startswith(f"{LIB}/ir_cn_qa#") for e in check.metadata["examples"])
    assert audit.checks["no_orphan_chunks"].passed and audit.checks["restricted_stays_restricted"].passed
