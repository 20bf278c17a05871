"""The Dagster code location over a copy of the demo corpus (dagster.materialize, in-process)."""

import json
import multiprocessing as mp
import os
import shutil
import sys
import time
from pathlib import Path

import duckdb
import pyarrow as pa
import pytest

dg = pytest.importorskip("dagster")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import definitions  # noqa: E402
from assets import library_sensor  # noqa: E402
from ragspine_pipeline.paths import DEMO_ROOT  # noqa: E402
from ragspine_pipeline.retrieval.link.narrative_link import NarrativeIndexRetriever  # noqa: E402
from ragspine_pipeline.sensitivity import is_restricted  # noqa: E402
from ragspine_pipeline.warehouse import pipeline as P  # noqa: E402
from ragspine_pipeline.warehouse.versioned import FAIL_ENV, VersionedTables  # noqa: E402
from resources import RetrievalResource, WarehouseResource  # noqa: E402
from tests.dagster_fixtures import copy_demo_vocabulary  # noqa: E402

LIB = "acme_reports"


@pytest.fixture
def env(tmp_path, monkeypatch):
    corpus = tmp_path / "corpus"
    shutil.copytree(DEMO_ROOT / LIB, corpus / LIB)
    copy_demo_vocabulary(corpus)  # the demo's glossary and dimensions, as this corpus's own
    wh_root = tmp_path / "warehouse"
    monkeypatch.setenv("RAGSPINE_WAREHOUSE", str(wh_root))
    monkeypatch.setenv("RAGSPINE_CORPUS_ROOT", str(corpus))
    warehouse = WarehouseResource(root=str(wh_root), corpus_root=str(corpus))
    return {"corpus": corpus, "wh": VersionedTables(wh_root), "warehouse": warehouse,
            "instance": dg.DagsterInstance.ephemeral(), "root": wh_root}


def run(env, run_config=None):
    return definitions.materialize_library(LIB, env["instance"], env["warehouse"], run_config)


def mat_md(result, key):
    (ev,) = [e for e in result.get_asset_materialization_events() if e.asset_key.to_user_string() == key]
    return {k: v.value for k, v in ev.step_materialization_data.materialization.metadata.items()}


def test_definitions_load_and_every_asset_is_described():
    defs = definitions.defs
    repo = defs.get_repository_def()
    keys = {k.to_user_string() for k in repo.asset_graph.get_all_asset_keys()}
    assert keys == {"raw_documents", "chunks", "lexical_index", "embeddings", "raptor_tree", "relation_graph",
                    "retrieval_snapshot", "catalog", "rerank_document_vectors", "page_images"}
    for key in repo.asset_graph.get_all_asset_keys():
        node = repo.asset_graph.get(key)
        assert node.description and node.group_name and node.owners and node.code_version
        assert node.kinds
    assert {j.name for j in repo.get_all_jobs()} >= {"refresh_library", "ask"}


def test_full_then_incremental_refresh(env):
    first = run(env)
    assert first.success
    checks = first.get_asset_check_evaluations()
    assert checks and all(c.passed for c in checks), [c.check_name for c in checks if not c.passed]
    md = mat_md(first, "chunks")
    assert md["new"] == 27 and md["changed"] == 0 and md["version"] == "v000001"
    before = {c.doc_id: c.version for c in P.active_chunks(env["wh"], LIB)}

    # A refresh with nothing changed publishes nothing new.
    snap = env["wh"].latest(P.SNAPSHOT, LIB).version
    again = run(env)
    assert mat_md(again, "chunks")["reused"] is True and mat_md(again, "chunks")["version"] == "v000001"
    assert env["wh"].latest(P.SNAPSHOT, LIB).version == snap
    assert env["wh"].versions(P.RAW, LIB) == ["v000001"]

    # Edit one, add one, delete one.
    lib = env["corpus"] / LIB
    p = lib / "pr_us_datacenter.md"
    p.write_text(p.read_text(encoding="utf-8") + "\n\nUpdate: orders doubled in Q4.\n", encoding="utf-8")
    (lib / "pr_new_item.md").write_text("# New item\n\nACME opened a lab in Osaka.\n", encoding="utf-8")
    (lib / "pr_eu_lyon.md").unlink()
    (lib / "pr_eu_lyon.meta.json").unlink()
    second = run(env)
    md2 = mat_md(second, "chunks")
    assert (md2["new"], md2["changed"], md2["withdrawn"], md2["unchanged"]) == (1, 1, 1, 25)
    after = {c.doc_id: c.version for c in P.active_chunks(env["wh"], LIB)}
    assert after[f"{LIB}/pr_us_datacenter"] == before[f"{LIB}/pr_us_datacenter"] + 1
    assert after[f"{LIB}/pr_new_item"] == 1 and f"{LIB}/pr_eu_lyon" not in after
    for doc, v in before.items():
        if doc not in (f"{LIB}/pr_us_datacenter", f"{LIB}/pr_eu_lyon"):
            assert after[doc] == v  # untouched documents keep their version
    # The old version is still readable for point-in-time queries.
    old = P.active_chunks(env["wh"], LIB, "v000001")
    assert f"{LIB}/pr_eu_lyon" in {c.doc_id for c in old}

    # The catalog exposes the published tables to a read-only notebook connection.
    con = duckdb.connect(str(env["root"] / "catalog.duckdb"), read_only=True)
    n = con.execute(f"SELECT count(*) FROM chunks_{LIB} WHERE active").fetchone()[0]
    versions = con.execute(f"SELECT max(version) FROM chunks_{LIB} WHERE doc_id = ?",
                           [f"{LIB}/pr_us_datacenter"]).fetchone()[0]
    con.close()
    # The catalog shows the active chunks of open documents only (RESTRICTED ones are left out).
    assert n == len(P.served_chunks(env["wh"], LIB, env["wh"].latest(P.CHUNKS, LIB).version)) and versions == 2


