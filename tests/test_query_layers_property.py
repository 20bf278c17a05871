"""Property: random corpora with RESTRICTED documents, random layer stacks and hostile
providers — no RESTRICTED text in any provider request or returned snippet, every
snippet's lineage resolves to a real open chunk, no synthesised (HyDE / LLM) text is ever
returned or cited, and no layer raises."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ragspine_pipeline.llm.provider import ScriptedProvider
from ragspine_pipeline.retrieval.chunking.chunking import Chunk, SourceLocator
from ragspine_pipeline.retrieval.lexical.analysis.glossary import (
    GlossaryGroup,
    GlossaryQueryRewriter,
)
from ragspine_pipeline.retrieval.limits import InvalidText
from ragspine_pipeline.retrieval.link.narrative_link import NarrativeIndex, NarrativeIndexRetriever
from ragspine_pipeline.retrieval.query import SecurityGate, make_query_layers
from ragspine_pipeline.sensitivity import is_restricted

MARK = "QQSECRETQQ"
SYNTH = "SYNTHWORD"  # only ever produced by the provider: must never be returned
WORDS = ["revenue", "fell", "tariffs", "margin", "2023", "2024", "acme", "china", "plant", "costs",
         "营收", "下滑", "关税", "毛利率", "globex"]
LABELS = ["PUBLIC", "INTERNAL", "RESTRICTED", "restricted", " Restricted ", "secret??", "", "конфиденц"]
GLOSSARY = GlossaryQueryRewriter(groups=[GlossaryGroup(("revenue", "营收", "sales"), "metric"),
                                         GlossaryGroup(("acme china", "ACME_CN"), "entity")])

text_st = st.lists(st.sampled_from(WORDS), min_size=1, max_size=8).map(" ".join)
NOT_TEXT = ["\x00", "\ud800", "\udfff"]  # NUL and lone surrogates: retrieval.limits.check_query refuses them
# The user's query: mostly valid text, sometimes with a character that is not text (the
# property then is that the stack refuses it with InvalidText, before any layer runs).
query_st = st.one_of(text_st, st.tuples(text_st, st.sampled_from(NOT_TEXT), st.integers(0, 60)).map(
    lambda t: t[0][:t[2]] + t[1] + t[0][t[2]:]))
doc_st = st.tuples(text_st, st.sampled_from(LABELS), st.sampled_from(["ACME_CN", "ACME_EU", ""]),
                   st.sampled_from(["2023", "2024", ""]))


def hostile(kind, words):
    def reply(prompt):
        if kind == "raise":
            raise RuntimeError("provider down")
        if kind == "none":
            return None
        if kind == "garbage":
            return "\x00{[" * 50
        if kind == "huge":
            return (SYNTH + " ") * 3000
        if kind == "json":
            return json.dumps([f"{SYNTH} {w}" for w in words] + [{"x": 1}, 7])
        if kind == "dict":
            return json.dumps({"entity": "ACME_CN" if words else "globex", "period": "2023",
                               "geography": [SYNTH], "topic": "x"})
        if kind == "verdict":
            return "COMPLEX" if len(prompt) % 2 else "YES"
        return "\n".join(f"- {SYNTH} {w}" for w in words)  # plausible list answers
    return ScriptedProvider(responses=reply)


stack_st = st.fixed_dictionaries({
    "transform": st.sampled_from(["none", "rag_fusion", "hyde", "step_back"]),
    "decompose": st.sampled_from(["none", "llm", "llm:2"]),
    "adaptive": st.sampled_from(["off", "on", "llm"]),
    "corrective": st.sampled_from(["off", "on", "llm"]),
    "auto_filters": st.sampled_from(["off", "on", "llm"]),
    "postprocessor": st.sampled_from(["none", "mmr", "lost_in_middle", "compress:30", "mmr,lost_in_middle,compress"]),
})


@settings(max_examples=1000, deadline=None)
@given(docs=st.lists(doc_st, min_size=1, max_size=7), stack=stack_st, query=query_st,
       kind=st.sampled_from(["raise", "none", "garbage", "huge", "json", "dict", "verdict", "list"]),
       words=st.lists(st.sampled_from(WORDS), min_size=0, max_size=3),
       exclude=st.booleans(), use_filter=st.booleans(), competitors=st.booleans())
def test_layers_never_leak_or_cite_synthesis(docs, stack, query, kind, words, exclude, use_filter, competitors):
    chunks = []
    for i, (text, label, entity, period) in enumerate(docs):
        body = f"{MARK} {text}" if is_restricted(label) else text
        chunks.append(Chunk(chunk_id=f"d{i}#0", doc_id=f"d{i}", title=f"d{i}", text=body,
                            source_locator=SourceLocator(f"d{i}", 0, len(body)), entity=entity,
                            period=period, sensitivity=label))
    base = NarrativeIndexRetriever(NarrativeIndex.from_chunks(chunks, rewriter=GLOSSARY,
                                                              exclude_restricted=exclude))
    provider = hostile(kind, words)
    layered = make_query_layers(base, provider=provider,
                                gate=SecurityGate(["globex"] if competitors else []), **stack)
    if any(bad in query for bad in NOT_TEXT):
        with pytest.raises(InvalidText):
            layered.retrieve(query, filters={"entity": "ACME_CN"} if use_filter else None, top_k=5)
        assert not provider.calls  # refused before any layer asked the provider
        return
    out = layered.retrieve(query, filters={"entity": "ACME_CN"} if use_filter else None, top_k=5)
    real = {c.chunk_id: c for c in chunks}
    for s in out:
        c = real[s["chunk_id"]]
        assert not is_restricted(c.sensitivity)
        assert s["text"] == c.text and s["doc_id"] == c.doc_id
        assert s["source_locator"] == c.source_locator.to_dict()
        assert SYNTH not in s["text"] and SYNTH not in s.get("prompt_text", "")
        assert s.get("prompt_text", s["text"]) in c.text or all(
            part.strip() in c.text for part in s["prompt_text"].split(" ") if part.strip())
    dumped = json.dumps(list(out), ensure_ascii=False)
    assert MARK not in dumped
    assert MARK not in json.dumps(getattr(out, "report", {}), ensure_ascii=False)
    for msgs, _ in provider.calls:
        assert all(MARK not in m["content"] for m in msgs)


@pytest.mark.slow
@settings(max_examples=5000, deadline=None)
@given(docs=st.lists(doc_st, min_size=1, max_size=7), stack=stack_st, query=query_st,
       kind=st.sampled_from(["raise", "none", "garbage", "huge", "json", "dict", "verdict", "list"]),
       words=st.lists(st.sampled_from(WORDS), min_size=0, max_size=3),
       exclude=st.booleans(), use_filter=st.booleans(), competitors=st.booleans())
def test_layers_never_leak_or_cite_synthesis_long(docs, stack, query, kind, words, exclude, use_filter,
                                                  competitors):
    test_layers_never_leak_or_cite_synthesis.hypothesis.inner_test(
        docs, stack, query, kind, words, exclude, use_filter, competitors)
