"""The retrieval service (issue 29): HTTP with OpenAPI, MCP tools, API keys scoped to
libraries, limits, metrics and hot snapshot swaps, over the one serving assembly.

Needs the ``[service]`` extra (FastAPI, uvicorn, the official ``mcp`` SDK). Entry points
for the CLI: ``serve_main(argv)``, ``mcp_main(argv)`` and ``keys_main(argv)``, each
returning an exit code. ``create_app(warehouse, ...)`` builds the ASGI app itself (tests,
Ray Serve). Importing this package imports neither FastAPI nor mcp: only the functions do.
"""

from __future__ import annotations

from typing import Any

from .keys import keys_main
from .main import mcp_main, serve_main


def create_app(*args: Any, **kwargs: Any) -> Any:
    from .app import create_app as build  # lazy: FastAPI, mcp ([service] extra)

    return build(*args, **kwargs)


__all__ = ["create_app", "keys_main", "mcp_main", "serve_main"]
