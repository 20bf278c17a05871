"""Query layers: security gate, RAG-Fusion, HyDE, step-back, decomposition, Adaptive-RAG,
CRAG, automatic filters — LLM layers against a real chat server on 127.0.0.1."""

import json

import pytest
from chat_server import (
    ChatServer,
    answer,
    garbage,
    no_choices,
    server_error,
    slow,
    system_of,
    user_of,
)

from ragspine_pipeline.llm.provider import OpenAICompatibleProvider, ScriptedProvider
from ragspine_pipeline.retrieval.chunking.chunking import Chunk, SourceLocator
from ragspine_pipeline.retrieval.filters import FilterError
from ragspine_pipeline.retrieval.hybrid.fusion import rrf_fuse
from ragspine_pipeline.retrieval.lexical.analysis.glossary import (
    GlossaryGroup,
    GlossaryQueryRewriter,
)
from ragspine_pipeline.retrieval.link.multi_index import MultiIndexRetriever
from ragspine_pipeline.retrieval.link.narrative_link import NarrativeIndex, NarrativeIndexRetriever
from ragspine_pipeline.retrieval.query import (
    AutoFilterExtractor,
    CorrectiveConfig,
    HeuristicComplexityClassifier,
    HeuristicGrader,
    HyDE,
    LayeredRetriever,
    LLMDecomposer,
    RAGFusion,
    RetrievalResult,
    SecurityConfigError,
    SecurityGate,
    StepBack,
    make_query_layers,
)
from ragspine_pipeline.retrieval.query.corrective import LLMGrader

SECRET = "ZEBRACODE"
LAYER_ENVS = ("RAGSPINE_QUERY_TRANSFORM", "RAGSPINE_QUERY_DECOMPOSE", "RAGSPINE_ADAPTIVE",
              "RAGSPINE_CORRECTIVE", "RAGSPINE_AUTO_FILTERS", "RAGSPINE_POSTPROCESSOR",
              "RAGSPINE_SECURITY_CONFIG", "RAGSPINE_COMPETITORS", "RAGSPINE_LLM_BASE_URL")


@pytest.fixture(autouse=True)
def _no_layer_env(monkeypatch):
    for v in LAYER_ENVS:
        monkeypatch.delenv(v, raising=False)


def chunk(cid, text, **md):
    doc = cid.split("#")[0]
    return Chunk(chunk_id=cid, doc_id=doc, title=doc, text=text,
                 source_locator=SourceLocator(doc, 0, len(text)), **md)


CORPUS = [
    chunk("cn23#0", "ACME China revenue fell in 2023 because tariffs raised costs.",
          entity="ACME_CN", period="2023", geography="CN"),
    chunk("cn24#0", "ACME China revenue recovered in 2024 on smart home sales.",
          entity="ACME_CN", period="2024", geography="CN"),
    chunk("eu23#0", "ACME EU gross margin fell in 2023 as energy prices rose.",
          entity="ACME_EU", period="2023", geography="EU"),
    chunk("us23#0", "ACME US net income grew in 2023 after layoffs cut costs.",
          entity="ACME_US", period="2023", geography="US"),
    chunk("gr23#0", "The group sales declined in 2023; tariffs and exchange losses weighed.",
          entity="ACME_GROUP", period="2023", geography="GLOBAL"),
    chunk("sec#0", f"{SECRET} revenue fell tariffs merger plan ACME China 2023", entity="ACME_CN",
          period="2023", geography="CN", sensitivity="RESTRICTED"),
    chunk("odd#0", f"{SECRET} odd label revenue tariffs", entity="ACME_CN", period="2023",
          sensitivity="confidential-ish"),
]
GLOSSARY = GlossaryQueryRewriter(groups=[
    GlossaryGroup(("revenue", "sales", "globex revenue"), "metric"),
    GlossaryGroup(("fell", "declined"), "event"),
    GlossaryGroup(("艾克美中国", "ACME China", "ACME_CN"), "entity"),
    GlossaryGroup(("ACME EU", "ACME Europe", "ACME_EU"), "entity"),
    GlossaryGroup(("ACME US", "ACME_US"), "entity"),
])