def test_crash_before_publish_keeps_previous_snapshot_serving(env, monkeypatch):
    assert run(env).success
    retrieval = RetrievalResource(warehouse_root=str(env["root"]))
    before = retrieval.ask("why close the Lyon plant", top_k=3)
    snap = env["wh"].latest(P.SNAPSHOT, LIB).version
    (env["corpus"] / LIB / "pr_eu_lyon.md").write_text("# Lyon\n\nCompletely rewritten text.\n", encoding="utf-8")
    monkeypatch.setenv(FAIL_ENV, "chunks")
    with pytest.raises(Exception, match="injected failure"):
        run(env)
    monkeypatch.delenv(FAIL_ENV)
    assert env["wh"].latest(P.SNAPSHOT, LIB).version == snap
    assert env["wh"].latest(P.CHUNKS, LIB).version == "v000001"  # written v2 exists, unpublished
    assert "v000002" in env["wh"].versions(P.CHUNKS, LIB)
    assert retrieval.ask("why close the Lyon plant", top_k=3) == before
    # The next refresh recovers and publishes the change.
    assert run(env).success
    assert retrieval.ask("Completely rewritten", top_k=1)[0]["doc_id"] == f"{LIB}/pr_eu_lyon"


def _read_once(root: str, lib: str) -> tuple[str, int, int]:
    con = duckdb.connect(str(Path(root) / "catalog.duckdb"), read_only=True)
    try:
        rows = con.execute(f"SELECT count(*), count(DISTINCT doc_id) FROM chunks_{lib} WHERE active").fetchone()
        sid = con.execute("SELECT snapshot_id FROM snapshots WHERE library = ?", [lib]).fetchone()[0]
    finally:
        con.close()
    return (sid, *rows)


def _reader(root: str, lib: str, ready, stop, out):
    """Another process: query the catalog read-only until told to stop; check each
    snapshot is whole. Sets ``ready`` after its first good read and reads once more after
    ``stop``, so it always sees the state before and after the refreshes — no clock."""
    seen, errors, reads = set(), [], 0
    while True:
        stopping = stop.is_set()
        try:
            seen.add(_read_once(root, lib))
            reads += 1
            ready.set()
        except Exception as exc:  # noqa: BLE001
            errors.append(repr(exc))
            if len(errors) > 50:
                ready.set()
                break
        if stopping:
            break
        stop.wait(0.02)
    out.put({"seen": sorted(map(str, seen)), "errors": errors, "reads": reads,
             "sids": sorted({s[0] for s in seen})})


def test_reader_in_another_process_during_refresh(env):
    assert run(env).success
    ctx = mp.get_context("spawn")
    q, ready, stop = ctx.Queue(), ctx.Event(), ctx.Event()
    proc = ctx.Process(target=_reader, args=(str(env["root"]), LIB, ready, stop, q))
    proc.start()
    try:
        assert ready.wait(timeout=120), "the reader process never completed a read"
        for i in range(3):
            p = env["corpus"] / LIB / f"extra_{i}.md"
            p.write_text(f"# Extra {i}\n\nAdded during a refresh {i}.\n", encoding="utf-8")
            assert run(env).success
    finally:
        stop.set()
    res = q.get(timeout=120)
    proc.join(timeout=60)
    assert res["errors"] == []
    final = _read_once(str(env["root"]), LIB)
    assert final[0] in res["sids"] and len(res["sids"]) >= 2  # old and new snapshots, each whole
    assert final[1] == len(P.served_chunks(env["wh"], LIB, env["wh"].latest(P.CHUNKS, LIB).version))


