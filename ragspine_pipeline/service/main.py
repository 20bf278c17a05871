"""``ragspine serve`` and ``ragspine mcp`` as functions the CLI calls: ``serve_main(argv)``
and ``mcp_main(argv)`` return an exit code (0, or 2 with one line on stderr).

Errors have the CLI's one shape, ``ragspine: error: serve: <option>: <what>``
(``errors_format``, shared with ``cli.py`` without importing it).

``serve`` refuses to bind anything but loopback without a key file (``--insecure-no-auth``
overrides, loudly); on loopback without keys every library is readable and a warning says
so. Its options reach every ``--workers`` process as ``RAGSPINE_*`` variables, read by
``app.app_from_env`` (uvicorn's factory), so one code path builds the app in each worker.
uvicorn runs with the listener limits of ``connections.uvicorn_options`` (header and
keep-alive timeouts, a connection cap, and a worker health-ping timeout long enough for
snapshot loading on a busy machine); with ``--workers`` N > 1 a runtime folder makes
``/readyz`` the service's readiness (readiness.py).
"""

from __future__ import annotations

import argparse
import ipaddress
import logging
import os
import shutil
import sys
import tempfile
from pathlib import Path

from .. import paths, serving, settings
from ..errors_format import OneLineParser, warn
from ..errors_format import fail as _fail
from .keys import KEYS_FILE_ENV, Principal
from .limits import ServiceLimits
from .served import ServedLibraries, ServingAssembly
from .sharded import sharded_backend

LOOPBACK_NAMES = ("localhost",)


def is_loopback(host: str) -> bool:
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--warehouse", default=None, help="warehouse folder (default: RAGSPINE_WAREHOUSE, else the "
                   "checkout's data/warehouse, else ./ragspine-warehouse)")
    p.add_argument("--library", action="append", default=None, help="serve only this library (repeatable)")
    p.add_argument("--mode", default=None, help="retrieval mode served by default (RAGSPINE_RETRIEVAL_MODE); bm25 "
                   "is always served too")


def _warehouse(args: argparse.Namespace) -> Path:
    return Path(args.warehouse) if args.warehouse else paths.default_warehouse()


def _check_published(prog: str, root: Path, libraries: list[str] | None) -> int | None:
    libs = serving.published_library_ids(root, libraries)
    missing = sorted(set(libraries or []) - set(libs))
    if missing or not libs:
        what = f"libraries {missing}" if missing else "any library"
        return _fail(prog, f"{'--library' if missing else '--warehouse'}: no published retrieval snapshot for {what} under {root}; `{serving.BUILD_COMMAND} "
                     f"--warehouse {root}` (or a Dagster refresh) publishes them")
    return None


def serve_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="ragspine serve", description="HTTP + MCP retrieval service (FastAPI on uvicorn)")
    _common(p)
    p.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8080, help="port (default 8080)")
    p.add_argument("--workers", type=int, default=1, help="worker processes sharing the memory-mapped snapshots")
    p.add_argument("--keys-file", default=None, help=f"API key file (default: {KEYS_FILE_ENV}); "
                   "see `ragspine keys create`")
    p.add_argument("--insecure-no-auth", action="store_true",
                   help="allow a non-loopback bind without a key file: every library readable by anyone")
    p.add_argument("--allowed-origin", action="append", default=None,
                   help="a browser Origin allowed besides loopback (RAGSPINE_SERVICE_ALLOWED_ORIGINS)")
    p.add_argument("--allowed-host", action="append", default=None,
                   help="a Host header every route accepts besides loopback (RAGSPINE_SERVICE_ALLOWED_HOSTS)")
    p.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    p.add_argument("--ray", action="store_true", help="run on Ray Serve (the [scale] extra): replicas, and each "
                   "library as hash shards (RAY_ADDRESS joins a cluster, else a local one starts)")
    p.add_argument("--shards", type=int, default=None, help="with --ray: shards per library (RAGSPINE_SHARDS; "
                   "at most the published index's RAGSPINE_BM25_BUCKETS)")
    p.add_argument("--replicas", type=int, default=1, help="with --ray: replicas of the HTTP app")
    return p


