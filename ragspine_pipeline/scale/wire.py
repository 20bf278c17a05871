"""The query path between a shard front and its shard actors: a framed TCP channel.

Why not Ray calls: on a 2-core box a Ray actor call costs about 1 ms and four in parallel
2.5-3 ms (the core worker's gRPC submit, scheduling and reply), while one shard's BM25
work is under 0.1 ms — the Ray hop was most of a sharded query's time. Ray still owns
the shards (placement, ``max_restarts``, the named actors every replica finds) and the
control path (``describe``: where a shard listens and its secret); only the per-query
calls travel here, as a socket round trip of a few tens of microseconds.

Safe by construction: nothing is unpickled. A frame is ``<II`` (header length, payload
length), a JSON header and raw bytes (the packed filter mask, query vectors, result
arrays). A connection is accepted only after it presents the shard's 32-byte secret,
which the shard hands out over Ray's authenticated channel (``describe``).

Failure model: a shard that fails in its code answers ``{"error": ...}`` (the connection
stays usable); a shard that dies, resets or misses the deadline loses the connection
(a late answer must never be read as the next query's), and the caller reports it as a
missing shard.

Limits (``WireLimits``): the listener must survive whatever reaches its port, so every
connection has deadlines (the secret, the wait for the next frame, each frame's bytes),
a frame's announced sizes are checked before a byte is allocated, the connections are
capped (an excess one gets an ``{"error": "refused: ...", "closed": true}`` frame and is
closed), and the accept loop survives ``accept()`` errors (EMFILE, ECONNABORTED, ...: it
logs, backs off and goes on). A listener that has not accepted for ``unhealthy_after_s``
while ``accept()`` kept failing reports itself unhealthy (``health``) and calls
``on_unhealthy`` (a shard actor then ends its process, so Ray restarts it).
"""

from __future__ import annotations

import contextlib
import errno
import hmac
import json
import logging
import secrets
import socket
import struct
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..retrieval.lexical.index.topk import ScoredDocs

log = logging.getLogger("ragspine.scale")

FRAME = struct.Struct("<II")
SECRET_BYTES = 32
MAX_HEADER = 4 << 20  # a header is a query's tokens, their df and a few numbers
MAX_ANSWER = 256 << 20  # what a client reads back: result arrays of a few thousand rows
CLIENT_IDLE_S = 30.0  # a pooled connection idle longer is not reused (the listener closes idle ones)
# accept() errors that say the listening socket itself is gone: nothing to retry
_DEAD_LISTENER = {errno.EBADF, errno.ENOTSOCK, errno.EINVAL}


class WireError(ConnectionError):
    """The channel to a shard broke (closed, reset, deadline, corrupt frame)."""


class FrameTooLarge(WireError):
    """A frame announced more bytes than the receiver accepts (refused before allocating)."""


class ShardRefused(WireError):
    """The shard refused a new connection (its connection cap): the message says why."""


@dataclass(frozen=True)
class WireLimits:
    """A listener's limits: what one connection may cost and how long it may hold a thread.

    ``max_payload`` bounds a request's raw bytes (a shard passes its own: its packed filter
    mask plus the query vectors); ``unhealthy_after_s``: how long ``accept()`` may keep
    failing before the listener reports itself unhealthy.
    """

    max_connections: int = 128
    handshake_timeout_s: float = 5.0
    idle_timeout_s: float = 120.0
    frame_timeout_s: float = 30.0
    max_header: int = MAX_HEADER
    max_payload: int = 64 << 20
    unhealthy_after_s: float = 30.0
    backoff_min_s: float = 0.005
    backoff_max_s: float = 1.0

    def __post_init__(self) -> None:
        for name in ("max_connections", "handshake_timeout_s", "idle_timeout_s", "frame_timeout_s", "max_header",
                     "max_payload", "unhealthy_after_s", "backoff_min_s", "backoff_max_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"WireLimits.{name} must be > 0 (got {getattr(self, name)!r})")


@dataclass(frozen=True)
class Endpoint:
    """Where a shard listens and the secret a client must present."""

    host: str
    port: int
    secret: bytes


def _recv_exact(sock: socket.socket, n: int, deadline: float | None = None) -> bytes:
    """``n`` bytes; with ``deadline`` (monotonic) all of them by then, however slowly
    they trickle in (a per-recv timeout alone lets a sender hold the reader forever)."""
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"{n - got} of {n} bytes still missing at the deadline")
            sock.settimeout(left)
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise WireError("the peer closed the connection")
        got += k
    return bytes(buf)


