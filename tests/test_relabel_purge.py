"""A relabel purges (#42 item 7): after a document becomes RESTRICTED (or withheld), no
file under the warehouse that others may read holds its text or tokens.

Built as an attacker would look: publish with the document open, relabel it through its
sidecar, publish again, then read every file under the warehouse — its bytes, every
Parquet table decompressed, the term dictionary of every BM25 file — for a canary word
of the document. Only the files docs/security.md names as owner-only may hold it, and
they must be mode 0600 (their folders 0700). The current snapshot keeps serving, and the
owner can still read the old versions retention keeps.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from types import SimpleNamespace

import duckdb
import numpy as np
import pyarrow.parquet as pq
import pytest

from ragspine_pipeline.graph.step import build_relation_graph
from ragspine_pipeline.retrieval.lexical.index.mapped import open_index
from ragspine_pipeline.retrieval.link.narrative_link import NarrativeIndexRetriever
from ragspine_pipeline.retrieval.vector.embedding_backends import make_embedding_backend
from ragspine_pipeline.warehouse import pipeline as P
from ragspine_pipeline.warehouse import served_refresh
from ragspine_pipeline.warehouse.lexical_stack import StackPolicy
from ragspine_pipeline.warehouse.raptor_tables import build_raptor_step
from ragspine_pipeline.warehouse.rerank_vectors import (
    open_for_refresh,
    refresh_document_vectors,
    store_path,
)
from ragspine_pipeline.warehouse.versioned import OWNER_ONLY_ASSETS, VersionedTables

LIB = "lib"
CANARY = "Quartzkrot"  # kept whole by the analyzer: greppable in tokens and term dictionaries


@pytest.fixture(autouse=True)
def _umask():
    """Published files readable by others (the usual 022): what the purge must narrow."""
    old = os.umask(0o022)
    yield
    os.umask(old)


def _write(folder: Path, name: str, text: str, label: str | None = "PUBLIC") -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.md").write_text(text, encoding="utf-8")
    if label is not None:
        (folder / f"{name}.meta.json").write_text(json.dumps({"sensitivity": label, "entity": "Acme Corp"}),
                                                  encoding="utf-8")


def _library(tmp_path: Path) -> Path:
    folder = tmp_path / "corpus" / LIB
    for i, words in enumerate(["revenue margin zebra plant", "tariff lyon union", "zebra plant revenue"]):
        _write(folder, f"d{i}", f"# Open {i}\n\n{words} for Acme Corp in 2024Q1.\n")
    _write(folder, "memo", f"# Memo {CANARY}\n\n{CANARY} margin plan of Acme Corp.\n\nzebra {CANARY} revenue.\n")
    return folder


def _refresh(wh: VersionedTables, corpus: Path, *, extras: bool = True) -> dict:
    """Every step of a refresh, the publish's metadata (what the purge did) returned."""
    steps = [lambda: P.build_raw_documents(wh, corpus, LIB), lambda: P.build_chunks(wh, LIB),
             lambda: P.build_lexical_index(wh, LIB)]
    if extras:
        steps += [lambda: P.build_embeddings(wh, LIB, make_embedding_backend("deterministic"), "deterministic"),
                  lambda: build_raptor_step(wh, LIB, threshold=0.3, max_depth=2),
                  lambda: build_relation_graph(wh, LIB)]
    for step in steps:
        step()
    meta = P.publish_snapshot(wh, LIB).metadata
    P.build_catalog(wh, [LIB], wh.root / "catalog.duckdb")
    return meta


def _readable_text(path: Path) -> str:
    """Everything a reader of ``path`` learns: its bytes, a Parquet file's rows, a BM25
    file's term dictionary."""
    text = path.read_bytes().decode("utf-8", "replace")
    if path.suffix == ".parquet":
        text += json.dumps(pq.read_table(path).to_pylist(), default=repr, ensure_ascii=False)
    if path.suffix == ".rsbm25":
        ix = open_index(path, kernel="numpy")
        vocab = ix.vocab
        text += " ".join(vocab.term(t) for t in range(len(vocab)))
    return text


def _holders(root: Path) -> list[Path]:
    return [p for p in sorted(root.rglob("*")) if p.is_file() and CANARY.lower() in _readable_text(p).lower()]


