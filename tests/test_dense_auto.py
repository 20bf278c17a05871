"""auto (model + fusion per library from the eval table), the fusion alternatives, the
vector cache, batching/progress, and the benchmark's offline fusion == the product's."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest

from ragspine_pipeline.paths import DEMO_ROOT
from ragspine_pipeline.retrieval.chunking.chunking import Chunk as _Chunk
from ragspine_pipeline.retrieval.chunking.chunking import SourceLocator
from ragspine_pipeline.retrieval.hybrid.fusion import (
    FusionConfig,
    convex_fuse,
    fusion_from_env,
    rrf_fuse,
    weighted_rrf_fuse,
)
from ragspine_pipeline.retrieval.hybrid.retriever import HybridRetriever
from ragspine_pipeline.retrieval.vector.auto_policy import (
    GROUP_SETS,
    POLICY_FILE,
    AutoEmbeddingBackend,
    choice_for_group,
    derive_policy,
    load_policy,
)
from ragspine_pipeline.retrieval.vector.batching import (
    embed_in_batches,
    log_progress,
    tqdm_progress,
)
from ragspine_pipeline.retrieval.vector.embedding_backends import DeterministicHashBackend
from ragspine_pipeline.retrieval.vector.language_profile import chunk_group, profile, text_group
from ragspine_pipeline.vector_cache import CachingEmbeddingBackend

ROOT = Path(__file__).resolve().parents[1]
TABLE = ROOT / "benchmarks" / "results" / "dense.json"

EN = ["The plant in Lyon was closed because the energy costs tripled and the building was old.",
      "Revenue fell in the second half of the year as the price war with the competitors went on.",
      "The board approved a new policy on travel expenses and on the use of company cars.",
      "Gross margin decreased because of higher input costs and of the weaker demand in Europe."]
ZH = ["2023年艾克美中国营业收入同比下降12.4%，主要原因是房地产市场低迷。",
      "毛利率下降的原因是价格战和原材料成本上升。", "公司董事会批准了新的差旅费用政策。",
      "里昂工厂因能源成本上涨三倍而关闭。"]


def Chunk(*, chunk_id, doc_id, text, language=""):
    return _Chunk(chunk_id=chunk_id, doc_id=doc_id, title=doc_id, text=text,
                  source_locator=SourceLocator(doc_id, 0, len(text)), language=language)


def _chunks(texts, lang=""):
    return [Chunk(chunk_id=f"c{i:02d}", doc_id=f"d{i:02d}", text=t, language=lang) for i, t in enumerate(texts)]


class Counting(DeterministicHashBackend):
    def __post_init__(self):
        super().__post_init__()
        self.queries = 0

    def embed_queries(self, texts):
        self.queries += len(texts)
        return self.embed_texts(texts)


def _policy(en=("minilm", "convex", 0.5), cjk=("e5", "rrf", 0.0)):
    def c(m, meth, w):
        return {"model": m, "method": meth, "weight": w, "reason": "test"}
    return {"choices": {"en": c(*en), "cjk": c(*cjk), "other": c("e5", "rrf", 1.0), "mixed": c("e5", "rrf", 0.0)}}


# ------------------------------------------------------------------------------ fusion
def test_weighted_rrf_with_unit_weights_is_rrf_exactly():
    runs = [["a", "b", "c"], ["c", "a", "d"], ["b", "b", "e"]]
    assert weighted_rrf_fuse([(r, 1.0) for r in runs]) == rrf_fuse(runs)
    assert list(weighted_rrf_fuse([(r, 1.0) for r in runs])) == list(rrf_fuse(runs))


def test_weighted_rrf_zero_weight_drops_the_channel():
    assert weighted_rrf_fuse([(["a", "b"], 1.0), (["z", "b"], 0.0)]) == rrf_fuse([["a", "b"]])
    fused = weighted_rrf_fuse([(["a", "b"], 1.0), (["b", "a"], 0.5)])
    assert fused["a"] == pytest.approx(1 / 61 + 0.5 / 62) and fused["b"] == pytest.approx(1 / 62 + 0.5 / 61)
    with pytest.raises(ValueError):
        weighted_rrf_fuse([(["a"], -1.0)])


def test_convex_fuse_normalises_each_channel():
    fused = convex_fuse({"a": 10.0, "b": 5.0, "c": 0.0}, {"c": 0.9, "b": 0.5, "d": 0.1}, 0.5)
    assert fused["a"] == pytest.approx(0.5) and fused["b"] == pytest.approx(0.5 * 0.5 + 0.5 * 0.5)
    assert fused["c"] == pytest.approx(0.5) and fused["d"] == pytest.approx(0.0)
    assert list(fused)[:3] == ["a", "b", "c"] or list(fused)[:3] == ["a", "c", "b"]
    assert list(convex_fuse({"x": 1.0}, {}, 0.0)) == ["x"]
    with pytest.raises(ValueError):
        convex_fuse({}, {}, 1.5)


def test_fusion_config_validation_and_env(monkeypatch):
    with pytest.raises(ValueError):
        FusionConfig(method="sum")
    with pytest.raises(ValueError):
        FusionConfig(method="rrf", dense_weight=0.5)
    with pytest.raises(ValueError):
        FusionConfig(method="convex", dense_weight=2.0)
    monkeypatch.delenv("RAGSPINE_FUSION", raising=False)
    monkeypatch.delenv("RAGSPINE_FUSION_DENSE_WEIGHT", raising=False)
    assert fusion_from_env() == FusionConfig()
    monkeypatch.setenv("RAGSPINE_FUSION", "convex")
    assert fusion_from_env() == FusionConfig("convex", 0.5, source="env")
    monkeypatch.setenv("RAGSPINE_FUSION_DENSE_WEIGHT", "0.3")
    assert fusion_from_env().dense_weight == 0.3
    monkeypatch.setenv("RAGSPINE_FUSION", "bogus")
    with pytest.raises(ValueError, match="RAGSPINE_FUSION"):
        fusion_from_env()


def test_default_hybrid_output_is_unchanged_rrf():
    """No fusion configured: the fused scores are exactly RRF k=60 over the two channels."""
    b = DeterministicHashBackend()
    hr = HybridRetriever(_chunks(EN), embedding_backend=b)
    assert hr.fusion == FusionConfig()
    bm = HybridRetriever(_chunks(EN), channels=("bm25",))
    hits = hr.search("energy costs plant", top_k=4)
    bm_ids = [bm.chunks[h.position].chunk_id for h in bm.search("energy costs plant", top_k=300)]
    dense = hr.with_channels(("dense",)).search("energy costs plant", top_k=300)
    ref = rrf_fuse([bm_ids, [d.chunk.chunk_id for d in dense]])
    assert [(h.chunk.chunk_id, h.fused) for h in hits] == list(ref.items())[:4]
    assert hits[0].fusion["method"] == "rrf" and hits[0].fusion["model"] == b.model_id


def test_bm25_only_retriever_has_no_fusion_key():
    hits = HybridRetriever(_chunks(EN), channels=("bm25",)).search("energy", top_k=2)
    assert all(h.fusion is None for h in hits)


# ---------------------------------------------------------------- bench == product
@pytest.mark.parametrize("method,w", [("rrf", 1.0), ("weighted_rrf", 0.5), ("weighted_rrf", 1.5),
                                      ("convex", 0.3), ("convex", 0.9)])
def test_benchmark_offline_fusion_equals_product(method, w):
    from benchmarks.bench_dense import fuse

    texts = EN * 3 + ["energy prices and plant closures in Lyon", "costs of energy"]
    chunks = [Chunk(chunk_id=f"c{i:02d}", doc_id=f"d{i:02d}", text=t + f" #{i}") for i, t in enumerate(texts)]
    b = DeterministicHashBackend()
    hr = HybridRetriever(chunks, embedding_backend=b, fusion=FusionConfig(method, w) if method != "rrf" else None)
    for q in ["energy costs plant", "revenue price war", "policy on cars"]:
        bh = hr.with_channels(("bm25",)).search(q, top_k=300)
        dh = hr.with_channels(("dense",)).search(q, top_k=300)
        b_ids = np.array([h.position for h in bh]), np.array([h.bm25 for h in bh])
        d_ids = np.array([h.position for h in dh]), np.array([h.vector for h in dh])
        offline = fuse(method, w, b_ids[0], b_ids[1], d_ids[0], d_ids[1]).tolist()
        product = [h.position for h in hr.search(q, top_k=300)]
        assert offline == product


# ------------------------------------------------------------------- language + policy
def test_language_groups():
    assert text_group(EN[0]) == "en"
    assert text_group("Der Vorstand hat die neue Richtlinie für Dienstreisen und Firmenwagen genehmigt.") == "latin"
    assert text_group(ZH[0]) == "cjk"
    assert text_group("Совет директоров утвердил новую политику.") == "cyrillic"
    assert text_group("وافق مجلس الإدارة على السياسة الجديدة") == "arabic"
    assert text_group("คณะกรรมการอนุมัตินโยบายใหม่") == "thai"
    assert chunk_group(EN[0], "zh-CN") == "cjk"  # declared metadata wins
    p = profile([(t, None) for t in EN + ZH[:1]])
    assert p.dominant == "en" and p.dominant_share == pytest.approx(0.8)


def _rows(bm25, cands):
    rows = [{"set": s, "model": "bm25", "method": "bm25", "weight": 0.0, "ndcg@10_select": v} for s, v in bm25.items()]
    for (s, m, meth, w), v in cands.items():
        rows.append({"set": s, "model": m, "method": meth, "weight": w, "ndcg@10_select": v})
    return rows


def test_derive_policy_guard_and_choice():
    bm25 = {"scifact": 0.60, "cranfield": 0.40, "cmrc2018-trial": 0.95}
    cands = {("scifact", "minilm", "rrf", 1.0): 0.66, ("cranfield", "minilm", "rrf", 1.0): 0.43,
             ("scifact", "e5", "rrf", 1.0): 0.70, ("cranfield", "e5", "rrf", 1.0): 0.39,  # hurts cranfield
             ("scifact", "minilm", "convex", 0.5): 0.66, ("cranfield", "minilm", "convex", 0.5): 0.43,
             ("cmrc2018-trial", "e5", "rrf", 1.0): 0.94, ("cmrc2018-trial", "e5", "dense", 1.0): 0.93,
             ("cmrc2018-trial", "e5", "weighted_rrf", 0.25): 0.95}
    pol = derive_policy(_rows(bm25, cands), ["e5", "minilm"])
    # e5 has the larger mean gain on English but loses on cranfield: the guard rules it out;
    # minilm rrf and convex tie: plain RRF wins the tie.
    assert (pol["en"]["model"], pol["en"]["method"], pol["en"]["weight"]) == ("minilm", "rrf", 1.0)
    # nothing beats BM25 on CMRC (a tie is not a gain): dense weight 0, hybrid is BM25
    assert pol["cjk"]["weight"] == 0.0 and pol["cjk"]["model"] == "e5"
    assert "guard" in pol["cjk"]["reason"]
    # a set nobody embedded does not vote, and the evidence says so
    pol2 = derive_policy(_rows({**bm25, "cranfield": 0.40}, {k: v for k, v in cands.items() if k[0] != "scifact"}),
                         ["e5", "minilm"])
    assert pol2["en"]["evidence"]["unmeasured_sets"] == ["scifact"] and pol2["en"]["model"] == "minilm"


def test_auto_guard_weight_zero_is_bm25_exactly_and_embeds_no_query():
    b = Counting()
    auto = AutoEmbeddingBackend(lambda m: b, _policy())
    hr = HybridRetriever(_chunks(ZH), embedding_backend=auto)
    assert hr.auto_choice.group == "cjk" and hr.fusion.dense_weight == 0
    bm = HybridRetriever(_chunks(ZH), channels=("bm25",))
    for q in ["营业收入下降", "工厂关闭"]:
        got = [(h.chunk.chunk_id, h.bm25, h.fused) for h in hr.search(q, top_k=4)]
        want = [(h.chunk.chunk_id, h.bm25, h.fused) for h in bm.search(q, top_k=4)]
        assert got == want
    assert b.queries == 0 and b.texts_embedded == 0


def test_auto_picks_model_and_fusion_per_library_and_reports_them(monkeypatch):
    monkeypatch.delenv("RAGSPINE_FUSION", raising=False)
    monkeypatch.delenv("RAGSPINE_FUSION_DENSE_WEIGHT", raising=False)
    made = {}

    def factory(m):
        made[m] = Counting()
        made[m].model_id = f"test-{m}"
        return made[m]

    auto = AutoEmbeddingBackend(factory, _policy())
    hr = HybridRetriever(_chunks(EN), embedding_backend=auto)
    assert hr.auto_choice.model == "minilm" and hr.fusion == FusionConfig("convex", 0.5, source="auto:en")
    hits = hr.search("energy costs", top_k=2)
    assert hits[0].fusion["model"] == "test-minilm" and hits[0].fusion["auto_group"] == "en"
    assert made["minilm"].queries == 1  # the query is embedded with the model that embedded the chunks
    monkeypatch.setenv("RAGSPINE_FUSION", "weighted_rrf")  # explicit env beats auto's fusion, not its model
    hr2 = HybridRetriever(_chunks(EN), embedding_backend=auto)
    assert hr2.fusion.method == "weighted_rrf" and hr2.auto_choice.model == "minilm"


def test_restricted_chunks_never_vote_in_auto(monkeypatch):
    """Non-interference: a RESTRICTED Chinese majority must not move an English library's
    model, fusion or any served score."""
    monkeypatch.delenv("RAGSPINE_FUSION", raising=False)
    monkeypatch.delenv("RAGSPINE_FUSION_DENSE_WEIGHT", raising=False)

    def factory(m):
        b = DeterministicHashBackend()
        b.model_id = f"test-{m}"
        return b

    auto = AutoEmbeddingBackend(factory, _policy())
    public = _chunks(EN)
    secret = [_Chunk(chunk_id=f"r{i:02d}", doc_id=f"r{i:02d}", title="r", text=t * 3, language="zh",
                     source_locator=SourceLocator(f"r{i:02d}", 0, len(t) * 3), sensitivity="RESTRICTED")
              for i, t in enumerate(ZH * 3)]
    alone = HybridRetriever(public, embedding_backend=auto)
    mixed = HybridRetriever(public + secret, embedding_backend=auto)
    assert mixed.auto_choice.model == alone.auto_choice.model == "minilm"
    assert mixed.fusion == alone.fusion and mixed.fusion_info() == alone.fusion_info()


def test_unmeasured_group_uses_other():
    c = choice_for_group("hebrew", _policy())
    assert c.model == "e5" and "unmeasured" in c.reason


@pytest.mark.skipif(not TABLE.exists() or not POLICY_FILE.exists(), reason="no committed table / policy")
def test_shipped_auto_policy_is_what_the_committed_table_justifies():
    """The shipped choices are exactly derive_policy over the committed table's rows."""
    table = json.loads(TABLE.read_text())
    shipped = load_policy()
    assert derive_policy(table["rows"], shipped["models"]) == shipped["choices"]
    assert table["policy"] == shipped["choices"]
    # and the resolution of each measured set's corpus group is the policy's group choice
    by_set = {a["set"]: a for a in table["auto"] if not a.get("missing")}
    for group, sets in GROUP_SETS.items():
        for s in sets:
            if s in by_set:
                assert by_set[s]["choice"]["group"] == group
                want = choice_for_group(group)
                assert by_set[s]["choice"]["model"] == want.model
                assert by_set[s]["fusion"]["dense_weight"] == want.fusion.dense_weight