def base(exclude_restricted=True, rewriter=GLOSSARY, **kw):
    index = NarrativeIndex.from_chunks(CORPUS, rewriter=rewriter, exclude_restricted=exclude_restricted)
    return NarrativeIndexRetriever(index, **kw)


def ids(snippets):
    return [s["chunk_id"] for s in snippets]


def assert_clean(snippets, bodies=()):
    real = {c.chunk_id: c for c in CORPUS}
    for s in snippets:
        assert SECRET not in json.dumps(s), s
        c = real[s["chunk_id"]]  # lineage resolves to a real chunk
        assert s["text"] == c.text and s["doc_id"] == c.doc_id
        assert c.sensitivity == "INTERNAL"
    for b in bodies:
        assert SECRET not in b


@pytest.fixture
def chat():
    with ChatServer() as srv:
        yield srv


def provider(srv, timeout=30.0):
    return OpenAICompatibleProvider(base_url=srv.url, model="m", timeout=timeout)


# ------------------------------------------------------------------ the gate
def test_gate_text_rules():
    gate = SecurityGate(competitors=["Globex", "英尼泰克"])
    assert gate.check_text("why did revenue fall") is None
    r = gate.check_text("Globex revenue 2023", "sub_question")
    assert r.reason == "names competitor entity 'Globex'" and r.kind == "sub_question"
    assert gate.check_text("ＧＬＯＢＥＸ sales") is not None  # NFKC + casefold
    assert gate.check_text("globexx sales") is None  # ASCII names match whole words only
    assert gate.check_text("英尼泰克的营收为什么下滑") is not None
    assert "empty" in gate.check_text("   ").reason and "empty" in gate.check_text(None).reason
    assert "too long" in gate.check_text("x" * 5000).reason
    with pytest.raises(TypeError):
        SecurityGate(competitors="Globex")
    with pytest.raises(ValueError):
        SecurityGate(competitors=[""])


def test_gate_filters_never_widen():
    gate = SecurityGate(competitors=["Globex"])
    user = {"entity": "ACME_CN"}
    assert gate.check_filters(user, {"entity": "ACME_CN", "period": "2023"}) is None  # narrower
    assert gate.check_filters(user, [("entity", "eq", "ACME_CN")]) is None  # same, other form
    assert "widens" in gate.check_filters(user, {"period": "2023"}).reason
    assert "widens" in gate.check_filters(user, None).reason
    assert "widens" in gate.check_filters({"entity": {"in": ["ACME_CN"]}}, {"entity": {"in": ["ACME_CN", "ACME_EU"]}}).reason
    assert "competitor" in gate.check_filters(None, {"entity": "Globex"}).reason
    assert "invalid filter" in gate.check_filters(None, {"nope": 1}).reason
    with pytest.raises(FilterError):
        gate.check_filters({"nope": 1}, {"nope": 1})


def test_gate_config_files(tmp_path, monkeypatch):
    cfg = tmp_path / "sec.json"
    cfg.write_text(json.dumps({"competitors": ["Globex", ["Initech", "英尼泰克"]]}), encoding="utf-8")
    gl = tmp_path / "glossary.json"
    gl.write_text(json.dumps({"groups": [{"kind": "competitor", "terms": ["Umbrella", "安布雷拉"]},
                                         {"kind": "metric", "terms": ["revenue", "sales"]}]}), encoding="utf-8")
    monkeypatch.setenv("RAGSPINE_SECURITY_CONFIG", str(cfg))
    monkeypatch.setenv("RAGSPINE_COMPETITORS", "Hooli, Pied Piper")
    gate = SecurityGate.from_env(glossary=gl)
    assert set(gate.competitors) == {"Globex", "Initech", "英尼泰克", "Umbrella", "安布雷拉", "Hooli", "Pied Piper"}
    bad = tmp_path / "bad.json"
    bad.write_text("{", encoding="utf-8")
    with pytest.raises(SecurityConfigError, match="not valid JSON"):
        SecurityGate.from_config(bad)
    bad.write_text(json.dumps({"competitors": "Globex"}), encoding="utf-8")
    with pytest.raises(SecurityConfigError, match="must be a list"):
        SecurityGate.from_config(bad)
    with pytest.raises(SecurityConfigError, match="not found"):
        SecurityGate.from_config(tmp_path / "missing.json")


