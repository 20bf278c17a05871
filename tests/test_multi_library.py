"""Several libraries as one answer (issue 43): one ranking over the union, the router's
fallback before any relaxation, duplicates collapsed across libraries."""

import random

import pytest

from ragspine_pipeline.retrieval.chunking.chunking import chunk_document
from ragspine_pipeline.retrieval.link.global_rank import rank_union
from ragspine_pipeline.retrieval.link.multi_index import MultiIndexRetriever
from ragspine_pipeline.retrieval.link.narrative_link import NarrativeIndex, NarrativeIndexRetriever
from ragspine_pipeline.retrieval.vector.embedding_backends import DeterministicHashBackend
from ragspine_pipeline.settings import SettingsError

WORDS = [f"w{i}" for i in range(60)]


def corpus(n=120, seed=7):
    rnd = random.Random(seed)
    return [(f"d{i:03d}", " ".join(rnd.choice(WORDS[: 10 + i % 50]) for _ in range(rnd.randint(5, 40))))
            for i in range(n)]


def index(docs, name, backend=None, **meta):
    chunks = []
    for doc_id, text in docs:
        chunks += chunk_document(text, doc_id=doc_id, metadata={"sensitivity": "PUBLIC", **meta})
    return NarrativeIndex.from_chunks(chunks, library_id=name, embedding_backend=backend,
                                      channels=("bm25", "dense") if backend else ("bm25",))


def split(docs, parts, backend=None):
    return {f"lib{k}": NarrativeIndexRetriever(index([d for i, d in enumerate(docs) if i % parts == k], f"lib{k}",
                                                     backend)) for k in range(parts)}


def fused_falls(out):
    return all(a["scores"]["fused"] >= b["scores"]["fused"] for a, b in zip(out, out[1:], strict=False))


@pytest.mark.parametrize("dense", [False, True])
def test_global_split_ranks_as_one_library(dense):
    docs = corpus()
    be = DeterministicHashBackend(dim=32) if dense else None
    one = NarrativeIndexRetriever(index(docs, "one", be))
    for parts in (2, 3):
        multi = MultiIndexRetriever(split(docs, parts, be), fusion="global")
        for q in ("w3 w17", "w1 w2 w40", "w55", "w9 w9 w33 w12"):
            ref = one.retrieve(q, top_k=10)
            out = multi.retrieve(q, top_k=10)
            assert [s["doc_id"] for s in out] == [s["doc_id"] for s in ref], (parts, q)
            for a, b in zip(out, ref, strict=True):
                assert a["scores"]["bm25"] == pytest.approx(b["scores"]["bm25"], rel=1e-9)
                if dense:
                    assert a["scores"]["vector"] == pytest.approx(b["scores"]["vector"], abs=1e-6)  # raw cosine
            assert [s["rank"] for s in out] == list(range(1, len(out) + 1)) and fused_falls(out)
            assert multi.last["fusion"] == "global"


def test_unrelated_library_no_longer_takes_rank_two_and_rrf_stays_selectable(monkeypatch):
    tools = [(f"t{i}", f"the grep tool searches files for a pattern, option {i} prints line numbers") for i in range(6)]
    licenses = [(f"l{i}", f"the licensee may copy the work; clause {i} of the license") for i in range(6)]
    libs = {"tools": NarrativeIndexRetriever(index(tools, "tools")),
            "licenses": NarrativeIndexRetriever(index(licenses, "licenses"))}
    q = "grep files for a pattern, license"
    monkeypatch.setenv("RAGSPINE_MULTI_FUSION", "rrf")
    rrf = MultiIndexRetriever(libs)
    assert rrf.fusion == "rrf"
    old = rrf.retrieve(q, top_k=5)
    assert old[1]["library_id"] == "licenses"  # the per-library rule: every library's best gets rank-1 credit
    assert fused_falls(old)  # fused is the score the answer is ranked by, in rrf too
    monkeypatch.delenv("RAGSPINE_MULTI_FUSION")
    new = MultiIndexRetriever(libs).retrieve(q, top_k=5)  # global is the default
    assert [s["library_id"] for s in new] == ["tools"] * 5 and fused_falls(new)
    monkeypatch.setenv("RAGSPINE_MULTI_FUSION", "zipper")
    with pytest.raises(SettingsError, match="RAGSPINE_MULTI_FUSION"):
        MultiIndexRetriever(libs)
    with pytest.raises(ValueError, match="unknown multi-library fusion"):
        MultiIndexRetriever(libs, fusion="zipper")


