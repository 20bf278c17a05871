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
    m = MultiIndexRetriever({"reports": a, "policies": b})
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
