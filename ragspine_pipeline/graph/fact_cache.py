"""Each served chunk's facts, kept with the graph version, so a refresh extracts only new chunks.

Why: the relation graph is a pure function of the served chunks, and almost all of its
cost is the rule extraction over every chunk's text (SciFact: 3.3 s of a 4.0 s step). A 1%
refresh re-extracted the whole library, most of the refresh's time. A chunk's facts depend
only on the chunk (its id is content-addressed: document, offsets, text) and on the
metadata the extractor falls back to (title, entity, period), under the dimensions of the
graph's input hash. So a graph version stores, per served chunk, those inputs' digest and
the facts that chunk gave (``FACTS_TABLE``; a chunk with none has an empty list), and the
next version reuses them for every chunk whose id and digest are unchanged.

The result is the full build's, row for row: the same facts per chunk, deduplicated and
assembled the same way (``build.dedupe_facts``, ``build.assemble_graph``). Only served
chunks are ever read or written here: a chunk relabelled RESTRICTED or withheld is not in
the served table, so its cached facts are neither used nor carried into the new version.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..retrieval.chunking.chunk_schema import row_to_chunk
from ..warehouse.common import first_row_per_key, restricted_mask
from .build import GraphBuildError, dedupe_facts, known_facts
from .dimensions import Dimensions
from .extract import Extractor, MetricFact

FACTS_TABLE = "chunk_facts"
FACTS_SCHEMA = pa.schema([("chunk_id", pa.string()), ("inputs", pa.string()), ("facts", pa.string())])
_META = ("doc_id", "title", "entity", "period", "language", "start_char")
# The served columns the facts need (the rest of a row is read only for the chunks the
# extractor meets, and the text only for the chunks a fact cites); version: the row's key.
FACT_COLUMNS = ["chunk_id", "sensitivity", "version", *_META]


@dataclass(frozen=True)
class ChunkFacts:
    """The graph inputs of a library's served chunks, with what the refresh reused."""

    docs: dict[str, dict[str, str]]  # doc_id -> title, entity, period, language (first chunk's)
    facts: list[MetricFact]  # deduplicated, ``assemble_graph``'s order
    table: pa.Table  # FACTS_TABLE rows of every served chunk (chunk_id order)
    spans: dict[str, tuple[int, str]]  # chunk_id -> (document offset, text) of every cited chunk
    extracted: int  # chunks run through the extractor
    reused: int  # chunks whose facts came from the previous version


def _inputs(doc_id: str | None, title: str | None, entity: str | None, period: str | None,
            start: int | None) -> str:
    """Digest of what a chunk's facts depend on besides its content-addressed id."""
    blob = repr((doc_id or "", title or "", entity or "", period or "", start or 0))  # unambiguous, cheap
    return hashlib.blake2b(blob.encode("utf-8", "surrogatepass"), digest_size=8).hexdigest()


def load_cache(table: pa.Table | None) -> pa.Table | None:
    """A previous version's ``FACTS_TABLE`` (chunk_id, inputs digest, facts JSON), as the
    cache ``served_facts`` looks chunks up in (by Arrow, no Python row per chunk)."""
    return None if table is None else table.select(["chunk_id", "inputs", "facts"])


