"""``ragspine serve --ray``: the same FastAPI service on Ray Serve, over sharded libraries.

Why: one uvicorn process is one failure domain; on Ray Serve the app runs as R replicas
(restarted by Serve) and each library as S shard actors (``shards.py``) that map only
their hash buckets of the published index. The app is the service's own ``create_app``
(same routes, keys, limits, errors, MCP at /mcp): only the assembly differs —
``ShardedAssembly`` builds each library's retrievers as the single-process service does,
then points their BM25 index and dense ranking at the library's shards
(``shards.attach``), so filters, variants, fusion, rerank and the RESTRICTED exits are
the ones the single process runs.

Shards are named, detached actors (one set per library snapshot version, found again by
every replica), so a replica restart does not restart them and a killed shard is
recreated by Ray (``max_restarts``) while the replicas keep serving (503 meanwhile, or a
``partial`` answer when the request allows it). ``run_ray_service`` starts (or joins)
the cluster, binds 127.0.0.1 unless told otherwise, and on exit removes the deployment
and the shards.

The service never imports this module: ``register()`` puts ``RayBackend`` in the
service's hook (``service/sharded.py``): the ``serve --ray`` runner and each request's
shard scope. ``ragspine serve`` registers it, and so does every replica (``build_app``).

Ingress (``RayServiceConfig.ingress``):

- ``replica`` (default): each Serve replica runs the app on its own uvicorn server bound
  to ``host:port`` with ``SO_REUSEPORT`` (the kernel spreads connections over the
  replicas of a node); Serve still places, health-checks (``check_health``: the server
  thread is alive) and restarts the replicas, and no Serve proxy is started. Why: Serve's
  proxy path (HTTP proxy actor, then a Ray call to the replica, then the replica's request
  wrapper) cost 10-12 ms per request on this 2-core box, five times the whole request of
  the single-process service; served this way a request costs what it costs there, plus
  the shard hops.
- ``serve``: Serve's own HTTP proxy in front of ``@serve.ingress`` replicas (with
  ``RAY_SERVE_ENABLE_HA_PROXY=1`` in the cluster's environment, Serve's HAProxy and
  direct-ingress replicas instead); measured beside ``replica`` in
  ``benchmarks/bench_ray_serving.py``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import logging
import os
import signal
import socket
import sys
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .. import settings
from ..cpus import usable_cpus
from ..errors_format import fail
from ..filter_input import hybrid_retrievers
from ..service.served import ServedLibraries, ServingAssembly
from ..service.sharded import register_sharded_backend
from ..warehouse.common import LEXICAL, SNAPSHOT
from ..warehouse.versioned import VersionedTables
from .config import ScaleUnavailable, require_ray, shard_timeout_s
from .config import shards as shard_count
from .requests import ShardRequest, ShardUnavailable, shard_request
from .shards import (
    NAMESPACE,
    ShardedBM25,
    VectorSource,
    attach,
    segment_buckets,
    start_shards,
    write_layout,
)

log = logging.getLogger("ragspine.scale")

APP_NAME = "ragspine"
SHARD_PREFIX = "shard:"
RAY_OBJECT_STORE_BYTES = 300 * 1024 * 1024


def published_segments(version_dir: Path) -> Path | None:
    """The folder holding the hash-bucket segments of a lexical version, or None when it
    was published as one file (``RAGSPINE_BM25_BUCKETS`` unset at build)."""
    if segment_buckets(version_dir):
        return version_dir
    for sub in sorted(p for p in version_dir.iterdir() if p.is_dir()) if version_dir.is_dir() else ():
        if segment_buckets(sub):
            return sub
    return None


@dataclasses.dataclass
class ShardedAssembly(ServingAssembly):
    """``ServingAssembly`` whose libraries are answered by ``shards`` shard actors each.

    ``layout_root``: where a library published as one file is laid out in ``shards``
    buckets first (tests and benchmarks only; without it such a library is an error that
    says to republish with ``RAGSPINE_BM25_BUCKETS``).
    """

    shards: int = 1
    timeout_s: float | None = None
    layout_root: Path | None = None
    fronts: dict[tuple[str, str], ShardedBM25] = dataclasses.field(default_factory=dict)

    def prepare(self, wh: VersionedTables, library: str, version: str, retrievers: Mapping[str, Any]) -> None:
        """Point the library's retrievers at its shards (started, and warm, once per
        version) before ``build_library`` warms them: the warm-up's probes then run through
        the front and the shards every query goes to, and the replica never reads the whole
        BM25 file it no longer searches."""
        hybrids = [h for r in retrievers.values() for h in hybrid_retrievers(r)]
        front = self.fronts.get((library, version))
        if front is None:
            front = self._front(wh, library, version, hybrids)
            self.fronts[(library, version)] = front
        for h in hybrids:
            attach(h, front)

    def _front(self, wh: VersionedTables, library: str, version: str, hybrids: list[Any]) -> ShardedBM25:
        pub = wh.get(SNAPSHOT, library, version)
        meta = pub.manifest["metadata"]
        lex = wh.get(LEXICAL, library, meta["lexical_index"]).path
        folder = published_segments(Path(lex))
        if folder is None or segment_buckets(folder) < self.shards:
            have = segment_buckets(folder) if folder is not None else 1
            if self.layout_root is None:
                raise ScaleUnavailable(
                    f"library {library!r}: its published BM25 index has {have} hash bucket(s), fewer than "
                    f"--shards {self.shards}: republish it with RAGSPINE_BM25_BUCKETS >= {self.shards} "
                    "(a shard maps whole buckets; nothing is rebuilt at serving time)")
            folder = self._layout(library, version, hybrids[0])
        dense = any(h.embedding_backend is not None and "dense" in h.channels for h in hybrids)
        vectors = None
        if dense:
            emb = meta.get("embeddings")
            if emb in (None, "None"):
                raise ScaleUnavailable(f"library {library!r}: a dense mode is served but the snapshot stores no "
                                       "embeddings for the shards to hold; serve --mode bm25 or embed at build")
            vectors = VectorSource(warehouse=str(wh.root), library=library, version=str(emb))
        tag = hashlib.sha256(f"{Path(wh.root).resolve()}|{folder}".encode()).hexdigest()[:12]
        name = f"{SHARD_PREFIX}{tag}:{library}@{version}"
        handles = start_shards(folder, self.shards, vectors=vectors, name=name)
        front = ShardedBM25(handles, timeout_s=self.timeout_s, path=str(folder))
        log.info("library %s@%s served by %d shards over %s", library, version, self.shards, folder)
        return front

    def _layout(self, library: str, version: str, hybrid: Any) -> Path:
        """A layout of this version with at least ``shards`` buckets (the fewest such), or
        a new one with exactly ``shards`` (``b{B}`` folders, written once, then only read)."""
        assert self.layout_root is not None
        base = self.layout_root / library / version
        have = sorted((segment_buckets(p), p) for p in base.glob("b*") if segment_buckets(p) >= self.shards)
        if have:
            return have[0][1]
        folder = base / f"b{self.shards}"
        if segment_buckets(folder) != self.shards:
            ids = hybrid.chunks.chunk_ids() if callable(getattr(hybrid.chunks, "chunk_ids", None)) else [
                c.chunk_id for c in hybrid.chunks]
            write_layout(folder, hybrid.index, ids, self.shards)
        return folder


def ensure_ray(address: str | None = None) -> Any:
    """Join ``address`` (or ``RAY_ADDRESS``), else start a local cluster on this
    machine's CPUs; namespace ``ragspine`` so the shards can be found by name."""
    ray = require_ray()
    if not ray.is_initialized():
        addr = address or os.environ.get("RAY_ADDRESS")
        if addr:
            ray.init(address=addr, namespace=NAMESPACE, log_to_driver=False)
        else:
            ray.init(num_cpus=usable_cpus(), include_dashboard=False, namespace=NAMESPACE, log_to_driver=False,
                     object_store_memory=RAY_OBJECT_STORE_BYTES)
    return ray