def test_libraries_with_different_models_fuse_dense_by_rank_per_model():
    docs = corpus(40)
    a = NarrativeIndex.from_chunks([c for d, t in docs[:20] for c in chunk_document(t, doc_id=d)],
                                   library_id="a", embedding_backend=DeterministicHashBackend(dim=16))
    b = NarrativeIndex.from_chunks([c for d, t in docs[20:] for c in chunk_document(t, doc_id=d)],
                                   library_id="b", embedding_backend=DeterministicHashBackend(dim=24))
    parts = {"a": a.retriever, "b": b.retriever}
    hits = rank_union(parts, "w3 w5", None, 10)
    assert hits and all(h.hit.fusion["dense"] == "rank_per_model" for h in hits)
    same = rank_union({"a": a.retriever, "b": a.retriever}, "w3 w5", None, 10)
    assert all(h.hit.fusion["dense"] == "raw_cosine" and h.hit.fusion["bm25_stats"] == "union" for h in same)
    out = MultiIndexRetriever({"a": NarrativeIndexRetriever(a), "b": NarrativeIndexRetriever(b)}).retrieve("w3 w5")
    assert {s["library_id"] for s in out} == {"a", "b"} and fused_falls(out)


# ------------------------------------------------------------------ router fallback
def three():
    reports = NarrativeIndexRetriever(NarrativeIndex.from_chunks(
        chunk_document("data protection report for the US entity", doc_id="reports/us",
                       metadata={"entity": "ACME_US", "topic": "results", "sensitivity": "PUBLIC"})
        + chunk_document("data protection report for the CN entity", doc_id="reports/cn",
                         metadata={"entity": "ACME_CN", "topic": "results", "sensitivity": "PUBLIC"}),
        library_id="reports"))
    policies = NarrativeIndexRetriever(NarrativeIndex.from_chunks(
        [c for i in range(4) for c in chunk_document(f"data protection policy, part {i} of the policy text",
                                                     doc_id=f"policies/p{i}",
                                                     metadata={"entity": "ACME_EU", "topic": "policy",
                                                               "sensitivity": "PUBLIC"})],
        library_id="policies"))
    return {"reports": reports, "policies": policies}


@pytest.mark.parametrize("fusion", ["global", "rrf"])
def test_strict_filter_is_tried_on_every_library_before_relaxing(fusion):
    libs = three()
    m = MultiIndexRetriever(libs, router=lambda q: ["policies"], fusion=fusion)
    out = m.retrieve("data protection policy", filters={"entity": "ACME_US"}, top_k=5)
    assert [s["doc_id"] for s in out] == ["reports/us"]
    assert all(s["filters_relaxed"] is False and s["route_widened"] is True for s in out)
    assert m.last["routed"] == ["policies"] and m.last["searched"] == ["policies", "reports"]
    assert fusion == "rrf" or m.last["bm25_stats"] == "union"
    # Same answer as searching every library from the start (RAGSPINE_ROUTER=none).
    assert [s["doc_id"] for s in MultiIndexRetriever(libs, fusion=fusion).retrieve(
        "data protection policy", filters={"entity": "ACME_US"}, top_k=5)] == ["reports/us"]
    # Routed libraries satisfy the filter: no widening.
    out = m.retrieve("data protection policy", filters={"entity": "ACME_EU"}, top_k=5)
    assert out and all(s["library_id"] == "policies" and "route_widened" not in s for s in out)
    # Nothing anywhere satisfies it: relaxed last, within the routed libraries, and said so.
    out = m.retrieve("data protection policy", filters={"entity": "ACME_JP"}, top_k=5)
    assert out and all(s["filters_relaxed"] is True and s["library_id"] == "policies" for s in out)
    assert m.last["filters_relaxed"] is True and m.last["widened"] is False
    # A query the routed library cannot answer at all is tried everywhere.
    out = m.retrieve("CN entity report", top_k=5)
    assert out and out[0]["doc_id"] == "reports/cn" and out[0]["route_widened"] is True


def test_demo_filter_answers_exactly_like_router_none(published_demo, monkeypatch):
    """The issue's demo case: the rules router picks the policies library for a policy
    question, while only the reports library holds ACME_US; the answer must be the exact
    ACME_US reports that RAGSPINE_ROUTER=none gives, never relaxed policies."""
    from ragspine_pipeline.serving import open_published_retriever

    q, f = "data protection policy", {"entity": "ACME_US"}
    routed = open_published_retriever(published_demo).retrieve(q, filters=f, top_k=5)
    monkeypatch.setenv("RAGSPINE_ROUTER", "none")
    everyone = open_published_retriever(published_demo).retrieve(q, filters=f, top_k=5)
    assert routed and all(s["entity"] == "ACME_US" and s["filters_relaxed"] is False for s in routed)
    assert [s["chunk_id"] for s in routed] == [s["chunk_id"] for s in everyone]


