"""The spec deviations the audit of issue 46 found, each pinned by a test that failed before.

1. ``build_narrative_retriever`` (the spec's CLI/service wiring entry) honours and validates
   ``RAGSPINE_RETRIEVAL_MODE`` and ``RAGSPINE_EMBEDDING_BACKEND`` / ``RAGSPINE_EMBEDDING``.
2. A backend without ``model_id`` is asked to embed once per search, not twice.
3. The SQLite chunk store (the spec's migration path) is re-read when the file changes.
4. Every query layer's fan-out has a documented ceiling (``RAGSPINE_QUERY_DECOMPOSE=llm:1000``).
"""

from __future__ import annotations

import os
import sqlite3

import pytest

from ragspine_pipeline.retrieval.chunking.chunk_store import ChunkStore
from ragspine_pipeline.retrieval.chunking.chunking import chunk_document
from ragspine_pipeline.retrieval.link.narrative_link import build_narrative_retriever
from ragspine_pipeline.settings import SettingsError

DOCS = {"cn": "ACME China revenue fell in 2023 because of the price war.",
        "eu": "The Lyon plant closes in 2024: energy costs doubled."}
ENV = ("RAGSPINE_RETRIEVAL_MODE", "RAGSPINE_EMBEDDING_BACKEND", "RAGSPINE_EMBEDDING")


