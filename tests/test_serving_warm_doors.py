"""Every long-lived door warms before it answers, once per library (#47 item 4, the parts left).

The FastAPI service warmed each library before its generation was swapped in
(``tests/test_serving_warm.py``); here the other doors and the leftovers:

* a Ray shard warms its segments before it says where it listens (files read, heaviest
  terms checked, kernels called unfiltered and filtered), and the sharded replica warms
  its libraries through the front and the shards, not through the whole index it no
  longer searches (shards built in this process: no Ray needed);
* the Dagster ``RetrievalResource`` warms a library when it opens it (``warm``, on by
  default), once per snapshot; the CLI's one-shot door stays cold;
* a library served in a dense mode and in ``bm25`` opens its BM25 file once, and answers
  in ``bm25`` what a load of its own answers;
* each library's warm-up is one log line;
* the union ranking builds dense positions only for the libraries that answer the dense
  channel, with the same answers.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from service_fixtures import refresh_library
from test_multi_library_language import ENGLISH, GERMAN
from test_scale_serving import _retriever, _synthetic

from ragspine_pipeline import serving
from ragspine_pipeline.corpus import DEMO_ROOT, list_libraries, load_golden
from ragspine_pipeline.retrieval.hybrid.unwrap import hybrid_retrievers
from ragspine_pipeline.retrieval.link import assembly_warm
from ragspine_pipeline.service.served import ServedLibraries, ServingAssembly
from ragspine_pipeline.warehouse import pipeline as P
from ragspine_pipeline.warehouse.versioned import VersionedTables


@pytest.fixture(scope="module")
def warehouse(tmp_path_factory) -> Path:
    """The demo published in 2 hash buckets (what shards map), vectors stored."""
    root = tmp_path_factory.mktemp("warm_doors")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RAGSPINE_BM25_BUCKETS", "2")
        wh = VersionedTables(root)
        for lib in list_libraries():
            refresh_library(wh, DEMO_ROOT, lib, graph=False)
    return root


def _checked(ix: Any) -> bool:
    """The lazy checks a first query would run are done (lengths and vocabulary table), in
    every segment of an index published in hash buckets."""
    return all(bool(s._lengths_ok and s.vocab._table_ok) for s in getattr(ix, "segments", None) or [ix])


def _indexes(*retrievers: Any) -> list[Any]:
    return [h.index for r in retrievers for h in hybrid_retrievers(r)]


def _counting_warm(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, list[Any], Any]]:
    """``serving.warm_retriever`` recording (name, the indexes it found, its report)."""
    calls: list[tuple[str, list[Any], Any]] = []
    real = serving.warm_retriever

    def warm(*retrievers: Any, **kwargs: Any) -> Any:
        indexes = _indexes(*retrievers)
        report = real(*retrievers, **kwargs)
        calls.append((kwargs.get("name", ""), indexes, report))
        return report

    monkeypatch.setattr(serving, "warm_retriever", warm)
    return calls


# ------------------------------------------------------------------ Ray: shards and replica
def test_a_shard_warms_its_segments_before_it_listens(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from ragspine_pipeline.retrieval.lexical.refresh.segments import open_segments
    from ragspine_pipeline.scale.shards import BM25Shard, write_layout

    chunks, _ = _synthetic(600)
    single = _retriever(chunks)
    write_layout(tmp_path, single.index, [c.chunk_id for c in single.chunks], 2)
    df = np.concatenate([np.asarray(s.df) for s in open_segments(tmp_path).segments])
    cut = int(np.quantile(df, 0.8))
    monkeypatch.setattr(assembly_warm, "HEAVY_TERM_POSTINGS", cut)  # "heavy" at this corpus's scale
    shard = BM25Shard(str(tmp_path), [1])
    try:
        (seg,) = shard.index.segments
        assert _checked(seg)
        heavy = np.asarray(seg.df) >= cut
        assert heavy.sum() > 2 and seg._file.term_ok[heavy].all()  # the probe alone checks one term
        assert shard.warmed.indexes == 1 and shard.warmed.heavy_terms == int(heavy.sum())
        assert shard.warmed.prefetched_bytes == Path(seg.path).stat().st_size
        assert "shard probe" in shard.warmed.seconds  # its own filtered two steps ran once
    finally:
        shard.wire.close()


def test_the_sharded_replica_warms_through_its_shards(warehouse: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``ShardedAssembly`` points a library's retrievers at its shards before the warm-up,
    so the probes (unfiltered and filtered) go through the front to the shards, and the
    generation is swapped in after; the shards are warm before the front opens."""
    from ragspine_pipeline.scale import serve as SV
    from ragspine_pipeline.scale.shards import (
        BM25Shard,
        ShardedBM25,
        assign_buckets,
        segment_buckets,
    )

    bodies: list[BM25Shard] = []

    def start_shards(folder: Any, shards: int, *, vectors: Any = None, name: str | None = None) -> list[Any]:
        made = [BM25Shard(str(folder), b, vectors) for b in assign_buckets(segment_buckets(folder), shards)]
        bodies.extend(made)
        return made

    def front(handles: list[Any], *, timeout_s: float | None = None, path: str | None = None) -> ShardedBM25:
        return ShardedBM25([None] * len(handles), infos=[b.describe() for b in handles], timeout_s=30.0, path=path)

    searches: list[bool] = []  # filtered?
    real_search = ShardedBM25.search

    def search(self: ShardedBM25, *args: Any, **kwargs: Any) -> Any:
        cand = kwargs.get("candidates", args[2] if len(args) > 2 else None)
        searches.append(cand is not None)
        return real_search(self, *args, **kwargs)

    monkeypatch.setattr(SV, "start_shards", start_shards)
    monkeypatch.setattr(SV, "ShardedBM25", front)
    monkeypatch.setattr(ShardedBM25, "search", search)
    calls = _counting_warm(monkeypatch)
    assembly = SV.ShardedAssembly.resolve(warehouse, mode="hybrid")
    assembly.shards = 2
    served = ServedLibraries(assembly)
    try:
        assert served.refresh()
        libs = list_libraries()
        for _, indexes, report in calls:  # warmed through the front, not the whole file
            assert indexes and all(isinstance(ix, ShardedBM25) for ix in indexes)
            assert report.prefetched_bytes == 0 and not report.skipped_prefetch
        assert sorted(name for name, _, _ in calls) == sorted(
            f"library {lib}@{served.current.libraries[lib].version}" for lib in libs)
        assert True in searches and False in searches  # the probes reached the shards, filtered or not
        assert len(bodies) == 2 * len(libs)
        for body in bodies:  # each shard warm before the front opened
            assert body.warmed.indexes == len(body.index.segments) and "shard probe" in body.warmed.seconds
            assert all(_checked(seg) for seg in body.index.segments)
        for snap in served.current.libraries.values():
            assert all(isinstance(ix, ShardedBM25) for ix in _indexes(*snap.retrievers.values()))
            assert isinstance(snap.retrievers["hybrid"].retrieve("revenue 2023", top_k=3), list)
    finally:
        for body in bodies:
            body.wire.close()


