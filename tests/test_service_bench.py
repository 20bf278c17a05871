"""The memory step of the service benchmark (issue 29 item 5): the per-process figures it
reads from /proc and the table it writes, so a broken parser cannot publish wrong numbers."""

from __future__ import annotations

import mmap
import os
from pathlib import Path

import pytest

from benchmarks.bench_service import MAPPED_FILES, memory_markdown, smaps_mib


@pytest.mark.skipif(not Path("/proc/self/smaps_rollup").exists(), reason="needs Linux smaps_rollup")
def test_smaps_counts_a_mapped_index_file(tmp_path):
    path = tmp_path / MAPPED_FILES[0]
    path.write_bytes(b"x" * (4 << 20))
    before = smaps_mib(os.getpid())["mapped_index_rss"]  # index files other tests of this process mapped
    with path.open("rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        assert sum(mm[i] for i in range(0, len(mm), 4096)) == ord("x") * 1024  # touch every page
        got = smaps_mib(os.getpid())
    assert got["rss"] >= got["pss"] >= got["uss"] > 0
    assert 3.9 <= got["mapped_index_rss"] - before <= 4.1  # exactly the touched pages of that file
    assert got["mapped_index_pss"] <= got["mapped_index_rss"]


def test_memory_table_reports_the_pss_each_added_worker_costs():
    def run(n: int, total: float) -> dict:
        w = {"rss": 600.0, "pss": 300.0, "uss": 160.0, "mapped_index_rss": 315.0, "mapped_index_pss": 105.0,
             "cpu_s": 1.0}
        return {"per_worker_mib": [w] * n, "supervisor_mib": w if n > 1 else None, "total_pss_mib": total}

    lines = memory_markdown({"warehouse": "wh", "libraries": ["lib"], "runs": {"3": run(3, 960.0),
                                                                               "1": run(1, 560.0)}})
    rows = [line for line in lines if line.startswith("| 1 ") or line.startswith("| 3 ")]
    assert rows[0].startswith("| 1 ") and rows[0].endswith("| 560.0 |  |")
    assert rows[1].startswith("| 3 ") and rows[1].endswith("| 960.0 | 200.0 |")  # (960 - 560) / 2
    assert sum("| supervisor |" in line for line in lines) == 1
    assert memory_markdown({"runs": {}}) == []