def serve_main(argv: list[str] | None = None) -> int:
    prog = "serve"
    try:
        args = serve_parser().parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    if args.workers < 1:
        return _fail(prog, f"--workers: must be at least 1, not {args.workers}")
    if not args.ray and (args.shards is not None or args.replicas != 1):
        return _fail(prog, f"--{'shards' if args.shards is not None else 'replicas'}: only with --ray")
    if args.ray and args.workers != 1:
        return _fail(prog, "--workers: not with --ray (Ray Serve runs --replicas replicas)")
    if args.ray and args.replicas < 1:
        return _fail(prog, f"--replicas: must be at least 1, not {args.replicas}")
    if not 0 < args.port < 65536:
        return _fail(prog, f"--port: must be in 1..65535, not {args.port}")
    keys_file = args.keys_file or settings.get(KEYS_FILE_ENV)
    if keys_file and not Path(keys_file).is_file():
        return _fail(prog, f"--keys-file: {keys_file}: no such file (`ragspine keys create --keys-file {keys_file} "
                     "--library ID` makes one)")
    open_to_all = None  # the warning printed once every check has passed
    if not keys_file and not is_loopback(args.host):
        if not args.insecure_no_auth:
            return _fail(prog, f"--host: refusing to bind {args.host} without a key file: anyone who reaches it could read "
                         "every library; pass --keys-file (or RAGSPINE_KEYS_FILE), bind 127.0.0.1, or "
                         "--insecure-no-auth")
        open_to_all = (f"--insecure-no-auth: {args.host} is not loopback: every library is readable by anyone "
                       "who can reach this port")
    elif not keys_file:
        open_to_all = f"--keys-file: none given: every library is readable without a key on {args.host} (loopback only)"
    root = _warehouse(args)
    failed = _check_published(prog, root, args.library)
    if failed is not None:
        return failed
    env = {"RAGSPINE_WAREHOUSE": str(root.resolve())}
    if keys_file:
        env[KEYS_FILE_ENV] = str(Path(keys_file).resolve())
    if args.mode:
        env["RAGSPINE_RETRIEVAL_MODE"] = args.mode
    if args.library:
        env["RAGSPINE_SERVICE_LIBRARIES"] = ",".join(args.library)
    if args.allowed_origin:
        env["RAGSPINE_SERVICE_ALLOWED_ORIGINS"] = ",".join(args.allowed_origin)
    if args.allowed_host:
        env["RAGSPINE_SERVICE_ALLOWED_HOSTS"] = ",".join(args.allowed_host)
    try:
        settings.get("RAGSPINE_RETRIEVAL_MODE", args.mode)
    except settings.SettingsError as exc:
        return _fail(prog, f"--mode: {exc}")
    if open_to_all:
        warn(prog, open_to_all)
    if args.ray:
        return _serve_ray(prog, args, root, keys_file)
    import uvicorn  # lazy: [service] extra, only when a server starts

    from .connections import uvicorn_options  # lazy: uvicorn at its top
    from .metrics import MULTIPROC_ENV  # lazy: prometheus_client at its top
    from .readiness import RUNTIME_ENV, prepare  # lazy: anyio at its top

    metrics_dir = None  # workers > 1: /metrics sums every worker (prometheus_client's multiprocess mode)
    if args.workers > 1 and not os.environ.get(MULTIPROC_ENV):
        metrics_dir = tempfile.mkdtemp(prefix="ragspine-metrics-")
        env[MULTIPROC_ENV] = metrics_dir
    runtime_dir = None  # workers > 1: /readyz is ready once every worker has loaded
    if args.workers > 1:
        runtime_dir = tempfile.mkdtemp(prefix="ragspine-runtime-")
        prepare(Path(runtime_dir), args.workers)
        env[RUNTIME_ENV] = runtime_dir
    try:
        options = uvicorn_options()
    except settings.SettingsError as exc:
        return _fail(prog, str(exc))
    os.environ.update(env)  # every worker process reads them (uvicorn's factory: app.app_from_env)
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr)
    try:
        uvicorn.run("ragspine_pipeline.service.app:app_from_env", factory=True, host=args.host, port=args.port,
                    workers=args.workers, log_level=args.log_level, access_log=False, **options)
    finally:
        for folder in (metrics_dir, runtime_dir):
            if folder:
                shutil.rmtree(folder, ignore_errors=True)
    return 0


def _serve_ray(prog: str, args: argparse.Namespace, root: Path, keys_file: str | None) -> int:
    """``serve --ray``: the same app on Ray Serve over sharded libraries, run by the sharded
    backend ``scale`` registers (sharded.py; ``ragspine serve`` registers it)."""
    backend = sharded_backend()
    if backend is None:
        return _fail(prog, "--ray: no sharded backend in this process: `ragspine serve --ray` registers Ray's "
                     "(ragspine_pipeline.scale.serve.register())")
    return backend.serve(prog, args, root, keys_file)


def mcp_main(argv: list[str] | None = None) -> int:
    """``ragspine mcp``: the MCP tools over stdio, reading every library of the warehouse
    (or those named by ``--library``) as the local user. stdout carries the protocol only."""
    import anyio  # lazy: [service] extra, only when the tools start

    from .mcp_tools import build_mcp  # lazy: the mcp SDK at its top

    prog = "mcp"
    p = OneLineParser(prog="ragspine mcp", description="MCP tools over stdio for desktop assistants")
    _common(p)
    try:
        args = p.parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    root = _warehouse(args)
    failed = _check_published(prog, root, args.library)
    if failed is not None:
        return failed
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    try:
        served = ServedLibraries(ServingAssembly.resolve(root, mode=args.mode), args.library)
        served.refresh()
    except (ValueError, FileNotFoundError, RuntimeError) as exc:
        return _fail(prog, f"--warehouse: {exc}")
    served.start(settings.get("RAGSPINE_SERVICE_RELOAD_S"))
    try:
        anyio.run(build_mcp(served, ServiceLimits.from_settings(), local=Principal("stdio", None)).run_stdio_async)
    finally:
        served.stop()
    return 0


__all__ = ["is_loopback", "mcp_main", "serve_main", "serve_parser"]