def test_gate_in_the_pipeline_refuses_and_reports(monkeypatch):
    b = base()
    plain = b.retrieve("revenue fell", top_k=5)
    monkeypatch.setenv("RAGSPINE_COMPETITORS", "Globex")
    layered = make_query_layers(b)
    assert isinstance(layered, LayeredRetriever)
    out = layered.retrieve("revenue fell", top_k=5)
    assert isinstance(out, RetrievalResult) and isinstance(out, list)
    # the glossary's "globex revenue fell" variant never reaches BM25, and says so
    assert {"variant": "globex revenue fell", "reason": "names competitor entity 'Globex'",
            "kind": "glossary"} in out.refused
    assert out.status == "ok" and out
    assert b.index.retriever.rewriter is GLOSSARY  # the shared index is not modified
    assert ids(b.retrieve("revenue fell", top_k=5)) == ids(plain)
    refused = layered.retrieve("Globex revenue in 2023", top_k=5)
    assert refused == [] and refused.status == "refused"
    assert refused.refused[0]["kind"] == "original"
    json.dumps(out)  # still plain data


def test_all_layers_off_is_the_base_itself():
    b = base()
    assert make_query_layers(b) is b
    assert make_query_layers(b, transform="none", decompose="none", adaptive="off", corrective="off",
                             auto_filters="off", postprocessor="none") is b
    for kw, bad in (("transform", "magic"), ("decompose", "rules"), ("adaptive", "maybe"),
                    ("corrective", "sometimes"), ("auto_filters", "llm?")):
        with pytest.raises(ValueError, match="accepted values"):
            make_query_layers(b, **{kw: bad})
    with pytest.raises(ValueError, match="RAGSPINE_LLM_BASE_URL"):
        make_query_layers(b, transform="hyde")
    with pytest.raises(ValueError, match="glossary rewriter or an LLM"):
        make_query_layers(base(rewriter=None), transform="rag_fusion")


# -------------------------------------------------------------- RAG-Fusion
def test_rag_fusion_with_the_glossary_alone_reuses_rrf_fuse(monkeypatch):
    b = base()
    monkeypatch.setenv("RAGSPINE_QUERY_TRANSFORM", "rag_fusion")
    layered = make_query_layers(b)
    assert isinstance(layered.transform, RAGFusion) and layered.transform.provider is None
    out = layered.retrieve("revenue fell", top_k=5)
    kinds = [v["kind"] for v in out.report["variants"]]
    assert kinds[0] == "original" and "glossary" in kinds
    texts = [v["variant"] for v in out.report["variants"]]
    expected = rrf_fuse([[("", s["chunk_id"]) for s in b.retrieve(t, top_k=20)] for t in texts])
    assert [k[1] for k in expected][:5] == ids(out)
    assert out[0]["scores"]["query_variants_fused"] == pytest.approx(next(iter(expected.values())))
    assert all(s["layers"] == ["rag_fusion"] and s["query_variants"] for s in out)
    assert len(out) >= 3 and [s["rank"] for s in out] == list(range(1, len(out) + 1))
    assert_clean(out)


# ------------------------------------------------------------- LLM layers
def script_for(srv, replies):
    """Reply by the layer's system prompt."""
    def script(body):
        sys_ = system_of(body)
        for key, reply in replies.items():
            if key in sys_:
                return reply(body) if callable(reply) else reply
        return answer("")
    srv.script = script


