import os

import pytest
from hypothesis import HealthCheck, settings

try:  # `python -m pytest` puts the checkout on sys.path; a bare `pytest` puts tests/ there
    from tests import kernel_warmup
except ImportError:  # pragma: no cover - depends on how pytest was started
    import kernel_warmup  # type: ignore[no-redef]

# Before any kernel module is imported: numba's cache in a folder keyed by the kernel
# sources' stamp, outside the clone (tests/kernel_warmup.py says why; #46 item 4).
kernel_warmup.use_stamped_cache()

settings.register_profile("ci", max_examples=60, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("dev", max_examples=150, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def pytest_configure(config):
    """The xdist controller compiles (or loads) the kernels once, before its workers start,
    so the two workers do not both compile the same kernels on a cold cache."""
    if getattr(config.option, "numprocesses", None) and not hasattr(config, "workerinput"):
        print(f"kernels warmed before the workers start: {kernel_warmup.warm()}", flush=True)


@pytest.fixture(scope="session", autouse=True)
def _warm_kernels(request):
    """When the whole suite runs in one process, the same warm as the xdist controller's
    (cheap once the cache holds the kernels). A few files run alone compile only what they
    use; xdist workers find the kernels warmed already."""
    if not hasattr(request.config, "workerinput") and len(request.session.items) > 300:
        kernel_warmup.warm()


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
