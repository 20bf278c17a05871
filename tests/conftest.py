import os

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile("ci", max_examples=60, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("dev", max_examples=150, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture(autouse=True)
def _no_ambient_config(monkeypatch):
    """Tests start from library defaults, whatever the developer's shell exports."""
    for var in [v for v in os.environ if v.startswith("RAGSPINE_")]:  # every layer and limit
        monkeypatch.delenv(var, raising=False)


@pytest.fixture(scope="session")
def published_demo(tmp_path_factory):
    """The demo corpus published to a warehouse (every library, deterministic vectors),
    built with the engine's steps, no Dagster: the same tables ``ragspine demo`` serves."""
    from ragspine_pipeline.corpus import DEMO_ROOT, list_libraries
    from ragspine_pipeline.retrieval.vector.embedding_backends import DeterministicHashBackend
    from ragspine_pipeline.warehouse import pipeline as P
    from ragspine_pipeline.warehouse.versioned import VersionedTables

    root = tmp_path_factory.mktemp("published")
    wh = VersionedTables(root)
    for lib in list_libraries():
        P.build_raw_documents(wh, DEMO_ROOT, lib)
        P.build_chunks(wh, lib)
        P.build_lexical_index(wh, lib)
        P.build_embeddings(wh, lib, DeterministicHashBackend(), "deterministic")
        P.publish_snapshot(wh, lib)
    return root
