"""A VectorStore over a Parquet table (the pipeline's ``embeddings`` versions), queried by DuckDB.

Rows are ``id``, ``vector`` (list<float32>) and any metadata columns. Queries run in an
in-memory DuckDB connection straight over the Parquet file (``list_cosine_similarity``,
no extension needed), so the table never has to fit in Python objects; ``where`` uses the
same predicates as the lexical pre-filter, compiled to parameterized SQL. Writes
(``upsert``/``delete``) produce a new file via temp + rename: readers holding the old path
keep a consistent view. Ties are broken by id ascending. RESTRICTED rows are not removed
here — the retriever's exits do that.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute  # noqa: F401  (pa.compute)
import pyarrow.parquet as pq

from ..filters import FilterError, compile_filters
from .store import VectorHit, unit_rows

_SQL_OPS = {"eq": "=", "ne": "<>", "gt": ">", "gte": ">=", "lt": "<", "lte": "<="}


class ParquetVectorStore:
    def __init__(self, path: str | os.PathLike[str], *, id_column: str = "id", vector_column: str = "vector") -> None:
        self.path = Path(path)
        self.id_column = id_column
        self.vector_column = vector_column

    # ------------------------------------------------------------------ reads
    def _schema(self) -> pa.Schema | None:
        return pq.read_schema(self.path) if self.path.exists() else None

    def count(self) -> int:
        return pq.ParquetFile(self.path).metadata.num_rows if self.path.exists() else 0

    def query(self, vector: Sequence[float], k: int = 10, where: Mapping[str, Any] | None = None) -> list[VectorHit]:
        schema = self._schema()
        if schema is None or k <= 0:
            return []
        meta_cols = [n for n in schema.names if n not in (self.id_column, self.vector_column)]
        fields = {n: (int if pa.types.is_integer(schema.field(n).type) else
                      float if pa.types.is_floating(schema.field(n).type) else
                      bool if pa.types.is_boolean(schema.field(n).type) else str) for n in meta_cols}
        preds = compile_filters(where, fields)
        clauses, params = [], []
        for p in preds:
            col = f'"{p.field}"'
            if p.op in _SQL_OPS:
                clauses.append(f"{col} {_SQL_OPS[p.op]} ?")
                params.append(p.operand)
            elif p.op in ("in", "nin"):
                values = sorted(p.operand, key=repr)
                if not values:
                    clauses.append("FALSE" if p.op == "in" else "TRUE")
                    continue
                clauses.append(f"{col} {'NOT ' if p.op == 'nin' else ''}IN ({', '.join('?' * len(values))})")
                params.extend(values)
            elif p.op == "between":
                clauses.append(f"{col} BETWEEN ? AND ?")
                params.extend(p.operand)
            else:  # pragma: no cover - compile_filters rejects unknown operators
                raise FilterError(f"filter on {p.field!r}: unsupported operator {p.op!r}")
        q = np.asarray(vector, dtype=np.float32)
        n = float(np.linalg.norm(q))
        if n == 0:
            return []
        sql = (f'SELECT "{self.id_column}", list_cosine_similarity("{self.vector_column}", ?::FLOAT[]) AS s'
               + "".join(f', "{c}"' for c in meta_cols)
               + " FROM read_parquet(?)" + (" WHERE " + " AND ".join(clauses) if clauses else "")
               + f' ORDER BY s DESC, "{self.id_column}" ASC LIMIT ?')
        con = duckdb.connect()
        try:
            rows = con.execute(sql, [(q / n).tolist(), str(self.path), *params, k]).fetchall()
        finally:
            con.close()
        return [VectorHit(str(r[0]), float(r[1]), dict(zip(meta_cols, r[2:], strict=True))) for r in rows]

    # ----------------------------------------------------------------- writes
    def _replace(self, table: pa.Table) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.{uuid.uuid4().hex}.tmp")
        pq.write_table(table, tmp)
        os.replace(tmp, self.path)

    def upsert(self, ids: Sequence[str], vectors: Sequence[Sequence[float]],
               metadata: Sequence[Mapping[str, Any]] | None = None) -> int:
        arr = unit_rows(ids, vectors, metadata)
        if not ids:
            return 0
        new: dict[str, list] = {self.id_column: list(ids), self.vector_column: arr.tolist()}
        for key in sorted({k for m in (metadata or []) for k in m}):
            new[key] = [m.get(key) for m in (metadata or [])]
        new_t = pa.table({**new, self.vector_column: pa.array(new[self.vector_column], pa.list_(pa.float32()))})
        if self.path.exists():
            old = pq.read_table(self.path)
            if old.num_rows and len(old.column(self.vector_column)[0]) != arr.shape[1]:
                raise ValueError("vector dimension differs from the stored vectors")
            keep = pa.compute.invert(pa.compute.is_in(old.column(self.id_column), value_set=pa.array(list(ids))))
            old = old.filter(keep)
            new_t = pa.concat_tables([old, new_t.select(old.column_names)]) if old.num_rows else new_t
        self._replace(new_t.sort_by(self.id_column))
        return len(ids)

    def delete(self, ids: Sequence[str]) -> int:
        if not self.path.exists() or not ids:
            return 0
        old = pq.read_table(self.path)
        hit = pa.compute.is_in(old.column(self.id_column), value_set=pa.array(list(ids)))
        n = int(pa.compute.sum(hit).as_py() or 0)
        if n:
            self._replace(old.filter(pa.compute.invert(hit)))
        return n
