"""A serving process is ready before it says so (#47 item 4): the first query after open
pays no kernel load, compile or lazy check.

The service's generation, and the one door opened with ``warm=True``, come back with every
BM25 kernel the first queries call already loaded (no numba dispatcher gains a signature on
them, filtered or not, either layout), the index's lazy checks done, the published vectors
warmed, and ``/readyz`` answers 503 until the warm-up has finished. The CLI's one-shot door
(``warm`` off) leaves the lazy checks to its query.
"""

from __future__ import annotations

import importlib
import pkgutil
import threading
from pathlib import Path

import numpy as np
import pytest
from service_fixtures import refresh_library, wait_ready

from ragspine_pipeline import serving
from ragspine_pipeline.corpus import DEMO_ROOT, list_libraries
from ragspine_pipeline.retrieval.hybrid.unwrap import hybrid_retrievers
from ragspine_pipeline.retrieval.lexical import kernels as kernel_pkg
from ragspine_pipeline.retrieval.lexical.index.packed_index import PackedBM25Index
from ragspine_pipeline.retrieval.link.assembly_warm import (
    WarmReport,
    check_heavy_terms,
    prefetch,
    warm_index,
)
from ragspine_pipeline.retrieval.vector.published import PublishedVectors
from ragspine_pipeline.service.served import ServedLibraries, ServingAssembly
from ragspine_pipeline.warehouse import served_records
from ragspine_pipeline.warehouse.versioned import VersionedTables

QUESTIONS = ["revenue 2023", "travel policy", "gross margin", "why did the plant close"]


def _signatures() -> dict[str, int]:
    """Loaded signatures of every numba dispatcher of the kernel modules imported so far:
    a first query that loads or compiles one grows a count."""
    out = {}
    for info in pkgutil.iter_modules(kernel_pkg.__path__):
        mod = importlib.import_module(f"{kernel_pkg.__name__}.{info.name}")
        for name, obj in vars(mod).items():
            sigs = getattr(obj, "signatures", None)
            if isinstance(sigs, list) and hasattr(obj, "py_func"):
                out[f"{info.name}.{name}"] = len(sigs)
    return out


def _publish(root: Path, *, packed: bool) -> Path:
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(served_records, "BATCH_ROWS", 4)  # many record batches: a probe reads few of them
        if packed:
            mp.setenv("RAGSPINE_BM25_LAYOUT", "packed")
        wh = VersionedTables(root)
        for lib in list_libraries():
            refresh_library(wh, DEMO_ROOT, lib, graph=False)
    return root


