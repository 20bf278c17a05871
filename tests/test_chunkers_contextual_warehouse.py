"""Contextual headers in the warehouse: the lexical_index and embeddings steps index and
embed header + text when RAGSPINE_CONTEXTUAL (or their run config) is on; snippets and
citations stay the stored chunk's; off is exactly the chunk text (no manifest key)."""

from __future__ import annotations

import hashlib
import json

import pytest
from dagster_fixtures import demo_warehouse

from ragspine_pipeline.retrieval.chunking.contextual import contextual_header
from ragspine_pipeline.retrieval.lexical.analysis.analyzer import make_analyzer
from ragspine_pipeline.retrieval.link.narrative_link import NarrativeIndexRetriever
from ragspine_pipeline.retrieval.vector.embedding_backends import DeterministicHashBackend
from ragspine_pipeline.sensitivity import is_restricted
from ragspine_pipeline.warehouse import pipeline as P

LIB = "acme_reports"


class Spy(DeterministicHashBackend):
    """The "deterministic" backend (same model id), recording what it is asked to embed."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.seen: list[str] = []

    def embed_texts(self, texts):
        self.seen.extend(texts)
        return super().embed_texts(texts)


def _build(tmp_path, monkeypatch, contextual: str | None, *, env: str | None = None):
    if env is None:
        monkeypatch.delenv("RAGSPINE_CONTEXTUAL", raising=False)
    else:
        monkeypatch.setenv("RAGSPINE_CONTEXTUAL", env)
    demo = demo_warehouse(tmp_path, monkeypatch)
    side = demo.corpus / LIB / "ar2023_us_results.meta.json"  # a word only this title has
    meta = json.loads(side.read_text(encoding="utf-8"))
    side.write_text(json.dumps({**meta, "title": meta["title"] + " Zephyrquill"}), encoding="utf-8")
    wh = demo.tables()
    P.build_raw_documents(wh, demo.corpus, LIB)
    P.build_chunks(wh, LIB)
    lex = P.build_lexical_index(wh, LIB, contextual=contextual)
    spy = Spy()
    emb = P.build_embeddings(wh, LIB, spy, "deterministic", contextual=contextual)
    P.publish_snapshot(wh, LIB)
    return wh, lex, emb, spy


def _tokens(wh) -> dict[str, list[str]]:
    t = wh.read(P.LEXICAL, LIB, "tokens")
    return dict(zip(t.column("chunk_id").to_pylist(), t.column("tokens").to_pylist(), strict=True))


def test_off_is_the_chunk_text_exactly(tmp_path, monkeypatch):
    wh, lex, emb, spy = _build(tmp_path / "a", monkeypatch, None)
    an = make_analyzer(None)
    chunks = {c.chunk_id: c for c in P.active_chunks(wh, LIB)}
    # RESTRICTED chunks get no tokens: the lexical index is a published table.
    assert _tokens(wh) == {cid: an.analyze(c.text, c.language or None) for cid, c in chunks.items()
                           if not is_restricted(c.sensitivity)}
    assert sorted(spy.seen) == sorted(c.text for c in chunks.values() if not is_restricted(c.sensitivity))
    for pub in (lex.published, emb.published, wh.latest(P.SNAPSHOT, LIB)):
        assert "contextual" not in pub.manifest["metadata"]
    # An explicit "off" is the same index, the same snapshot and the same snippets.
    wh2, *_ = _build(tmp_path / "b", monkeypatch, "off")
    assert _tokens(wh2) == _tokens(wh)
    q = "why did revenue fall in China"
    a = NarrativeIndexRetriever(P.load_snapshot_index(wh, LIB)).retrieve(q, top_k=5)
    b = NarrativeIndexRetriever(P.load_snapshot_index(wh2, LIB)).retrieve(q, top_k=5)
    def key(snips):  # everything but the build times of the two warehouses
        return [(s["chunk_id"], s["text"], s["source_locator"]["start"], s["source_locator"]["end"], s["scores"])
                for s in snips]

    assert key(a) == key(b) and a


@pytest.mark.parametrize("how", ["argument", "environment"])
def test_on_the_header_reaches_bm25_and_the_embeddings_not_the_snippets(tmp_path, monkeypatch, how):
    wh, lex, emb, spy = _build(tmp_path, monkeypatch, "on" if how == "argument" else None,
                               env="on" if how == "environment" else None)
    fields = "title,entity,period,heading"
    assert lex.metadata["contextual"] == fields and emb.published.manifest["metadata"]["contextual"] == fields
    assert wh.latest(P.SNAPSHOT, LIB).manifest["metadata"]["contextual"] == fields
    an = make_analyzer(None)
    chunks = {c.chunk_id: c for c in P.active_chunks(wh, LIB)}
    expect = {cid: f"{contextual_header(c)}\n\n{c.text}" if contextual_header(c) else c.text
              for cid, c in chunks.items()}
    open_ids = sorted(cid for cid, c in chunks.items() if not is_restricted(c.sensitivity))
    assert _tokens(wh) == {cid: an.analyze(expect[cid], chunks[cid].language or None) for cid in open_ids}
    assert sorted(spy.seen) == sorted(expect[cid] for cid in open_ids)  # RESTRICTED never embedded
    vt = wh.read(P.EMBEDDINGS, LIB, "vectors")
    hashes = dict(zip(vt.column("chunk_id").to_pylist(), vt.column("text_hash").to_pylist(), strict=True))
    assert hashes == {cid: hashlib.sha1(expect[cid].encode()).hexdigest() for cid in open_ids}
    # A word only the header has finds the chunk; its snippet is the stored text and span.
    word = "zephyrquill"
    assert not any(word in c.text.lower() for c in chunks.values())
    ids = {cid for cid in open_ids if chunks[cid].doc_id.endswith("ar2023_us_results")}
    retriever = NarrativeIndexRetriever(P.load_snapshot_index(wh, LIB, channels=("bm25",)))
    hits = retriever.retrieve(word, top_k=50)
    assert ids and {s["chunk_id"] for s in hits} == ids
    for s in hits:
        c = chunks[s["chunk_id"]]
        assert s["text"] == c.text and s["source_locator"] == c.source_locator.to_dict()


def test_turning_it_on_reindexes_every_chunk_once(tmp_path, monkeypatch):
    wh, lex, _, _ = _build(tmp_path, monkeypatch, "off")
    n = lex.metadata["chunks_indexed"]
    on = P.build_lexical_index(wh, LIB, contextual="title")
    assert on.metadata["chunks_analyzed"] == n and on.metadata["contextual"] == "title"
    assert P.build_lexical_index(wh, LIB, contextual="title").metadata["reused"] is True
    spy = Spy()
    assert P.build_embeddings(wh, LIB, spy, "deterministic", contextual="title").metadata["embedded"] > 0
    chunks = [c for c in P.active_chunks(wh, LIB) if not is_restricted(c.sensitivity)]
    assert sorted(spy.seen) == sorted(f"{' '.join(c.title.split())}\n\n{c.text}" for c in chunks)
    with pytest.raises(ValueError, match="RAGSPINE_CONTEXTUAL"):
        P.build_lexical_index(wh, LIB, contextual="title,nonsense")


def test_a_title_change_reindexes_the_header_of_unchanged_chunk_ids(tmp_path, monkeypatch):
    wh, _, _, _ = _build(tmp_path, monkeypatch, "on")
    corpus = tmp_path / "corpus"
    side = corpus / LIB / "ar2023_us_results.meta.json"
    meta = json.loads(side.read_text(encoding="utf-8"))
    side.write_text(json.dumps({**meta, "title": meta["title"].replace("Zephyrquill", "Quetzalmoor")}),
                    encoding="utf-8")
    before = {c.chunk_id for c in P.active_chunks(wh, LIB) if c.doc_id.endswith("ar2023_us_results")}
    P.build_raw_documents(wh, corpus, LIB)
    P.build_chunks(wh, LIB)
    lex = P.build_lexical_index(wh, LIB, contextual="on")
    spy = Spy()
    emb = P.build_embeddings(wh, LIB, spy, "deterministic", contextual="on")
    P.publish_snapshot(wh, LIB)
    after = {c.chunk_id for c in P.active_chunks(wh, LIB) if c.doc_id.endswith("ar2023_us_results")}
    assert after == before  # same text, same ids: only the header changed
    assert lex.metadata["chunks_analyzed"] == len(after) and emb.metadata["embedded"] == len(after)
    assert all("Quetzalmoor" in t for t in spy.seen)
    retriever = NarrativeIndexRetriever(P.load_snapshot_index(wh, LIB, channels=("bm25",)))
    assert {s["chunk_id"] for s in retriever.retrieve("quetzalmoor", top_k=50)} == after
    assert not retriever.retrieve("zephyrquill", top_k=50)
    dense = NarrativeIndexRetriever(P.load_snapshot_index(wh, LIB))  # the snapshot's vectors load aligned
    assert dense.retrieve("Quetzalmoor results", top_k=3)