@dataclasses.dataclass(frozen=True)
class RayServiceConfig:
    """What every replica builds its app from (plain values: it travels to the replicas)."""

    warehouse: str
    shards: int = 1
    replicas: int = 1
    host: str = "127.0.0.1"
    port: int = 8080
    keys_file: str | None = None
    mode: str | None = None
    libraries: tuple[str, ...] = ()
    allowed_origins: tuple[str, ...] = ()
    allowed_hosts: tuple[str, ...] = ()
    timeout_s: float | None = None
    layout_root: str | None = None
    ingress: str = "replica"  # "replica" (uvicorn in each replica) or "serve" (Serve's proxy)
    log_level: str = "info"  # as ``ragspine serve --log-level`` (info: one access line per request)


def build_app(config: RayServiceConfig) -> Any:
    """The service's FastAPI app over ``ShardedAssembly`` (what each replica runs), with
    Ray's backend registered in this replica's process."""
    # lazy: FastAPI and the mcp SDK (the optional [service] extra) load only where an app is built
    from ..service.app import create_app

    register()
    root = Path(config.warehouse)
    assembly = dataclasses.replace(ShardedAssembly.resolve(root, mode=config.mode), shards=config.shards,
                                   timeout_s=config.timeout_s,
                                   layout_root=Path(config.layout_root) if config.layout_root else None)
    served = ServedLibraries(assembly, list(config.libraries) or None)
    return create_app(root, keys_file=config.keys_file, libraries=list(config.libraries) or None, served=served,
                      allowed_origins=config.allowed_origins, allowed_hosts=config.allowed_hosts)