def test_hyde_probe_is_never_returned_or_cited(chat):
    hyde_text = "HYPOTHETICAL: tariffs raised costs and revenue fell in 2023."
    script_for(chat, {"hypothetical passage": answer(hyde_text), "would answer": answer(hyde_text)})
    b = base()
    layered = LayeredRetriever(b, transform=HyDE(provider(chat)))
    q = "what happened to the business"
    assert b.retrieve(q, top_k=5) == []  # the plain query finds nothing...
    out = layered.retrieve(q, top_k=5)
    assert "cn23#0" in ids(out)  # ...the HyDE probe finds the right chunk
    dumped = json.dumps(out) + json.dumps(out.report)
    assert "HYPOTHETICAL" not in dumped
    assert out.report["variants"][1] == {"kind": "hyde", "variant": f"<hyde probe, {len(hyde_text)} chars>",
                                         "leg": q}
    assert all(s["query_variants"] == ["hyde"] for s in out)
    assert_clean(out, chat.bodies)


def test_step_back_adds_the_general_question(chat):
    script_for(chat, {"step-back": answer("1. What drove revenue in 2023?")})
    out = LayeredRetriever(base(), transform=StepBack(provider(chat))).retrieve("why tariffs", top_k=5)
    assert [v["kind"] for v in out.report["variants"]] == ["original", "step_back"]
    assert out.report["variants"][1]["variant"] == "What drove revenue in 2023?"
    assert out and all(s["layers"] == ["step_back"] for s in out)
    assert user_of(json.loads(chat.bodies[0])) == "why tariffs"


def test_rag_fusion_with_llm_paraphrases_gated(chat):
    script_for(chat, {"different words": answer('["Globex revenue 2023", "sales declined 2023"]')})
    layered = LayeredRetriever(base(), gate=SecurityGate(["Globex"]),
                               transform=RAGFusion(rewriter=GLOSSARY, provider=provider(chat)))
    out = layered.retrieve("revenue fell", top_k=5)
    kinds = [v["kind"] for v in out.report["variants"]]
    assert "paraphrase" in kinds
    assert {"variant": "Globex revenue 2023", "reason": "names competitor entity 'Globex'",
            "kind": "paraphrase"} in out.refused
    assert "Globex revenue 2023" not in [v["variant"] for v in out.report["variants"]]


def test_decomposition_merges_deterministically(chat):
    subs = "- Why did ACME China revenue fall in 2023?\n- Why did ACME EU gross margin fall in 2023?\n" \
           "- How did Globex do?\n- Why did ACME China revenue fall in 2023?"
    script_for(chat, {"Split the question": answer(subs)})
    layered = LayeredRetriever(base(), gate=SecurityGate(["Globex"]), decomposer=LLMDecomposer(provider(chat)))
    q = "compare ACME China revenue and ACME EU margin in 2023"
    out = layered.retrieve(q, top_k=10)
    assert out.report["sub_questions"] == ["Why did ACME China revenue fall in 2023?",
                                           "Why did ACME EU gross margin fall in 2023?"]
    assert out.refused == [{"variant": "How did Globex do?", "reason": "names competitor entity 'Globex'",
                            "kind": "sub_question"}]
    assert len(ids(out)) == len(set(ids(out)))  # de-duplicated by chunk
    assert {"cn23#0", "eu23#0"} <= set(ids(out))
    eu = next(s for s in out if s["chunk_id"] == "eu23#0")
    assert "Why did ACME EU gross margin fall in 2023?" in eu["sub_questions"]
    assert all(s["sub_questions"] and s["layers"][-1] == "decompose" for s in out)
    again = layered.retrieve(q, top_k=10)
    assert json.dumps(again) == json.dumps(out)  # deterministic merge
    assert_clean(out, chat.bodies)


@pytest.mark.parametrize("failure", [server_error, garbage, no_choices, lambda: answer(None),
                                     lambda: answer(""), lambda: answer("\n\n   \n"), slow])
