"""Names and records shared by the warehouse steps (no Dagster here)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..sensitivity import is_restricted
from .versioned import Published

RAW, CHUNKS, LEXICAL, SNAPSHOT = "raw_documents", "chunks", "lexical_index", "retrieval_snapshot"
EMBEDDINGS = "embeddings"
RAPTOR = "raptor_tree"


@dataclass
class CheckOutcome:
    """One asset-check result computed by the engine; the asset turns it into Dagster's."""

    passed: bool
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass
class StepResult:
    published: Published
    metadata: dict[str, Any] = field(default_factory=dict)
    checks: dict[str, CheckOutcome] = field(default_factory=dict)


def last_row_per_key(table: pa.Table, key: str) -> pa.Table:
    """The last row of each ``key`` value (segments are concatenated oldest first, so the
    last row is the newest state of that key), in table order."""
    return _row_per_key(table, key, "max")


def first_row_per_key(table: pa.Table, key: str) -> pa.Table:
    """The first row of each ``key`` value, in table order."""
    return _row_per_key(table, key, "min")


def _row_per_key(table: pa.Table, key: str, which: str) -> pa.Table:
    if table.num_rows == 0:
        return table
    # Arrow's hash group-by (nulls are one key, as in a dict): no Python object per row,
    # which cost ~0.3 s per refresh of a 250k-chunk library over its state tables.
    pos = pa.table({"k": table.column(key), "i": pa.array(np.arange(table.num_rows, dtype=np.int64))})
    rows = pos.group_by("k", use_threads=False).aggregate([("i", which)]).column(f"i_{which}").to_numpy()
    return table.take(pa.array(np.sort(rows), pa.int64()))


def restricted_mask(labels: pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
    """Which rows carry a restricted label, ``is_restricted`` judged once per distinct label
    (a library of millions of chunks has a handful of labels); None counts as restricted."""
    bad = [v for v in pc.unique(labels).to_pylist() if is_restricted(v)]
    return pc.is_in(labels, value_set=pa.array(bad, labels.type), skip_nulls=False)
