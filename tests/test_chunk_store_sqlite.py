"""Spec probe: the spec's chunk store is SQLite and older schemas migrate additively.

User code as the spec writes it -- ``ChunkStore(db_path)``, ``init_schema()``,
``iter_chunks(...)``, ``replace_doc_chunks(...)``, ``build_narrative_retriever(chunk_db)``
-- over SQLite files this test builds itself with ``sqlite3`` in the accepted DDL (table
``narrative_chunk``, one column per StoredChunk field, locators as JSON text). The SQLite
file is never modified; the DuckDB store is written beside it (``<path>.duckdb``) and used
by later opens; no DuckDB extension (``sqlite_scanner``) is loaded or installed.
"""

import json
import os
import sqlite3
from datetime import datetime

import duckdb
import pytest

from ragspine_pipeline.retrieval.chunking.chunk_store import ChunkStore, StoredChunk
from ragspine_pipeline.retrieval.chunking.chunking import SourceLocator, chunk_document
from ragspine_pipeline.retrieval.chunking.sqlite_migration import SqliteMigrationError
from ragspine_pipeline.retrieval.link.narrative_link import build_narrative_retriever

NEW_DDL = """CREATE TABLE narrative_chunk (
  chunk_id TEXT NOT NULL, doc_id TEXT NOT NULL, title TEXT, text TEXT, source_locator TEXT,
  ordinal INTEGER, topic TEXT, entity TEXT, geography TEXT, period TEXT, language TEXT,
  sensitivity TEXT, parent_id TEXT, heading TEXT, window_text TEXT, parent_locator TEXT,
  chunker TEXT, valid_as_of TEXT, ingested_at TEXT, version INTEGER, active INTEGER)"""
OLD_DDL = """CREATE TABLE narrative_chunk (
  chunk_id TEXT NOT NULL, doc_id TEXT NOT NULL, title TEXT, text TEXT, source_locator TEXT,
  ordinal INTEGER, topic TEXT, entity TEXT, geography TEXT, period TEXT, language TEXT,
  sensitivity TEXT, valid_as_of TEXT, ingested_at TEXT, version INTEGER, active INTEGER)"""
NEW_ONLY = ("parent_id", "heading", "window_text", "parent_locator", "chunker")

CN = "ACME China revenue fell in 2023 because of the price war.\n\nMargins fell too."
CN_V1 = "ACME China revenue was flat in 2022."
EU = "The Lyon plant closes in 2024: energy costs doubled."
SECRET = "Board-only: the Lyon plant sale price is 41 million."


def locator(doc_id, start, end, path):
    return json.dumps({"doc_id": doc_id, "start": start, "end": end, "source_path": path})


def spec_rows():
    """(row dict in the SQLite columns, the StoredChunk it must read back as)."""
    out = []

    def add(c, *, version, active, ingested, stored, parent=None, window="", heading="", chunker="paragraph"):
        """``ingested``: the SQLite text; ``stored``: the naive-UTC time it must read back as."""
        parent_loc = SourceLocator(c.doc_id, *parent, c.source_locator.source_path) if parent else None
        row = {"chunk_id": c.chunk_id, "doc_id": c.doc_id, "title": c.title, "text": c.text,
               "source_locator": locator(c.doc_id, c.start, c.end, c.source_locator.source_path),
               "ordinal": c.ordinal, "topic": c.topic, "entity": c.entity, "geography": c.geography,
               "period": c.period, "language": c.language, "sensitivity": c.sensitivity,
               "parent_id": f"{c.doc_id}#p0" if parent else "", "heading": heading, "window_text": window,
               "parent_locator": locator(c.doc_id, *parent, c.source_locator.source_path) if parent else None,
               "chunker": chunker, "valid_as_of": "2023-12-31", "ingested_at": ingested,
               "version": version, "active": 1 if active else 0}
        want = StoredChunk(**{**{f: getattr(c, f) for f in c.__dataclass_fields__},
                              "parent_id": row["parent_id"], "heading": heading, "window_text": window,
                              "parent_locator": parent_loc, "chunker": chunker,
                              "valid_as_of": "2023-12-31", "ingested_at": stored, "version": version,
                              "active": active})
        out.append((row, want))

    meta = {"entity": "ACME_CN", "topic": "finance", "language": "en", "sensitivity": "INTERNAL"}
    (old,) = chunk_document(CN_V1, doc_id="ar2022_cn", source_path="cn.md", metadata=meta)
    add(old, version=1, active=False, ingested="2024-01-01T10:00:00", stored=datetime(2024, 1, 1, 10))
    for c in chunk_document(CN, doc_id="ar2022_cn", source_path="cn.md", metadata=meta):
        add(c, version=2, active=True, ingested="2024-03-01T09:00:00+02:00", stored=datetime(2024, 3, 1, 7),
            parent=(0, len(CN)),
            window=CN, heading="Results", chunker="parent_child")
    eu_meta = {"entity": "ACME_EU", "topic": "operations", "language": "en", "sensitivity": "PUBLIC"}
    for c in chunk_document(EU, doc_id="pr_eu_lyon", source_path="eu.md", metadata=eu_meta):
        add(c, version=1, active=True, ingested="", stored=datetime(1970, 1, 1))  # unknown: the epoch
    for c in chunk_document(SECRET, doc_id="board_lyon", source_path="b.md",
                            metadata={**eu_meta, "sensitivity": "RESTRICTED"}):
        add(c, version=1, active=True, ingested="2024-02-01T00:00:00Z", stored=datetime(2024, 2, 1))
    return out