def test_sensor_registers_new_library_and_detects_changes(env):
    instance = env["instance"]
    ctx = dg.build_sensor_context(instance=instance, resources={"warehouse": env["warehouse"]})
    res = library_sensor(ctx)
    assert [r.partition_key for r in res.run_requests] == [LIB]
    assert res.dynamic_partitions_requests[0].partition_keys == [LIB]
    instance.add_dynamic_partitions("library", [LIB])
    ctx2 = dg.build_sensor_context(instance=instance, cursor=res.cursor, resources={"warehouse": env["warehouse"]})
    assert library_sensor(ctx2).run_requests == []
    time.sleep(0.01)
    (env["corpus"] / LIB / "new.md").write_text("# new\n\ntext\n", encoding="utf-8")
    ctx3 = dg.build_sensor_context(instance=instance, cursor=res.cursor, resources={"warehouse": env["warehouse"]})
    assert [r.partition_key for r in library_sensor(ctx3).run_requests] == [LIB]


def _ask(env, config):
    return definitions.defs.get_job_def("ask").execute_in_process(
        run_config={"ops": {"ask_question": {"config": config}}} if config is not None else None,
        resources={"retrieval": RetrievalResource(warehouse_root=str(env["root"]))}, raise_on_error=False)


def test_ask_job_returns_snippets_as_metadata(env):
    assert run(env).success
    result = _ask(env, {"query": "为什么营收下滑", "filters": [{"field": "entity", "value": "ACME_CN"}], "top_k": 3})
    assert result.success
    snippets = result.output_for_node("ask_question")
    assert len(snippets) == 3 and all(s["entity"] == "ACME_CN" for s in snippets)
    # Structured clauses: operands typed by field, list operators, all AND-combined.
    result = _ask(env, {"query": "revenue", "top_k": 20, "filters": [
        {"field": "period", "op": "between", "values": ["2023", "2023"]}, {"field": "version", "op": "gte", "value": "1"}]})
    assert result.success and all(s["period"] == "2023" for s in result.output_for_node("ask_question"))
    # The launchpad's default is a runnable example question.
    default = _ask(env, None)
    assert default.success and default.output_for_node("ask_question")
    # Query layers from the run config: each snippet records the layers that touched it.
    plain = _ask(env, {"query": "why close the Lyon plant", "top_k": 5}).output_for_node("ask_question")
    layered = _ask(env, {"query": "why close the Lyon plant", "top_k": 5, "transform": "rag_fusion",
                         "postprocessor": "lost_in_middle"}).output_for_node("ask_question")
    assert layered and all("lost_in_middle" in s.get("layers", []) for s in layered)
    assert all("layers" not in s for s in plain)


def test_ask_job_config_is_described_with_an_example_and_no_machine_paths(env):
    job = definitions.defs.get_job_def("ask")
    fields = job.graph.node_named("ask_question").definition.config_schema.as_field().config_type.fields
    assert set(fields) == {"query", "filters", "top_k", "transform", "decompose", "adaptive", "corrective",
                           "auto_filters", "postprocessor"}
    assert all(f.description for f in fields.values())
    clause = fields["filters"].config_type.inner_type.inner_type.fields  # Noneable(Array(Shape))
    assert set(clause) == {"field", "op", "value", "values"} and all(f.description for f in clause.values())
    default = job.run_config_schema.config_type.fields["ops"].default_value
    assert default["ask_question"]["config"]["query"]
    blob = json.dumps({"d": default, "desc": {k: f.description for k, f in fields.items()}})
    assert str(ROOT) not in blob and "/tmp" not in blob and "/home" not in blob


def test_ask_job_bad_filter_fails_naming_the_clause(env):
    assert run(env).success
    for clause, words in [
        ({"field": "entity", "value": "NOPE"}, ["filters[1]", "NOPE"]),
        ({"field": "period", "op": "gte", "value": "2023x"}, ["filters[1]", "2023x"]),
        ({"field": "colour", "value": "red"}, ["filters[1]", "colour"]),
        ({"field": "period", "op": "between", "values": ["2022"]}, ["filters[1]", "between"]),
    ]:
        result = _ask(env, {"query": "revenue", "filters": [{"field": "language", "value": "en"}, clause]})
        assert not result.success
        (failure,) = [e for e in result.all_events if e.event_type_value == "STEP_FAILURE"]
        msg = str(failure.event_specific_data.error)
        assert all(w in msg for w in words), msg