# ------------------------------------------------------------------ Dagster and the one-shot door
def test_the_dagster_resource_warms_a_library_once_when_it_opens_it(warehouse: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("dagster")
    from resources.retrieval import RetrievalResource

    calls = _counting_warm(monkeypatch)
    res = RetrievalResource(warehouse_root=str(warehouse), mode="bm25")
    first = res.ask("revenue 2023", top_k=3)
    assert sorted(name.split("@")[0] for name, _, _ in calls) == sorted(f"library {lib}" for lib in list_libraries())
    assert all(_checked(ix) for _, indexes, _ in calls for ix in indexes)
    assert res.ask("travel policy", top_k=3) is not None and res.ask("revenue 2023", top_k=3) == first
    assert len(calls) == len(list_libraries())  # cached: not warmed again
    calls.clear()
    cold = RetrievalResource(warehouse_root=str(warehouse), mode="bm25", warm=False)
    assert not any(_checked(ix) for lib in list_libraries() for ix in _indexes(cold.retriever_for(lib)))
    assert cold.ask("revenue 2023", top_k=3) == first and not calls


def test_the_cli_one_shot_door_stays_cold(warehouse: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _counting_warm(monkeypatch)
    r = serving.open_retriever(warehouse, mode="bm25")  # what `ragspine query` opens
    assert not any(_checked(ix) for ix in _indexes(r))  # its one query pays its own checks
    assert r.retrieve("revenue 2023", top_k=3) and not calls


# ------------------------------------------------------------------ one open, one log line
def test_a_library_warm_up_is_one_log_line(warehouse: Path, caplog: pytest.LogCaptureFixture) -> None:
    served = ServedLibraries(ServingAssembly.resolve(warehouse, mode="hybrid"))
    with caplog.at_level(logging.INFO, logger="ragspine"):
        served.refresh()
    warmed = [r.getMessage() for r in caplog.records if "warmed" in r.getMessage()]
    assert len(warmed) == len(list_libraries())  # the warm-up's own line, not a second one by the service
    for lib, snap in served.current.libraries.items():
        assert sum(m.startswith(f"library {lib}@{snap.version} warmed: ") for m in warmed) == 1


def test_a_library_served_in_two_modes_opens_its_bm25_file_once(warehouse: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    opened: list[str] = []
    real_open = P.open_bm25_file
    monkeypatch.setattr(P, "open_bm25_file", lambda path, *a, **k: (opened.append(str(path)),
                                                                     real_open(path, *a, **k))[1])
    served = ServedLibraries(ServingAssembly.resolve(warehouse, mode="hybrid"))
    served.refresh()
    libs = list_libraries()
    assert len(opened) == len(set(opened)) == len(libs)  # one open per library, not one per mode
    for snap in served.current.libraries.values():
        (hyb,), (lex,) = (hybrid_retrievers(snap.retrievers[m]) for m in ("hybrid", "bm25"))
        assert lex.index is hyb.index and lex.channels == ("bm25",) and lex.embedding_backend is None
        assert "dense" in hyb.channels
    # The bm25 mode answers what a bm25 load of its own answers, filters and all.
    alone = serving.open_published_retriever(warehouse, mode="bm25")
    whole = served.current.retriever(libs, "bm25")
    for g in load_golden(DEMO_ROOT / "golden_queries.json"):
        for filters in (g.get("filters"), None):
            assert whole.retrieve(g["query"], filters=filters, top_k=8) == \
                alone.retrieve(g["query"], filters=filters, top_k=8), g["query"]


# ------------------------------------------------------------------ dense positions, only where used
def test_dense_positions_are_built_only_for_the_libraries_that_answer_dense(monkeypatch: pytest.MonkeyPatch) -> None:
    """German and English libraries with different models: a German question's dense
    channel is answered by the German library alone (``_language_home``), so the English
    one gets no dense positions (an arange(n) per query without a filter), filtered or not;
    the answers are those of the pre-filter that built them for every library."""
    from ragspine_pipeline.retrieval.chunking.chunking import chunk_document
    from ragspine_pipeline.retrieval.hybrid.fusion import FusionConfig
    from ragspine_pipeline.retrieval.link.global_rank import rank_union
    from ragspine_pipeline.retrieval.link.narrative_link import NarrativeIndex
    from ragspine_pipeline.retrieval.vector.embedding_backends import DeterministicHashBackend

    def build(docs: list[tuple[str, str]], name: str, dim: int, weight: float) -> Any:
        chunks = [c for d, t in docs for c in chunk_document(t, doc_id=d, metadata={"sensitivity": "PUBLIC",
                                                                                      "entity": d[:2]})]
        ix = NarrativeIndex.from_chunks(chunks, library_id=name, embedding_backend=DeterministicHashBackend(dim=dim))
        ix.retriever.fusion = FusionConfig(method="convex", dense_weight=weight)
        return ix.retriever

    parts = {"de": build(GERMAN, "de", 16, 0.7), "en": build(ENGLISH[:60], "en", 24, 0.5)}
    dense_calls: dict[str, list[bool]] = {"de": [], "en": []}

    def record(lib: str, h: Any, force: bool) -> None:
        real = type(h).prefilter

        def prefilter(filters: Any, mask: Any = None, dense: bool = False) -> Any:
            dense_calls[lib].append(dense)
            return real(h, filters, mask, dense or force)

        monkeypatch.setattr(h, "prefilter", prefilter)

    def ranked(force: bool, query: str, filters: Any) -> list[Any]:
        for lib, h in parts.items():
            record(lib, h, force)
        report: dict[str, Any] = {}
        hits = rank_union(parts, query, filters, 10, report=report)
        assert report["dense_scope"] == ["de"]
        return [(x.library_id, x.hit.position, x.hit.fused, x.hit.bm25, x.hit.vector) for x in hits]

    for query in ("Wie ist der wort5 und wort17?", "wort5 wort17"):  # told by its words; by its best match
        for filters in (None, {"entity": "de"}):
            for calls in dense_calls.values():
                calls.clear()
            got = ranked(False, query, filters)
            assert True not in dense_calls["en"] and True in dense_calls["de"], (query, filters)
            assert got and got == ranked(True, query, filters), (query, filters)