# ------------------------------------------------------------------ cache + batching
def test_caching_backend_embeds_each_text_once(tmp_path):
    b = Counting()
    seen = []
    c = CachingEmbeddingBackend(b, tmp_path, flush_every=2, progress=lambda d, t: seen.append((d, t)))
    v1 = c.embed_texts(EN)
    assert b.texts_embedded == 4 and seen[-1] == (4, 4) and len(seen) == 2
    assert len(list(c.folder.glob("passage-*.npz"))) == 2
    q = c.embed_queries(["energy"])
    c2 = CachingEmbeddingBackend(b, tmp_path)
    assert c2.embed_texts(EN[::-1]) == v1[::-1] and c2.embed_queries(["energy"]) == q
    assert b.texts_embedded == 5  # nothing re-embedded by the second instance
    assert c2.embedded == {"passage": 0, "query": 0}


def test_embed_in_batches_and_progress_hooks():
    b = Counting()
    seen = []
    out = embed_in_batches(b, EN + ZH, batch=3, progress=lambda d, t: seen.append(d))
    assert out.shape == (8, 256) and seen == [3, 6, 8] and b.calls == 3
    np.testing.assert_allclose(out, np.asarray(b.embed_texts(EN + ZH)), atol=1e-7)
    logged = []
    hook = log_progress(logged.append, "embeddings[lib]", every=0.5)
    for d in range(1, 11):
        hook(d, 10)
    assert logged[0] == "embeddings[lib]: 1/10 (10%)" and logged[-1] == "embeddings[lib]: 10/10 (100%)"
    assert len(logged) == 3


