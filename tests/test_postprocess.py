"""Post-processors: MMR, lost-in-the-middle, extractive compression, the chain, wiring."""

import json

import pytest

from ragspine_pipeline.retrieval.chunking.chunking import Chunk, SourceLocator
from ragspine_pipeline.retrieval.link.narrative_link import NarrativeIndex, NarrativeIndexRetriever
from ragspine_pipeline.retrieval.postprocess import (
    ExtractiveCompressor,
    LostInTheMiddle,
    MMRPostprocessor,
    PostprocessorChain,
    lost_in_middle_order,
    make_postprocessor,
)
from ragspine_pipeline.retrieval.vector.embedding_backends import DeterministicHashBackend

REF_FIELDS = ("text", "doc_id", "title", "chunk_id", "source_locator", "rank", "scores",
              "sensitivity", "entity", "period", "geography", "topic", "language")


def chunk(cid, text, **md):
    return Chunk(chunk_id=cid, doc_id=cid.split("#")[0], title=cid, text=text,
                 source_locator=SourceLocator(cid.split("#")[0], 0, len(text)), **md)


def snip(i, text, fused):
    return {"rank": i, "text": text, "chunk_id": f"d{i}#0", "doc_id": f"d{i}", "sensitivity": "internal",
            "scores": {"bm25": fused, "vector": None, "fused": fused}}


CORPUS = [
    chunk("a#0", "Revenue fell in 2023 because tariffs raised costs for ACME China."),
    chunk("b#0", "Revenue fell in 2023 because tariffs raised costs for ACME China!"),  # near duplicate
    chunk("c#0", "Revenue in Europe grew on smart home sales."),
    chunk("d#0", "Gross margin improved as layoffs cut costs."),
    chunk("e#0", "Revenue fell. The board met. Tariffs were the cause of the revenue decline in 2023. "
                 "Weather was mild. Staff enjoyed the canteen. Nothing else happened that year at all."),
    chunk("s#0", "SECRET revenue fell tariffs", sensitivity="restricted"),
]


def retriever(postprocessor=None, exclude_restricted=True, collapse_duplicates=False):
    """Collapsing duplicates is off by default here: the MMR tests need both near-copies."""
    index = NarrativeIndex.from_chunks(CORPUS, exclude_restricted=exclude_restricted)
    return NarrativeIndexRetriever(index, postprocessor=postprocessor, collapse_duplicates=collapse_duplicates)


def test_off_is_byte_identical(monkeypatch):
    plain = retriever().retrieve("revenue fell tariffs", top_k=5)
    for spec in (None, "", "none", "off, none"):
        assert make_postprocessor(spec) is None
    monkeypatch.setenv("RAGSPINE_POSTPROCESSOR", "")
    off = retriever(make_postprocessor()).retrieve("revenue fell tariffs", top_k=5)
    assert json.dumps(off, sort_keys=True) == json.dumps(plain, sort_keys=True)
    assert all("layers" not in s and "prompt_text" not in s for s in plain)


def test_factory_parses_chain_and_params():
    chain = make_postprocessor(" MMR:0.7 , lost_in_the_middle,compress:120 ")
    assert chain.names == ["mmr", "lost_in_middle", "compress"]
    assert chain.steps[0].lambda_ == 0.7 and chain.steps[2].max_chars == 120
    for bad, msg in (("mmr:x", "not a number"), ("mmr:1.5", r"\[0, 1\]"), ("compress:0", "positive"),
                     ("lost_in_middle:3", "no parameter"), ("rerank", "unknown postprocessor 'rerank'")):
        with pytest.raises(ValueError, match=msg):
            make_postprocessor(bad)
    with pytest.raises(TypeError):
        make_postprocessor(["mmr"])
    with pytest.raises(TypeError):
        PostprocessorChain([object()])


def test_mmr_drops_near_duplicates_and_diversifies():
    plain = retriever().retrieve("revenue fell tariffs 2023", top_k=5)
    ids = [s["chunk_id"] for s in plain]
    assert {"a#0", "b#0"} <= set(ids)
    out = retriever(make_postprocessor("mmr")).retrieve("revenue fell tariffs 2023", top_k=5)
    out_ids = [s["chunk_id"] for s in out]
    assert len({"a#0", "b#0"} & set(out_ids)) == 1  # one of the two near-duplicates survives
    assert out_ids[0] == ids[0]  # the best hit stays first
    assert all(s["layers"] == ["mmr"] for s in out)
    by_id = {s["chunk_id"]: s for s in plain}
    for s in out:  # references untouched
        for f in REF_FIELDS:
            assert s.get(f) == by_id[s["chunk_id"]].get(f)


