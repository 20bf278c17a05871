"""Shared set-up of the framework adapter tests (tests/test_integrations_*.py): a small
warehouse that is not the demo (two libraries about lighthouses and orchards, one RESTRICTED
canary document among them), published with the engine's steps (BM25 only, no Dagster),
and a real service on 127.0.0.1 over it with a key scoped to both libraries.

A plain helper module (not conftest): a test file imports the ``warehouse`` and ``service``
fixtures it uses (module scope: built once per test file) and ``door`` for its ``make``.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ragspine_pipeline.warehouse import pipeline as P
from ragspine_pipeline.warehouse.versioned import VersionedTables

# Haystack reports usage over the network unless this is off; it is read when haystack is first
# imported, and every integration test module imports this one first.
os.environ.setdefault("HAYSTACK_TELEMETRY_ENABLED", "False")

# The canary: words no open document has, so any trace of them in an output is a leak.
CANARY = "quokka zeppelin canarytoken"
QUERY = "lighthouse keeper lamp"

DOCS: dict[str, dict[str, dict]] = {
    "lighthouses": {
        "north": {"text": "# North light\n\nThe lighthouse keeper trims the lamp at dusk on the north cape.",
                  "meta": {"entity": "NORTH", "period": "2023", "topic": "maintenance", "sensitivity": "PUBLIC"}},
        "south": {"text": "# South light\n\nThe south lighthouse lamp was replaced; the keeper logged it in 2024.",
                  "meta": {"entity": "SOUTH", "period": "2024", "topic": "maintenance", "sensitivity": "PUBLIC"}},
        "east": {"text": "# East light\n\nA keeper's diary: the lighthouse lamp burns oil through the winter.",
                 "meta": {"entity": "EAST", "period": "2022", "topic": "history", "sensitivity": "INTERNAL"}},
        "west": {"text": "# West light\n\nThe west lighthouse has an automatic lamp and no keeper since 2021.",
                 "meta": {"entity": "WEST", "period": "2021", "topic": "history", "sensitivity": "PUBLIC"}},
        "secret": {"text": f"# Keeper file\n\nThe lighthouse keeper lamp {CANARY} vault code.",
                   "meta": {"entity": "NORTH", "period": "2023", "topic": "maintenance",
                            "sensitivity": "RESTRICTED"}},
    },
    "orchards": {
        "apples": {"text": "# Apples\n\nThe orchard keeper prunes the apple trees; a lamp lights the barn.",
                   "meta": {"entity": "ORCHARD", "period": "2024", "topic": "farming", "sensitivity": "PUBLIC"}},
        "pears": {"text": "# Pears\n\nPear harvest notes from the orchard, 2023.",
                  "meta": {"entity": "ORCHARD", "period": "2023", "topic": "farming", "sensitivity": "PUBLIC"}},
    },
}
LIBRARIES = tuple(sorted(DOCS))


def build_corpus(root: Path) -> Path:
    """The two libraries published under ``root/wh`` (BM25 only): the warehouse path."""
    corpus = root / "corpus"
    for lib, docs in DOCS.items():
        folder = corpus / lib
        folder.mkdir(parents=True, exist_ok=True)
        for name, doc in docs.items():
            (folder / f"{name}.md").write_text(doc["text"], encoding="utf-8")
            (folder / f"{name}.meta.json").write_text(json.dumps(doc["meta"]), encoding="utf-8")
    wh = VersionedTables(root / "wh")
    for lib in DOCS:
        P.build_raw_documents(wh, corpus, lib)
        P.build_chunks(wh, lib)
        P.build_lexical_index(wh, lib)
        P.publish_snapshot(wh, lib)
    return root / "wh"


@contextlib.contextmanager
def served(warehouse: Path, keys_dir: Path, **limits) -> Iterator[tuple[str, str]]:
    """A real ``ragspine serve`` app (BM25) on 127.0.0.1 over ``warehouse``, with a key file
    holding one key for both libraries: (base URL, key)."""
    from service_fixtures import running, wait_ready

    from ragspine_pipeline.service import keys as K
    from ragspine_pipeline.service.app import create_app
    from ragspine_pipeline.service.limits import ServiceLimits

    keyfile = keys_dir / "keys.json"
    key = K.create_key(keyfile, list(LIBRARIES))[1]
    app = create_app(warehouse, mode="bm25", keys_file=keyfile,
                     limits=ServiceLimits(**({"rate_per_s": 0} | limits)))
    with running(app) as url:
        import httpx

        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}) as c:
            wait_ready(c.get)
        yield url, key


def assert_no_canary(objects: object) -> None:
    """Nothing in ``objects`` (framework documents or nodes, rendered with ``repr``) carries
    the RESTRICTED canary document: not its words, not its id."""
    text = repr(objects)
    for word in (*CANARY.split(), "lighthouses/secret", "vault code"):
        assert word not in text, f"restricted content reached a framework object: {word!r}"


@pytest.fixture(scope="module")
def warehouse(tmp_path_factory):
    return build_corpus(tmp_path_factory.mktemp("integrations"))


@pytest.fixture(scope="module")
def service(warehouse, tmp_path_factory):
    with served(warehouse, tmp_path_factory.mktemp("integration_keys")) as (url, key):
        yield url, key


DOORS = ["in_process", "http"]


def door(cls: Any, which: str, warehouse: Path, service: tuple[str, str]) -> Any:
    """A constructor of adapter ``cls`` through one door: the warehouse in this process
    (BM25) or the service over HTTP with its key."""
    url, key = service
    if which == "in_process":
        return lambda **kw: cls(warehouse, mode="bm25", **kw)
    return lambda **kw: cls(base_url=url, api_key=key, **kw)
