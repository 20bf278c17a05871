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