class RagspineReplica:
    """A Serve replica of ``ingress="serve"``: Serve's proxy calls the app built in the
    replica (``__serve_build_asgi_app__``)."""

    def __init__(self, config: RayServiceConfig) -> None:
        self.config = config

    def __serve_build_asgi_app__(self) -> Any:
        replica_logging(self.config.log_level)
        return build_app(self.config)


def replica_logging(level: str) -> None:
    """The replica logs as ``ragspine serve --log-level`` does (Ray may have configured the
    root logger already, so the ragspine loggers get the level themselves)."""
    logging.basicConfig(level=level.upper())
    logging.getLogger("ragspine").setLevel(level.upper())


def reuse_port_socket(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port`` that every replica of a node can bind
    (``SO_REUSEPORT``: the kernel spreads new connections over them)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    sock.listen(2048)
    return sock


class ServingReplica:
    """A Serve replica of ``ingress="replica"``: the app on this replica's own uvicorn
    server (a thread with its own event loop), listening on the service's port."""

    def __init__(self, config: RayServiceConfig) -> None:
        import uvicorn  # lazy: uvicorn, the optional [service] extra, in the replica that serves


        replica_logging(config.log_level)
        self.config = config
        self.sock = reuse_port_socket(config.host, config.port)
        self.server = uvicorn.Server(uvicorn.Config(build_app(config), log_level=config.log_level, access_log=False,
                                                    lifespan="on"))
        # Server.run: uvicorn's own event loop choice (uvloop where installed), as `ragspine serve`.
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]},
                                       name="ragspine-http", daemon=True)
        self.thread.start()

    def check_health(self) -> None:
        """Serve's health check: a replica whose server stopped is restarted."""
        if not self.thread.is_alive():
            raise RuntimeError("the replica's HTTP server stopped")

    def __del__(self) -> None:
        """Stop accepting, finish the requests in flight (Serve's graceful shutdown)."""
        server = getattr(self, "server", None)
        if server is not None:
            server.should_exit = True
            self.thread.join(timeout=10)
            self.sock.close()


