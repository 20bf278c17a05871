from ragspine_pipeline.retrieval.chunking.chunking import chunk_document
from ragspine_pipeline.retrieval.link.multi_index import MultiIndexRetriever
from ragspine_pipeline.retrieval.link.narrative_link import NarrativeIndex, NarrativeIndexRetriever


def lib(docs, name):
    chunks = []
    for doc_id, text, label in docs:
        chunks += chunk_document(text, doc_id=f"{name}/{doc_id}", metadata={"sensitivity": label})
    return NarrativeIndexRetriever(NarrativeIndex.from_chunks(chunks, library_id=name))


def test_fusion_provenance_gate_and_router_fallback():
    filler = [(f"f{i}", f"unrelated filler text number {i} about weather", "PUBLIC") for i in range(6)]
    a = lib([("r1", "lyon plant closure energy costs lyon", "PUBLIC"), ("r2", "lyon plant closure", "PUBLIC"),
             ("s", "lyon plant closure SECRET", "RESTRICTED")] + filler, "reports")
    b = lib([("p1", "a long travel policy that mentions a plant once among very many other words "
                    "about hotels flights meals receipts approvals and reimbursement limits", "PUBLIC")] + filler,
            "policies")
    best = {name: r.retrieve("lyon plant closure", top_k=1)[0]["scores"]["bm25"] for name, r in
            (("reports", a), ("policies", b))}
    assert best["policies"] < 0.5 * best["reports"]  # the data makes policies the weak library
    m = MultiIndexRetriever({"reports": a, "policies": b}, min_relative_strength=0.5)  # the opt-in gate
    out = m.retrieve("lyon plant closure", top_k=5)
    assert {s["library_id"] for s in out} == {"reports"}  # weak library gated out
    assert {s["doc_id"] for s in out} == {"reports/r1", "reports/r2"}
    both = MultiIndexRetriever({"reports": a, "policies": b}, min_relative_strength=0.0).retrieve("plant", top_k=5)
    assert {s["library_id"] for s in both} == {"reports", "policies"}
    assert [s["rank"] for s in both] == list(range(1, len(both) + 1))
    assert all("SECRET" not in s["text"] for s in both)

    def broken(query):
        raise RuntimeError("router down")

    assert MultiIndexRetriever({"reports": a, "policies": b}, router=broken).route("q") == ["policies", "reports"]
    assert MultiIndexRetriever({"reports": a, "policies": b}, router=lambda q: ["policies"]).route("q") == ["policies"]
    assert MultiIndexRetriever({"reports": a, "policies": b}, router=lambda q: ["nope"]).route("q") == ["policies", "reports"]


def lib_meta(docs, name):
    """docs: (doc_id, text, entity, period) — every document PUBLIC."""
    chunks = []
    for doc_id, text, entity, period in docs:
        chunks += chunk_document(text, doc_id=f"{name}/{doc_id}",
                                 metadata={"sensitivity": "PUBLIC", "entity": entity, "period": period})
    return NarrativeIndexRetriever(NarrativeIndex.from_chunks(chunks, library_id=name))


def _two_libraries():
    reports = lib_meta([("us", "us plant closure and margin", "ACME_US", "2023"),
                        ("cn", "cn plant closure plant closure", "ACME_CN", "2023")], "reports")
    policies = lib_meta([(f"p{i}", f"plant closure policy number {i}", "ACME_EU", "2022") for i in range(5)],
                        "policies")
    return MultiIndexRetriever({"reports": reports, "policies": policies}, min_relative_strength=0.0)


def test_filter_relaxation_is_global_never_per_library():
    """A library with no match under the filter must not add unfiltered hits."""
    m = _two_libraries()
    out = m.retrieve("plant closure", filters={"entity": "ACME_US"}, top_k=5)
    assert [s["doc_id"] for s in out] == ["reports/us"]
    assert all(s["entity"] == "ACME_US" and s["filters_relaxed"] is False for s in out)


def test_filter_relaxed_only_when_empty_everywhere_and_then_for_every_snippet():
    m = _two_libraries()
    out = m.retrieve("plant closure", filters={"period": {"gte": "2030"}}, top_k=4)
    assert len(out) == 4 and {s["library_id"] for s in out} == {"reports", "policies"}
    assert all(s["filters_relaxed"] is True for s in out)
    # Relaxation off: an empty answer, not an unfiltered one.
    strict = MultiIndexRetriever(m.retrievers, min_relative_strength=0.0, retry_without_filters=False)
    assert strict.retrieve("plant closure", filters={"period": {"gte": "2030"}}, top_k=4) == []
    # The libraries' own retrievers keep their setting (views, not flags flipped in place).
    assert all(r.retry_without_filters for r in m.retrievers.values())
    assert m.retrieve("plant closure", top_k=0) == []


# ------------------------------------------------------------- routing over three libraries
import json  # noqa: E402

import pytest  # noqa: E402
from chat_server import ChatServer, answer, server_error, user_of  # noqa: E402

from ragspine_pipeline.llm.provider import OpenAICompatibleProvider  # noqa: E402
from ragspine_pipeline.retrieval.lexical.analysis.glossary import GlossaryGroup  # noqa: E402
from ragspine_pipeline.retrieval.link.routing import (  # noqa: E402
    FallbackRouter,
    MetadataRouter,
    ProviderRouter,
    describe_library,
    make_router,
)

GLOSSARY = [GlossaryGroup(("营业收入", "revenue"), "metric"), GlossaryGroup(("毛利率", "gross margin"), "metric"),
            GlossaryGroup(("艾克美中国", "ACME China", "ACME_CN"), "entity"),
            GlossaryGroup(("ACME US", "ACME_US"), "entity"), GlossaryGroup(("裁员", "layoffs"), "term")]