def _owner_only(path: Path, root: Path) -> bool:
    """The file is 0600 and every folder from the warehouse root down to it is closed to
    others (0700 somewhere on the way: nobody else can reach it)."""
    if stat.S_IMODE(path.stat().st_mode) != 0o600:
        return False
    folders = [path.parent, *path.parent.parents]
    return any(stat.S_IMODE(d.stat().st_mode) == 0o700 for d in folders[: len(path.relative_to(root).parts) - 1])


def _assert_only_owner_only_files_hold_the_canary(root: Path) -> list[Path]:
    holders = _holders(root)
    open_holders = [str(p.relative_to(root)) for p in holders if not _owner_only(p, root)]
    assert not open_holders, open_holders
    return holders


def _served(wh: VersionedTables, query: str) -> list[dict]:
    return NarrativeIndexRetriever(P.load_snapshot_index(wh, LIB)).retrieve(query, top_k=10)


def test_a_relabel_to_restricted_narrows_every_older_version_that_holds_the_text(tmp_path):
    folder = _library(tmp_path)
    corpus = folder.parent
    wh = VersionedTables(tmp_path / "wh")
    first = _refresh(wh, corpus)
    assert first["purge_hidden_documents"] == 0
    before = [p for p in _holders(wh.root) if p.relative_to(wh.root).parts[0] not in OWNER_ONLY_ASSETS]
    assert {p.relative_to(wh.root).parts[0] for p in before} >= {"lexical_index", "raptor_tree", "relation_graph"}
    old_lex = wh.latest(P.LEXICAL, LIB).version

    (folder / "memo.meta.json").write_text(json.dumps({"sensitivity": "RESTRICTED"}), encoding="utf-8")
    meta = _refresh(wh, corpus)
    assert meta["purge_hidden_documents"] == 1 and meta["purge_versions_narrowed"] >= 4, meta
    assert meta["purge_current_shared"] == 0 and "memo" not in json.dumps(meta)
    holders = _assert_only_owner_only_files_hold_the_canary(wh.root)
    # Which files hold it now: the owner's tables, and the narrowed older derived versions.
    derived = {p.relative_to(wh.root).parts[0] for p in holders} - OWNER_ONLY_ASSETS
    assert derived >= {"lexical_index", "raptor_tree", "relation_graph"}, derived
    for p in holders:
        rel = p.relative_to(wh.root).parts
        assert rel[0] in OWNER_ONLY_ASSETS or rel[2] != wh.latest(rel[0], LIB).version, rel
    # The current versions stay readable by others, and serve without the document.
    for asset in ("lexical_index", "embeddings", "raptor_tree", "relation_graph"):
        cur = wh.latest(asset, LIB).path
        assert stat.S_IMODE(cur.stat().st_mode) == 0o755, asset
        assert all(stat.S_IMODE(f.stat().st_mode) & 0o044 for f in cur.iterdir() if f.suffix != ".arrow"), asset
    assert _served(wh, "zebra revenue") and not any("memo" in h["doc_id"] for h in _served(wh, f"{CANARY} margin"))
    # The owner still reads an old version (a notebook holding the old catalog open).
    assert wh.read(P.LEXICAL, LIB, "tokens", old_lex).num_rows
    # Idempotent: a republish with nothing new narrows nothing more.
    again = _refresh(wh, corpus)
    assert again.get("purge_files_narrowed", 0) == 0


def test_a_label_problem_and_a_parse_error_purge_like_a_relabel(tmp_path):
    """A label problem (an odd label value: RESTRICTED, fail closed) and a sidecar that stops
    parsing (withheld) narrow the older versions that hold the document's text."""
    folder = _library(tmp_path)
    _write(folder, "memo2", f"# Second\n\nzebra {CANARY}two plan.\n")
    corpus = folder.parent
    wh = VersionedTables(tmp_path / "wh")
    _refresh(wh, corpus, extras=False)
    (folder / "memo2.meta.json").write_text('{"sensitivity": "RESTRICTED", ', encoding="utf-8")
    meta = _refresh(wh, corpus, extras=False)  # withheld alone: its rows leave the current tables too
    assert meta["purge_hidden_documents"] == 1 and meta["purge_versions_narrowed"] >= 1, meta
    assert not any(f"{CANARY}two".lower() in _readable_text(p).lower()
                   for p in wh.latest(P.LEXICAL, LIB).path.iterdir() if p.is_file())
    (folder / "memo.meta.json").write_text(json.dumps({"sensitivity": "PUBL1C"}), encoding="utf-8")
    meta = _refresh(wh, corpus, extras=False)
    assert meta["purge_hidden_documents"] == 2 and meta["purge_versions_narrowed"] >= 1, meta
    holders = _assert_only_owner_only_files_hold_the_canary(wh.root)
    assert any(p.relative_to(wh.root).parts[0] == P.LEXICAL for p in holders)
    # Fixed, the withheld document serves again: its chunks are analyzed again.
    (folder / "memo2.meta.json").write_text(json.dumps({"sensitivity": "PUBLIC"}), encoding="utf-8")
    _refresh(wh, corpus, extras=False)
    assert any(h["doc_id"].endswith("/memo2") for h in _served(wh, f"{CANARY}two zebra"))
    assert not any(h["doc_id"] == f"{LIB}/memo" for h in _served(wh, f"{CANARY} zebra plan"))