def test_tqdm_progress_quiet_when_not_a_terminal(monkeypatch):
    monkeypatch.setattr("sys.stderr", io.StringIO())  # not a tty
    assert tqdm_progress("x") is None
    assert tqdm_progress("x", enabled=False) is None
    buf = io.StringIO()
    hook = tqdm_progress("embed", stream=buf)
    hook(5, 10)
    hook(10, 10)
    assert "embed" in buf.getvalue()


def test_retriever_reports_embedding_progress():
    b = Counting()
    seen = []
    hr = HybridRetriever(_chunks(EN), embedding_backend=b, embed_progress=lambda d, t: seen.append((d, t)))
    hr.search("energy", top_k=2)
    assert seen[-1] == (4, 4)


@pytest.mark.slow
def test_int8_e5_close_to_fp32():
    from ragspine_pipeline.retrieval.vector.embedding_backends import make_embedding_backend

    try:
        fp32, int8 = make_embedding_backend("e5"), make_embedding_backend("e5-int8")
    except Exception as exc:  # noqa: BLE001 - no [embed-onnx] here
        pytest.skip(str(exc))
    assert "int8" in int8.model_id and int8.model_id != fp32.model_id
    a, b = np.asarray(fp32.embed_texts(EN + ZH)), np.asarray(int8.embed_texts(EN + ZH))
    assert (a * b).sum(1).min() > 0.97
    # length-sorted batching returns input order
    one = np.asarray([fp32.embed_texts([t])[0] for t in EN[:2]])
    np.testing.assert_allclose(a[:2], one, atol=1e-4)


