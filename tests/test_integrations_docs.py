"""Every Python example of the integration pages (docs/integrations/*.md) runs as printed:
against the published demo warehouse in this process, and against a real service on
127.0.0.1 with a key (the pages' ``data/warehouse``, ``http://127.0.0.1:8080`` and
``rsk_...`` stand for them). A page whose framework is not installed is skipped.
"""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest

pytest.importorskip("fastapi")

import integrations_fixtures  # noqa: E402, F401  (switches Haystack's telemetry off before any import)
from service_fixtures import running, wait_ready  # noqa: E402

PAGES = Path(__file__).resolve().parents[1] / "docs" / "integrations"
NEEDS = {"langchain.md": "langchain_core", "llamaindex.md": "llama_index.core", "haystack.md": "haystack"}


def python_blocks(page: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", page.read_text(encoding="utf-8"), re.S)


@pytest.fixture(scope="module")
def demo_service(published_demo, tmp_path_factory):
    """The demo warehouse served (BM25) with one key for every library: (url, key)."""
    import httpx

    from ragspine_pipeline.service import keys as K
    from ragspine_pipeline.service.app import create_app
    from ragspine_pipeline.service.limits import ServiceLimits

    keyfile = tmp_path_factory.mktemp("doc_keys") / "keys.json"
    key = K.create_key(keyfile, ["acme_policies", "acme_reports"])[1]
    app = create_app(published_demo, mode="bm25", keys_file=keyfile, limits=ServiceLimits(rate_per_s=0))
    with running(app) as url:
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}) as c:
            wait_ready(c.get)
        yield url, key


def test_every_integration_page_has_an_example_and_is_in_the_nav():
    nav = (PAGES.parents[1] / "mkdocs.yml").read_text(encoding="utf-8")
    for name in ("index.md", *NEEDS):
        assert python_blocks(PAGES / name), f"{name} shows no Python example"
        assert f"integrations/{name}" in nav


@pytest.mark.parametrize("page", ["index.md", *NEEDS])
def test_integration_page_examples_run(page, published_demo, demo_service, monkeypatch):
    if page in NEEDS:
        pytest.importorskip(NEEDS[page])
    url, key = demo_service
    monkeypatch.setenv("RAGSPINE_RETRIEVAL_MODE", "bm25")  # the demo warehouse's vectors are test doubles
    monkeypatch.setenv("SEARCH_API_KEY", key)
    for i, code in enumerate(python_blocks(PAGES / page)):
        code = (code.replace('"data/warehouse"', repr(str(published_demo)))
                .replace('"http://127.0.0.1:8080"', repr(url)).replace('"rsk_..."', repr(key)))
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(compile(code, f"{page} example {i + 1}", "exec"), {"__name__": "__doc_example__"})
        printed = out.getvalue()
        assert printed.strip(), f"{page} example {i + 1} printed nothing"
        assert "chars" in printed or "busy" in printed, printed  # a citation (doc_id chars start-end)
