"""The chunks and embeddings steps on Ray (``executor="ray"``) publish what the local steps do.

Ray runs in a child process inside a private network namespace (``unshare -n``, loopback
up), so every Ray address is 127.0.0.1 and no traffic leaves the box; the child is this
file run as a script (``_child_main``). Its Ray temp folder is private to the test, so the
teardown can tell its processes apart from any other Ray on the machine: after the child
has shut its cluster down, no raylet or gcs_server of that folder may remain (any that
does is killed by pid and the test fails).

Compared with a local build of the same corpus: the chunk rows, document versions and
document state (every column but ``ingested_at``, the wall-clock time of each build), and
the vectors of the ``deterministic`` backend, byte for byte.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from ragspine_pipeline.paths import DEMO_ROOT  # noqa: E402
from ragspine_pipeline.retrieval.vector.embedding_backends import make_embedding_backend  # noqa: E402
from ragspine_pipeline.scale.build import RayExecutor, step_executor  # noqa: E402
from ragspine_pipeline.warehouse.pipeline import (  # noqa: E402
    CHUNKS,
    EMBEDDINGS,
    build_chunks,
    build_embeddings,
    build_raw_documents,
)
from ragspine_pipeline.warehouse.versioned import VersionedTables, read_segments  # noqa: E402

LIBS = ("acme_policies", "acme_reports")
SPEC = "deterministic"
CHILD_TIMEOUT_S = 240


def _namespace_problem() -> str | None:
    """Why Ray cannot run here in a private network namespace, or None."""
    if importlib.util.find_spec("ray") is None:
        return "Ray is not installed (the [scale] extra)"
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        return "unshare or ip is not available"
    if os.geteuid() != 0:
        return "unshare -n needs root"
    probe = subprocess.run(["unshare", "-n", "true"], capture_output=True, text=True, check=False)
    if probe.returncode != 0:
        return f"cannot create a network namespace: {probe.stderr.strip()[:200]}"
    return None


NAMESPACE_PROBLEM = _namespace_problem()
needs_ray = pytest.mark.skipif(NAMESPACE_PROBLEM is not None, reason=f"Ray test skipped: {NAMESPACE_PROBLEM}")


def build(root: Path, corpus: Path, libs: list[str], executor: str, log=None) -> dict[str, Any]:
    """raw -> chunks -> embeddings (deterministic) of each library on the executor named
    ``executor`` (passed in, as the resource and the indexing door do); the steps' metadata."""
    wh = VersionedTables(root)
    executor = step_executor(executor)
    out: dict[str, Any] = {}
    for lib in libs:
        build_raw_documents(wh, corpus, lib)
        ch = build_chunks(wh, lib, executor=executor, log=log)
        emb = build_embeddings(wh, lib, make_embedding_backend(SPEC), SPEC, executor=executor, log=log)
        out[lib] = {"chunks": ch.metadata, "embeddings": emb.metadata,
                    "checks": {k: bool(v.passed) for k, v in {**ch.checks, **emb.checks}.items()}}
    return out


def tables(root: Path, lib: str) -> dict[str, pa.Table]:
    """The published tables to compare (ingested_at left out: it is each build's clock)."""
    wh = VersionedTables(root)
    ch, emb = wh.latest(CHUNKS, lib), wh.latest(EMBEDDINGS, lib)
    out = {name: read_segments(ch, name) for name in ("chunks", "doc_versions", "doc_state")}
    out = {k: t.drop_columns([c for c in ("ingested_at",) if c in t.column_names]) for k, t in out.items()}
    out["vectors"] = read_segments(emb, "vectors")
    return out


def _child_main(job_file: str) -> None:
    """Inside the namespace: each of the job's runs on one local Ray cluster; their results."""
    from ragspine_pipeline.scale.cluster import ray_cluster

    job = json.loads(Path(job_file).read_text())
    results: dict[str, Any] = {}
    with ray_cluster(2) as cluster:
        for run in job["runs"]:
            results[run["name"]] = {"address": cluster.address, **_child_run(run)}
    Path(job["out"]).write_text(json.dumps(results, default=str))


def _child_run(run: dict[str, Any]) -> dict[str, Any]:
    """One build on the connected cluster: through Dagster, through the engine with killed
    workers, or with embedding workers that never stop dying (the step must fail)."""
    from ragspine_pipeline.scale import build as scale_build

    if run["mode"] == "dagster":
        steps, lines = _materialize(run)
        return {"steps": steps, "log_lines": lines}
    if run["mode"] == "kill":
        lines: list[str] = []
        with scale_build.inject_worker_kills(run["markers"], *run["kill"]):
            return {"steps": build(Path(run["root"]), Path(run["corpus"]), run["libs"], "ray", lines.append),
                    "log_lines": lines}
    wh = VersionedTables(run["root"])  # "fail"
    lib = run["libs"][0]
    build_raw_documents(wh, Path(run["corpus"]), lib)
    build_chunks(wh, lib, executor=RayExecutor())
    error = None
    with scale_build.inject_worker_kills(run["markers"], "embeddings", times=1000):
        try:
            build_embeddings(wh, lib, make_embedding_backend(SPEC), SPEC, executor=RayExecutor())
        except scale_build.RayStepFailed as exc:
            error = str(exc)
    return {"error": error, "published": wh.latest(EMBEDDINGS, lib) is not None}


