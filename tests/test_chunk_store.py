import duckdb
import pytest

from ragspine_pipeline.retrieval.chunking.chunk_store import ChunkStore, ReadOnlyQueryError
from ragspine_pipeline.retrieval.chunking.chunking import Chunk, SourceLocator, chunk_document


def chunks(text, doc="d1", **md):
    return chunk_document(text, doc_id=doc, title="T", metadata=md)


@pytest.fixture
def store(tmp_path):
    s = ChunkStore(tmp_path / "c.duckdb")
    yield s
    s.close()


def test_versions_idempotence_and_withdrawal(store):
    assert store.replace_doc_chunks("d1", chunks("alpha.\n\nbeta.", entity="A")) == 1
    assert store.replace_doc_chunks("d1", chunks("alpha.\n\nbeta.", entity="A")) == 0  # no new version
    assert [c.version for c in store.iter_chunks()] == [1]
    assert store.replace_doc_chunks("d1", chunks("gamma.", entity="A")) == 1
    active = list(store.iter_chunks())
    assert [(c.text, c.version, c.active) for c in active] == [("gamma.", 2, True)]
    every = list(store.iter_chunks(include_inactive=True))
    assert sorted((c.version, c.active) for c in every) == [(1, False), (2, True)]
    assert store.replace_doc_chunks("d1", []) == 0
    assert list(store.iter_chunks()) == []
    assert [v["withdrawn"] for v in store.doc_versions("d1")] == [False, False, True]
    # Re-adding after a withdrawal continues the version sequence.
    store.replace_doc_chunks("d1", chunks("alpha.\n\nbeta."))
    assert [c.version for c in store.iter_chunks()] == [4]


def test_point_in_time_reads(store):
    store.replace_doc_chunks("d1", chunks("first version."))
    t1 = store.iter_chunks()[0].ingested_at
    store.replace_doc_chunks("d2", chunks("other doc.", doc="d2"))
    store.replace_doc_chunks("d1", chunks("second version."))
    t3 = max(c.ingested_at for c in store.iter_chunks())
    store.replace_doc_chunks("d1", [])
    assert [c.text for c in store.iter_chunks(as_of=t1)] == ["first version."]
    assert sorted(c.text for c in store.iter_chunks(as_of=t3)) == ["other doc.", "second version."]
    assert [c.text for c in store.iter_chunks()] == ["other doc."]
    assert [c.text for c in store.iter_chunks(as_of=t1.isoformat())] == ["first version."]


def test_iter_chunks_and_combines_filters(store):
    store.replace_doc_chunks("a", chunks("x1.", doc="a", entity="E1", period="2023", language="en"))
    store.replace_doc_chunks("b", chunks("x2.", doc="b", entity="E1", period="2024", language="en"))
    store.replace_doc_chunks("c", chunks("x3.", doc="c", entity="E2", period="2023", language="zh"))
    assert [c.doc_id for c in store.iter_chunks(entity="E1")] == ["a", "b"]
    assert [c.doc_id for c in store.iter_chunks(entity="E1", period="2023")] == ["a"]
    assert [c.doc_id for c in store.iter_chunks(language="zh", topic="")] == ["c"]
    assert [c.doc_id for c in store.iter_chunks(language="zh", topic="risk")] == []
    assert [c.doc_id for c in store.iter_chunks(doc_id="c")] == ["c"]
    # Filter values are bound parameters, never SQL text.
    assert list(store.iter_chunks(entity="E1' OR '1'='1")) == []


def test_execute_read_is_read_only(store):
    store.replace_doc_chunks("a", chunks("text.", doc="a"))
    assert store.execute_read("SELECT count(*) FROM chunks WHERE doc_id = ?", ["a"]) == [(1,)]
    for sql in ("DELETE FROM chunks", "UPDATE chunks SET text = 'x'", "DROP TABLE chunks",
                "INSERT INTO chunks (chunk_id, doc_id) VALUES ('x', 'y')",
                "SELECT 1; DELETE FROM chunks", "CREATE TABLE t AS SELECT 1",
                "COPY chunks TO '/tmp/x.csv'", "ATTACH ':memory:' AS m"):
        with pytest.raises(ReadOnlyQueryError):
            store.execute_read(sql)
    assert store.execute_read("SELECT count(*), min(text) FROM chunks") == [(1, "text.")]