def deploy(config: RayServiceConfig) -> None:
    """Run ``replicas`` replicas of the app answering on ``host:port`` (their own
    servers, or behind Serve's proxy: ``config.ingress``)."""
    ray = ensure_ray()
    from ray import serve  # lazy: Ray Serve, the heavy [scale] extra (ensure_ray checked it)

    shard_timeout_s(config.timeout_s)  # a bad RAGSPINE_SHARD_TIMEOUT_S fails here, not in a replica
    options: dict[str, Any] = {"name": "ragspine-service", "num_replicas": config.replicas,
                               "ray_actor_options": {"num_cpus": 0}}
    if config.ingress == "replica":
        serve.start(proxy_location="Disabled")
        deployment = serve.deployment(**options)(ServingReplica)
        serve.run(deployment.bind(config), name=APP_NAME, route_prefix=None, blocking=False)
    elif config.ingress == "serve":
        serve.start(http_options={"host": config.host, "port": config.port})
        deployment = serve.deployment(**options)(serve.ingress()(RagspineReplica))
        serve.run(deployment.bind(config), name=APP_NAME, route_prefix="/", blocking=False)
    else:
        raise ValueError(f"ingress must be 'replica' or 'serve' (got {config.ingress!r})")
    log.info("ragspine on Ray Serve: http://%s:%d (%d replicas, %d shards per library, %s ingress, cluster %s)",
             config.host, config.port, config.replicas, config.shards, config.ingress,
             ray.get_runtime_context().gcs_address)


def shard_actors() -> list[str]:
    """Names of the shard actors alive in the ragspine namespace."""
    ray = require_ray()
    return sorted(a["name"] if isinstance(a, dict) else a for a in ray.util.list_named_actors()
                  if str(a["name"] if isinstance(a, dict) else a).startswith(SHARD_PREFIX))


def shutdown() -> None:
    """Remove the deployment and every shard actor (detached: they outlive their creator)."""
    ray = require_ray()
    if not ray.is_initialized():
        return
    from ray import serve  # lazy: Ray Serve, the heavy [scale] extra (require_ray checked it)

    serve.shutdown()
    for name in shard_actors():
        with contextlib.suppress(ValueError):  # already gone
            ray.kill(ray.get_actor(name, namespace=NAMESPACE))


def run_ray_service(config: RayServiceConfig, stop: threading.Event | None = None) -> int:
    """``ragspine serve --ray``: deploy, serve until SIGINT/SIGTERM (or ``stop``), clean up."""
    stop = stop or threading.Event()
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())
    deploy(config)
    try:
        stop.wait()
    finally:
        shutdown()
        require_ray().shutdown()
    return 0


def config_from(warehouse: str | os.PathLike[str], *, libraries: Sequence[str] | None = None,
                **kwargs: Any) -> RayServiceConfig:
    """A ``RayServiceConfig`` with the warehouse resolved (replicas may run elsewhere)."""
    return RayServiceConfig(warehouse=str(Path(warehouse).resolve()), libraries=tuple(libraries or ()), **kwargs)


class RayBackend:
    """The service's sharded backend on Ray (``service.sharded.ShardedBackend``)."""

    unavailable: tuple[type[Exception], ...] = (ShardUnavailable,)

    def request(self, allow_partial: bool) -> contextlib.AbstractContextManager[ShardRequest]:
        return shard_request(allow_partial)

    def serve(self, prog: str, args: argparse.Namespace, root: Path, keys_file: str | None) -> int:
        """``serve --ray``, after the service's checks: Ray present, the shard count valid,
        then ``run_ray_service`` (exit 2 with one line when Ray or ``--shards`` is wrong)."""
        try:
            require_ray()
            n = shard_count(args.shards)
        except ScaleUnavailable as exc:
            return fail(prog, f"--ray: {exc}")
        except settings.SettingsError as exc:
            return fail(prog, f"--shards: {exc}")
        logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr)
        config = config_from(root, libraries=args.library, shards=n, replicas=args.replicas, host=args.host,
                             port=args.port, keys_file=str(Path(keys_file).resolve()) if keys_file else None,
                             mode=args.mode, allowed_origins=tuple(args.allowed_origin or ()),
                             allowed_hosts=tuple(args.allowed_host or ()), log_level=args.log_level)
        return run_ray_service(config)


def register() -> None:
    """Make Ray the service's sharded backend in this process (``service/sharded.py``)."""
    register_sharded_backend(RayBackend())


__all__ = ["APP_NAME", "RagspineReplica", "RayBackend", "RayServiceConfig", "ServingReplica", "ShardedAssembly", "build_app", "config_from",
           "deploy", "ensure_ray", "published_segments", "register", "reuse_port_socket", "run_ray_service", "shard_actors",
           "shutdown"]