def _materialize(job: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """raw_documents -> chunks -> embeddings through Dagster with ``executor="ray"`` on the
    warehouse resource: (each library's asset metadata, the runs' log lines)."""
    import dagster as dg

    from assets.library_assets import chunks, embeddings, raw_documents
    from assets.partitions import library_partitions
    from resources import WarehouseResource

    instance = dg.DagsterInstance.ephemeral()
    instance.add_dynamic_partitions(library_partitions.name, job["libs"])
    warehouse = WarehouseResource(root=job["root"], corpus_root=job["corpus"], executor="ray")
    steps: dict[str, Any] = {}
    lines: list[str] = []
    for lib in job["libs"]:
        res = dg.materialize([raw_documents, chunks, embeddings], partition_key=lib, instance=instance,
                             resources={"warehouse": warehouse},
                             run_config={"ops": {"embeddings": {"config": {"embedding": SPEC}}}})
        mats = {e.asset_key.to_user_string(): {k: v.value for k, v in
                                                e.step_materialization_data.materialization.metadata.items()}
                for e in res.get_asset_materialization_events()}
        steps[lib] = {"chunks": mats["chunks"], "embeddings": mats["embeddings"],
                      "checks": {c.check_name: bool(c.passed) for c in res.get_asset_check_evaluations()}}
        lines += [e.user_message for e in instance.all_logs(res.run_id) if e.user_message]
    return steps, lines


def run_on_ray(tmp: Path, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Run ``runs`` (name, mode, root, corpus, libs[, kill]) in one child on one Ray
    cluster in a private network and pid namespace; each run's result with the names of
    its kill markers. Tears down by pid."""
    ray_tmp = Path(tempfile.mkdtemp(prefix="r1ray", dir="/tmp"))  # short: Ray's socket paths must fit
    for run in runs:
        run["markers"] = str(tmp / "markers" / run["name"])
        Path(run["markers"]).mkdir(parents=True)
    job_file = tmp / "job.json"
    job_file.write_text(json.dumps({"runs": runs, "out": str(tmp / "result.json")}))
    env = {**os.environ, "RAY_TMPDIR": str(ray_tmp), "RAY_USAGE_STATS_ENABLED": "0",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    # A pid namespace too: whatever the child leaves is killed with it when it exits.
    cmd = ["unshare", "-n", "-p", "-f", "--mount-proc", "bash", "-c",
           f"ip link set lo up && {sys.executable} {Path(__file__).resolve()} {job_file}"]
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=CHILD_TIMEOUT_S, check=False)
    finally:
        left = _ray_processes(ray_tmp)
        for pid in left:  # ours alone (their command line names our private temp folder)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(ray_tmp, ignore_errors=True)
    assert proc.returncode == 0, f"Ray child failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    assert not left, f"Ray processes left behind after the cluster shut down: {left}"
    result = json.loads((tmp / "result.json").read_text())
    for run in runs:
        result[run["name"]]["markers"] = sorted(p.name for p in Path(run["markers"]).iterdir())
    return result


def _ray_processes(ray_tmp: Path) -> list[int]:
    """Pids of raylet / gcs_server processes whose command line names ``ray_tmp``."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if str(ray_tmp) in cmd and ("raylet" in cmd or "gcs_server" in cmd):
            found.append(int(proc.name))
    return found


@pytest.fixture(scope="module")
def local_demo(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("local") / "wh"
    build(root, DEMO_ROOT, list(LIBS), "local")
    return root


@pytest.fixture(scope="module")
def ray_demo(tmp_path_factory) -> tuple[Path, dict[str, Any]]:
    """The demo corpus built on one Ray cluster twice: through Dagster, and through the
    engine with one chunking task and one embedding actor SIGKILLed (one cluster start)."""
    if NAMESPACE_PROBLEM is not None:
        pytest.skip(f"Ray test skipped: {NAMESPACE_PROBLEM}")
    tmp = tmp_path_factory.mktemp("ray")
    corpus = str(DEMO_ROOT)
    res = run_on_ray(tmp, [
        {"name": "dagster", "mode": "dagster", "root": str(tmp / "dagster"), "corpus": corpus, "libs": list(LIBS)},
        {"name": "kill", "mode": "kill", "root": str(tmp / "kill"), "corpus": corpus, "libs": ["acme_reports"],
         "kill": ["chunks", "embeddings"]}])
    return tmp, res


def assert_same(local: Path, ray_root: Path, libs) -> None:
    for lib in libs:
        a, b = tables(local, lib), tables(ray_root, lib)
        for name in a:
            assert a[name].schema == b[name].schema, (lib, name)
            assert a[name].equals(b[name]), f"{lib}: table {name} differs between the local and the Ray build"
        assert b["vectors"].num_rows > 0


@needs_ray
def test_demo_corpus_through_dagster_on_ray_equals_local_build(local_demo: Path, ray_demo) -> None:
    tmp, all_runs = ray_demo
    res = all_runs["dagster"]
    assert res["address"].startswith("127.0.0.1:")
    assert_same(local_demo, tmp / "dagster", LIBS)
    for lib in LIBS:
        steps = res["steps"][lib]
        assert all(steps["checks"].values()), steps["checks"]
        for step in ("chunks", "embeddings"):
            md = steps[step]
            assert md["executor"] == "ray" and md["ray_address"].startswith("127.0.0.1:"), md
            assert md["ray_batches"] >= 1 and md["ray_workers"] == 2 and md["ray_rows_per_s"] > 0, md
    # Progress in the Dagster event log: one line per output batch of each Ray run.
    batches = sum(res["steps"][lib][s]["ray_batches"] for lib in LIBS for s in ("chunks", "embeddings"))
    assert len([ln for ln in res["log_lines"] if " on ray: " in ln]) == batches


@needs_ray
def test_killed_workers_are_retried_and_the_build_finishes(local_demo: Path, ray_demo) -> None:
    tmp, all_runs = ray_demo
    assert all_runs["kill"]["markers"] == ["chunks-0", "embeddings-0"]  # one task and one actor were SIGKILLed
    assert_same(local_demo, tmp / "kill", ["acme_reports"])


@needs_ray
@pytest.mark.slow
def test_workers_that_keep_dying_fail_the_step_and_publish_nothing(tmp_path: Path) -> None:
    res = run_on_ray(tmp_path, [{"name": "fail", "mode": "fail", "root": str(tmp_path / "wh"),
                                 "corpus": str(DEMO_ROOT), "libs": ["acme_reports"]}])["fail"]
    assert res["error"] and "nothing was published" in res["error"], res
    assert res["published"] is False
    assert VersionedTables(tmp_path / "wh").versions(EMBEDDINGS, "acme_reports") == []


def test_executor_setting_is_checked_and_local_needs_no_ray(tmp_path: Path) -> None:
    from ragspine_pipeline.settings import SettingsError
    from resources import WarehouseResource

    assert WarehouseResource(executor="ray").executor_name() == "ray"
    assert isinstance(WarehouseResource(executor="ray").step_executor(), RayExecutor)
    assert WarehouseResource(executor="local").step_executor() is None
    with pytest.raises(TypeError, match="executor object"):  # the warehouse takes no names: its caller resolves one
        build_chunks(VersionedTables(tmp_path / "wh0"), "acme_reports", executor="ray")
    with pytest.raises(SettingsError, match="RAGSPINE_EXECUTOR"):
        WarehouseResource(executor="spark").executor_name()
    steps = build(tmp_path / "wh", DEMO_ROOT, ["acme_reports"], "local")["acme_reports"]
    assert not [k for s in ("chunks", "embeddings") for k in steps[s] if k.startswith("ray_") or k == "executor"]


def _synthetic_corpus(folder: Path, n: int) -> None:
    """``n`` short markdown documents with varied lengths and labels, deterministic."""
    import random

    rng = random.Random(30)
    words = ["revenue", "margin", "plant", "supplier", "contract", "hedging", "policy", "audit", "energy", "europe",
             "china", "quarter", "growth", "risk", "dividend", "travel", "approval", "data", "protection"]
    lib = folder / "synth"
    lib.mkdir(parents=True)
    for i in range(n):
        paras = ["\n".join(" ".join(rng.choice(words) for _ in range(rng.randint(8, 60))) + "."
                           for _ in range(rng.randint(1, 4))) for _ in range(rng.randint(1, 5))]
        (lib / f"doc{i:05d}.md").write_text(f"# Document {i}\n\n" + "\n\n".join(paras) + "\n")
        if i % 50 == 0:
            (lib / f"doc{i:05d}.meta.json").write_text(json.dumps({"sensitivity": "RESTRICTED"}))


@needs_ray
@pytest.mark.slow
def test_five_thousand_documents_on_ray_equal_the_local_build(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus"
    _synthetic_corpus(corpus, 5000)
    build(tmp_path / "local", corpus, ["synth"], "local")
    res = run_on_ray(tmp_path, [{"name": "synth", "mode": "kill", "root": str(tmp_path / "wh"),
                                 "corpus": str(corpus), "libs": ["synth"], "kill": []}])["synth"]
    assert res["steps"]["synth"]["chunks"]["ray_rows"] == 5000
    assert_same(tmp_path / "local", tmp_path / "wh", ["synth"])


if __name__ == "__main__":
    _child_main(sys.argv[1])