SECRET = "Project Bluebird layoffs 420 people"


def three_libraries(with_secret: bool = True):
    def mk(name, docs):
        chunks = []
        for doc_id, text, meta in docs:
            chunks += chunk_document(text, doc_id=f"{name}/{doc_id}", metadata={"sensitivity": "PUBLIC", **meta})
        return NarrativeIndexRetriever(NarrativeIndex.from_chunks(chunks, library_id=name))

    reports = mk("reports", [
        ("cn", "ACME China revenue fell 12.4% in 2023; gross margin narrowed.", {"entity": "ACME_CN", "topic": "results"}),
        ("us", "ACME US revenue grew 9.7% in 2023.", {"entity": "ACME_US", "topic": "results"})])
    policies = mk("policies", [
        ("travel", "Travel policy: hotel limits and meal allowances.", {"entity": "ACME_GROUP", "topic": "policy"}),
        ("fx", "Policy on hedging foreign-exchange exposure.", {"entity": "ACME_GROUP", "topic": "policy"})])
    hr_docs = [("handbook", "The HR handbook covers leave and onboarding.", {"entity": "ACME_GROUP", "topic": "hr"})]
    if with_secret:  # RESTRICTED, in this library only
        hr_docs.append(("plan", f"{SECRET} at ACME China, revenue impact", {"entity": "ACME_CN", "topic": "hr",
                                                                           "sensitivity": "RESTRICTED"}))
    hr = mk("hr", hr_docs)
    return {"reports": reports, "policies": policies, "hr": hr}


def test_three_library_rules_router_success():
    libs = three_libraries()
    router = MetadataRouter.from_retrievers(libs, GLOSSARY)
    m = MultiIndexRetriever(libs, router=router, min_relative_strength=0.0)
    assert m.route("why did ACME China revenue fall") == ["reports"]
    assert m.route("what does the travel policy say about hotels") == ["policies"]
    assert m.route("HR handbook leave") == ["hr"]
    out = m.retrieve("why did ACME China revenue fall", top_k=5)
    assert out and {s["library_id"] for s in out} == {"reports"}
    assert router.last["picked"] == ["reports"] and router.last["features"]["entities"] == ["ACME_CN"]


def test_three_library_router_failure_or_empty_choice_searches_all():
    libs = three_libraries()
    rules = MetadataRouter.from_retrievers(libs, GLOSSARY)
    assert rules("weather in Lyon") == []  # nothing matched
    assert MultiIndexRetriever(libs, router=rules).route("weather in Lyon") == ["hr", "policies", "reports"]
    with ChatServer() as srv:
        srv.script = lambda body: server_error()
        llm = ProviderRouter(OpenAICompatibleProvider(base_url=srv.url, model="m", timeout=10),
                             {lib: describe_library(p) for lib, p in zip(sorted(libs), rules.profiles, strict=True)})
        m = MultiIndexRetriever(libs, router=llm, min_relative_strength=0.0)
        assert m.route("why did ACME China revenue fall") == ["hr", "policies", "reports"]  # failure: all
        out = m.retrieve("revenue", top_k=10)
        assert out and {s["library_id"] for s in out} == {"reports"}  # every library searched, reports matched
        # The model's choice wins when it answers; garbage falls back to the rules.
        srv.script = lambda body: answer(json.dumps(["policies"]))
        assert MultiIndexRetriever(libs, router=FallbackRouter([llm, rules])).route("ACME China revenue") == ["policies"]
        srv.script = lambda body: answer("I think reports?")
        assert MultiIndexRetriever(libs, router=FallbackRouter([llm, rules])).route("ACME China revenue") == ["reports"]
        srv.script = lambda body: answer(json.dumps(["nope"]))
        assert MultiIndexRetriever(libs, router=llm).route("ACME China revenue") == ["hr", "policies", "reports"]
        assert all(SECRET not in b for b in srv.bodies)  # descriptions are metadata of served chunks only
        assert all("sensitivity" not in user_of(json.loads(b)) for b in srv.bodies)


def test_three_library_restricted_in_one_library_only():
    libs, clean = three_libraries(with_secret=True), three_libraries(with_secret=False)
    r_secret = MetadataRouter.from_retrievers(libs, GLOSSARY)
    r_clean = MetadataRouter.from_retrievers(clean, GLOSSARY)
    assert r_secret.profiles == r_clean.profiles  # routing never depends on RESTRICTED content
    hr = next(p for p in r_secret.profiles if p.library_id == "hr")
    assert "ACME_CN" not in hr.entities  # only the RESTRICTED plan names ACME China
    for q in ("Project Bluebird layoffs", "ACME China layoffs", "why did ACME China revenue fall", "HR handbook"):
        assert r_secret(q) == r_clean(q)
        out = MultiIndexRetriever(libs, router=r_secret, min_relative_strength=0.0).retrieve(q, top_k=10)
        assert all(SECRET not in s["text"] and s["sensitivity"] != "RESTRICTED" for s in out)


def test_make_router_choices(monkeypatch):
    libs = three_libraries()
    assert isinstance(make_router(None, libs), MetadataRouter)
    assert make_router("none", libs) is None
    with pytest.raises(ValueError, match="unknown router"):
        make_router("magic", libs)
    monkeypatch.delenv("RAGSPINE_LLM_BASE_URL", raising=False)
    with pytest.raises(ValueError, match="needs an LLM provider"):
        make_router("llm", libs)
    with ChatServer() as srv:
        srv.script = lambda body: answer(json.dumps(["hr"]))
        monkeypatch.setenv("RAGSPINE_LLM_BASE_URL", srv.url)
        assert MultiIndexRetriever(libs, router=make_router("llm", libs)).route("anything") == ["hr"]