def test_mmr_lambda_one_keeps_relevance_order_and_lambda_zero_diversifies():
    snippets = [snip(1, "alpha beta gamma", 0.9), snip(2, "alpha beta gamma delta", 0.8),
                snip(3, "omega psi", 0.7)]
    keep = MMRPostprocessor(lambda_=1.0, duplicate_threshold=None).process("q", snippets)
    assert [s["rank"] for s in keep] == [1, 2, 3]
    div = MMRPostprocessor(lambda_=0.3, duplicate_threshold=None).process("q", snippets)
    assert [s["rank"] for s in div] == [1, 3, 2]
    top = MMRPostprocessor(lambda_=0.3, duplicate_threshold=None, top_n=2).process("q", snippets)
    assert [s["rank"] for s in top] == [1, 3]
    assert snippets[0].get("layers") is None  # inputs not mutated


def test_mmr_uses_dense_vectors_when_given_and_degrades_on_failure():
    class Boom:
        def embed_texts(self, texts):
            raise RuntimeError("model down")

    snippets = [snip(1, "alpha beta", 0.9), snip(2, "gamma delta", 0.8)]
    mmr = MMRPostprocessor(embedding_backend=DeterministicHashBackend(dim=32))
    sim, kind = mmr.similarity(snippets)
    assert kind == "dense" and sim.shape == (2, 2)
    sim, kind = MMRPostprocessor(embedding_backend=Boom()).similarity(snippets)
    assert kind == "tokens"
    assert len(MMRPostprocessor(embedding_backend=Boom()).process("q", snippets)) == 2
    with pytest.raises(TypeError):
        MMRPostprocessor(embedding_backend=object())


def test_lost_in_middle_puts_best_at_both_ends():
    assert lost_in_middle_order(0) == [] and lost_in_middle_order(1) == [0]
    assert lost_in_middle_order(5) == [0, 2, 4, 3, 1]
    assert lost_in_middle_order(6) == [0, 2, 4, 5, 3, 1]
    snippets = [snip(i, f"t{i}", 1.0 / i) for i in range(1, 6)]
    out = LostInTheMiddle().process("q", snippets)
    assert [s["rank"] for s in out] == [1, 3, 5, 4, 2]
    assert sorted(json.dumps({k: v for k, v in s.items() if k != "layers"}, sort_keys=True) for s in out) == \
        sorted(json.dumps(s, sort_keys=True) for s in snippets)


def test_compress_writes_prompt_text_only():
    plain = retriever().retrieve("tariffs revenue decline 2023", top_k=5)
    out = retriever(make_postprocessor("compress:70")).retrieve("tariffs revenue decline 2023", top_k=5)
    assert [s["chunk_id"] for s in out] == [s["chunk_id"] for s in plain]
    for p, o in zip(plain, out, strict=True):
        assert {k: v for k, v in o.items() if k not in ("prompt_text", "layers")} == p
        assert o["layers"] == ["compress"]
    long = next(o for o in out if o["chunk_id"] == "e#0")
    # Only sentences sharing query tokens, in source order ("The board met." is gone).
    assert long["prompt_text"] == "Revenue fell. Tariffs were the cause of the revenue decline in 2023."
    assert all(p in long["text"] for p in ("Revenue fell.", "Tariffs were the cause of the revenue "
                                           "decline in 2023."))  # extractive: verbatim
    short = next(o for o in out if o["chunk_id"] == "a#0")
    assert "prompt_text" not in short  # already within budget (66 chars)


def test_compress_cjk_and_no_overlap_and_existing_prompt_text():
    comp = ExtractiveCompressor(max_chars=12)
    text = "天气很好。营收下滑的原因是关税。员工很开心。"
    assert comp.compress("营收为何下滑", text) == "营收下滑的原因是关税。"
    assert comp.compress("zzz", text) == "天气很好。"  # no overlap: leading sentences
    s = {"text": "短。", "prompt_text": "天气很好。营收下滑的原因是关税。员工很开心。", "chunk_id": "x"}
    out = comp.process("营收下滑", [s])[0]
    assert out["text"] == "短。" and out["prompt_text"] == "营收下滑的原因是关税。"
    assert ExtractiveCompressor(max_chars=5).compress("q", "abcdefghij") == "abcde"


def test_chain_order_and_restricted_never_reaches_a_step():
    seen = []

    class Spy:
        name = "spy"

        def process(self, query, snippets):
            seen.extend(snippets)
            return snippets + [{"text": "leak", "sensitivity": "RESTRICTED", "chunk_id": "z"},
                               {"text": "odd", "sensitivity": "top-secret??", "chunk_id": "y"}]

    chain = PostprocessorChain([Spy(), make_postprocessor("lost_in_middle").steps[0], Spy()])
    r = retriever(chain, exclude_restricted=False)
    out = r.retrieve("SECRET revenue fell tariffs", top_k=6)
    assert out and all(s["sensitivity"] == "INTERNAL" for s in out)
    assert all("SECRET" not in s["text"] for s in seen)
    assert all(s["layers"] == ["lost_in_middle"] for s in out)


