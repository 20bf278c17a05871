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
import sys

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


# ---------------------------------------------------------------- 4. fan-out ceilings
class CountingBase:
    """A base retriever that counts its searches and finds one snippet per question."""

    retry_without_filters = False

    def __init__(self) -> None:
        self.searches: list[str] = []

    def retrieve(self, query, *, filters=None, top_k=50):
        self.searches.append(query)
        return [{"chunk_id": f"c{len(self.searches)}", "library_id": "", "text": query, "sensitivity": "INTERNAL"}]


class Flood:
    """An injected decomposer and transform that ask for far more than any ceiling."""

    name = "flood"

    def decompose(self, query):
        return [f"{query} part {i}" for i in range(1000)]

    def variants(self, query):
        from ragspine_pipeline.retrieval.query.transforms import Variant

        return [Variant("original", query), *(Variant("paraphrase", f"{query} v{i}") for i in range(100))]


class Chat:
    def chat(self, *args, **kwargs):  # never called: the ceiling is checked first
        raise AssertionError("no LLM call expected")


@pytest.mark.parametrize("value", ["llm:1000", "llm:9", "llm:0", "llm:x"])
def test_decomposition_past_its_ceiling_is_one_settings_error(monkeypatch, value):
    from ragspine_pipeline.retrieval.query import make_query_layers

    monkeypatch.setenv("RAGSPINE_QUERY_DECOMPOSE", value)
    with pytest.raises(SettingsError) as err:  # before: llm:1000 ran 301 searches
        make_query_layers(CountingBase(), provider=Chat())
    assert err.value.name == "RAGSPINE_QUERY_DECOMPOSE" and "from 1 to 8" in str(err.value)
    with pytest.raises(SettingsError):
        make_query_layers(CountingBase(), decompose=value, provider=Chat())


def test_every_layer_constructor_has_a_ceiling():
    from ragspine_pipeline.retrieval.lexical.analysis.glossary import (
        MAX_QUERIES,
        GlossaryQueryRewriter,
    )
    from ragspine_pipeline.retrieval.query import LLMDecomposer, RAGFusion
    from ragspine_pipeline.retrieval.query.decompose import MAX_SUBQUESTIONS
    from ragspine_pipeline.retrieval.query.transforms import MAX_VARIANTS

    LLMDecomposer(Chat(), max_subquestions=MAX_SUBQUESTIONS)
    with pytest.raises(ValueError, match="from 1 to 8"):
        LLMDecomposer(Chat(), max_subquestions=MAX_SUBQUESTIONS + 1)
    RAGFusion(rewriter=GlossaryQueryRewriter(), max_variants=MAX_VARIANTS)
    with pytest.raises(ValueError, match="from 1 to"):
        RAGFusion(rewriter=GlossaryQueryRewriter(), max_variants=MAX_VARIANTS + 1)
    GlossaryQueryRewriter(max_queries=MAX_QUERIES)
    with pytest.raises(ValueError, match="from 1 to"):
        GlossaryQueryRewriter(max_queries=MAX_QUERIES + 1)


def test_injected_layers_cannot_fan_out_past_the_search_ceiling():
    from ragspine_pipeline.retrieval.query import LayeredRetriever
    from ragspine_pipeline.retrieval.query.decompose import MAX_SUBQUESTIONS
    from ragspine_pipeline.retrieval.query.pipeline import MAX_SEARCHES
    from ragspine_pipeline.retrieval.query.transforms import MAX_VARIANTS

    base = CountingBase()
    out = LayeredRetriever(base, decomposer=Flood()).retrieve("why", top_k=5)
    assert len(base.searches) == 1 + MAX_SUBQUESTIONS  # the question and 8 of 1000 sub-questions
    assert out.report["sub_questions"] == [f"why part {i}" for i in range(MAX_SUBQUESTIONS)]
    assert any("MAX_SUBQUESTIONS" in d["reason"] for d in out.report["degraded"])

    base = CountingBase()
    out = LayeredRetriever(base, transform=Flood()).retrieve("why", top_k=5)
    assert len(base.searches) == 1 + MAX_VARIANTS
    assert any("MAX_VARIANTS" in d["reason"] for d in out.report["degraded"])

    base = CountingBase()
    out = LayeredRetriever(base, decomposer=Flood(), transform=Flood()).retrieve("why", top_k=5)
    assert len(base.searches) == MAX_SEARCHES == len(out.report["variants"])  # 9 legs x 9 variants, cut at 64
    assert [d["layer"] for d in out.report["degraded"]].count("fan_out") == 1
    assert out  # what was found before the ceiling is still answered


# ---------------------------------------------------------------- 5. the spec-names page
def _tool():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "tools" / "gen_spec_names.py"
    spec = importlib.util.spec_from_file_location("gen_spec_names", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, mod)  # its dataclass looks its module up there
    spec.loader.exec_module(mod)
    return sys.modules[spec.name]


def _page_rows(tool):
    import re

    text = tool.TARGET.read_text(encoding="utf-8")
    return [(name, kind, where.strip().strip("`"))
            for name, kind, where in re.findall(r"^\| `([\w.*]+)` \| ([^|]+?) \| ([^|]*)\|", text, flags=re.M)]


def test_every_name_on_the_spec_names_page_imports():
    import importlib

    from ragspine_pipeline.settings import REGISTRY

    tool = _tool()
    rows = _page_rows(tool)
    assert len(rows) > 60
    for name, kind, where in rows:
        if name.startswith("RAGSPINE_"):
            assert name in REGISTRY, name
        elif kind == "method":
            module, _, cls = where.rpartition(".")
            assert hasattr(getattr(importlib.import_module(module), cls), name.rpartition(".")[2]), name
        elif kind in ("class", "protocol", "function", "constant"):
            assert hasattr(importlib.import_module(where), name), name
        else:
            assert name in tool.OUTSIDE, name


def test_every_spec_name_is_on_the_page():
    tool = _tool()
    spec = tool.find_spec()
    if spec is None:
        pytest.skip("the spec text is not beside this checkout (../shared/spec)")
    on_page = {name for name, _, _ in _page_rows(tool)}
    for name in tool.spec_names(spec.read_text(encoding="utf-8")):
        if name.endswith("*"):  # a family (RAGSPINE_RAPTOR*): at least one of it
            assert any(n.startswith(name.rstrip("*")) for n in on_page), name
        else:
            assert name in on_page or any(n.endswith(f".{name}") for n in on_page), name
    assert tool.main(["--check", "--spec", str(spec)]) == 0, "docs/spec-names.md is stale"
