"""Opening a published index warms exactly the numba signatures its queries call (#27 item 2).

numba types a kernel by each array's dtype and read-only flag: a memory-mapped index passes
read-only arrays, an index built in memory writable ones. A warm for the wrong flags loads
code that no query runs, and the first query then loads (or, on a cold cache, compiles) its
own signature after all. The check runs in a fresh process, where nothing was loaded before
the open: every kind of query after the open (unfiltered, filtered by mask, packed bits or
positions, batched) must add no signature to any dispatcher of the BM25 kernels.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("numba")

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = r"""
import json, sys
import numpy as np
from numba.core.registry import CPUDispatcher
from ragspine_pipeline.retrieval.lexical.index import bm25
from ragspine_pipeline.retrieval.lexical.index.postings import count_postings
from ragspine_pipeline.retrieval.lexical.index.filter import PackedFilter
from ragspine_pipeline.retrieval.lexical.index.mapped import open_index
from ragspine_pipeline.retrieval.lexical.refresh.publish import write_layout
from tests.test_bm25_mmap import zipf_corpus

def signatures():
    out = {}
    for name, mod in list(sys.modules.items()):
        if name.startswith("ragspine_pipeline.retrieval.lexical."):
            for attr, v in vars(mod).items():
                if isinstance(v, CPUDispatcher):
                    out[f"{name.rsplit('.', 1)[1]}.{attr}"] = sorted(map(str, v.signatures))
    return out

bm25.BITSET_MIN_DOCS = 0  # bitset rows on a small corpus too (their rank directories are kernels)
docs, queries = zipf_corpus(3000, seed=3, max_len=60)
raw, _ = count_postings(docs)
ix = open_index(write_layout(raw, sys.argv[1], layout=sys.argv[2], k1=1.2, b=0.75))
before = signatures()
n = len(docs)
mask = np.random.default_rng(1).random(n) < 0.5
few = np.flatnonzero(np.random.default_rng(2).random(n) < 0.01)
packed = PackedFilter.from_mask(mask)
for q in queries:
    ix.search(q, k=10)
    ix.search(q, k=10, candidates=mask)
    ix.search(q, k=10, candidates=few)
    ix.search(q, k=10, candidates=packed)
ix.search_batch(queries, k=10, threads=1)
after = signatures()
print(json.dumps({"kernel": ix.kernel, "loaded_at_open": sum(map(len, before.values())),
                  "new": {k: sorted(set(v) - set(before.get(k, []))) for k, v in after.items()
                          if set(v) - set(before.get(k, []))}}))
"""


@pytest.mark.parametrize("layout", ["plain", "packed"])
def test_queries_after_an_open_load_no_kernel_signature(tmp_path, layout):
    res = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "lex.rsbm25"), layout], cwd=ROOT,
                         capture_output=True, text=True, check=False)
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["kernel"] == "numba" and out["loaded_at_open"] > 0
    assert out["new"] == {}, f"signatures loaded after the open, by the queries: {out['new']}"


def test_a_kernel_that_fails_to_compile_is_said(monkeypatch, caplog):
    """numba installed but a kernel failing to compile falls back to the numpy path (same
    answers) with a warning, not silently: a query tens of times slower must be visible."""
    import logging

    import numpy as np

    from ragspine_pipeline.retrieval.lexical.index import packed_index as packed

    def broken(*_args, **_kwargs):
        raise RuntimeError("Failed in nopython mode pipeline")

    monkeypatch.setattr(packed._PACKED, "warmed", set())
    monkeypatch.setattr(packed, "_warm", broken)
    with caplog.at_level(logging.WARNING, logger="ragspine_pipeline.retrieval.lexical.kernels.loader"):
        assert packed.load_packed_kernels(np.uint8, np.uint8) is None
    assert "numpy path" in caplog.text and "Failed in nopython mode" in caplog.text
