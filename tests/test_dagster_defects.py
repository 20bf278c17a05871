"""Issue 28 item 4, the Dagster defects, each seen where a user meets it:

1. check results of the library-partitioned assets are stored against their library
   partition (the UI's per-library check history), read back from the instance;
2. ``library_sensor``'s first evaluation over an up-to-date warehouse launches nothing;
3. a file touched back to identical content publishes nothing, while any change of its
   bytes, its sidecar, or whether its label can be read publishes (raw.py's content key);
4. the executed notebook shows no ``TqdmWarning``.
"""

import os
import shutil
import warnings

import pytest
from dagster_fixtures import DEMO, demo_warehouse

dg = pytest.importorskip("dagster")

import definitions  # noqa: E402  (dagster_fixtures puts the code location on sys.path)
from assets import library_sensor  # noqa: E402
from assets.partitions import library_partitions  # noqa: E402

LIBS = ("acme_policies", "acme_reports")


def _check_keys(defs) -> list[dg.AssetCheckKey]:
    return sorted(defs.get_repository_def().asset_graph.asset_check_keys, key=lambda k: k.to_user_string())


def test_every_check_of_a_partitioned_asset_is_partitioned_like_it():
    graph = definitions.defs.get_repository_def().asset_graph
    for key in _check_keys(definitions.defs):
        asset = graph.get(key.asset_key)
        if asset.partitions_def is not None:
            assert graph.get(key).partitions_def == library_partitions, key.to_user_string()


def test_definitions_load_without_a_preview_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error", dg.PreviewWarning)
        import assets.partitions as parts

        spec = parts.library_check("x", asset="raw_documents", description="why")
    assert spec.partitions_def == library_partitions


def test_check_results_are_recorded_against_their_library_partition(tmp_path, monkeypatch):
    env = demo_warehouse(tmp_path, monkeypatch, LIBS)
    instance = dg.DagsterInstance.ephemeral()
    order = [LIBS[0], LIBS[1], LIBS[0]]  # interleaved, as a daily refresh of both would run
    for lib in order:
        assert definitions.materialize_library(lib, instance, env.resource(), definitions.QUIET).success
    storage = instance.event_log_storage
    for name, asset in (("golden_ndcg_above_floor", "retrieval_snapshot"), ("parse_failures_zero", "raw_documents"),
                        ("restricted_stays_restricted", "chunks")):
        key = dg.AssetCheckKey(dg.AssetKey(asset), name)
        history = storage.get_asset_check_execution_history(key, limit=10)
        # Newest first; every evaluation names the library it was run for.
        assert [r.partition for r in history] == order[::-1], name
        assert all(r.event is not None for r in history)
        per_lib = {lib: [r.partition for r in storage.get_asset_check_execution_history(
            key, limit=10, partition_filter=_partition_filter(lib))] for lib in LIBS}
        assert per_lib == {LIBS[0]: [LIBS[0]] * 2, LIBS[1]: [LIBS[1]]}, name
    # The floor's history per library is one library's numbers, not a zig-zag of both.
    floors = {}
    key = dg.AssetCheckKey(dg.AssetKey("retrieval_snapshot"), "golden_ndcg_above_floor")
    for r in storage.get_asset_check_execution_history(key, limit=10):
        evaluation = r.event.dagster_event.event_specific_data
        floors.setdefault(r.partition, set()).add(evaluation.metadata["floor"].value)
    assert floors == {"acme_policies": {0.9}, "acme_reports": {0.7}}


def _partition_filter(lib: str):
    from dagster._core.event_api import PartitionKeyFilter

    return PartitionKeyFilter(key=lib)


# ------------------------------------------------------------------ 2. the sensor's first start
def _sensor(instance, resource, cursor=None):
    return library_sensor(dg.build_sensor_context(instance=instance, cursor=cursor, resources={"warehouse": resource}))


def _runs(result) -> dict[str, str]:
    return {r.partition_key: r.tags["ragspine/trigger"] for r in result.run_requests}


def test_sensor_first_start_over_an_up_to_date_warehouse_launches_nothing(tmp_path, monkeypatch):
    env = demo_warehouse(tmp_path, monkeypatch, LIBS)
    instance = dg.DagsterInstance.ephemeral()
    for lib in LIBS:
        assert definitions.materialize_library(lib, instance, env.resource(), definitions.QUIET).success
    first = _sensor(instance, env.resource())  # no cursor: the sensor's first evaluation
    assert _runs(first) == {} and not first.dynamic_partitions_requests
    assert set(json_keys(first.cursor)) == set(LIBS)  # initialized from the current state
    # A file touched back to identical bytes: its signature moved, its content did not.
    doc = env.corpus / "acme_reports" / "ir_cn_qa.md"
    doc.write_bytes(doc.read_bytes())
    touched = _sensor(instance, env.resource(), first.cursor)
    assert _runs(touched) == {} and touched.cursor != first.cursor
    # A real edit is still seen, tagged for what it is, and only for its library.
    doc.write_bytes(doc.read_bytes() + b"\n\nUpdate: orders doubled.\n")
    assert _runs(_sensor(instance, env.resource(), touched.cursor)) == {"acme_reports": "files changed"}


def test_sensor_first_start_launches_what_the_warehouse_lacks(tmp_path, monkeypatch):
    env = demo_warehouse(tmp_path, monkeypatch, LIBS)
    instance = dg.DagsterInstance.ephemeral()
    assert definitions.materialize_library(LIBS[0], instance, env.resource(), definitions.QUIET).success
    instance.add_dynamic_partitions(library_partitions.name, [LIBS[1]])  # registered, never built
    shutil.copytree(DEMO / LIBS[1], env.corpus / "brand_new")  # a folder the instance does not know
    (env.corpus / LIBS[0] / "added.md").write_text("# Added\n\nA new memo.\n", encoding="utf-8")
    first = _sensor(instance, env.resource())
    assert _runs(first) == {LIBS[0]: "files changed", LIBS[1]: "not built", "brand_new": "new library"}
    assert first.dynamic_partitions_requests[0].partition_keys == ["brand_new"]