def encode_frame(header: dict[str, Any], payload: bytes = b"") -> bytes:
    """One frame's bytes (a scatter encodes its request once for every shard)."""
    head = json.dumps(header, separators=(",", ":")).encode()
    return FRAME.pack(len(head), len(payload)) + head + payload


def send_frame(sock: socket.socket, header: dict[str, Any], payload: bytes = b"") -> None:
    sock.sendall(encode_frame(header, payload))


def recv_frame(sock: socket.socket, *, max_header: int = MAX_HEADER, max_payload: int = MAX_ANSWER,
               idle_s: float | None = None, frame_s: float | None = None) -> tuple[dict[str, Any], bytes]:
    """One frame. The announced sizes are checked against the limits before anything is
    allocated (``FrameTooLarge``). ``idle_s``: the frame must start within it; ``frame_s``:
    its remaining bytes must all arrive within it (None: the socket's own timeout)."""
    start = None if idle_s is None else time.monotonic() + idle_s
    hlen, plen = FRAME.unpack(_recv_exact(sock, FRAME.size, start))
    if hlen > max_header or plen > max_payload:
        raise FrameTooLarge(f"frame refused: header {hlen} bytes (limit {max_header}), payload {plen} bytes "
                            f"(limit {max_payload})")
    body = _recv_exact(sock, hlen + plen, None if frame_s is None else time.monotonic() + frame_s)
    return json.loads(body[:hlen]), body[hlen:]


Handler = Callable[[dict[str, Any], bytes], tuple[dict[str, Any], bytes]]