def served_facts(served: pa.Table, dims: Dimensions, cache: pa.Table | None,
                 rows: Callable[..., pa.Table] | None = None, unchanged: np.ndarray | None = None) -> ChunkFacts:
    """Facts of the served chunks (``served_chunk_table`` rows, chunk_id order; at least
    ``FACT_COLUMNS``), extracting only those without a cached row of the same inputs.
    ``rows(positions, columns=None)``: those served chunks' stored rows (default: ``served``'s
    own), read for the extracted chunks (whole) and the cited ones (offset and text) only.
    ``unchanged`` (bool per served row): rows that are the very stored rows the cache was
    built from, whose inputs digest is the cached one (not recomputed; the others are
    hashed and compared). Refuses a RESTRICTED row as the builder does, rather than
    trusting the caller."""
    rows = rows or (lambda at, columns=None: served.take(pa.array(at, pa.int64())))
    bad = restricted_mask(served.column("sensitivity").fill_null("INTERNAL"))
    if pc.any(bad).as_py():
        cid = served.filter(bad).column("chunk_id")[0].as_py()
        raise GraphBuildError(f"chunk {cid} is RESTRICTED; build the graph from served chunks only")
    n = served.num_rows
    ids = served.column("chunk_id").combine_chunks()
    c_inputs, c_facts = _cached(ids, cache)
    hashed = np.ones(n, np.bool_) if unchanged is None else ~np.asarray(unchanged, np.bool_)
    hashed |= np.asarray(pc.is_null(c_inputs).to_numpy(zero_copy_only=False), np.bool_)
    # Digests and facts stay Arrow columns; Python values only where a row is hashed or extracted.
    meta = served.select(list(_META)).filter(pa.array(hashed))
    values = zip(*(meta.column(c).to_pylist() for c in ("doc_id", "title", "entity", "period", "start_char")),
                 strict=True)
    fresh = pa.array([_inputs(*v) for v in values], pa.string())
    digests = pc.replace_with_mask(c_inputs, pa.array(hashed), fresh) if len(fresh) else c_inputs
    hit = pc.fill_null(pc.equal(digests, c_inputs), False)
    pairs: list[tuple[tuple[str, int, str], list[MetricFact]]] = []
    stated = pc.and_(hit, pc.not_equal(c_facts.fill_null("[]"), "[]"))  # most chunks state no fact
    if pc.any(stated).as_py():
        keys = served.select(["chunk_id", "doc_id", "start_char"]).filter(stated)
        for cid, doc, start, blob in zip(*(keys.column(c).to_pylist() for c in keys.column_names),
                                         c_facts.filter(stated).to_pylist(), strict=True):
            pairs.append(((doc, start or 0, cid), [MetricFact(**d) for d in json.loads(blob)]))
    missed = pc.invert(hit)
    todo = np.flatnonzero(np.asarray(missed.to_numpy(zero_copy_only=False), np.bool_)).tolist()
    made: list[str] = []
    if todo:  # only the new chunks become Python chunk objects and meet the extractor
        ex = Extractor(dims)
        known = {e.id for e in dims.entities}
        for row in rows(todo).to_pylist():
            c = row_to_chunk(row)
            facts = known_facts(ex, known, c)
            made.append(json.dumps([f.to_dict() for f in facts], ensure_ascii=False))
            pairs.append(((c.doc_id, c.source_locator.start, c.chunk_id), facts))
    blobs = pc.replace_with_mask(c_facts, missed, pa.array(made, pa.string())) if todo else c_facts
    facts = dedupe_facts(pairs)
    cited = sorted({f.chunk_id for f in facts})
    spans: dict[str, tuple[int, str]] = {}
    if cited:
        pos = pc.index_in(pa.array(cited, pa.string()), value_set=ids).to_pylist()
        got = rows(pos, ["start_char", "text"]).select(["chunk_id", "start_char", "text"]).to_pylist()
        spans = {r["chunk_id"]: (r["start_char"] or 0, r["text"] or "") for r in got}
    table = pa.table({"chunk_id": served.column("chunk_id"), "inputs": digests, "facts": blobs}, schema=FACTS_SCHEMA)
    return ChunkFacts(_first_rows(served), facts, table, spans, extracted=len(todo), reused=n - len(todo))


def _cached(ids: pa.Array, cache: pa.Table | None) -> tuple[pa.Array, pa.Array]:
    """(cached inputs digest, cached facts JSON) of each id; null where the cache has none."""
    if cache is None or not cache.num_rows:
        return pa.nulls(len(ids), pa.string()), pa.nulls(len(ids), pa.string())
    at = pc.index_in(ids, value_set=cache.column("chunk_id").combine_chunks())
    return (cache.column("inputs").combine_chunks().take(at).cast(pa.string()),
            cache.column("facts").combine_chunks().take(at).cast(pa.string()))


def _first_rows(served: pa.Table) -> dict[str, dict[str, str]]:
    """doc_id -> title, entity, period, language of each document's first served chunk
    (chunk_id order), as ``build_graph`` takes a document's metadata."""
    t = first_row_per_key(served.select(["doc_id", "title", "entity", "period", "language"]), "doc_id")
    cols = [t.column(c).to_pylist() for c in ("doc_id", "title", "entity", "period", "language")]
    return {d: {"title": ti or "", "entity": en or "", "period": pe or "", "language": la or ""}
            for d, ti, en, pe, la in zip(*cols, strict=True)}