class CountingBackend:
    """A fake embedding backend with no ``model_id``: counts every ``embed_texts`` call."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def embed_texts(self, texts: list[str]) -> list[list[float]]:
        self.calls.append(list(texts))
        return [[float(len(t) % 7) + 1.0, float(sum(map(ord, t)) % 11) + 1.0, 1.0] for t in texts]


@pytest.fixture
def chunk_db(tmp_path, monkeypatch):
    for name in ENV:
        monkeypatch.delenv(name, raising=False)
    path = tmp_path / "chunks.db"
    with ChunkStore(path) as store:
        store.init_schema()
        for doc_id, text in DOCS.items():
            store.replace_doc_chunks(doc_id, chunk_document(text, doc_id=doc_id, title=doc_id))
    return path


def _channels(retriever) -> tuple[str, ...]:
    return tuple(retriever.index.retriever.channels)


# ---------------------------------------------------------------- 1. env wiring
@pytest.mark.parametrize("name", ENV)
def test_wiring_entry_rejects_a_bad_value_with_one_settings_error(chunk_db, monkeypatch, name):
    monkeypatch.setenv(name, "bogus")
    with pytest.raises(SettingsError) as err:
        build_narrative_retriever(chunk_db)
    assert err.value.name == name and err.value.value == "bogus"


def test_wiring_entry_rejects_disagreeing_embedding_names(chunk_db, monkeypatch):
    monkeypatch.setenv("RAGSPINE_EMBEDDING_BACKEND", "deterministic")
    monkeypatch.setenv("RAGSPINE_EMBEDDING", "none")
    with pytest.raises(SettingsError):
        build_narrative_retriever(chunk_db)


@pytest.mark.parametrize("name", ["RAGSPINE_EMBEDDING_BACKEND", "RAGSPINE_EMBEDDING"])
def test_wiring_entry_builds_the_backend_the_variable_names(chunk_db, monkeypatch, name):
    retriever, store = build_narrative_retriever(chunk_db)
    store.close()
    assert retriever.index.retriever.embedding_backend is None  # unset: the spec's pure BM25 default
    monkeypatch.setenv(name, "deterministic")
    retriever, store = build_narrative_retriever(chunk_db)
    store.close()
    assert retriever.index.retriever.embedding_backend is not None
    assert _channels(retriever) == ("bm25", "dense")
    assert retriever.retrieve("China revenue", top_k=2)[0]["doc_id"] == "cn"


def test_wiring_entry_honours_the_retrieval_mode(chunk_db, monkeypatch):
    monkeypatch.setenv("RAGSPINE_EMBEDDING_BACKEND", "deterministic")
    monkeypatch.setenv("RAGSPINE_RETRIEVAL_MODE", "bm25")
    injected = CountingBackend()
    retriever, store = build_narrative_retriever(chunk_db, embedding_backend=injected)
    store.close()
    assert retriever.index.retriever.embedding_backend is None and _channels(retriever) == ("bm25",)
    retriever.retrieve("China revenue", top_k=2)
    assert injected.calls == []  # a lexical preset never embeds
    monkeypatch.setenv("RAGSPINE_RETRIEVAL_MODE", "vector")
    retriever, store = build_narrative_retriever(chunk_db)
    store.close()
    assert _channels(retriever) == ("dense",)
    monkeypatch.setenv("RAGSPINE_EMBEDDING_BACKEND", "none")
    monkeypatch.setenv("RAGSPINE_RETRIEVAL_MODE", "hybrid")
    with pytest.raises(SettingsError):  # hybrid with no backend is an error, never BM25 in disguise
        build_narrative_retriever(chunk_db)


# ---------------------------------------------------------------- 2. one embedding call per search
def test_a_backend_without_model_id_is_asked_once_per_search(chunk_db):
    backend = CountingBackend()
    assert not hasattr(backend, "model_id")
    retriever, store = build_narrative_retriever(chunk_db, embedding_backend=backend, glossary=False)
    store.close()
    retriever.retrieve("warm up", top_k=2)  # embeds the chunks (lazily) and identifies the model once
    backend.calls.clear()
    queries = ["China revenue", "Lyon plant", "energy costs"]
    for q in queries:
        assert retriever.retrieve(q, top_k=2)
    assert backend.calls == [[q] for q in queries]  # before: 6 calls (a model-id probe per search)


# ---------------------------------------------------------------- 3. the SQLite store re-read
def test_rows_added_to_the_sqlite_file_later_are_seen(tmp_path):
    from tests.test_chunk_store_sqlite import NEW_DDL, spec_rows, write_sqlite

    rows = [r for r, _ in spec_rows()]
    first, later = rows[:1], rows[1:]
    assert later, "the fixture needs rows for a second document"
    db = tmp_path / "chunks.db"
    write_sqlite(db, NEW_DDL, first)
    with ChunkStore(db) as store:  # migrated: the first rows
        seen = {c.chunk_id for c in store.iter_chunks(include_inactive=True)}
        assert seen == {r["chunk_id"] for r in first}
        con = sqlite3.connect(db)  # rows added to the file while the store is open
        cols = [r[1] for r in con.execute("PRAGMA table_info(narrative_chunk)")]
        con.executemany(f"INSERT INTO narrative_chunk ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})",
                        [[r[c] for c in cols] for r in later])
        con.commit()
        con.close()
        os.utime(db, ns=(1_600_000_000_000_000_000, 1_600_000_000_000_000_000))  # same mtime: the header counts
        seen = {c.chunk_id for c in store.iter_chunks(include_inactive=True)}
        assert seen == {r["chunk_id"] for r in rows}  # before: the first rows only, for ever
    with ChunkStore(db, read_only=True) as ro:  # a later open reads the re-read store
        assert {c.chunk_id for c in ro.iter_chunks(include_inactive=True)} == {r["chunk_id"] for r in rows}


def test_a_re_read_keeps_a_newer_version_written_through_the_store(tmp_path):
    from tests.test_chunk_store_sqlite import NEW_DDL, spec_rows, write_sqlite

    rows = [r for r, _ in spec_rows()]
    db = tmp_path / "chunks.db"
    write_sqlite(db, NEW_DDL, rows)
    doc = rows[-1]["doc_id"]
    with ChunkStore(db) as store:
        store.replace_doc_chunks(doc, [])  # withdrawn through the store after the migration
        con = sqlite3.connect(db)
        con.execute("UPDATE narrative_chunk SET title = 'touched'")
        con.commit()
        con.close()
        assert store.iter_chunks(doc_id=doc) == []  # the store's newer version stands
        assert {c.title for c in store.iter_chunks()} == {"touched"}  # the file's own documents re-read
