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
    for var in ("RAGSPINE_EMBEDDING", "RAGSPINE_EMBEDDING_BACKEND", "RAGSPINE_RETRIEVAL_MODE", "RAGSPINE_WAREHOUSE",
                "RAGSPINE_RERANKER", "RAGSPINE_GLOSSARY", "RAGSPINE_POSTPROCESSOR"):
        monkeypatch.delenv(var, raising=False)