def test_a_stacked_bm25_segment_from_an_older_version_is_narrowed(tmp_path, monkeypatch):
    """The BM25 stack links the previous version's segment files into the new version: the
    relabel merges the current file, and every older link of a segment that holds the
    document (one inode) becomes owner-only."""
    monkeypatch.setattr(served_refresh, "DEFAULT_POLICY", StackPolicy(max_segments=8, max_churn=0.9, min_docs=0))
    folder = _library(tmp_path)
    corpus = folder.parent
    for i in range(3, 30):
        _write(folder, f"d{i}", f"# Open {i}\n\nzebra plant w{i} revenue tariff.\n")
    wh = VersionedTables(tmp_path / "wh")
    _refresh(wh, corpus, extras=False)
    _write(folder, "d5", "# Open 5\n\nrewritten body with brandnew words.\n")
    _refresh(wh, corpus, extras=False)
    lex = wh.latest(P.LEXICAL, LIB)
    assert P.build_lexical_index(wh, LIB).metadata["reused"]
    stacked = [p for p in lex.path.iterdir() if p.suffix == ".rsbm25"]
    assert stacked and any(p.stat().st_nlink > 1 for p in stacked), "the refresh did not stack"
    (folder / "memo.meta.json").write_text(json.dumps({"sensitivity": "RESTRICTED"}), encoding="utf-8")
    meta = _refresh(wh, corpus, extras=False)
    assert meta["purge_current_shared"] == 0, meta
    holders = _assert_only_owner_only_files_hold_the_canary(wh.root)
    assert any(p.suffix == ".rsbm25" for p in holders)  # the old segments: there, owner-only
    cur = wh.latest(P.LEXICAL, LIB).path
    assert not any(p.parent == cur for p in holders)
    assert _served(wh, "brandnew rewritten")[0]["doc_id"].endswith("/d5")


def test_the_reranker_vector_store_keeps_no_byte_of_a_dropped_row(tmp_path):
    """DuckDB keeps a deleted row's bytes in its free blocks: a refresh that drops rows (a
    chunk relabelled RESTRICTED) writes the rows left into a new file."""
    def chunk(cid: str, text: str, label: str = "PUBLIC"):
        return SimpleNamespace(chunk_id=cid, text=text, sensitivity=label)

    def encode(texts):
        return [np.full((2, 3), len(t), np.float32) for t in texts]

    path = tmp_path / "rerank_vectors" / f"{LIB}.duckdb"
    chunks = [chunk(f"{LIB}/d{i}#{i}", f"open text {i}") for i in range(300)]
    memo = [chunk(f"{LIB}/{CANARY}#{i}", f"memo {i}") for i in range(300)]
    with open_for_refresh(path) as st:
        refresh_document_vectors(st, "m", encode, chunks + memo)
    assert CANARY.encode() in path.read_bytes()
    with open_for_refresh(path) as st:
        report = refresh_document_vectors(st, "m", encode, chunks + [chunk(c.chunk_id, c.text, "RESTRICTED")
                                                                     for c in memo])
    assert report.removed == 300 and report.rows == 300
    assert CANARY.encode() not in path.read_bytes()
    with open_for_refresh(path) as st:
        assert len(st.keys("m")) == 300


