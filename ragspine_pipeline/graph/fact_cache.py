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

import pyarrow as pa
import pyarrow.compute as pc

from ..retrieval.chunking.chunk_schema import row_to_chunk
from ..warehouse.common import restricted_mask
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


def load_cache(table: pa.Table | None) -> dict[str, tuple[str, str]]:
    """chunk_id -> (inputs digest, facts JSON) of a previous version's ``FACTS_TABLE``."""
    if table is None:
        return {}
    cols = [table.column(c).to_pylist() for c in ("chunk_id", "inputs", "facts")]
    return {cid: (dig, facts) for cid, dig, facts in zip(*cols, strict=True)}


def served_facts(served: pa.Table, dims: Dimensions, cache: dict[str, tuple[str, str]],
                 rows: Callable[..., pa.Table] | None = None) -> ChunkFacts:
    """Facts of the served chunks (``served_chunk_table`` rows, chunk_id order; at least
    ``FACT_COLUMNS``), extracting only those without a cached row of the same inputs.
    ``rows(positions, columns=None)``: those served chunks' stored rows (default: ``served``'s
    own), read for the extracted chunks (whole) and the cited ones (offset and text) only. Refuses a RESTRICTED row as the
    builder does, rather than trusting the caller."""
    rows = rows or (lambda at, columns=None: served.take(pa.array(at, pa.int64())))
    bad = restricted_mask(served.column("sensitivity").fill_null("INTERNAL"))
    if pc.any(bad).as_py():
        cid = served.filter(bad).column("chunk_id")[0].as_py()
        raise GraphBuildError(f"chunk {cid} is RESTRICTED; build the graph from served chunks only")
    ids = served.column("chunk_id").to_pylist()
    doc_ids, titles, entities, periods, langs, starts = (served.column(c).to_pylist() for c in _META)
    ex = Extractor(dims)
    known = {e.id for e in dims.entities}
    docs: dict[str, dict[str, str]] = {}
    pairs: list[tuple[tuple[str, int, str], list[MetricFact]]] = []
    digests, blobs, todo = [], [], []
    for i, cid in enumerate(ids):
        doc = doc_ids[i]
        if doc not in docs:  # a document's metadata from its first served chunk, as build_graph
            docs[doc] = {"title": titles[i] or "", "entity": entities[i] or "", "period": periods[i] or "",
                         "language": langs[i] or ""}
        dig = _inputs(doc, titles[i], entities[i], periods[i], starts[i])
        hit = cache.get(cid)
        digests.append(dig)
        if hit is not None and hit[0] == dig:
            blobs.append(hit[1])
            if hit[1] != "[]":  # most chunks state no fact
                pairs.append(((doc, starts[i] or 0, cid), [MetricFact(**d) for d in json.loads(hit[1])]))
        else:
            blobs.append(None)
            todo.append(i)
    if todo:  # only the new chunks become Python chunk objects and meet the extractor
        for i, row in zip(todo, rows(todo).to_pylist(), strict=True):
            c = row_to_chunk(row)
            facts = known_facts(ex, known, c)
            blobs[i] = json.dumps([f.to_dict() for f in facts], ensure_ascii=False)
            pairs.append(((c.doc_id, c.source_locator.start, c.chunk_id), facts))
    facts = dedupe_facts(pairs)
    cited = sorted({f.chunk_id for f in facts})
    spans: dict[str, tuple[int, str]] = {}
    if cited:
        at = {cid: i for i, cid in enumerate(ids)}
        got = rows([at[c] for c in cited], ["start_char", "text"]).select(["chunk_id", "start_char", "text"]).to_pylist()
        spans = {r["chunk_id"]: (r["start_char"] or 0, r["text"] or "") for r in got}
    table = pa.table({"chunk_id": served.column("chunk_id"), "inputs": pa.array(digests, pa.string()),
                      "facts": pa.array(blobs, pa.string())}, schema=FACTS_SCHEMA)
    return ChunkFacts(docs, facts, table, spans, extracted=len(todo), reused=len(ids) - len(todo))
