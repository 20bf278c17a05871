"""The shard listener under hostile load, without Ray (issue 44, item 5).

An idle or trickling connection is closed at its deadline (it no longer pins a shard
thread); a frame header announcing 2 GiB is refused before a byte is allocated; the
accept loop survives ``accept()`` errors (EMFILE for real, in a process with few file
descriptors; ECONNABORTED injected) and reports itself unhealthy when it cannot accept;
connections past the cap are refused with a clear error frame; a pooled connection the
shard closed is not reused.
"""

from __future__ import annotations

import errno
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ragspine_pipeline.scale import wire as W

ROOT = Path(__file__).resolve().parents[1]
WAIT_S = 20.0  # an upper bound on waits for an event or a count, never a timing window


def _echo(header: dict[str, Any], payload: bytes) -> tuple[dict[str, Any], bytes]:
    return {"echo": header.get("n")}, payload[::-1]


def _until(cond: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not cond():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


def _closed_by_peer(sock: socket.socket) -> bool:
    """Read until the listener closes the connection (True), or WAIT_S passes."""
    sock.settimeout(WAIT_S)
    try:
        while sock.recv(4096):
            pass
        return True
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


@pytest.fixture
def server_factory() -> Iterator[Callable[..., W.WireServer]]:
    made: list[W.WireServer] = []

    def make(**limits: Any) -> W.WireServer:
        server = W.WireServer(_echo, limits=W.WireLimits(**limits))
        made.append(server)
        return server

    yield make
    for s in made:
        s.close()


def _raw(ep: W.Endpoint, secret: bool = True) -> socket.socket:
    sock = socket.create_connection((ep.host, ep.port), timeout=WAIT_S)
    if secret:
        sock.sendall(ep.secret)
    return sock


def _ask(client: W.WireClient, n: int, payload: bytes = b"") -> tuple[dict[str, Any], bytes]:
    return client.receive(client.send(W.encode_frame({"n": n}, payload), WAIT_S), WAIT_S)


# ------------------------------------------------------------------ deadlines
def test_idle_and_trickling_connections_are_closed_at_their_deadlines(server_factory: Any) -> None:
    """No secret, an authenticated connection that never asks, and a frame whose bytes stop
    coming: each is closed by the listener and its thread freed."""
    server = server_factory(handshake_timeout_s=0.2, idle_timeout_s=0.3, frame_timeout_s=0.2)
    ep = server.endpoint
    silent, idle, trickle = _raw(ep, secret=False), _raw(ep), _raw(ep)
    trickle.sendall(W.FRAME.pack(2, 100) + b"{}" + b"x" * 10)  # 90 payload bytes never come
    _until(lambda: server.connections == 3, "the three connections were never accepted")
    for sock in (silent, idle, trickle):
        assert _closed_by_peer(sock)
        sock.close()
    _until(lambda: server.connections == 0, "a connection still holds a shard thread")
    client = W.WireClient(ep)
    assert _ask(client, 1, b"ab") == ({"echo": 1}, b"ba")  # the listener still answers
    client.close()


def test_a_frame_announcing_2_gib_is_refused_before_anything_is_allocated(
        server_factory: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[int] = []
    real = bytearray

    def guarded(n: int = 0, *args: Any) -> bytearray:  # what the receive path asks to allocate
        if isinstance(n, int):
            asked.append(n)
            if n > 64 << 20:
                raise MemoryError(f"the listener tried to allocate {n} bytes")
        return real(n, *args)

    monkeypatch.setattr(W, "bytearray", guarded, raising=False)
    server = server_factory(max_payload=1 << 20)
    sock = _raw(server.endpoint)
    sock.sendall(W.FRAME.pack(2, 2 << 30))  # a header announcing a 2 GiB payload
    assert _closed_by_peer(sock)
    sock.close()
    assert asked == [W.SECRET_BYTES, W.FRAME.size], asked  # the secret, the 8-byte frame header: nothing more
    sock = _raw(server.endpoint)
    sock.sendall(W.FRAME.pack(W.MAX_HEADER + 1, 0))  # the header is capped too
    assert _closed_by_peer(sock)
    with pytest.raises(W.FrameTooLarge):  # a client reading an answer checks its own limit
        a, b = socket.socketpair()
        a.sendall(W.FRAME.pack(2, W.MAX_ANSWER + 1))
        W.recv_frame(b)


def test_a_shard_bounds_its_frames_by_its_own_mask_and_query_vectors(tmp_path: Path) -> None:
    from test_scale_exact import synthetic_chunks

    from ragspine_pipeline.retrieval.hybrid.retriever import HybridRetriever
    from ragspine_pipeline.scale.shards import (
        MAX_QUERY_VECTOR_BYTES,
        BM25Shard,
        ShardUnhealthy,
        write_layout,
    )

    chunks = synthetic_chunks(300)
    single = HybridRetriever(chunks)
    write_layout(tmp_path, single.index, [c.chunk_id for c in single.chunks], 2)
    shard = BM25Shard(str(tmp_path), [0])
    assert shard.wire.limits.max_payload == -(-300 // 8) + MAX_QUERY_VECTOR_BYTES
    shard.check_health()
    # Its listening socket breaks (shutdown wakes the blocked accept with EINVAL): unhealthy at once.
    shard.wire._sock.shutdown(socket.SHUT_RDWR)
    _until(lambda: shard.wire.health() is not None, "a broken listener never reported unhealthy")
    with pytest.raises(ShardUnhealthy, match="cannot accept connections"):
        shard.describe()  # the front asks describe over Ray, sees this and has Ray restart it
    shard.wire.close()


def test_a_front_names_a_shard_at_its_cap_or_gone_as_missing(tmp_path: Path) -> None:
    """The front's view: a shard refusing at its connection cap, then a shard whose channel
    broke, are missing shards with their reason (503, or partial with allow_partial)."""
    from test_scale_exact import in_process_front, synthetic_chunks

    from ragspine_pipeline.retrieval.hybrid.retriever import HybridRetriever
    from ragspine_pipeline.scale.requests import ShardUnavailable, shard_request
    from ragspine_pipeline.scale.shards import write_layout

    single = HybridRetriever(synthetic_chunks(300))
    write_layout(tmp_path, single.index, [c.chunk_id for c in single.chunks], 2)
    front, bodies = in_process_front(tmp_path, 2, limits=W.WireLimits(max_connections=1))
    assert len(front.search(["w1"], 5).ids) == 5  # one pooled connection to each shard
    front._links[1].close()  # the front's pooled one is gone: its next request needs a new one
    _until(lambda: bodies[1].wire.connections == 0, "the front's connection was never released")
    hog = _raw(bodies[1].wire.endpoint)  # ... and shard 1's one connection is taken
    _until(lambda: bodies[1].wire.connections == 1, "the hog was never accepted")
    with pytest.raises(ShardUnavailable, match="shard 1: failed: refused: the shard serves its maximum of 1"):
        front.search(["w1"], 5)
    with shard_request(allow_partial=True) as req:
        assert len(front.search(["w1"], 5).ids) > 0 and 1 in req.missing
    hog.close()
    bodies[0].wire.close()
    with pytest.raises(ShardUnavailable, match="shard 0: .*in-process shard"):
        front.search(["w1"], 5)
    bodies[1].wire.close()


# ------------------------------------------------------------------ accept errors
def test_the_accept_loop_survives_aborted_and_exhausted_accepts(
        server_factory: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    errors = [errno.EMFILE, errno.ECONNABORTED, errno.ENFILE, errno.EPROTO]
    real = W.WireServer._accept_one

    def flaky(self: W.WireServer) -> socket.socket:
        if errors:
            raise OSError(errors.pop(0), "injected")
        return real(self)

    monkeypatch.setattr(W.WireServer, "_accept_one", flaky)
    server = server_factory(backoff_min_s=0.001, backoff_max_s=0.01)
    client = W.WireClient(server.endpoint)
    assert _ask(client, 7) == ({"echo": 7}, b"")
    assert not errors and server.health() is None
    client.close()


def test_a_listener_that_keeps_failing_to_accept_reports_unhealthy(
        server_factory: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    def failing(self: W.WireServer) -> socket.socket:
        raise OSError(errno.EMFILE, "Too many open files")

    monkeypatch.setattr(W.WireServer, "_accept_one", failing)
    told = threading.Event()
    reasons: list[str] = []
    server = W.WireServer(_echo, limits=W.WireLimits(unhealthy_after_s=0.05, backoff_min_s=0.001,
                                                      backoff_max_s=0.01),
                          on_unhealthy=lambda why: (reasons.append(why), told.set()))
    try:
        assert told.wait(WAIT_S), "on_unhealthy was never called"
        assert "accept() has failed" in (server.health() or "") and len(reasons) == 1
    finally:
        server.close()
    assert server.health() == "the listener is closed"


def test_an_unexpected_failure_of_the_accept_loop_is_unhealthy(
        server_factory: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(self: W.WireServer, conn: socket.socket) -> None:
        conn.close()
        raise MemoryError("injected")

    monkeypatch.setattr(W.WireServer, "_admit", broken)
    server = server_factory()
    _raw(server.endpoint).close()
    _until(lambda: server.health() is not None, "a failed accept loop still reported healthy")
    assert "the accept loop failed (MemoryError: injected)" in str(server.health())


EMFILE_SERVER = textwrap.dedent("""
    import logging, resource, sys, threading
    from ragspine_pipeline.scale.wire import WireLimits, WireServer
    logging.basicConfig(level=logging.WARNING)
    server = WireServer(lambda h, p: ({"echo": h.get("n")}, b""),
                        limits=WireLimits(handshake_timeout_s=60, backoff_max_s=0.05))
    import os
    used = len(os.listdir("/proc/self/fd"))
    resource.setrlimit(resource.RLIMIT_NOFILE, (used + 4, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    print(server.endpoint.port, server.endpoint.secret.hex(), flush=True)
    sys.stdin.read()  # until the test closes our stdin
    print("HEALTH", server.health(), flush=True)
""")


def test_the_listener_serves_again_after_running_out_of_file_descriptors() -> None:
    """The issue's failure for real: a shard process out of descriptors (EMFILE on
    accept) must keep its accept loop and answer once descriptors are free again."""
    proc = subprocess.Popen([sys.executable, "-c", EMFILE_SERVER], cwd=ROOT, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdin is not None
        port, secret = proc.stdout.readline().split()
        ep = W.Endpoint("127.0.0.1", int(port), bytes.fromhex(secret))
        assert proc.stderr is not None
        lines: list[str] = []
        ran_out = threading.Event()

        def read_stderr() -> None:
            for line in proc.stderr:  # type: ignore[union-attr]
                lines.append(line)
                if "Too many open files" in line:
                    ran_out.set()

        threading.Thread(target=read_stderr, daemon=True).start()
        hogs = [_raw(ep, secret=False) for _ in range(12)]  # more than the 4 descriptors it has left
        assert ran_out.wait(WAIT_S), "".join(lines)  # accept() ran out of descriptors, and said so
        for sock in hogs:
            sock.close()
        client = W.WireClient(ep)
        assert _ask(client, 3) == ({"echo": 3}, b"")
        client.close()
        proc.stdin.close()
        out = proc.stdout.read()
        proc.wait(WAIT_S)
        assert "HEALTH None" in out, out + "".join(lines)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


# ------------------------------------------------------------------ connection cap
def test_connections_past_the_cap_are_refused_cleanly(server_factory: Any) -> None:
    server = server_factory(max_connections=2)
    ep = server.endpoint
    held = [_raw(ep), _raw(ep)]
    _until(lambda: server.connections == 2, "the two connections were never accepted")
    client = W.WireClient(ep)
    try:  # the refusal frame is read as the answer, or, when the write failed first, raised
        head, _ = _ask(client, 1)
        assert head["closed"] is True, head
        why = head["error"]
    except W.ShardRefused as exc:
        why = str(exc)
    assert "refused: the shard serves its maximum of 2 connections" in why
    assert not client._idle and server.refused == 1  # a refused connection is not pooled
    held.pop().close()
    _until(lambda: server.connections == 1, "a closed connection was never released")
    assert _ask(client, 2) == ({"echo": 2}, b"")
    client.close()
    for sock in held:
        sock.close()


def test_a_pooled_connection_the_shard_closed_is_not_reused(server_factory: Any) -> None:
    server = server_factory(idle_timeout_s=0.1)
    client = W.WireClient(server.endpoint)
    assert _ask(client, 1) == ({"echo": 1}, b"")
    _until(lambda: server.connections == 0, "the idle connection was never closed")
    assert _ask(client, 2, b"xy") == ({"echo": 2}, b"yx")  # a fresh connection, no error
    client.close()


def test_limits_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_connections"):
        W.WireLimits(max_connections=0)
    assert np.isfinite(W.WireLimits().idle_timeout_s)
