"""LanceDB adapter (embedded, ANN index) for corpora past brute force. Extra: ``[ann]``.

Same VectorStore protocol and the same predicates as the lexical pre-filter; ``where`` is
compiled to Lance's SQL filter and applied *before* the vector search (prefilter), so a
filter never lets other rows in. Lance takes filters as SQL text, so operands are written
as literals by ``_literal`` (strings quoted with '' escaping, numbers by repr, nothing
else accepted). ANN results are approximate; ``refine_factor`` re-ranks candidates
exactly. Ties are ordered by id ascending.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from ..filters import FilterError, compile_filters
from .store import VectorHit, unit_rows

_SQL_OPS = {"eq": "=", "ne": "!=", "gt": ">", "gte": ">=", "lt": "<", "lte": "<="}


class VectorStoreUnavailable(RuntimeError):
    pass


def _literal(v: Any) -> str:
    if isinstance(v, bool):
        return "TRUE" if v else "FALSE"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return "'" + v.replace("'", "''") + "'"
    raise FilterError(f"cannot use {v!r} as a filter value")


class LanceDBVectorStore:
    def __init__(self, uri: str | os.PathLike[str], table: str = "vectors", *, nprobes: int = 20,
                 refine_factor: int = 10) -> None:
        try:
            import lancedb  # lazy: lancedb, the optional [ann] extra
        except ImportError:
            raise VectorStoreUnavailable("LanceDBVectorStore needs lancedb (pip install 'ragspine-pipeline[ann]')") from None
        self._db = lancedb.connect(str(uri))
        self.table_name = table
        self.nprobes = nprobes
        self.refine_factor = refine_factor
        self._fields: dict[str, type] = {}

    def _table(self):
        try:
            return self._db.open_table(self.table_name)
        except (ValueError, FileNotFoundError):
            return None

    def count(self) -> int:
        t = self._table()
        return 0 if t is None else int(t.count_rows())

    def upsert(self, ids: Sequence[str], vectors: Sequence[Sequence[float]],
               metadata: Sequence[Mapping[str, Any]] | None = None) -> int:
        arr = unit_rows(ids, vectors, metadata)
        if not ids:
            return 0
        cols: dict[str, Any] = {"id": pa.array(list(ids), pa.string()),
                                "vector": pa.FixedSizeListArray.from_arrays(pa.array(arr.ravel()), arr.shape[1])}
        for key in sorted({k for m in (metadata or []) for k in m}):
            cols[key] = [m.get(key) for m in (metadata or [])]
            sample = next((m[key] for m in metadata or [] if m.get(key) is not None), "")
            self._fields[key] = type(sample) if isinstance(sample, (int, float, bool)) else str
        data = pa.table(cols)
        t = self._table()
        if t is None:
            self._db.create_table(self.table_name, data=data)
        else:
            t.merge_insert("id").when_matched_update_all().when_not_matched_insert_all().execute(data)
        return len(ids)

    def delete(self, ids: Sequence[str]) -> int:
        t = self._table()
        if t is None or not ids:
            return 0
        before = t.count_rows()
        t.delete(f"id IN ({', '.join(_literal(str(i)) for i in ids)})")
        return before - t.count_rows()

    def build_index(self, *, num_partitions: int = 256, num_sub_vectors: int | None = None) -> None:
        t = self._table()
        if t is None:
            raise ValueError("nothing to index")
        t.create_index(metric="cosine", index_type="IVF_PQ", num_partitions=num_partitions,
                       num_sub_vectors=num_sub_vectors)

    def _where_sql(self, where: Mapping[str, Any] | None) -> str | None:
        t = self._table()
        fields = dict(self._fields)
        if t is not None:
            for f in t.schema:
                if f.name not in ("id", "vector") and f.name not in fields:
                    fields[f.name] = (int if pa.types.is_integer(f.type) else float if pa.types.is_floating(f.type)
                                      else bool if pa.types.is_boolean(f.type) else str)
        preds = compile_filters(where, fields)
        parts = []
        for p in preds:
            col = f"`{p.field}`"
            if p.op in _SQL_OPS:
                parts.append(f"{col} {_SQL_OPS[p.op]} {_literal(p.operand)}")
            elif p.op in ("in", "nin"):
                vals = sorted(p.operand, key=repr)
                if not vals:
                    parts.append("FALSE" if p.op == "in" else "TRUE")
                else:
                    parts.append(f"{col} {'NOT ' if p.op == 'nin' else ''}IN ({', '.join(_literal(v) for v in vals)})")
            elif p.op == "between":
                parts.append(f"{col} BETWEEN {_literal(p.operand[0])} AND {_literal(p.operand[1])}")
        return " AND ".join(parts) or None

    def query(self, vector: Sequence[float], k: int = 10, where: Mapping[str, Any] | None = None) -> list[VectorHit]:
        t = self._table()
        if t is None or k <= 0:
            return []
        q = np.asarray(vector, dtype=np.float32)
        if not np.linalg.norm(q):
            return []
        search = t.search(q / np.linalg.norm(q)).distance_type("cosine").limit(k)
        sql = self._where_sql(where)
        if sql:
            search = search.where(sql, prefilter=True)
        if t.list_indices():
            search = search.nprobes(self.nprobes).refine_factor(self.refine_factor)
        rows = search.to_arrow().to_pylist()
        hits = [VectorHit(r["id"], 1.0 - float(r["_distance"]),
                          {k2: v for k2, v in r.items() if k2 not in ("id", "vector", "_distance")}) for r in rows]
        return sorted(hits, key=lambda h: (-round(h.score, 6), h.id))
