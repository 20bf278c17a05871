"""numba starts for the BM25 kernels without importing scipy.linalg (#27 item 2), and
nothing else in the process loses it."""

from __future__ import annotations

import importlib
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from ragspine_pipeline.retrieval.lexical.kernels.numba_start import _hidden

ROOT = Path(__file__).resolve().parents[1]


def test_a_hidden_module_fails_to_import_in_the_hiding_thread_only():
    name = "colorsys"  # a small standard module nothing here imports
    sys.modules.pop(name, None)
    seen: dict[str, object] = {}
    with _hidden(name):
        with pytest.raises(ModuleNotFoundError):
            importlib.import_module(name)
        other = threading.Thread(target=lambda: seen.setdefault("mod", importlib.import_module(name)))
        other.start()
        other.join()
    assert seen["mod"] is sys.modules[name]  # the other thread imported it
    sys.modules.pop(name)
    assert importlib.import_module(name).__name__ == name  # and this thread can, after


SCRIPT = r"""
import sys
import numpy as np
pytest_numba = __import__("numba")
from ragspine_pipeline.retrieval.lexical.kernels.loader import load_kernels
assert load_kernels(mapped=True) is not None
assert "scipy.linalg" not in sys.modules, "loading the kernels imported scipy.linalg"
import scipy.linalg  # every later import works
from numba import njit
dot = njit(lambda a, b: np.dot(a, b))  # BLAS in jitted code: checked again when it compiles
a = np.arange(4.0)
assert dot(a, a) == 14.0
print("ok")
"""


def test_kernels_load_without_scipy_linalg_and_blas_still_works_after():
    pytest.importorskip("numba")
    pytest.importorskip("scipy")
    res = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, capture_output=True, text=True, check=False)
    assert res.returncode == 0 and res.stdout.strip().endswith("ok"), res.stderr[-3000:]