def test_full_chain_order_is_applied_as_given():
    out = retriever(make_postprocessor("mmr,lost_in_middle,compress:60")).retrieve(
        "revenue fell tariffs 2023", top_k=5)
    assert all(s["layers"] == ["mmr", "lost_in_middle", "compress"] for s in out)
    rev = retriever(make_postprocessor("compress:60,mmr")).retrieve("revenue fell tariffs 2023", top_k=5)
    assert all(s["layers"] == ["compress", "mmr"] for s in rev)


def test_mmr_uses_the_served_index_vectors_without_a_model_call():
    from ragspine_pipeline.retrieval.postprocess import IndexVectorLookup

    class Counting(DeterministicHashBackend):
        calls = 0

        def embed_texts(self, texts):
            Counting.calls += 1
            return super().embed_texts(texts)

    backend = Counting(dim=32)
    index = NarrativeIndex.from_chunks(CORPUS, embedding_backend=backend)
    plain = NarrativeIndexRetriever(index).retrieve("revenue fell tariffs 2023", top_k=5)
    lookup = IndexVectorLookup({"": index.retriever})
    before = Counting.calls
    mat = lookup(plain)
    assert mat is not None and mat.shape[0] == len(plain) and Counting.calls == before
    mmr = MMRPostprocessor(vectors=lookup)
    assert mmr.similarity(plain)[1] == "dense" and Counting.calls == before
    # a snippet the index has no vector for: token sets, not a model call
    assert IndexVectorLookup({"": NarrativeIndex.from_chunks(CORPUS).retriever})(plain) is None
    stray = [{**plain[0], "chunk_id": "nope#0"}]
    assert lookup(stray) is None and MMRPostprocessor(vectors=lookup).similarity(stray)[1] == "tokens"


def test_make_query_layers_gives_mmr_the_index_vectors():
    from ragspine_pipeline.retrieval.query import make_query_layers

    index = NarrativeIndex.from_chunks(CORPUS, embedding_backend=DeterministicHashBackend(dim=32))
    layered = make_query_layers(NarrativeIndexRetriever(index), postprocessor="mmr")
    out = layered.retrieve("revenue fell tariffs 2023", top_k=5)
    mmr = layered.postprocessor.steps[0]
    assert out and mmr.similarity(list(out))[1] == "dense"


# ------------------------------------------------------------------ duplicates collapse (issue 43)
def test_duplicates_collapse_to_the_best_with_the_others_listed():
    from ragspine_pipeline.retrieval.postprocess.dedup import collapse

    out = retriever(collapse_duplicates=True).retrieve("revenue fell tariffs 2023", top_k=5)
    ids = [s["chunk_id"] for s in out]
    assert len({"a#0", "b#0"} & set(ids)) == 1 and len(out) == 3  # a#0 and b#0 differ in punctuation only
    kept = next(s for s in out if s["chunk_id"] in ("a#0", "b#0"))
    other = "b" if kept["doc_id"] == "a" else "a"
    assert kept["duplicates"] == [{"doc_id": other, "chunk_id": f"{other}#0",
                                   "source_locator": SourceLocator(other, 0, len(CORPUS[0].text)).to_dict()}]
    assert all("duplicates" not in s for s in out if s is not kept)
    # The rules: equal after normalising; near-identical from 0.9 Jaccard of word 3-grams, so short texts
    # that differ in a word stay apart while a long passage with one word changed collapses.
    long = " ".join(f"word{i}" for i in range(120))
    texts = ["Policy number 1", "policy  NUMBER 1", "Policy number 2", long, long.replace("word60", "other")]
    groups = collapse(texts, str)
    assert [(g.kept, g.copies) for g in groups] == [("Policy number 1", ["policy  NUMBER 1"]),
                                                    ("Policy number 2", []), (long, [texts[4]])]
    assert len(collapse(texts, str, threshold=1.01)) == 4  # exact rule only


def test_restricted_duplicate_is_never_listed():
    """A RESTRICTED copy of a public passage (kept in the index's statistics here) must not
    appear in a duplicates list: only chunks past both exits are compared."""
    text = CORPUS[2].text
    chunks = [chunk("p#0", text), chunk("q#0", text), chunk("r#0", text, sensitivity="RESTRICTED"),
              chunk("z#0", "unrelated words")]
    r = NarrativeIndexRetriever(NarrativeIndex.from_chunks(chunks, exclude_restricted=False))
    out = r.retrieve("revenue europe smart home", top_k=3)
    assert [s["chunk_id"] for s in out] == ["p#0"]
    assert [d["chunk_id"] for d in out[0]["duplicates"]] == ["q#0"]
    assert "r#0" not in json.dumps(out)