def test_failing_providers_degrade_to_the_plain_path(chat, failure):
    chat.script = lambda body: failure()
    p = provider(chat, timeout=0.3)
    b = base()
    q = "why did revenue fall"
    plain = b.retrieve(q, top_k=5)
    stacks = {
        "hyde": LayeredRetriever(b, transform=HyDE(p)),
        "step_back": LayeredRetriever(b, transform=StepBack(p)),
        "rag_fusion_llm": LayeredRetriever(b, transform=RAGFusion(provider=p)),
        "decompose": LayeredRetriever(b, decomposer=LLMDecomposer(p)),
        "adaptive_llm": make_query_layers(b, adaptive="llm", decompose="llm", provider=p),
        "crag_llm": make_query_layers(b, corrective="llm", provider=p),
    }
    for name, layered in stacks.items():
        out = layered.retrieve(q, top_k=5)
        assert ids(out) == ids(plain), name
        assert {k: v for k, v in out[0].items() if k not in ("layers",)} == plain[0] or name in (
            "hyde", "step_back", "rag_fusion_llm", "crag_llm"), name
        if name in ("hyde", "step_back", "rag_fusion_llm", "decompose"):
            assert out.report["degraded"], name


# ------------------------------------------------------------ Adaptive-RAG
def test_adaptive_classifier_zh_en():
    clf = HeuristicComplexityClassifier(rewriter=GLOSSARY)
    assert clf.classify("why did revenue fall").route == "single"
    assert clf.classify("为什么营收下滑").route == "single"
    r = clf.classify("compare ACME China and ACME EU revenue in 2023 and 2024")
    assert r.route == "decompose" and "comparison marker" in r.reasons and "2 entities" in r.reasons
    assert clf.classify("艾克美中国和ACME EU的营收相比如何？2023年与2024年有何差异").route == "decompose"


def test_adaptive_routes_and_reports(chat):
    script_for(chat, {"Split the question": answer("ACME China revenue 2023\nACME EU revenue 2023")})
    layered = make_query_layers(base(), adaptive="on", decompose="llm", provider=provider(chat))
    simple = layered.retrieve("why did revenue fall", top_k=5)
    assert simple.report["route"]["route"] == "single" and simple.report["route"]["taken"] == "single"
    assert chat.bodies == []  # single-shot: the decomposer was never asked
    hard = layered.retrieve("compare ACME China and ACME EU revenue in 2023 and 2024", top_k=5)
    assert hard.report["route"]["taken"] == "decompose"
    assert hard.report["sub_questions"] == ["ACME China revenue 2023", "ACME EU revenue 2023"]
    no_dec = make_query_layers(base(), adaptive="on")
    out = no_dec.retrieve("compare ACME China and ACME EU revenue in 2023 and 2024", top_k=5)
    assert out.report["route"]["taken"] == "single" and "no decomposer" in out.report["degraded"][0]["reason"]


# -------------------------------------------------------------------- CRAG
def test_crag_refuses_weak_context_with_a_reason():
    layered = make_query_layers(base(), corrective="on")
    out = layered.retrieve("quantum chromodynamics lattice", top_k=5)
    assert out == [] and out.status == "refused_weak_context"
    rounds = out.report["corrective"]
    assert [r["action"] for r in rounds] == ["rewrite", "refuse"]
    assert len([r for r in rounds if r["action"] not in ("accept", "refuse")]) <= 2
    ok = layered.retrieve("why did ACME China revenue fall in 2023", top_k=5)
    assert ok.status == "ok" and ok[0]["chunk_id"] == "cn23#0"
    assert ok.report["corrective"][-1]["action"] == "accept" and ok[0]["layers"] == ["corrective"]


def test_crag_drops_filters_then_rewrites_bounded():
    b = base()
    layered = make_query_layers(b, corrective="on")
    # The filter admits only a chunk about something else: weak -> drop filters -> good.
    out = layered.retrieve("ACME EU gross margin energy prices", filters={"entity": "ACME_US"}, top_k=5)
    actions = [r["action"] for r in out.report["corrective"]]
    assert actions == ["drop_filters", "accept"]
    assert out[0]["chunk_id"] == "eu23#0" and all(s["filters_relaxed"] for s in out)
    # A base that forbids relaxation: CRAG does not drop the user's filters.
    strict = make_query_layers(base(retry_without_filters=False), corrective="on")
    out = strict.retrieve("ACME EU gross margin energy prices", filters={"entity": "ACME_US"}, top_k=5)
    assert "drop_filters" not in [r["action"] for r in out.report["corrective"]]
    assert out.status == "refused_weak_context"
    with pytest.raises(ValueError):
        CorrectiveConfig(max_rounds=3)