@pytest.fixture(scope="module", params=["plain", "packed"])
def layout(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def warehouse(layout, tmp_path_factory) -> Path:
    return _publish(tmp_path_factory.mktemp(f"warm_{layout}"), packed=layout == "packed")


def _indexes(*retrievers) -> list:
    return [h.index for r in retrievers for h in hybrid_retrievers(r)]


def _checked(ix) -> bool:
    """The lazy checks a first query would run are done (lengths and vocabulary table)."""
    return bool(ix._lengths_ok and ix.vocab._table_ok)


def test_prefetch_reads_a_file_once_and_stays_under_its_limit(tmp_path):
    f = tmp_path / "data.bin"
    f.write_bytes(np.arange(3 << 18, dtype=np.int32).tobytes())  # 3 MiB: several reads
    assert prefetch(f) == f.stat().st_size
    assert prefetch(f, limit=f.stat().st_size - 1) == 0  # larger than the limit: left alone
    assert prefetch(tmp_path / "missing.bin") == 0


def test_the_service_generation_is_warm_before_it_is_served(warehouse, layout, monkeypatch):
    warmed_vectors = []
    real = PublishedVectors.warm
    monkeypatch.setattr(PublishedVectors, "warm", lambda self: (warmed_vectors.append(self.path), real(self))[1])
    served = ServedLibraries(ServingAssembly.resolve(warehouse, mode="hybrid"))
    served.refresh()
    gen = served.current
    assert gen is not None
    libs = list(gen.libraries.values())
    indexes = _indexes(*(r for lib in libs for r in lib.retrievers.values()))
    assert indexes and all(_checked(ix) for ix in indexes)
    for h in hybrid_retrievers(libs[0].retrievers["bm25"]):  # every record batch's checksums checked
        assert h.chunks._verify.__self__.batch_ok.all()
    assert all(isinstance(ix, PackedBM25Index) == (layout == "packed") for ix in indexes)
    # Every library's published vectors warmed once (the bm25 mode serves none).
    assert len(warmed_vectors) == len(libs)
    before = _signatures()
    for lib in libs:
        for mode, r in lib.retrievers.items():
            for q in QUESTIONS:
                assert isinstance(r.retrieve(q, top_k=3), list), mode
                r.retrieve(q, top_k=3, filters={"entity": "ACME_CN"})
    assert _signatures() == before  # nothing loaded or compiled by the first queries


def test_the_one_door_warms_only_when_asked(warehouse):
    cold = serving.open_published_retriever(warehouse, mode="bm25")
    assert not any(_checked(ix) for ix in _indexes(cold))  # the one-shot query pays its own
    warm = serving.open_published_retriever(warehouse, mode="bm25", warm=True)
    assert all(_checked(ix) for ix in _indexes(warm))
    assert warm.retrieve(QUESTIONS[0], top_k=3) == cold.retrieve(QUESTIONS[0], top_k=3)


def test_a_bare_index_warms_its_kernels_and_checks(warehouse):
    r = serving.open_published_retriever(warehouse, mode="bm25", library=list_libraries()[0])
    (ix,) = _indexes(r)
    report = warm_index(ix)
    assert _checked(ix) and report.prefetched_bytes == Path(ix.path).stat().st_size
    before = _signatures()
    ix.search(["revenue"], k=3)
    ix.search(["margin"], k=3, candidates=np.arange(0, ix.n_docs, 3))
    assert _signatures() == before


def test_the_heaviest_terms_are_checked_at_start_the_rest_on_first_use(warehouse):
    r = serving.open_published_retriever(warehouse, mode="bm25", library=list_libraries()[0])
    (ix,) = _indexes(r)
    df = np.asarray(ix.df)
    cut = int(np.quantile(df, 0.9))
    report = WarmReport()
    check_heavy_terms(ix, report, min_postings=cut)
    ok = ix._file.term_ok
    assert report.heavy_terms == int((df >= cut).sum()) > 0
    assert ok[df >= cut].all() and not ok[df < cut].any()


def test_readyz_waits_for_the_warm_up(warehouse, monkeypatch):
    pytest.importorskip("fastapi")
    pytest.importorskip("mcp")
    from fastapi.testclient import TestClient

    from ragspine_pipeline.service.app import create_app
    from ragspine_pipeline.service.limits import ServiceLimits

    started, release = threading.Event(), threading.Event()
    real = serving.warm_retriever

    def slow_warm(*retrievers, **kwargs):
        started.set()
        assert release.wait(30)
        return real(*retrievers, **kwargs)

    monkeypatch.setattr(serving, "warm_retriever", slow_warm)
    with TestClient(create_app(warehouse, mode="bm25", limits=ServiceLimits(rate_per_s=0)),
                    base_url="http://127.0.0.1:8080") as c:
        assert started.wait(30)
        assert c.get("/readyz").status_code == 503  # loaded, not yet warm: not ready
        release.set()
        wait_ready(c.get)
        assert c.post("/v1/search", json={"query": QUESTIONS[0]}).status_code == 200


def test_the_probe_never_takes_restricted_text():
    """The warm-up's probe query is embedded like any query: it is taken from an open chunk,
    never from a RESTRICTED one or one with an odd label (fail closed), and none at all when
    no open chunk is among the first few."""
    from ragspine_pipeline.retrieval.chunking.chunking import chunk_document
    from ragspine_pipeline.retrieval.link.assembly_warm import probe_text
    from ragspine_pipeline.retrieval.link.narrative_link import NarrativeIndex

    def retriever(labels):
        chunks = [c for i, label in enumerate(labels)
                  for c in chunk_document(f"secret merger plan number {i}" if label != "PUBLIC"
                                          else f"open annual report {i}", doc_id=f"d{i}",
                                          metadata={"sensitivity": label})]
        return NarrativeIndex.from_chunks(chunks, library_id="lib", exclude_restricted=False).retriever

    assert probe_text(retriever(["RESTRICTED", "Restricted-ish", "PUBLIC"])) == "open annual report 2"
    assert probe_text(retriever(["RESTRICTED", "RESTRICTED"])) is None
