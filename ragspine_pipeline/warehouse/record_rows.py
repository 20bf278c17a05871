"""Each served row as the JSON list the served records keep (``served_records.ROW_COLUMN``).

Why: writing the records of a 1M-chunk library spent ~30 s turning every row into Python
objects and ``json.dumps`` (most of a refresh, #27). DuckDB's ``json_array`` builds the same
JSON in C++, a slice of rows at a time (bounded memory at any library size). What ``read_row``
parses back is the same as before: strings, integers, booleans and nulls are written by
DuckDB, and a timestamp goes in as Python's ``isoformat`` string, made here as before. A
table with any other column type (a float's text, a nested value) takes the Python path, so
a row never reads back differently from the chunk it was written from.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any

import duckdb
import pyarrow as pa

SLICE_ROWS = 65_536  # rows per DuckDB query: a few MB of JSON at a time

__all__ = ["row_json_batches"]


def _plain(t: pa.DataType) -> bool:
    return (pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_integer(t)
            or pa.types.is_boolean(t) or pa.types.is_null(t) or pa.types.is_timestamp(t))


def _jsonable(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(f"a served record holds a {type(value).__name__}")


def _isoformat(col: pa.ChunkedArray | pa.Array) -> pa.Array:
    return pa.array([None if v is None else v.isoformat() for v in col.to_pylist()], pa.string())


def _python_rows(table: pa.Table) -> pa.Array:
    names = table.column_names
    return pa.array([json.dumps([r[c] for c in names], default=_jsonable) for r in table.to_pylist()], pa.string())


def _duckdb_rows(con: duckdb.DuckDBPyConnection, query: str) -> Callable[[pa.Table], pa.Array]:
    def rows(part: pa.Table) -> pa.Array:
        cols = {f.name: _isoformat(part.column(f.name)) if pa.types.is_timestamp(f.type) else part.column(f.name)
                for f in part.schema}
        given = pa.table(cols)
        con.register("served_part", given)
        try:
            out = con.sql(query).to_arrow_table()
        finally:
            con.unregister("served_part")
        # Row order is DuckDB's insertion order (preserve_insertion_order); the first column
        # (the chunk id) coming back unchanged proves it for this slice.
        if out.num_rows != part.num_rows or not out.column("k").equals(given.column(0)):
            raise RuntimeError("DuckDB's JSON rows do not follow the table's rows")
        return out.column("j").combine_chunks().cast(pa.string())
    return rows


def row_json_batches(table: pa.Table, batch_rows: int) -> Iterator[tuple[pa.RecordBatch, pa.Array]]:
    """(batch of ``table``, its rows as JSON lists in column order), ``batch_rows`` rows at
    a time, in table order."""
    con = None
    if all(_plain(f.type) for f in table.schema):
        con = duckdb.connect(config={"preserve_insertion_order": True})
        quoted = ['"' + n.replace('"', '""') + '"' for n in table.column_names]
        first = quoted[0] if quoted else "NULL"
        make = _duckdb_rows(con, f"SELECT {first} AS k, json_array({', '.join(quoted)})::VARCHAR AS j "
                                 "FROM served_part")
    else:
        make = _python_rows
    try:
        step = max(batch_rows, SLICE_ROWS // batch_rows * batch_rows)
        for lo in range(0, table.num_rows, step):
            part = table.slice(lo, step)
            rows = make(part)
            for off in range(0, part.num_rows, batch_rows):
                yield part.slice(off, batch_rows).combine_chunks().to_batches()[0], rows.slice(off, batch_rows)
    finally:
        if con is not None:
            con.close()