def test_unreadable_file_is_withheld_until_it_parses_and_keeps_last_good_version(env):
    assert run(env).success
    doc = f"{LIB}/ir_cn_qa"
    good = (env["corpus"] / LIB / "ir_cn_qa.md").read_bytes()
    (env["corpus"] / LIB / "ir_cn_qa.md").write_bytes(b"\xc3\x28 broken")
    res = run(env)
    md = mat_md(res, "raw_documents")
    assert md["parse_failures"] == 1 and "ir_cn_qa.md" in md["failed_files"][0]
    checks = {c.check_name: c for c in res.get_asset_check_evaluations()}
    assert not checks["parse_failures_zero"].passed and checks["no_orphan_chunks"].passed
    # The last good version stays stored (and indexed) but is not served.
    assert doc in {c.doc_id for c in P.active_chunks(env["wh"], LIB)}
    served = P.load_snapshot_index(env["wh"], LIB)
    assert doc not in {c.doc_id for c in served.retriever.chunks}
    # The opt-out serves the last good version (availability first) ...
    run(env, {"ops": {"chunks": {"config": {"on_parse_error": "serve_last_good"}}}})
    assert doc in {c.doc_id for c in P.load_snapshot_index(env["wh"], LIB).retriever.chunks}
    # ... and once the file parses again it is served by default, with no new version.
    run(env)
    assert doc not in {c.doc_id for c in P.load_snapshot_index(env["wh"], LIB).retriever.chunks}
    (env["corpus"] / LIB / "ir_cn_qa.md").write_bytes(good)
    res = run(env)
    assert mat_md(res, "chunks")["changed"] == 0
    assert doc in {c.doc_id for c in P.load_snapshot_index(env["wh"], LIB).retriever.chunks}


def test_rechunk_with_new_chunker_rechunks_everything(env):
    assert run(env).success
    res = run(env, {"ops": {"chunks": {"config": {"chunker": "paragraph:200:40"}}}})
    md = mat_md(res, "chunks")
    assert md["unchanged"] + md["changed"] == 27 and md["changed"] > 0 and md["chunker"] == "paragraph:200:40"


def test_quality_floor_check_goes_red_when_quality_drops(env, tmp_path, monkeypatch):
    floor = tmp_path / "floor.json"
    floor.write_text(json.dumps({LIB: 0.99}))
    monkeypatch.setenv("RAGSPINE_QUALITY_FLOOR_FILE", str(floor))
    res = run(env)
    (check,) = [c for c in res.get_asset_check_evaluations() if c.check_name == "golden_ndcg_above_floor"]
    assert not check.passed and check.metadata["floor"].value == 0.99
    floor.write_text(json.dumps({LIB: 0.5}))
    res = run(env, {"ops": {"chunks": {"config": {"chunker": "paragraph:120:20"}}}})
    (check,) = [c for c in res.get_asset_check_evaluations() if c.check_name == "golden_ndcg_above_floor"]
    assert check.metadata["ndcg@10"].value > 0 and check.passed == (check.metadata["ndcg@10"].value >= 0.5)


def test_retention_prunes_old_versions_but_keeps_published(env):
    wh = env["wh"]
    for i in range(4):
        pub = wh.write("scratch", LIB, {"t": pa.table({"x": [i]})})
    dead = env["root"] / "scratch" / LIB / ".tmp-v000099-dead"
    dead.mkdir()  # an abandoned half-write, older than the grace period
    os.utime(dead, (time.time() - 7200, time.time() - 7200))
    live = env["root"] / "scratch" / LIB / ".tmp-v000100-live"
    live.mkdir()  # a temp folder a live writer may still be filling: left alone
    assert wh.prune("scratch", LIB, keep=2) == []  # every version is inside the default 1 h retention
    removed = wh.prune("scratch", LIB, keep=2, retain_for=0)
    assert removed == ["v000001", "v000002"]
    assert wh.versions("scratch", LIB) == ["v000003", "v000004"] and wh.latest("scratch", LIB).version == pub.version
    assert [p.name for p in (env["root"] / "scratch" / LIB).glob(".tmp-*")] == [live.name]
    # The published version is never pruned, even when it is older than `keep` allows.
    wh.publish(wh.get("scratch", LIB, "v000003"))
    wh.write("scratch", LIB, {"t": pa.table({"x": [9]})}, publish=False)
    wh.write("scratch", LIB, {"t": pa.table({"x": [10]})}, publish=False)
    wh.prune("scratch", LIB, keep=1, retain_for=0)
    assert "v000003" in wh.versions("scratch", LIB)
    assert wh.read("scratch", LIB, "t").column("x").to_pylist() == [2]  # v000003 holds i=2


