"""notebooks/warehouse.ipynb runs top to bottom against a freshly materialized warehouse."""

import shutil
import sys
from pathlib import Path

import pytest

dg = pytest.importorskip("dagster")
nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")
pytest.importorskip("matplotlib")
pytest.importorskip("pandas")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def test_notebook_executes(tmp_path, monkeypatch):
    import definitions
    from ragspine_pipeline.paths import DEMO_ROOT
    from resources import WarehouseResource

    corpus = tmp_path / "corpus"
    shutil.copytree(DEMO_ROOT / "acme_reports", corpus / "acme_reports")
    monkeypatch.setenv("RAGSPINE_WAREHOUSE", str(tmp_path / "wh"))
    wh = WarehouseResource(root=str(tmp_path / "wh"), corpus_root=str(corpus))
    definitions.materialize_library("acme_reports", dg.DagsterInstance.ephemeral(), wh, definitions.QUIET)
    nb = nbformat.read(ROOT / "notebooks" / "warehouse.ipynb", as_version=4)
    client = nbclient.NotebookClient(nb, timeout=120, kernel_name="python3",
                                     resources={"metadata": {"path": str(ROOT / "notebooks")}})
    client.execute()
    outs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert not [o for o in outs if o.get("output_type") == "error"]
    text = "".join(o.get("text", "") for o in outs)
    assert "chunks active then" in text
    # No TqdmWarning ("IProgress not found") from the dense model's loader (issue 28 item 4).
    assert "TqdmWarning" not in text and "IProgress" not in text
    # DataFrames, rendered as tables (not tuples from fetchall()).
    tables = [o["data"]["text/html"] for o in outs if "text/html" in o.get("data", {})]
    assert len(tables) >= 5 and all("<table" in t for t in tables)
    assert any("acme_reports/" in t for t in tables) and any("ndcg@10" in t for t in tables)
    assert "fetchall" not in "".join(c.source for c in nb.cells)
    # The pictures: chunk lengths + versions over time, and golden nDCG per library.
    assert sum("image/png" in o.get("data", {}) for o in outs) >= 2