def test_crag_llm_grader_sees_only_open_snippets():
    sp = ScriptedProvider(responses=("NO", "fell revenue", "YES"))
    crag = CorrectiveConfig(grader=LLMGrader(sp), provider=sp)
    layered = LayeredRetriever(base(exclude_restricted=False), corrective=crag)
    out = layered.retrieve("revenue fell tariffs", top_k=5)
    assert out and out.status == "ok"
    assert all(SECRET not in m["content"] for msgs, _ in sp.calls for m in msgs)
    assert HeuristicGrader().grade("x", []).ok is False


# ------------------------------------------------------------ auto filters
def test_auto_filter_extraction_zh_en():
    ex = AutoFilterExtractor(rewriter=GLOSSARY)
    assert ex.extract("艾克美中国2023年营收为什么下滑") == ({"entity": "ACME_CN", "period": "2023"}, [])
    assert ex.extract("ACME China revenue FY2023 vs FY2024")[0] == {"entity": "ACME_CN",
                                                                    "period": {"in": ["2023", "2024"]}}
    f, notes = ex.extract("ACME EU 上半年 2024 margin")
    assert f == {"entity": "ACME_EU", "period": "2024"} and "上半年" in notes[0]
    assert ex.extract("why did sales in Europe fall")[0] == {"geography": "EU"}
    assert ex.extract("ACME China and ACME US")[0] == {"entity": {"in": ["ACME_CN", "ACME_US"]}}
    assert ex.extract("why did revenue fall") == ({}, [])


def test_auto_filters_in_the_pipeline():
    b = base()
    layered = make_query_layers(b, auto_filters="on")
    out = layered.retrieve("ACME China revenue 2024", top_k=5)
    assert out.report["filters_source"] == "extracted"
    assert out.report["filters"] == {"entity": "ACME_CN", "period": "2024"}
    assert ids(out) == ["cn24#0"]
    # an explicit user filter always wins: no extraction at all
    user = layered.retrieve("ACME China revenue 2024", filters={"period": "2023"}, top_k=5)
    assert user.report["filters_source"] == "user" and "filters_extracted" not in user.report
    assert all(s["period"] == "2023" for s in user)
    # nothing extracted: exactly the unfiltered search
    none = layered.retrieve("why did revenue fall", top_k=5)
    assert none.report["filters"] is None and ids(none) == ids(b.retrieve("why did revenue fall", top_k=5))
    # extracted filters matching nothing never narrow to nothing (and never go wider than unfiltered)
    miss = layered.retrieve("ACME US revenue 2022 tariffs", top_k=5)
    unfiltered = ids(b.retrieve("ACME US revenue 2022 tariffs", top_k=5))
    assert set(ids(miss)) <= set(unfiltered) and miss


def test_extracted_competitor_filter_is_refused():
    gl = GlossaryQueryRewriter(groups=[GlossaryGroup(("Globex", "GLOBEX_INC"), "entity")])
    layered = LayeredRetriever(base(), gate=SecurityGate(["GLOBEX_INC"]), auto_filters=AutoFilterExtractor(gl))
    out = layered.retrieve("GLOBEX_INC revenue", top_k=5)
    assert out.status == "refused"  # the question itself names the competitor id
    layered = LayeredRetriever(base(), gate=SecurityGate(["GLOBEX_INC"]), auto_filters=AutoFilterExtractor(gl))
    out = layered.retrieve("globex revenue", top_k=5)
    assert any(r["kind"] == "extracted_filter" for r in out.refused)