class WireServer:
    """A shard's listener: one thread per connection, each frame answered by ``handler``.

    Binds ``host`` on a free port; ``endpoint`` is what ``describe`` hands to fronts. The
    threads are daemons: the shard process ending ends them. ``limits`` bound every
    connection (``WireLimits``); ``on_unhealthy(reason)`` is called once when the listener
    can no longer accept (``health`` then says why).
    """

    def __init__(self, handler: Handler, host: str = "127.0.0.1", limits: WireLimits | None = None,
                 on_unhealthy: Callable[[str], None] | None = None) -> None:
        self.handler = handler
        self.limits = limits or WireLimits()
        self.on_unhealthy = on_unhealthy
        self.secret = secrets.token_bytes(SECRET_BYTES)
        self._sock = socket.create_server((host, 0), backlog=64)
        self.endpoint = Endpoint(host, int(self._sock.getsockname()[1]), self.secret)
        self._closed = threading.Event()
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._unhealthy: str | None = None
        self.refused = 0  # connections refused at the cap (a figure for logs and tests)
        self._thread = threading.Thread(target=self._accept_loop, name="shard-wire-accept", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ health
    @property
    def connections(self) -> int:
        with self._lock:
            return len(self._conns)

    def health(self) -> str | None:
        """None while the listener accepts; else why it cannot."""
        if self._closed.is_set():
            return "the listener is closed"
        if not self._thread.is_alive():
            return self._unhealthy or "the accept loop stopped"
        return self._unhealthy

    def _mark_unhealthy(self, reason: str) -> None:
        first = self._unhealthy is None
        self._unhealthy = reason
        if first:
            log.error("shard listener %s:%d unhealthy: %s", self.endpoint.host, self.endpoint.port, reason)
            if self.on_unhealthy is not None:
                self.on_unhealthy(reason)

    # ------------------------------------------------------------------ accept
    def _accept_one(self) -> socket.socket:
        return self._sock.accept()[0]

    def _accept_loop(self) -> None:
        try:
            self._accept_until_closed()
        except Exception as exc:  # noqa: BLE001 - a bug, not a network event: replace the listener
            self._mark_unhealthy(f"the accept loop failed ({type(exc).__name__}: {exc})")

    def _accept_until_closed(self) -> None:
        """Accept until closed. An ``accept()`` error (out of descriptors, an aborted
        handshake, ...) is logged and retried after a growing pause, never the end of the
        loop; only a listening socket that is gone ends it (unhealthy)."""
        lim = self.limits
        backoff, failing_since, last_log = lim.backoff_min_s, None, 0.0
        while not self._closed.is_set():
            try:
                conn = self._accept_one()
            except OSError as exc:
                if self._closed.is_set():
                    return
                now = time.monotonic()
                failing_since = now if failing_since is None else failing_since
                if exc.errno in _DEAD_LISTENER:
                    self._mark_unhealthy(f"the listening socket is gone ({type(exc).__name__}: {exc})")
                    return
                if now - last_log >= 10.0:
                    log.warning("shard listener: accept() failed (%s: %s); retrying in %.3f s",
                                type(exc).__name__, exc, backoff)
                    last_log = now
                if now - failing_since >= lim.unhealthy_after_s:
                    self._mark_unhealthy(f"accept() has failed for {now - failing_since:.1f} s "
                                         f"({type(exc).__name__}: {exc})")
                self._closed.wait(backoff)
                backoff = min(backoff * 2, lim.backoff_max_s)
                continue
            failing_since, backoff, self._unhealthy = None, lim.backoff_min_s, None
            self._admit(conn)

    def _admit(self, conn: socket.socket) -> None:
        """Serve ``conn`` on its own thread, or refuse it cleanly at the cap."""
        with self._lock:
            full = len(self._conns) >= self.limits.max_connections
            if not full:
                self._conns.add(conn)
        if full:
            self._refuse(conn)
            return
        try:
            threading.Thread(target=self._serve, args=(conn,), name="shard-wire", daemon=True).start()
        except RuntimeError as exc:  # no thread left: refuse this one, keep accepting
            with self._lock:
                self._conns.discard(conn)
            self._refuse(conn, f"refused: the shard cannot start a thread ({exc})")

    def _refuse(self, conn: socket.socket, why: str | None = None) -> None:
        """An error frame that says why, then close (read what already arrived first, so
        the close is a FIN the client reads after the frame, not a reset)."""
        self.refused += 1
        why = why or f"refused: the shard serves its maximum of {self.limits.max_connections} connections"
        with conn, contextlib.suppress(OSError):
            conn.settimeout(0.5)
            conn.sendall(encode_frame({"error": why, "closed": True}))
            conn.shutdown(socket.SHUT_WR)
            conn.setblocking(False)
            for _ in range(16):
                if not conn.recv(65536):
                    break

    # ------------------------------------------------------------------ serve
    def _serve(self, conn: socket.socket) -> None:
        lim = self.limits
        try:
            with conn:
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                got = _recv_exact(conn, SECRET_BYTES, time.monotonic() + lim.handshake_timeout_s)
                if not hmac.compare_digest(got, self.secret):
                    return
                while not self._closed.is_set():
                    header, payload = recv_frame(conn, max_header=lim.max_header, max_payload=lim.max_payload,
                                                 idle_s=lim.idle_timeout_s, frame_s=lim.frame_timeout_s)
                    try:
                        out_head, out_payload = self.handler(header, payload)
                    except Exception as exc:  # noqa: BLE001 - reported to the caller, who names the shard
                        out_head, out_payload = {"error": f"{type(exc).__name__}: {exc}"}, b""
                    conn.settimeout(lim.frame_timeout_s)  # a client that does not read its answer
                    send_frame(conn, out_head, out_payload)
        except FrameTooLarge as exc:
            log.warning("shard listener: %s; connection dropped", exc)
        except (OSError, WireError, ValueError):
            pass  # the client went away, idled past its deadline or sent garbage: drop the connection
        finally:
            with self._lock:
                self._conns.discard(conn)

    def close(self) -> None:
        """Stop accepting (shutdown wakes a blocked ``accept``) and drop every connection."""
        self._closed.set()
        for sock in [self._sock, *self._open_conns()]:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def _open_conns(self) -> list[socket.socket]:
        with self._lock:
            return list(self._conns)


def _reusable(sock: socket.socket) -> bool:
    """A pooled connection the listener has not closed (idle timeout, restart) and that
    holds no stray bytes: a peek that would block is the only good answer."""
    try:
        sock.settimeout(0)
        sock.recv(1, socket.MSG_PEEK)  # b"": the shard closed it; a byte: a stray answer
        return False
    except BlockingIOError:
        return True
    except OSError:
        return False


def _refusal(sock: socket.socket) -> str | None:
    """The shard's refusal, when its frame is what a failed write left to read."""
    try:
        sock.settimeout(0.2)
        head, _ = recv_frame(sock, max_header=1 << 16, max_payload=0)
    except (OSError, ValueError):
        return None
    return str(head["error"]) if head.get("closed") and "error" in head else None


class WireClient:
    """Connections to one shard, reused across queries (one request in flight on each).

    ``send`` takes an idle connection (or opens one) and writes the request; ``receive``
    reads its answer within a deadline and returns the connection to the pool, or closes
    it when anything went wrong or the shard said it closes it (a refusal at its
    connection cap). A pooled connection idle over ``CLIENT_IDLE_S`` or closed by the
    shard (its idle timeout) is dropped instead of reused.
    """

    def __init__(self, endpoint: Endpoint) -> None:
        self.endpoint = endpoint
        self._idle: list[tuple[socket.socket, float]] = []
        self._lock = threading.Lock()

    def _connect(self, timeout_s: float) -> socket.socket:
        sock = socket.create_connection((self.endpoint.host, self.endpoint.port), timeout=timeout_s)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.sendall(self.endpoint.secret)
        return sock

    def _pooled(self) -> socket.socket | None:
        now = time.monotonic()
        while True:
            with self._lock:
                if not self._idle:
                    return None
                sock, since = self._idle.pop()
            if now - since <= CLIENT_IDLE_S and _reusable(sock):
                return sock
            sock.close()

    def send(self, frame: bytes, timeout_s: float) -> socket.socket:
        """Write one encoded request (``encode_frame``) on an idle or new connection;
        ``ShardRefused`` when the shard refused a new one (its refusal frame arrived
        before the write failed)."""
        sock = self._pooled()
        fresh = sock is None
        try:
            if sock is None:
                sock = self._connect(timeout_s)
            sock.settimeout(timeout_s)
            sock.sendall(frame)
            return sock
        except OSError as exc:
            why = _refusal(sock) if fresh and sock is not None else None
            if sock is not None:
                sock.close()
            if why:
                raise ShardRefused(why) from exc
            raise WireError(f"{type(exc).__name__}: {exc}") from exc

    def receive(self, sock: socket.socket, timeout_s: float) -> tuple[dict[str, Any], bytes]:
        try:
            sock.settimeout(max(timeout_s, 1e-6))
            got = recv_frame(sock)
        except TimeoutError as exc:
            sock.close()
            raise TimeoutError("no answer within the deadline") from exc
        except (OSError, ValueError) as exc:
            sock.close()
            raise WireError(f"{type(exc).__name__}: {exc}") from exc
        if got[0].get("closed"):  # the shard refused this connection and closed it
            sock.close()
        else:
            with self._lock:
                self._idle.append((sock, time.monotonic()))
        return got

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for sock, _ in idle:
            sock.close()


def scored_frame(parts: Sequence[ScoredDocs]) -> tuple[dict[str, Any], bytes]:
    """Result lists as one frame: their lengths in the header, all ids then all scores."""
    ids = [np.ascontiguousarray(p.ids, np.int64) for p in parts]
    scores = [np.ascontiguousarray(p.scores, np.float64) for p in parts]
    return {"lens": [len(x) for x in ids]}, b"".join(x.tobytes() for x in ids + scores)


def scored_parts(header: dict[str, Any], payload: bytes) -> list[ScoredDocs]:
    """The result lists of a ``scored_frame`` (views on the payload, no copy)."""
    lens = [int(n) for n in header["lens"]]
    total = sum(lens)
    ids = np.frombuffer(payload, np.int64, total)
    scores = np.frombuffer(payload, np.float64, total, offset=8 * total)
    out, at = [], 0
    for n in lens:
        out.append(ScoredDocs(ids[at:at + n], scores[at:at + n]))
        at += n
    return out


__all__ = ["Endpoint", "FrameTooLarge", "ShardRefused", "WireClient", "WireError", "WireLimits", "WireServer", "encode_frame", "recv_frame",
           "scored_frame", "scored_parts", "send_frame"]