def json_keys(cursor: str) -> list[str]:
    import json

    return list(json.loads(cursor))


# ------------------------------------------------------------------ 3. content, not signatures
def _listing(root) -> dict[str, tuple[int, int]]:
    """Every path under the warehouse with its mtime and size: what a publish would change."""
    return {str(p.relative_to(root)): (p.stat().st_mtime_ns, p.stat().st_size) for p in root.rglob("*")}


def test_files_touched_back_to_identical_content_publish_nothing(tmp_path, monkeypatch):
    env = demo_warehouse(tmp_path, monkeypatch)
    instance = dg.DagsterInstance.ephemeral()
    assert definitions.materialize_library("acme_reports", instance, env.resource(), definitions.QUIET).success
    before = _listing(env.root)
    folder = env.corpus / "acme_reports"
    touched = [p for p in sorted(folder.iterdir()) if p.name.startswith("ir_cn_qa")]
    assert {p.suffix for p in touched} == {".md", ".json"}  # the document and its sidecar
    for p in touched:
        p.write_bytes(p.read_bytes())  # new mtime and ctime, same bytes
    result = definitions.materialize_library("acme_reports", instance, env.resource(), definitions.QUIET)
    assert _listing(env.root) == before  # no version folder, no data file, not even a rewritten one
    md = {e.asset_key.to_user_string(): {k: v.value for k, v in e.step_materialization_data.materialization
                                         .metadata.items()} for e in result.get_asset_materialization_events()}
    assert md["raw_documents"]["touched_unchanged"] == 1 and md["raw_documents"]["parsed"] == 0
    assert md["raw_documents"]["reused"] and md["chunks"]["reused"]
    assert md["retrieval_snapshot"]["reused"] == "True" and md["catalog"]["rebuilt"] is False



def _same_size_and_mtime(path, body: str, like: os.stat_result) -> None:
    """Rewrite ``path`` keeping its size and mtime: only ctime (and the bytes) tell."""
    assert len(body.encode("utf-8")) == like.st_size
    path.write_text(body, encoding="utf-8")
    os.utime(path, ns=(like.st_atime_ns, like.st_mtime_ns))


def test_a_relabel_to_restricted_always_publishes_and_withholds(tmp_path):
    from test_security import meta, refresh, served_doc_ids, write_lib

    from ragspine_pipeline.warehouse.versioned import VersionedTables

    def side(label: str) -> str:
        return meta(sensitivity=label).ljust(40)  # JSON allows the trailing spaces: one size for both labels

    def front(label: str) -> str:
        return f"---\nsensitivity: {label}\n---\n# Front\n\nParis plant memo.".ljust(80)

    corpus = tmp_path / "corpus"
    folder = write_lib(corpus, {"side.md": "# Side\n\nLyon plant memo.", "side.meta.json": side("PUBLIC"),
                                "front.md": front("PUBLIC"), "open.md": "# Open\n\nCanteen menu."})
    wh = VersionedTables(tmp_path / "wh")
    first = refresh(wh, corpus)
    assert served_doc_ids(wh) == {"lib/side", "lib/front", "lib/open"}
    # Same size, same mtime: the sidecar's label and the front matter's label both change.
    side_st, front_st = (folder / "side.meta.json").stat(), (folder / "front.md").stat()
    _same_size_and_mtime(folder / "side.meta.json", side("RESTRICTED"), side_st)
    _same_size_and_mtime(folder / "front.md", front("RESTRICTED"), front_st)
    raw = refresh(wh, corpus)
    assert raw.metadata["parsed"] == 2 and raw.metadata["changed_files"] == 2
    assert raw.published.version != first.published.version
    assert raw.metadata["restricted_documents"] == 2 and served_doc_ids(wh) == {"lib/open"}


def test_a_sidecar_made_unreadable_publishes_and_withholds_its_document(tmp_path):
    from test_security import meta, refresh, served_doc_ids, write_lib

    from ragspine_pipeline.warehouse.versioned import VersionedTables

    corpus = tmp_path / "corpus"
    body = meta(sensitivity="PUBLIC")
    folder = write_lib(corpus, {"doc.md": "# Doc\n\nLyon plant memo.", "doc.meta.json": body,
                                "open.md": "# Open\n\nCanteen menu."})
    wh = VersionedTables(tmp_path / "wh")
    first = refresh(wh, corpus)
    assert served_doc_ids(wh) == {"lib/doc", "lib/open"}
    (folder / "doc.meta.json").unlink()
    (folder / "doc.meta.json").mkdir()  # the label can no longer be read
    raw = refresh(wh, corpus)
    assert raw.published.version != first.published.version and raw.metadata["parsed"] == 1
    assert not raw.checks["parse_failures_zero"].passed
    assert [f.split(":")[0] for f in raw.checks["parse_failures_zero"].metadata["files"]] == ["doc.md"]
    assert served_doc_ids(wh) == {"lib/open"}
    # Readable again with the very same bytes as before: that is a change too, and it serves again.
    (folder / "doc.meta.json").rmdir()
    (folder / "doc.meta.json").write_text(body, encoding="utf-8")
    again = refresh(wh, corpus)
    assert again.metadata["parsed"] == 1 and again.checks["parse_failures_zero"].passed
    assert served_doc_ids(wh) == {"lib/doc", "lib/open"}