def test_batch_rolls_back_whole_on_error(store):
    store.replace_doc_chunks("a", chunks("keep me.", doc="a"))
    bad = chunks("other.", doc="b")
    with pytest.raises(ValueError):
        store.replace_many([("a", chunks("changed.", doc="a")), ("b", bad + bad)])
    assert [c.text for c in store.iter_chunks()] == ["keep me."]


def test_wrong_doc_id_rejected(store):
    with pytest.raises(ValueError, match="belongs to"):
        store.replace_doc_chunks("other", chunks("x."))


def test_init_schema_idempotent_and_migrates_old_schema(tmp_path):
    path = tmp_path / "old.duckdb"
    con = duckdb.connect(str(path))
    con.execute("CREATE TABLE chunks (chunk_id VARCHAR, doc_id VARCHAR, text VARCHAR, entity VARCHAR)")
    con.execute("INSERT INTO chunks VALUES ('d#0', 'd', 'old text', 'E')")
    con.close()
    with ChunkStore(path) as s:
        s.init_schema()
        s.init_schema()
        (c,) = list(s.iter_chunks())
        assert (c.text, c.entity, c.version, c.active, c.sensitivity) == ("old text", "E", 1, True, "INTERNAL")
        cols = {r[0] for r in s.execute_read(
            "SELECT column_name FROM information_schema.columns WHERE table_name = 'chunks'")}
        assert {"valid_as_of", "ingested_at", "version", "active", "superseded_at"} <= cols
        s.replace_doc_chunks("d", chunks("new text", doc="d"))
        assert [(x.text, x.version) for x in s.iter_chunks()] == [("new text", 2)]


def test_read_only_store_refuses_writes(tmp_path):
    path = tmp_path / "ro.duckdb"
    with ChunkStore(path) as s:
        s.replace_doc_chunks("a", chunks("x.", doc="a"))
    with ChunkStore(path, read_only=True) as ro:
        assert len(list(ro.iter_chunks())) == 1
        with pytest.raises(PermissionError):
            ro.replace_doc_chunks("a", [])


def test_ingest_classifies_rows_of_a_migrated_store_as_known(tmp_path):
    """A store from an older schema has chunk rows but no version records: re-ingesting
    its documents is a change (v2), not a new document."""
    from ragspine_pipeline.corpus import Document, ingest_documents

    path = tmp_path / "old.duckdb"
    con = duckdb.connect(str(path))
    con.execute("CREATE TABLE chunks (chunk_id VARCHAR, doc_id VARCHAR, text VARCHAR)")
    con.execute("INSERT INTO chunks VALUES ('lib/a#0', 'lib/a', 'old text')")
    con.close()
    with ChunkStore(path) as s:
        rep = ingest_documents(s, [Document("lib/a", "A", "new text", {})], scope_prefix="lib/")
        assert (rep.new, rep.changed) == ([], ["lib/a"])
        assert [c.version for c in s.iter_chunks()] == [2]


def test_make_chunker_validates_up_front():
    from ragspine_pipeline.corpus import make_chunker

    assert make_chunker("paragraph:320:40").key == "paragraph:320:40"
    for bad in ("paragraph:10:10", "paragraph:0", "paragraph:1:2:3", "paragraph:x", "sentence"):
        with pytest.raises(ValueError):
            make_chunker(bad)


def test_parent_locator_round_trips_with_the_document_id(store):
    """Defect 5: the row mapping put the parent chunk's id into ``parent_locator.doc_id``."""
    text = "Heading\n\nThe child sentence sits inside the parent section."
    loc = SourceLocator("lib/doc", 9, len(text), "/corpus/lib/doc.md")
    child = Chunk(chunk_id="lib/doc#1", doc_id="lib/doc", title="Doc", text=text[9:30],
                  source_locator=SourceLocator("lib/doc", 9, 30, "/corpus/lib/doc.md"),
                  parent_id="lib/doc#p0", heading="Heading", window_text=text[9:],
                  parent_locator=loc, chunker="parent_child")
    store.replace_doc_chunks("lib/doc", [child])
    (back,) = store.iter_chunks()
    assert back.parent_locator == loc and back.parent_locator.doc_id == "lib/doc"
    assert (back.parent_id, back.heading, back.window_text, back.chunker) == (
        "lib/doc#p0", "Heading", text[9:], "parent_child")


def test_iter_chunks_returns_a_list(store):
    store.replace_doc_chunks("a", chunks("one.", doc="a"))
    out = store.iter_chunks()
    assert type(out) is list and len(out) == 1 and out == store.iter_chunks()
