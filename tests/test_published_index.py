"""The published index is the served index (#27 items 1-2), without Dagster.

The ``lexical_index`` step writes a BM25 file and the served chunk records into its
version; serving maps both (no rebuild, no Python chunk per row) and must answer exactly
as the token path does. A warehouse from before the files still serves (from tokens) and
gets them on its next refresh; a damaged file is an error naming it, never an answer.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from ragspine_pipeline.corpus import DEMO_ROOT, load_golden
from ragspine_pipeline.retrieval.chunking.chunk_columns import ChunkColumns
from ragspine_pipeline.retrieval.lexical.format.file import (
    IndexFormatError,
    id_digest,
    strings_to_blob,
)
from ragspine_pipeline.retrieval.lexical.index.mapped import MappedBM25Index
from ragspine_pipeline.retrieval.link.narrative_index import NarrativeIndexRetriever
from ragspine_pipeline.sensitivity import LABELS_ENV, is_restricted
from ragspine_pipeline.serving import open_published_retriever
from ragspine_pipeline.warehouse import pipeline as P
from ragspine_pipeline.warehouse.lexical_files import BM25_FILE
from ragspine_pipeline.warehouse.served_records import SERVED_FILE, SERVED_META
from ragspine_pipeline.warehouse.versioned import VersionedTables

LIBS = ("acme_reports", "acme_policies")
FILTERS = [None, {"language": "en"}, {"sensitivity": "PUBLIC"}, {"doc_id": "pol_ai_usage"}]


def _publish(wh: VersionedTables, corpus: Path) -> None:
    for lib in LIBS:
        P.build_raw_documents(wh, corpus, lib)
        P.build_chunks(wh, lib)
        P.build_lexical_index(wh, lib)
        P.publish_snapshot(wh, lib)


def _strip_files(root: Path) -> None:
    """A warehouse as written before the files existed: tokens only."""
    for p in [*root.rglob(BM25_FILE), *root.rglob(SERVED_FILE), *root.rglob(SERVED_META)]:
        p.unlink()


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("published")
    corpus = tmp / "corpus"
    for lib in LIBS:
        shutil.copytree(DEMO_ROOT / lib, corpus / lib)
    _publish(VersionedTables(tmp / "wh"), corpus)
    shutil.copytree(tmp / "wh", tmp / "old")
    _strip_files(tmp / "old")
    return tmp


def _dump(snippets) -> str:
    return json.dumps(snippets, sort_keys=True, ensure_ascii=False, default=str)


def _lex_dir(root: Path, lib: str) -> Path:
    wh = VersionedTables(root)
    return wh.get(P.LEXICAL, lib, wh.latest(P.SNAPSHOT, lib).manifest["metadata"]["lexical_index"]).path


def test_a_published_library_serves_from_the_mapped_files_with_the_token_paths_answers(built):
    wh = VersionedTables(built / "wh")
    for lib in LIBS:
        new, old = P.load_snapshot_index(wh, lib), P.load_snapshot_index(VersionedTables(built / "old"), lib)
        assert isinstance(new.retriever.index, MappedBM25Index)
        assert isinstance(new.retriever.chunks, ChunkColumns)
        assert not isinstance(old.retriever.index, MappedBM25Index)
        assert isinstance(old.retriever.chunks, list)
        assert len(new) == len(old) and not any(is_restricted(c.sensitivity) for c in new.retriever.chunks)
        assert new.retriever.restricted.tolist() == old.retriever.restricted.tolist()
        a, b = NarrativeIndexRetriever(new), NarrativeIndexRetriever(old)
        for q in [g["query"] for g in load_golden()]:
            for f in FILTERS:
                x, y = a.retrieve(q, filters=f, top_k=10), b.retrieve(q, filters=f, top_k=10)
                assert _dump(x) == _dump(y), (lib, q, f)
            assert a.ranked_doc_ids(q, chunk_depth=20, depth=5) == b.ranked_doc_ids(q, chunk_depth=20, depth=5)
            assert [c.chunk_id for c in a.ranked_chunks(q, top_k=7)] == [c.chunk_id for c in b.ranked_chunks(q, top_k=7)]
    x = open_published_retriever(built / "wh", mode="bm25")
    y = open_published_retriever(built / "old", mode="bm25")
    for q in [g["query"] for g in load_golden()]:
        assert _dump(x.retrieve(q, top_k=8)) == _dump(y.retrieve(q, top_k=8))


def test_the_published_files_hold_no_restricted_chunk_and_the_records_are_owner_only(built):
    wh = VersionedTables(built / "wh")
    lib = "acme_policies"
    folder = _lex_dir(built / "wh", lib)
    assert (folder / SERVED_FILE).stat().st_mode & 0o077 == 0
    chunks = P.load_snapshot_index(wh, lib).retriever.chunks
    labels = chunks.column("sensitivity").to_pylist()
    assert labels and "RESTRICTED" not in labels
    assert "hr_restructuring_plan_zh" not in set(chunks.column("doc_id").to_pylist())


def test_an_old_warehouse_serves_from_tokens_and_its_next_refresh_writes_the_files(built, tmp_path):
    root = tmp_path / "old"
    shutil.copytree(built / "old", root)
    wh = VersionedTables(root)
    before = P.load_snapshot_index(wh, "acme_reports")
    assert not isinstance(before.retriever.index, MappedBM25Index)
    res = P.build_lexical_index(wh, "acme_reports")
    assert res.metadata["reused"] is False and res.metadata["chunks_analyzed"] == 0  # nothing re-tokenized
    assert res.metadata["bm25_docs"] == len(before)
    P.publish_snapshot(wh, "acme_reports")
    after = P.load_snapshot_index(wh, "acme_reports")
    assert isinstance(after.retriever.index, MappedBM25Index)
    assert P.build_lexical_index(wh, "acme_reports").metadata["reused"] is True  # once is enough
    q = load_golden()[0]["query"]
    assert _dump(NarrativeIndexRetriever(after).retrieve(q)) == _dump(NarrativeIndexRetriever(before).retrieve(q))


def test_a_label_restricted_under_todays_rules_is_never_served_from_the_files(built, monkeypatch):
    # INTERNAL was open when the files were written; dropped from the known labels it is
    # RESTRICTED now: serving must re-select the rows (the token path), not trust the files.
    monkeypatch.setenv(LABELS_ENV, "PUBLIC,CONFIDENTIAL,RESTRICTED")
    wh = VersionedTables(built / "wh")
    lex = wh.get(P.LEXICAL, "acme_policies", wh.latest(P.SNAPSHOT, "acme_policies").manifest["metadata"]["lexical_index"])
    assert "INTERNAL" in (lex.path / SERVED_FILE).read_bytes().decode("utf-8", "replace")
    index = P.load_snapshot_index(wh, "acme_policies")
    assert not isinstance(index.retriever.index, MappedBM25Index)
    assert len(index) and all(c.sensitivity == "PUBLIC" for c in index.retriever.chunks)


def _flip(path: Path, at: float) -> None:
    raw = bytearray(path.read_bytes())
    i = int(len(raw) * at)
    raw[i] ^= 0xFF
    path.write_bytes(bytes(raw))


def _serve_all(root: Path, lib: str) -> None:
    """Open and ask enough that every block of both files has been read."""
    r = NarrativeIndexRetriever(P.load_snapshot_index(VersionedTables(root), lib))
    n = len(r.index)
    for q in [g["query"] for g in load_golden()]:
        r.retrieve(q, top_k=n)
    list(r.index.retriever.chunks)
    r.index.retriever.index.verify()


@pytest.mark.parametrize("name,damage", [
    (BM25_FILE, "truncate"), (BM25_FILE, 0.5), (BM25_FILE, 0.9),
    (SERVED_FILE, "truncate"), (SERVED_FILE, 0.3), (SERVED_FILE, 0.6), (SERVED_META, "truncate"),
])
def test_a_damaged_file_is_an_error_naming_it(built, tmp_path, name, damage):
    root = tmp_path / "wh"
    shutil.copytree(built / "wh", root)
    lib = "acme_reports"
    _serve_all(root, lib)  # undamaged: fine
    path = _lex_dir(root, lib) / name
    if damage == "truncate":
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    else:
        _flip(path, damage)
    with pytest.raises(IndexFormatError) as err:
        _serve_all(root, lib)
    want = SERVED_FILE if name == SERVED_META else name
    assert want in str(err.value)


def test_an_open_compares_the_id_digests_recorded_at_publish_not_the_id_columns(built, tmp_path):
    root = tmp_path / "wh"
    shutil.copytree(built / "wh", root)
    lib = "acme_reports"
    retriever = P.load_snapshot_index(VersionedTables(root), lib).retriever
    chunks, bm25 = retriever.chunks, retriever.index
    assert chunks.id_digest is not None and chunks.id_digest == bm25.doc_id_digest()
    assert chunks.id_digest == id_digest(*strings_to_blob(chunks.chunk_ids()))
    # A sidecar naming other ids (same count) is refused; so is one that is not a digest.
    side = _lex_dir(root, lib) / SERVED_META
    meta = json.loads(side.read_text())
    side.write_text(json.dumps({**meta, "chunk_id_digest": "00" * 32}))
    with pytest.raises(ValueError, match="chunk_id order"):
        P.load_snapshot_index(VersionedTables(root), lib)
    side.write_text(json.dumps({**meta, "chunk_id_digest": "not hex"}))
    with pytest.raises(IndexFormatError, match=SERVED_FILE):
        P.load_snapshot_index(VersionedTables(root), lib)
    # Records written before the digest: the ids are compared whole, as before.
    side.write_text(json.dumps({k: v for k, v in meta.items() if k != "chunk_id_digest"}))
    old = P.load_snapshot_index(VersionedTables(root), lib).retriever
    assert old.chunks.id_digest is None and isinstance(old.index, MappedBM25Index)


def test_chunk_columns_build_the_same_chunks_and_answer_from_columns():
    import pyarrow as pa

    from ragspine_pipeline.retrieval.chunking.chunk_schema import row_to_chunk

    rows = [{"chunk_id": f"d{i % 3}#{i:04d}", "doc_id": f"d{i % 3}", "title": None if i == 2 else f"T{i}",
             "text": f"text {i}", "source_path": "", "start_char": i, "end_char": i + 5, "ordinal": i,
             "topic": "", "entity": "", "geography": "", "period": "", "language": "en" if i % 2 else "",
             "sensitivity": None if i == 1 else "PUBLIC", "parent_id": "", "heading": "", "window_text": "",
             "parent_start": None, "parent_end": None, "chunker": None, "valid_as_of": "", "ingested_at": None,
             "version": None if i == 3 else 2} for i in range(6)]
    rows.sort(key=lambda r: r["chunk_id"])
    ints = {"start_char", "end_char", "ordinal", "parent_start", "parent_end", "version"}
    schema = pa.schema([(k, pa.int32() if k in ints else pa.timestamp("us") if k == "ingested_at" else pa.string())
                        for k in rows[0]])
    cols = ChunkColumns(pa.Table.from_pylist(rows, schema=schema))
    built = [row_to_chunk(r) for r in rows]
    assert list(cols) == built and [cols[i] for i in range(6)] == built and cols[-1] == built[-1]
    assert cols[1:3] == built[1:3]
    for name in ("title", "sensitivity", "chunker", "version", "language"):
        assert cols.values(name).tolist() == [getattr(c, name) for c in built]
    assert cols.values("no_such_field", 7).tolist() == [7] * 6
    assert cols.languages() == ["en"]
    codes, docs = cols.codes("doc_id")
    assert [docs[k] for k in codes] == [c.doc_id for c in built]
    sub = cols.take(cols.matching("language", lambda v: v == "en"))
    assert list(sub) == [c for c in built if c.language == "en"]
    with pytest.raises(ValueError, match="chunk_id order"):
        ChunkColumns(pa.Table.from_pylist(rows[::-1], schema=schema))


def test_an_older_records_layout_is_served_from_tokens_and_a_newer_one_is_an_error(built, tmp_path):
    from ragspine_pipeline.warehouse.served_records import RECORDS_FORMAT

    root = tmp_path / "wh"
    shutil.copytree(built / "wh", root)
    side = _lex_dir(root, "acme_reports") / SERVED_META
    meta = json.loads(side.read_text())
    side.write_text(json.dumps({**meta, "format": RECORDS_FORMAT - 1}))
    wh = VersionedTables(root)
    assert not isinstance(P.load_snapshot_index(wh, "acme_reports").retriever.index, MappedBM25Index)
    assert P.build_lexical_index(wh, "acme_reports").metadata["reused"] is False  # rewritten once
    P.publish_snapshot(wh, "acme_reports")
    assert isinstance(P.load_snapshot_index(wh, "acme_reports").retriever.index, MappedBM25Index)
    side = _lex_dir(root, "acme_reports") / SERVED_META
    side.write_text(json.dumps({**json.loads(side.read_text()), "format": RECORDS_FORMAT + 1}))
    with pytest.raises(IndexFormatError) as err:
        P.load_snapshot_index(wh, "acme_reports")
    assert SERVED_FILE in str(err.value) and f"{RECORDS_FORMAT + 1}" in str(err.value)
    assert f"format {RECORDS_FORMAT}" in str(err.value)
