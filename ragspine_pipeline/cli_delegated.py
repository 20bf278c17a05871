"""The ``ragspine`` commands that parse their own options: ``config`` (the settings
registry), ``serve``, ``mcp`` and ``keys`` (the retrieval service). ``cli.main`` hands
everything after the command word to the entry point here, so each keeps its own parser,
help and exit codes. ``serve`` first registers Ray's sharded backend with the service
(``scale.serve.register``: the service never imports scale), so ``serve --ray`` runs it.
The service's FastAPI, uvicorn and mcp (the ``[service]`` extra) load only when one of
its commands runs.
"""

from __future__ import annotations

from collections.abc import Callable

from . import service, settings  # service/__init__ imports neither FastAPI nor mcp
from .scale import serve as scale_serve  # imports no Ray: only its functions do

DELEGATED_HELP = {
    "config": "print the effective RAGSPINE_* settings and where each came from (default, environment, "
              "argument), secrets masked; exit 2 on a bad value",
    "serve": "run the retrieval service: HTTP API with OpenAPI, MCP at /mcp, API keys scoped to libraries "
             "(needs the [service] extra; serve --help)",
    "mcp": "serve the search and graph tools over MCP on stdio for a desktop assistant (mcp --help)",
    "keys": "create, list, revoke or rotate the service's API keys (keys --help)",
}


def _delegated(name: str) -> Callable[[list[str]], int]:
    """The entry point of a command that parses its own options (argv -> exit code)."""
    if name == "config":
        return settings.config_main
    return {"serve": _serve, "mcp": service.mcp_main, "keys": service.keys_main}[name]


def _serve(argv: list[str]) -> int:
    """``ragspine serve``: the service's entry point, with Ray's sharded backend registered
    for ``--ray``."""
    scale_serve.register()
    return service.serve_main(argv)


def cmd_delegated(name: str, argv: list[str]) -> int:
    """``ragspine config|serve|mcp|keys ...``: the command's own parser and exit codes
    (--help 0, a bad option 2)."""
    try:
        return int(_delegated(name)(argv) or 0)
    except SystemExit as exc:
        return int(exc.code or 0)