# ---------------------------------------------------------------- RESTRICTED
def test_no_layer_ever_sees_or_sends_restricted_text(chat):
    script_for(chat, {
        "would answer": answer(f"revenue fell tariffs {SECRET}?"),
        "different words": answer("revenue fell\ntariffs merger plan"),
        "step-back": answer("merger plan revenue"),
        "Split the question": answer("revenue fell tariffs\nmerger plan ACME China"),
        "SIMPLE": answer("COMPLEX"),
        "YES or NO": answer("YES"),
        "keyword search": answer("merger plan"),
    })
    p = provider(chat)
    for excl in (True, False):
        b = base(exclude_restricted=excl)
        stacks = [make_query_layers(b, transform=t, decompose="llm", adaptive="llm", corrective="llm",
                                    auto_filters="on", postprocessor="mmr,lost_in_middle,compress:60",
                                    provider=p) for t in ("hyde", "rag_fusion", "step_back")]
        multi = MultiIndexRetriever({"a": b, "b": base(exclude_restricted=excl)})
        stacks.append(make_query_layers(multi, transform="rag_fusion", corrective="on", provider=p))
        for layered in stacks:
            for q in ("revenue fell tariffs merger plan", "ACME China 2023 merger plan", "为什么营收下滑"):
                out = layered.retrieve(q, top_k=10)
                dumped = json.dumps(out) + json.dumps(out.report)
                assert SECRET not in dumped
                for s in out:
                    assert s["chunk_id"] not in ("sec#0", "odd#0")
    assert chat.bodies and all(SECRET not in b for b in chat.bodies)


def test_layers_on_a_multi_index_keep_library_ids():
    multi = MultiIndexRetriever({"a": base(), "b": NarrativeIndexRetriever(NarrativeIndex.from_chunks(
        [chunk("x#0", "Revenue fell at the plant in 2023 due to tariffs.")]))}, min_relative_strength=0)
    layered = make_query_layers(multi, transform="rag_fusion", postprocessor="lost_in_middle")
    out = layered.retrieve("revenue fell tariffs", top_k=5)
    assert {s["library_id"] for s in out} == {"a", "b"}
    assert all(s["layers"] == ["rag_fusion", "lost_in_middle"] for s in out)
    assert layered.retrievers is layered.base.retrievers  # inspection reaches the base


def test_hyde_probe_text_stays_out_of_refusals_too(chat):
    hyde_text = "HYPOTHETICAL revenue fell because of tariffs"
    script_for(chat, {"would answer": answer(hyde_text)})
    layered = make_query_layers(base(), transform="hyde", provider=provider(chat),
                                gate=SecurityGate(["globex"]))
    out = layered.retrieve("tariffs", top_k=5)
    # the glossary turns the probe into "... globex revenue ..." — refused, reported by kind only
    assert {"variant": "<glossary variant of the hyde probe>", "reason": "names competitor entity 'globex'",
            "kind": "glossary"} in out.refused
    assert "hypothetical" not in json.dumps(out.report).lower() and out


def test_llm_filter_extraction_rules_win_and_garbage_is_ignored(chat):
    from ragspine_pipeline.retrieval.query import LLMFilterExtractor

    replies = iter([answer('{"entity": "ACME_EU", "period": "2023", "geography": {"x": 1}}'),
                    answer('{"period": ["2024", "2023"], "topic": "risk"}'), garbage(), answer("[1, 2]")])
    chat.script = lambda body: next(replies)
    ex = LLMFilterExtractor(provider(chat), fallback=AutoFilterExtractor(GLOSSARY))
    f, notes = ex.extract("ACME China margin")  # the rule's entity wins over the model's
    assert f == {"entity": "ACME_CN", "period": "2023"} and "'geography' ignored" in notes[0]
    f, _ = ex.extract("margin")
    assert f == {"period": {"in": ["2023", "2024"]}}  # unknown fields dropped
    assert ex.extract("ACME China margin")[0] == {"entity": "ACME_CN"}  # garbage: rules only
    f, notes = ex.extract("margin")
    assert f == {} and "not a JSON object" in notes[0]
    layered = make_query_layers(base(), auto_filters="llm", provider=provider(chat))
    chat.script = lambda body: answer('{"entity": "NO_SUCH_ENTITY"}')
    out = layered.retrieve("why did revenue fall", top_k=5)  # matches nothing: never narrows to nothing
    assert out and out.report["filters_extracted"] == {"entity": "NO_SUCH_ENTITY"}
    assert all(SECRET not in b for b in chat.bodies)
