"""notebooks/warehouse.ipynb runs top to bottom against a freshly materialized warehouse."""

import shutil
import sys
from pathlib import Path

import pytest

dg = pytest.importorskip("dagster")
nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def test_notebook_executes(tmp_path, monkeypatch):
    import definitions
    from resources import WarehouseResource

    corpus = tmp_path / "corpus"
    shutil.copytree(ROOT / "data" / "demo" / "acme_reports", corpus / "acme_reports")
    monkeypatch.setenv("RAGSPINE_WAREHOUSE", str(tmp_path / "wh"))
    wh = WarehouseResource(root=str(tmp_path / "wh"), corpus_root=str(corpus))
    definitions.materialize_library("acme_reports", dg.DagsterInstance.ephemeral(), wh, definitions.QUIET)
    nb = nbformat.read(ROOT / "notebooks" / "warehouse.ipynb", as_version=4)
    client = nbclient.NotebookClient(nb, timeout=120, kernel_name="python3",
                                     resources={"metadata": {"path": str(ROOT / "notebooks")}})
    client.execute()
    outputs = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
    assert "chunks_acme_reports" in outputs and "chunks active then" in outputs
