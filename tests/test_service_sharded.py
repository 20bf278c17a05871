"""The service's sharded-backend hook (service/sharded.py): the service never imports scale;
scale registers Ray's backend (``scale.serve.register``), ``ragspine serve`` does so first."""

from __future__ import annotations

import pytest

from ragspine_pipeline.service import sharded


@pytest.fixture
def no_backend():
    before = list(sharded._BACKEND)
    sharded._BACKEND.clear()
    yield
    sharded._BACKEND[:] = before


def test_without_a_backend_a_request_is_whole_and_nothing_means_missing_shards(no_backend):
    assert sharded.sharded_backend() is None
    with sharded.request_scope(allow_partial=True) as scope:
        pass
    assert scope.partial is False and dict(scope.missing) == {}
    assert sharded.unavailable_errors() == ()
    with pytest.raises(RuntimeError):  # `except ()` catches nothing: a real error still surfaces
        try:
            raise RuntimeError("boom")
        except sharded.unavailable_errors():
            pytest.fail("caught by an empty tuple")


def test_scale_registers_ray_and_its_scope_records_or_raises_missing_shards(no_backend):
    from ragspine_pipeline.scale import serve
    from ragspine_pipeline.scale.requests import ShardRequest, ShardUnavailable

    serve.register()
    backend = sharded.sharded_backend()
    assert isinstance(backend, serve.RayBackend)
    assert sharded.unavailable_errors() == (ShardUnavailable,)
    with sharded.request_scope(allow_partial=True) as scope:
        assert isinstance(scope, ShardRequest) and scope.allow_partial
    serve.register()  # again: replaced, still one
    assert len(sharded._BACKEND) == 1


def test_ragspine_serve_registers_the_ray_backend_before_the_service_runs(no_backend, monkeypatch):
    from ragspine_pipeline import cli_delegated, service
    from ragspine_pipeline.scale.serve import RayBackend

    seen = {}
    monkeypatch.setattr(service, "serve_main", lambda argv: seen.setdefault("backend", sharded.sharded_backend()) and 0)
    assert cli_delegated.cmd_delegated("serve", []) == 0
    assert isinstance(seen["backend"], RayBackend)
