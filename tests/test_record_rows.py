"""Served records' JSON rows: DuckDB writes what json.dumps wrote, row for row (#27)."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pyarrow as pa

from ragspine_pipeline.warehouse import record_rows
from ragspine_pipeline.warehouse.record_rows import row_json_batches

HOSTILE = ['plain', 'quote " back \\ slash', 'new\nline\ttab\r\x00\x01\x1f', 'é 漢字 😀 \u2028\u2029', '', None]


def _table(n: int, *, extra: dict[str, pa.Array] | None = None) -> pa.Table:
    cols = {
        "chunk_id": pa.array([f"c{i:06d}" for i in range(n)]),
        "text": pa.array([HOSTILE[i % len(HOSTILE)] for i in range(n)]),
        "ordinal": pa.array([None if i % 7 == 0 else i * 1_000_003 - 2**40 for i in range(n)], pa.int64()),
        "flag": pa.array([None if i % 5 == 0 else i % 2 == 0 for i in range(n)]),
        "parent_start": pa.nulls(n),
        "ingested_at": pa.array([None if i % 4 == 0 else datetime(2026, 1, 1 + i % 28, 3, 4, 5, (i % 3) * 1234)
                                 for i in range(n)], pa.timestamp("us")),
        "valid_at": pa.array([datetime(2025, 5, 6, 7, 8, 9, i % 2, tzinfo=UTC) for i in range(n)],
                             pa.timestamp("us", tz="UTC")),
    }
    cols.update(extra or {})
    return pa.table(cols)


def _rows(table: pa.Table, batch_rows: int) -> list[list]:
    out = []
    for batch, rows in row_json_batches(table, batch_rows):
        assert len(batch) == len(rows)
        out.extend(json.loads(s) for s in rows.to_pylist())
    return out


def test_duckdb_rows_read_back_as_the_python_rows_in_table_order(monkeypatch):
    monkeypatch.setattr(record_rows, "SLICE_ROWS", 64)  # several DuckDB slices and a short last one
    table = _table(300)
    want = [json.loads(s) for s in record_rows._python_rows(table).to_pylist()]
    assert _rows(table, 16) == want
    assert want[1][5] == datetime(2026, 1, 2, 3, 4, 5, 1234).isoformat()  # the same strings as before
    assert want[0][6].endswith("+00:00")
    assert _rows(table.slice(0, 0), 16) == []


def test_a_column_duckdb_would_write_differently_takes_the_python_path(monkeypatch):
    table = _table(10, extra={"score": pa.array([0.1 * i for i in range(10)])})
    monkeypatch.setattr(record_rows, "_duckdb_rows", None)  # would fail if called
    assert _rows(table, 4) == [json.loads(s) for s in record_rows._python_rows(table).to_pylist()]