# ------------------------------------------------------------------------ warehouse
def test_warehouse_auto_records_the_choice_and_the_snapshot_serves_it(tmp_path):
    import shutil

    from ragspine_pipeline.retrieval.link.narrative_link import NarrativeIndexRetriever
    from ragspine_pipeline.retrieval.vector.embedding_backends import make_embedding_backend
    from ragspine_pipeline.warehouse import pipeline as P
    from ragspine_pipeline.warehouse.versioned import VersionedTables

    lib = "acme_policies"
    shutil.copytree(DEMO_ROOT / lib, tmp_path / "corpus" / lib)
    wh = VersionedTables(tmp_path / "wh")
    P.build_raw_documents(wh, tmp_path / "corpus", lib)
    P.build_chunks(wh, lib)
    P.build_lexical_index(wh, lib)
    groups = ["en", "latin", "cyrillic", "arabic", "thai", "cjk", "other", "mixed"]
    pol = {"choices": {g: {"model": "deterministic:64", "method": "convex", "weight": 0.4, "reason": "t"}
                       for g in groups}}
    logs: list[str] = []
    res = P.build_embeddings(wh, lib, AutoEmbeddingBackend(make_embedding_backend, pol), "auto", log=logs.append)
    meta = res.metadata
    assert meta["spec"] == "deterministic:64" and meta["model_id"] == "deterministic-hash-64"
    assert meta["fusion"]["method"] == "convex" and meta["fusion"]["source"].startswith("auto:")
    assert meta["auto"]["model"] == "deterministic:64" and meta["auto"]["profile"]["dominant"]
    assert logs and logs[-1].endswith("(100%)")
    snap = P.publish_snapshot(wh, lib)
    assert snap.metadata["fusion"]["dense_weight"] == 0.4
    idx = P.load_snapshot_index(wh, lib)
    assert idx.retriever.fusion.method == "convex" and idx.retriever.fusion.dense_weight == 0.4
    snippets = NarrativeIndexRetriever(idx).retrieve("travel policy", top_k=2)
    assert snippets[0]["scores"]["fusion"]["method"] == "convex"
    assert snippets[0]["scores"]["fusion"]["model"] == "deterministic-hash-64"
    # A new fusion with the same model and chunks is not silently ignored: a version that
    # embeds nothing carries it, and the next snapshot serves it.
    pol2 = {"choices": {g: {**c, "weight": 0.6} for g, c in pol["choices"].items()}}
    res2 = P.build_embeddings(wh, lib, AutoEmbeddingBackend(make_embedding_backend, pol2), "auto")
    assert res2.metadata["embedded"] == 0 and res2.metadata["fusion"]["dense_weight"] == 0.6
    assert P.publish_snapshot(wh, lib).metadata["fusion"]["dense_weight"] == 0.6
    again = P.build_embeddings(wh, lib, AutoEmbeddingBackend(make_embedding_backend, pol2), "auto")
    assert again.metadata["reused"] is True