def write_sqlite(path, ddl, rows):
    con = sqlite3.connect(path)
    con.execute(ddl)
    cols = [r[1] for r in con.execute("PRAGMA table_info(narrative_chunk)")]
    if rows:
        con.executemany(f"INSERT INTO narrative_chunk ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})",
                        [[r[c] for c in cols] for r in rows])
    con.commit()
    con.close()
    os.utime(path, ns=(1_600_000_000_000_000_000, 1_600_000_000_000_000_000))
    return path.read_bytes(), path.stat().st_mtime_ns


def old_schema(want):
    """What an older-schema row reads back as: the added fields at their defaults."""
    return StoredChunk(**{**{f: getattr(want, f) for f in want.__dataclass_fields__},
                          "parent_id": "", "heading": "", "window_text": "", "parent_locator": None,
                          "chunker": "paragraph"})


def ordered(chunks):
    return sorted(chunks, key=lambda c: (c.doc_id, c.ordinal, c.version, c.chunk_id))


@pytest.fixture()
def no_duckdb_on_sqlite(monkeypatch):
    """Every path DuckDB is asked to open; a SQLite file among them fails the test."""
    opened = []
    real = duckdb.connect

    def spy(database=":memory:", *args, **kwargs):
        opened.append(str(database))
        with open(database, "rb") if os.path.isfile(str(database)) else open(os.devnull, "rb") as f:
            assert f.read(16) != b"SQLite format 3\x00", f"DuckDB was handed the SQLite file {database}"
        return real(database, *args, **kwargs)

    monkeypatch.setattr(duckdb, "connect", spy)
    return opened


def assert_offline(store):
    """No extension may be installed or autoloaded, and sqlite_scanner never is."""
    settings = dict(store._con.execute(
        "SELECT name, value FROM duckdb_settings() WHERE name IN "
        "('autoinstall_known_extensions', 'autoload_known_extensions')").fetchall())
    assert settings == {"autoinstall_known_extensions": "false", "autoload_known_extensions": "false"}
    loaded = {n for n, ld, inst in store._con.execute(
        "SELECT extension_name, loaded, installed FROM duckdb_extensions()").fetchall() if ld or inst}
    assert "sqlite_scanner" not in loaded and "sqlite" not in loaded


@pytest.mark.parametrize("schema", ["current", "older"])
def test_sqlite_chunk_store_migrates_beside_and_reads_back_equal(tmp_path, schema, no_duckdb_on_sqlite):
    pairs = spec_rows()
    ddl = NEW_DDL if schema == "current" else OLD_DDL
    rows = [r if schema == "current" else {k: v for k, v in r.items() if k not in NEW_ONLY} for r, _ in pairs]
    want = [w if schema == "current" else old_schema(w) for _, w in pairs]
    db = tmp_path / "data" / "chunks.db"
    db.parent.mkdir()
    before = write_sqlite(db, ddl, rows)

    # --- the spec's user code
    store = ChunkStore(db)
    store.init_schema()
    store.init_schema()  # idempotent
    assert store.iter_chunks(include_inactive=True) == ordered(want)
    assert store.iter_chunks() == ordered([w for w in want if w.active])
    cn_active = [w for w in ordered(want) if w.active and w.entity == "ACME_CN"]
    assert cn_active and store.iter_chunks(entity="ACME_CN") == cn_active  # the metadata pre-filter
    assert_offline(store)

    # as_of reads follow the migrated lineage: before the v2 ingest, v1 was the active one
    assert [c.text for c in store.iter_chunks(doc_id="ar2022_cn", as_of="2024-02-15T00:00:00")] == [CN_V1]
    # re-ingesting the same active chunks is a no-op (fingerprints were migrated); new ones version up
    same = [c for c in want if c.doc_id == "pr_eu_lyon"]
    assert store.replace_doc_chunks("pr_eu_lyon", same) == 0
    (news,) = chunk_document("The Lyon plant closure was postponed.", doc_id="pr_eu_lyon")
    assert store.replace_doc_chunks("pr_eu_lyon", [news]) == 1
    assert store.latest_versions()["pr_eu_lyon"] == 2
    store.close()

    sibling = tmp_path / "data" / "chunks.db.duckdb"
    assert sibling.is_file()
    assert (db.read_bytes(), db.stat().st_mtime_ns) == before  # the user's file is never modified
    assert sorted(p.name for p in db.parent.iterdir()) == ["chunks.db", "chunks.db.duckdb"]
    assert str(db) not in no_duckdb_on_sqlite

    # --- a later open uses the migrated store (the write above is there), and serves retrieval
    retriever, store = build_narrative_retriever(str(db))
    try:
        assert store.migrated_from == str(db) and store.db_path == str(sibling)
        assert [c.text for c in store.iter_chunks(doc_id="pr_eu_lyon")] == ["The Lyon plant closure was postponed."]
        snippets = retriever.retrieve("why did ACME China revenue fall", top_k=5)
        assert snippets and snippets[0]["doc_id"] == "ar2022_cn"
        assert snippets[0]["source_locator"]["source_path"] == "cn.md"
        assert all("Board-only" not in s["text"] for s in retriever.retrieve("Lyon plant sale price", top_k=10))
    finally:
        store.close()
    with ChunkStore(db, read_only=True) as ro:  # read-only opens use the migrated store too
        assert ro.db_path == str(sibling) and len(ro.iter_chunks(doc_id="pr_eu_lyon")) == 1
        assert_offline(ro)
    assert (db.read_bytes(), db.stat().st_mtime_ns) == before


