"""RAPTOR trees (engine): deterministic clustering, extractive syntheses with member
lineage, retrieval modes, reuse on a small refresh, and the RESTRICTED property."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ragspine_pipeline.ingest.documents import Document
from ragspine_pipeline.retrieval.chunking.chunking import chunk_document
from ragspine_pipeline.retrieval.raptor import (
    RaptorError,
    build_raptor_tree,
    make_raptor_retriever,
    raptor_enabled,
    raptor_settings,
)
from ragspine_pipeline.retrieval.vector.embedding_backends import DeterministicHashBackend

TOPICS = {
    "canteen": ["The canteen opens at eight and serves breakfast.", "The canteen serves lunch from noon.",
                "Canteen prices are subsidised for staff."],
    "revenue": ["Revenue grew four percent in Europe.", "Revenue in Asia grew six percent.",
                "Revenue growth was driven by services."],
    "travel": ["Travel by train is reimbursed in second class.", "Travel by air needs approval for long trips.",
               "Hotel travel costs are capped per city."],
}


def corpus(restricted: str = "") -> list:
    chunks = []
    for topic, sentences in TOPICS.items():
        for i, s in enumerate(sentences):
            chunks += chunk_document(s, doc_id=f"lib/{topic}{i}", title=topic.title(), metadata={"entity": "Acme"})
    if restricted:
        chunks += chunk_document(restricted, doc_id="lib/secret", title="Secret",
                                 metadata={"sensitivity": "RESTRICTED", "entity": "Acme"})
    return chunks


def test_tree_clusters_by_topic_with_synthesis_lineage():
    tree = build_raptor_tree(corpus(), threshold=0.2)
    level1 = tree.levels[1]
    syn = [n for n in level1 if n.is_synthesis]
    assert syn, tree.shape()
    for n in syn:
        topics = {m.split("#")[0].split("/")[1].rstrip("0123456789") for m in n.members}
        assert len(topics) == 1  # each cluster is one topic
        assert n.members == tuple(sorted(n.members)) and set(n.doc_ids) == {m.split("#")[0] for m in n.members}
        # Extractive: every sentence of the summary is a sentence of a member.
        member_text = " ".join(c.text for c in corpus() if c.chunk_id in n.members)
        assert all(part in member_text for part in n.text.split(". ") if part)
    shape = tree.shape()
    assert shape["leaves"] == 9 and shape["nodes_per_level"][0] == 9 and shape["levels"] >= 2


def test_tree_is_deterministic_and_reuses_unchanged_nodes():
    chunks = corpus()
    a, b = build_raptor_tree(chunks, threshold=0.2), build_raptor_tree(chunks, threshold=0.2)
    assert a.to_rows() == b.to_rows()
    changed = [c if c.doc_id != "lib/travel2" else c.with_(text="Hotel travel costs are capped per city night.")
               for c in chunks]
    c = build_raptor_tree(changed, threshold=0.2, previous=a)
    untouched = [n for n in a.synthesis_nodes() if not any(m.startswith("lib/travel") for m in n.members)]
    assert untouched and c.reused >= len(untouched)


def test_collapsed_tree_returns_syntheses_that_cite_their_members():
    chunks = corpus()
    r = make_raptor_retriever(chunks, mode="collapsed", threshold=0.2)
    snips = r.retrieve("canteen lunch breakfast", top_k=10)
    syn = [s for s in snips if s["is_synthesis"]]
    assert syn and all("doc_id" not in s and "source_locator" not in s for s in syn)
    by_id = {c.chunk_id: c for c in chunks}
    for s in syn:
        assert s["cites"] == [by_id[m].source_locator.to_dict() for m in s["members"]]
    leaves = make_raptor_retriever(chunks, mode="leaves", threshold=0.2).retrieve("canteen", top_k=5)
    assert leaves and not any(s["is_synthesis"] for s in leaves)
    internal = make_raptor_retriever(chunks, mode="internal", threshold=0.2).retrieve("revenue", top_k=5)
    assert internal and all(s["is_synthesis"] for s in internal)


def test_dense_backend_and_provider_summaries():
    calls = []

    class Provider:
        def chat(self, messages, **_):
            calls.append(messages[-1]["content"])
            return "A written summary."

    r = make_raptor_retriever(corpus(), mode="internal", threshold=0.2, provider=Provider(),
                              embedding_backend=DeterministicHashBackend(dim=64))
    assert calls and all(n.text == "A written summary." for n in r.tree.synthesis_nodes())


def test_settings_from_env(monkeypatch):
    monkeypatch.setenv("RAGSPINE_RAPTOR_MODE", "leaves")
    monkeypatch.setenv("RAGSPINE_RAPTOR_DEPTH", "2")
    monkeypatch.setenv("RAGSPINE_RAPTOR_THRESHOLD", "0.5")
    assert raptor_settings() == ("leaves", 2, 0.5)
    assert raptor_enabled() is False
    monkeypatch.setenv("RAGSPINE_RAPTOR", "on")
    assert raptor_enabled() is True
    monkeypatch.setenv("RAGSPINE_RAPTOR_MODE", "sideways")
    with pytest.raises(RaptorError):
        raptor_settings()
    with pytest.raises(RaptorError):
        build_raptor_tree(corpus(), threshold=0)


MARK = "zanzibarmerger"


@settings(max_examples=30, deadline=None)
@given(secret=st.lists(st.sampled_from(["canteen", "revenue", "travel", "lunch", "growth", MARK]), min_size=1,
                       max_size=12),
       threshold=st.floats(0.05, 0.9), dense=st.booleans())
def test_restricted_chunks_never_contribute_to_any_node(secret, threshold, dense):
    text = " ".join([*secret, MARK]) + "."
    seen: list[str] = []

    class Spy(DeterministicHashBackend):
        def embed_texts(self, texts):
            seen.extend(texts)
            return super().embed_texts(texts)

    def summarizer(texts):
        seen.extend(texts)
        return " ".join(t[:30] for t in texts)

    chunks = corpus(restricted=text)
    tree = build_raptor_tree(chunks, threshold=threshold, embedding_backend=Spy(dim=32) if dense else None,
                             summarizer=summarizer)
    for n in tree.nodes:
        assert MARK not in n.text and not any(m.startswith("lib/secret") for m in n.members)
        assert "lib/secret" not in n.doc_ids and n.sensitivity != "RESTRICTED"
    assert not any(MARK in t for t in seen)  # nothing of it reached the model or the summarizer
    r = make_raptor_retriever(chunks, mode="collapsed", threshold=threshold)
    assert all(MARK not in s["text"] for s in r.retrieve(f"{MARK} canteen", top_k=20))


def test_a_library_of_restricted_chunks_only_has_nothing_to_search():
    only = chunk_document("secret text", doc_id="lib/s", metadata={"sensitivity": "RESTRICTED"})
    assert build_raptor_tree(only).note == "no open chunks"
    with pytest.raises(RaptorError):
        make_raptor_retriever(only)


def test_documents_chunked_with_layout_build_a_tree():
    from ragspine_pipeline.corpus import make_chunker

    d = Document("lib/law", "Law", "第一条 员工每年享有带薪年假。\n\n第二条 员工年假不得跨年使用。\n\n第三条 加班应当支付加班费。", {})
    chunks = make_chunker("laws")(d)
    tree = build_raptor_tree(chunks, threshold=0.1)
    assert tree.shape()["leaves"] == 3


def test_rebuild_asks_the_summarizer_only_for_changed_clusters():
    calls: list[tuple[str, ...]] = []

    def summarizer(texts):
        calls.append(tuple(texts))
        return " / ".join(t[:20] for t in texts)

    chunks = corpus()
    first = build_raptor_tree(chunks, threshold=0.2, summarizer=summarizer)
    n_first = len(calls)
    assert n_first == len(first.synthesis_nodes()) > 1
    changed = [c if c.doc_id != "lib/travel2" else c.with_(text="Hotel travel costs are capped per city night.")
               for c in chunks]
    calls.clear()
    second = build_raptor_tree(changed, threshold=0.2, summarizer=summarizer, previous=first)
    assert second.reused == n_first - len(calls) and len(calls) < n_first
    assert all(any("travel" in t.lower() for t in texts) for texts in calls)  # only the travel cluster



def _mixed(seed: int, n: int = 200) -> list:
    """n short documents over overlapping vocabularies: clusters whose from-scratch
    leader clustering is sensitive to the order and weights of everything before."""
    import random

    rng = random.Random(seed)
    out = []
    for i in range(n):
        t = rng.randrange(10)
        words = [f"w{(t * 6 + rng.randrange(14)) % 80}" for _ in range(8)]
        out += chunk_document(" ".join(words) + ".", doc_id=f"lib/d{i:03d}", title="T")
    return out


def _refresh(seed: int, threshold: float, rebuild: bool):
    chunks = _mixed(seed)
    first = build_raptor_tree(chunks, threshold=threshold)
    changed, removed, edited = set(), set(), []
    for i, c in enumerate(chunks):
        if i in (5, 105):  # 2 of 200 chunks: 1%
            removed.add(c.chunk_id)
            c = c.with_(text=c.text[:-1] + " w3 w77.", chunk_id=c.chunk_id + "-v2")
            changed.add(c.chunk_id)
        edited.append(c)
    second = build_raptor_tree(edited, threshold=threshold, previous=first, rebuild=rebuild)
    old_keys = {n.key for n in first.nodes}
    rebuilt = [n for n in second.synthesis_nodes() if n.key not in old_keys]
    left = [set(p.members) for p in first.synthesis_nodes() if set(p.members) & removed]
    # A node may be rebuilt only on a changed chunk's path: it holds the new chunk, or it
    # is what remains of a cluster the old chunk left.
    off_path = [n for n in rebuilt if not set(n.members) & changed and not any(set(n.members) <= m for m in left)]
    return first, second, rebuilt, off_path


@pytest.mark.parametrize("seed,threshold", [(7, 0.35), (7, 0.5), (8, 0.35), (8, 0.4), (9, 0.4)])
def test_a_one_percent_refresh_rebuilds_only_the_subtrees_of_changed_chunks(seed, threshold):
    first, second, rebuilt, off_path = _refresh(seed, threshold, rebuild=False)
    assert len(first.synthesis_nodes()) >= 20
    assert not off_path, [n.members for n in off_path]
    assert second.reused == len(second.synthesis_nodes()) - len(rebuilt)  # the rest: same key, same summary
    assert len(rebuilt) <= 2 * 2 * second.shape()["levels"]  # left + joined, per changed chunk and level


def test_clustering_from_scratch_would_rebuild_unaffected_subtrees():
    """Why the refresh keeps the previous clusters: from scratch, two changed chunks move others."""
    _, again, _, off_path = _refresh(8, 0.35, rebuild=True)
    assert off_path and again.reused > 0  # summaries are still reused by key where clusters match


@pytest.mark.parametrize("how", ["restricted", "withdrawn"])
def test_a_document_leaving_the_open_set_leaves_no_trace_in_the_refreshed_tree(how):
    """Non-interference: incremental seeds are previous clusters, shaped by every member. When
    a document becomes RESTRICTED (still passed in, labelled) or is withdrawn (gone), the
    refreshed tree equals a tree built as if it had never existed."""
    chunks = _mixed(7)
    first = build_raptor_tree(chunks, threshold=0.35)
    target = chunks[5].doc_id
    rest = [c for c in chunks if c.doc_id != target]
    given = rest if how == "withdrawn" else [c.with_(sensitivity="RESTRICTED") if c.doc_id == target else c
                                             for c in chunks]
    refreshed = build_raptor_tree(given, threshold=0.35, previous=first)
    fresh = build_raptor_tree(rest, threshold=0.35)
    shape = [[(n.key, n.members) for n in level] for level in fresh.levels]
    assert [[(n.key, n.members) for n in level] for level in refreshed.levels] == shape
    assert all(target not in n.doc_ids for n in refreshed.nodes)