def test_dense_english_is_english_and_other_latin_needs_evidence():
    """A document of terms with few English function words stays English (SciFact's
    24721866 and Cranfield's 1395 once gave their English libraries the multilingual
    model); another Latin-script language needs its own function words to outnumber
    English's, or English's to be all but absent (a language without a stop list)."""
    jargon = ("Activation of AMP-activated protein kinase suppresses oxidized low-density "
              "lipoprotein-induced macrophage proliferation. Macrophage-derived foam cells, "
              "oxidized LDL, AMPK activators AICAR metformin, cell cycle arrest, p27Kip1 "
              "expression, ERK phosphorylation, atherosclerotic lesions in ApoE mice.")
    assert text_group(jargon) == "en"
    assert text_group("low density stagnation point heat transfer measurements in the hypersonic "
                      "shock tunnel . low density stagnation point heat transfer rates") == "en"
    assert text_group("Der Vorstand hat die Richtlinie mit einer Mehrheit und ohne Gegenstimmen "
                      "für das nächste Jahr beschlossen, so die Zeitung.") == "latin"
    # Vietnamese (no stop list here): no English function words at all.
    assert text_group("Hội đồng quản trị đã phê duyệt chính sách mới về công tác phí năm nay") == "latin"
    assert profile([(jargon, None, "d1"), ("The board approved the new policy for the year.", None, "d2")]
                   ).languages == ["en"]