# ------------------------------------------------------------------ duplicates across libraries
PASSAGE = ("Subject to the terms and conditions of this License, each Contributor hereby grants to You a "
           "perpetual, worldwide, non-exclusive, no-charge, royalty-free, irrevocable patent license.")


@pytest.mark.parametrize("fusion", ["global", "rrf"])
def test_same_passage_in_two_libraries_appears_once_and_top_k_is_filled(fusion):
    def lib(name, extra, label="PUBLIC"):
        chunks = chunk_document(PASSAGE, doc_id=f"{name}/LICENSE", metadata={"sensitivity": "PUBLIC"})
        chunks += chunk_document(PASSAGE + " ", doc_id=f"{name}/COPY", metadata={"sensitivity": label})
        for i in range(extra):
            chunks += chunk_document(f"patent license note {name}{i}: contributors grant rights", doc_id=f"{name}/n{i}",
                                     metadata={"sensitivity": "PUBLIC"})
        return NarrativeIndexRetriever(NarrativeIndex.from_chunks(chunks, library_id=name, exclude_restricted=False))

    m = MultiIndexRetriever({"a": lib("a", 2), "b": lib("b", 2, label="RESTRICTED")}, fusion=fusion)
    out = m.retrieve("contributor grants patent license", top_k=5)
    texts = [" ".join(s["text"].split()) for s in out]
    assert len(out) == 5 and texts.count(PASSAGE) == 1  # filled to top_k after collapsing
    dup = next(s for s in out if " ".join(s["text"].split()) == PASSAGE)
    listed = {d["doc_id"] for d in [dup, *dup["duplicates"]]}
    assert listed == {"a/LICENSE", "a/COPY", "b/LICENSE"}  # b/COPY is RESTRICTED: never listed
    assert all(set(d) >= {"doc_id", "source_locator"} for d in dup["duplicates"])
    assert "b/COPY" not in repr(out)
    from ragspine_pipeline.snippet_format import format_snippet

    assert "also in: " in format_snippet(dup) and "b/COPY" not in format_snippet(dup)


def test_refresh_stack_scores_with_the_union_statistics(tmp_path):
    """A library served from a refresh stack takes the union's statistics too: its scores
    are those of one index over its live rows and the other library's documents."""
    import numpy as np

    from ragspine_pipeline.retrieval.lexical.index.bm25 import BM25Index
    from ragspine_pipeline.retrieval.lexical.refresh.stack import StackedBM25
    from ragspine_pipeline.retrieval.link.global_rank import takes_stats
    from ragspine_pipeline.warehouse.lexical_files import open_bm25_file
    from tests.test_bm25_stack import DEEP, _corpus, _publish, _refresh

    corpus = _corpus(n=400)
    _publish(tmp_path / "v0", None, corpus)
    corpus, changed = _refresh(corpus, seed=1)
    _publish(tmp_path / "v1", tmp_path / "v0", corpus, changed=changed, stack=DEEP)
    ids = sorted(corpus)
    stack = open_bm25_file(tmp_path / "v1", ids)
    assert isinstance(stack, StackedBM25) and takes_stats(stack)
    other_docs = [["t1", "t2", "t9"], ["t2"] * 3, ["t40", "t1"], ["zz"]]
    other = BM25Index(other_docs)
    union = BM25Index([corpus[c] for c in ids] + other_docs)
    mask = np.random.default_rng(3).random(len(ids)) < 0.5
    for q in (["t1"], ["t2", "t40"], ["t3", "t3", "t9"]):
        for cand in (None, mask):
            ref_mask = None if cand is None else np.concatenate([cand, np.ones(len(other_docs), bool)])
            total = stack.survivor_stats(q, cand) + other.survivor_stats(q)
            got = stack.search(q, 10, candidates=cand, stats=total)
            ref = union.search(q, len(ids) + len(other_docs), candidates=ref_mask)
            want = {int(i): s for i, s in zip(ref.ids, ref.scores, strict=True) if i < len(ids)}
            assert len(got.ids) and all(want[int(i)] == pytest.approx(s, rel=1e-9)
                                        for i, s in zip(got.ids, got.scores, strict=True))
