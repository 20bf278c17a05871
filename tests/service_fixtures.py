"""Shared set-up of the service tests (tests/test_service*.py): a published warehouse of
the demo corpus (with relation graphs), an API key file, and a real uvicorn server on
127.0.0.1 on a free port, run in a thread of the test process.

A plain helper module (not conftest): ``from service_fixtures import build_warehouse``.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ragspine_pipeline.corpus import list_libraries
from ragspine_pipeline.graph.step import build_relation_graph
from ragspine_pipeline.paths import DEMO_ROOT
from ragspine_pipeline.retrieval.vector.embedding_backends import DeterministicHashBackend
from ragspine_pipeline.warehouse import pipeline as P
from ragspine_pipeline.warehouse.versioned import VersionedTables

LIBS = ("acme_policies", "acme_reports")


def refresh_library(wh: VersionedTables, corpus: Path, lib: str, *, graph: bool = True) -> str:
    """The engine's steps of one library, then publish: the new snapshot version."""
    P.build_raw_documents(wh, corpus, lib)
    P.build_chunks(wh, lib)
    P.build_lexical_index(wh, lib)
    P.build_embeddings(wh, lib, DeterministicHashBackend(), "deterministic")
    if graph:
        build_relation_graph(wh, lib)
    return P.publish_snapshot(wh, lib).metadata["version"]


def build_warehouse(root: Path, *, copy_corpus: bool = False) -> tuple[Path, Path]:
    """(warehouse, corpus): every demo library published under ``root/wh``; with
    ``copy_corpus`` the corpus is a private copy a test may edit."""
    corpus = DEMO_ROOT
    if copy_corpus:
        corpus = root / "corpus"
        shutil.copytree(DEMO_ROOT, corpus)
    wh = VersionedTables(root / "wh")
    for lib in list_libraries(corpus):
        refresh_library(wh, corpus, lib)
    return root / "wh", corpus


def wait_ready(get: Any, timeout_s: float = 60.0) -> None:
    """Poll /readyz (a client's ``get``) until 200: the snapshots are loaded."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if get("/readyz").status_code == 200:
            return
        time.sleep(0.05)
    raise AssertionError("the service never became ready")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def running(app: Any, **options: Any) -> Iterator[str]:
    """``app`` served by uvicorn on 127.0.0.1 (a free port) in a thread: its base URL.
    ``options``: more ``uvicorn.Config`` arguments (the listener limits of ``serve``)."""
    import uvicorn

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on",
                                           **options))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise AssertionError("uvicorn did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