def test_the_unredacted_catalog_is_owner_only(tmp_path):
    folder = _library(tmp_path)
    wh = VersionedTables(tmp_path / "wh")
    _refresh(wh, folder.parent, extras=False)
    out = tmp_path / "restricted" / "catalog_restricted.duckdb"
    out.parent.mkdir()
    P.build_catalog(wh, [LIB], out, include_restricted=True)
    con = duckdb.connect(str(out), read_only=True)
    try:
        assert con.execute(f"SELECT count(*) FROM chunks_{LIB} WHERE text LIKE '%{CANARY}%'").fetchone()[0]
    finally:
        con.close()
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    assert stat.S_IMODE(out.with_suffix(".json").stat().st_mode) == 0o600
    assert sorted(p.name for p in out.parent.iterdir()) == ["catalog_restricted.duckdb", "catalog_restricted.json"]


def test_a_deleted_document_back_as_restricted_leaves_no_old_row_in_the_current_tables(tmp_path):
    """A deleted document's tokens stay in an appended-to segment until a compaction; when
    it comes back RESTRICTED (another text: other chunk ids), its old rows must leave the
    current tables at once, and the older versions holding them become owner-only."""
    folder = _library(tmp_path)
    corpus = folder.parent
    wh = VersionedTables(tmp_path / "wh")
    _refresh(wh, corpus)
    for suffix in (".md", ".meta.json"):
        (folder / f"memo{suffix}").unlink()
    _refresh(wh, corpus)
    assert any(CANARY.lower() in _readable_text(p).lower() for p in wh.latest(P.LEXICAL, LIB).table_paths("tokens"))
    _write(folder, "memo", "# Memo\n\nan entirely new text about the canteen.\n", label="RESTRICTED")
    meta = _refresh(wh, corpus)
    assert meta["purge_current_shared"] == 0, meta
    _assert_only_owner_only_files_hold_the_canary(wh.root)
    for asset, table in ((P.LEXICAL, "tokens"), (P.EMBEDDINGS, "vectors")):
        rows = [r for p in wh.latest(asset, LIB).table_paths(table) for r in pq.read_table(p).to_pylist()]
        assert rows and not any(r["chunk_id"].startswith(f"{LIB}/memo#") for r in rows), asset


def test_the_reranker_store_is_narrowed_at_the_publish_and_reopened_by_its_refresh(tmp_path):
    folder = _library(tmp_path)
    corpus = folder.parent
    wh = VersionedTables(tmp_path / "wh")
    _refresh(wh, corpus, extras=False)
    path = store_path(wh.root, LIB)

    def refresh_store() -> None:
        served = P.served_chunks(wh, LIB, wh.latest(P.SNAPSHOT, LIB).manifest["metadata"]["chunks"])
        with open_for_refresh(path) as st:
            refresh_document_vectors(st, "m", lambda texts: [np.ones((2, 3), np.float32) for _ in texts], served)

    refresh_store()
    assert stat.S_IMODE(path.stat().st_mode) == 0o644 and f"{LIB}/memo#".encode() in path.read_bytes()
    (folder / "memo.meta.json").write_text(json.dumps({"sensitivity": "RESTRICTED"}), encoding="utf-8")
    meta = _refresh(wh, corpus, extras=False)
    assert meta["purge_stores_narrowed"] == 1 and stat.S_IMODE(path.stat().st_mode) == 0o600
    refresh_store()  # drops the document's rows: a new, compact file, readable again
    assert stat.S_IMODE(path.stat().st_mode) == 0o644 and f"{LIB}/memo#".encode() not in path.read_bytes()


def test_a_bucketed_bm25_index_folder_is_narrowed_with_its_version(tmp_path, monkeypatch):
    """``RAGSPINE_BM25_BUCKETS`` > 1 writes the index as segment files in a nested folder."""
    monkeypatch.setenv("RAGSPINE_BM25_BUCKETS", "2")
    folder = _library(tmp_path)
    wh = VersionedTables(tmp_path / "wh")
    _refresh(wh, folder.parent, extras=False)
    assert any(wh.latest(P.LEXICAL, LIB).path.glob("bm25-segments/*.rsbm25"))
    (folder / "memo.meta.json").write_text(json.dumps({"sensitivity": "RESTRICTED"}), encoding="utf-8")
    _refresh(wh, folder.parent, extras=False)
    holders = _assert_only_owner_only_files_hold_the_canary(wh.root)
    assert any(p.parent.name == "bm25-segments" for p in holders)
