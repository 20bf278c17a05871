"""RESTRICTED through the Dagster code location: no restricted text in metadata, check
results or logs; one run per library on the run queue; every check is described."""

import json
import shutil
import sys
from pathlib import Path

import pytest

dg = pytest.importorskip("dagster")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import definitions  # noqa: E402
from ragspine_pipeline.paths import DEMO_ROOT  # noqa: E402
from resources import WarehouseResource  # noqa: E402

LIB = "acme_policies"
MARKER = "QUARTZWALRUS"


def _all_event_text(instance: "dg.DagsterInstance") -> str:
    from dagster._serdes import serialize_value

    records = [e for run in instance.get_runs() for e in instance.all_logs(run.run_id)]
    return "\n".join(serialize_value(e) for e in records)


def test_no_restricted_text_in_metadata_checks_or_logs(tmp_path, monkeypatch, capfd):
    corpus = tmp_path / "corpus"
    shutil.copytree(DEMO_ROOT / LIB, corpus / LIB)
    body = f"# {MARKER} board minutes\n\n{MARKER} the board approved the sale of the Lyon plant. " * 3
    (corpus / LIB / "board_minutes.md").write_text(body, encoding="utf-8")
    (corpus / LIB / "board_minutes.meta.json").write_text(json.dumps({"sensitivity": "Restricted"}), encoding="utf-8")
    # An odd spelling of the label fails closed too.
    (corpus / LIB / "hr_note.md").write_text(f"{MARKER} personnel decision", encoding="utf-8")
    (corpus / LIB / "hr_note.meta.json").write_text(json.dumps({"sensitivity": "RESTRI\u200bCTED"}),
                                                    encoding="utf-8")
    monkeypatch.setenv("RAGSPINE_EMBEDDING", "none")
    instance = dg.DagsterInstance.ephemeral()
    wh = WarehouseResource(root=str(tmp_path / "wh"), corpus_root=str(corpus))
    result = definitions.materialize_library(LIB, instance, wh)
    assert result.success
    checks = {c.check_name: c for c in result.get_asset_check_evaluations()}
    assert checks["restricted_never_served"].passed
    assert checks["restricted_never_served"].metadata["restricted_probed"].value >= 2
    # Issue 25: a zero-width space inside the label is not a known spelling: reported.
    assert not checks["sensitivity_labels_valid"].passed
    assert [f.split(":")[0] for f in checks["sensitivity_labels_valid"].metadata["files"].value] == ["hr_note.md"]
    text = _all_event_text(instance)
    assert "board_minutes" in text  # the event log does describe the run ...
    assert MARKER not in text  # ... but never with the restricted words
    out, err = capfd.readouterr()
    assert MARKER not in out and MARKER not in err
    # The ask job answers from the served index: nothing restricted comes back.
    from resources import RetrievalResource

    snippets = RetrievalResource(warehouse_root=str(tmp_path / "wh")).ask(f"{MARKER} board minutes Lyon plant", top_k=10)
    assert all(MARKER not in json.dumps(s, ensure_ascii=False) for s in snippets)


def test_run_queue_allows_one_run_per_library():
    instance = dg.DagsterInstance.from_config(str(ROOT / ".dagster_home"))
    limits = instance.get_concurrency_config().run_queue_config.tag_concurrency_limits
    assert {"key": "dagster/partition", "value": {"applyLimitPerUniqueValue": True}, "limit": 1} in limits


def test_every_asset_check_is_described():
    defs = definitions.defs
    graph = defs.resolve_asset_graph()
    specs = [spec for key in graph.asset_check_keys for spec in [graph.get_check_spec(key)]]
    assert specs and all(spec.description for spec in specs), [s.name for s in specs if not s.description]