def test_embeddings_asset_is_incremental_and_model_switch_is_published_by_snapshot(env, monkeypatch):
    monkeypatch.setenv("RAGSPINE_EMBEDDING", "deterministic")
    first = run(env)
    md = mat_md(first, "embeddings")
    assert md["embedded"] == md["count"] > 0 and md["model_id"] == "deterministic-hash-256" and md["dim"] == 256
    retrieval = RetrievalResource(warehouse_root=str(env["root"]))
    snippets = retrieval.ask("why close the Lyon plant", top_k=3)
    assert snippets[0]["scores"]["vector"] is not None  # hybrid from the published vectors
    p = env["corpus"] / LIB / "pr_us_monterrey.md"
    p.write_text(p.read_text(encoding="utf-8") + "\n\nA new paragraph about Monterrey.\n", encoding="utf-8")
    md2 = mat_md(run(env), "embeddings")
    assert 0 < md2["embedded"] < md["count"] / 5  # only the changed document's chunks
    old_emb = env["wh"].latest(P.SNAPSHOT, LIB).manifest["metadata"]["embeddings"]
    # Switch models: everything is re-embedded; the old vectors serve until the snapshot publishes.
    monkeypatch.setenv(FAIL_ENV, "retrieval_snapshot")
    with pytest.raises(Exception, match="injected failure"):
        run(env, {"ops": {"embeddings": {"config": {"embedding": "deterministic:64"}}}})
    monkeypatch.delenv(FAIL_ENV)
    snap = env["wh"].latest(P.SNAPSHOT, LIB).manifest["metadata"]
    assert snap["embeddings"] == old_emb and snap["embedding_model"] == "deterministic-hash-256"
    assert env["wh"].latest(P.EMBEDDINGS, LIB).manifest["metadata"]["model_id"] == "deterministic-hash-64"
    assert retrieval.ask("why close the Lyon plant", top_k=1)[0]["scores"]["vector"] is not None
    run(env, {"ops": {"embeddings": {"config": {"embedding": "deterministic:64"}}}})
    assert env["wh"].latest(P.SNAPSHOT, LIB).manifest["metadata"]["embedding_model"] == "deterministic-hash-64"
    # The published embeddings table is directly usable as a VectorStore.
    from ragspine_pipeline.retrieval.vector.embedding_backends import make_embedding_backend
    from ragspine_pipeline.retrieval.vector.parquet_store import ParquetVectorStore

    pub = env["wh"].latest(P.EMBEDDINGS, LIB)
    store = ParquetVectorStore(pub.table_path("vectors"), id_column="chunk_id")
    # RESTRICTED chunks are never embedded (their text must not reach a model).
    chunks = {c.chunk_id: c for c in P.active_chunks(env["wh"], LIB) if not is_restricted(c.sensitivity)}
    target = next(c for c in chunks.values() if "Monterrey" in c.text)
    (qv,) = make_embedding_backend("deterministic:64").embed_texts([target.text])
    assert store.count() == len(chunks) and store.query(qv, k=1)[0].id == target.chunk_id


def test_without_embedding_backend_snapshot_is_pure_bm25(env, monkeypatch):
    monkeypatch.setenv("RAGSPINE_EMBEDDING", "none")
    res = run(env)
    assert mat_md(res, "embeddings")["backend"] == "none"
    assert env["wh"].latest(P.SNAPSHOT, LIB).manifest["metadata"]["embeddings"] is None
    s = RetrievalResource(warehouse_root=str(env["root"])).ask("why close the Lyon plant", top_k=1)[0]
    assert s["scores"]["vector"] is None


def test_served_snapshot_uses_its_own_model_and_lexical_mode_loads_no_vectors(env, monkeypatch):
    monkeypatch.setenv("RAGSPINE_EMBEDDING", "deterministic")
    assert run(env).success
    from ragspine_pipeline.retrieval.vector.embedding_backends import DeterministicHashBackend

    other = DeterministicHashBackend(dim=32)  # a differently configured backend is not mixed in
    idx = P.load_snapshot_index(env["wh"], LIB, embedding_backend=other)
    assert idx.retriever.embedding_backend.model_id == "deterministic-hash-256"
    lexical = P.load_snapshot_index(env["wh"], LIB, channels=("bm25",))
    assert lexical.retriever.embedding_backend is None and lexical.retriever.embedded_count == 0
    s = NarrativeIndexRetriever(lexical).retrieve("why close the Lyon plant", top_k=1)[0]
    assert s["scores"]["vector"] is None