def test_read_only_open_migrates_in_memory_and_writes_nothing(tmp_path, no_duckdb_on_sqlite):
    db = tmp_path / "chunks.db"
    pairs = spec_rows()
    before = write_sqlite(db, NEW_DDL, [r for r, _ in pairs])
    with ChunkStore(db, read_only=True) as store:
        assert store.iter_chunks(include_inactive=True) == ordered([w for _, w in pairs])
        with pytest.raises(PermissionError):
            store.replace_doc_chunks("pr_eu_lyon", [])
        assert_offline(store)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["chunks.db"]
    assert (db.read_bytes(), db.stat().st_mtime_ns) == before


def test_a_second_migration_never_replaces_the_first(tmp_path):
    """Two processes migrating the same file: the first published store stays (os.link)."""
    db = tmp_path / "chunks.db"
    write_sqlite(db, NEW_DDL, [r for r, _ in spec_rows()])
    with ChunkStore(db) as store:
        store.replace_doc_chunks("pr_eu_lyon", [])  # a write only the first store has
    target = str(tmp_path / "chunks.db.duckdb")
    ChunkStore._migrate(str(db), target)  # the late process: its store is discarded
    assert sorted(p.name for p in tmp_path.iterdir()) == ["chunks.db", "chunks.db.duckdb"]
    with ChunkStore(db) as store:
        assert store.iter_chunks(doc_id="pr_eu_lyon") == []


def test_a_changed_sqlite_file_is_re_read_and_keeps_what_it_lost(tmp_path, caplog):
    """Re-read on change (issue 46; rows added later: tests/test_spec_deviations.py); rows
    deleted from the file are not deleted from the store (it never deletes rows)."""
    db = tmp_path / "chunks.db"
    write_sqlite(db, NEW_DDL, [r for r, _ in spec_rows()])
    ChunkStore(db).close()
    con = sqlite3.connect(db)
    con.execute("DELETE FROM narrative_chunk")
    con.commit()
    con.close()
    with caplog.at_level("WARNING"), ChunkStore(db) as store:
        assert store.iter_chunks()  # the migrated rows, not the emptied file
    assert any("changed after it was migrated" in r.getMessage() for r in caplog.records)


def bad_row(**change):
    row = dict(spec_rows()[0][0])
    row.update(change)
    return row


@pytest.mark.parametrize(("ddl", "rows", "message"), [
    ("CREATE TABLE other (x TEXT)", [], "without a narrative_chunk table"),
    (NEW_DDL.replace("sensitivity TEXT,", ""), [bad_row()], "lacks sensitivity"),
    (NEW_DDL, [bad_row(source_locator="{not json")], "source_locator must be JSON"),
    (NEW_DDL, [bad_row(parent_locator='{"start": 1}')], "parent_locator must be JSON"),
    (NEW_DDL, [bad_row(active=2)], "active must be 0 or 1"),
    (NEW_DDL, [bad_row(ingested_at="yesterday")], "ingested_at must be ISO-8601"),
    (NEW_DDL, [bad_row(version="v2")], "version must be an integer"),
    (NEW_DDL, [bad_row(doc_id="")], "doc_id is empty"),
])
def test_an_unmigratable_file_is_one_clear_error_and_leaves_nothing(tmp_path, ddl, rows, message):
    db = tmp_path / "chunks.db"
    write_sqlite(db, ddl, rows)
    with pytest.raises(SqliteMigrationError, match=message) as err:
        ChunkStore(db)
    assert str(db) in str(err.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["chunks.db"]
