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
"""

from __future__ import annotations

import hmac
import json
import logging
import secrets
import socket
import struct
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..retrieval.lexical.bm25_topk import ScoredDocs

log = logging.getLogger("ragspine.scale")

FRAME = struct.Struct("<II")
SECRET_BYTES = 32
MAX_HEADER = 16 << 20  # a header is a query's tokens and a few numbers
MAX_PAYLOAD = 1 << 31  # a packed mask of 16G documents; anything larger is a corrupt frame


class WireError(ConnectionError):
    """The channel to a shard broke (closed, reset, deadline, corrupt frame)."""


@dataclass(frozen=True)
class Endpoint:
    """Where a shard listens and the secret a client must present."""

    host: str
    port: int
    secret: bytes


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise WireError("the shard closed the connection")
        got += k
    return bytes(buf)


def encode_frame(header: dict[str, Any], payload: bytes = b"") -> bytes:
    """One frame's bytes (a scatter encodes its request once for every shard)."""
    head = json.dumps(header, separators=(",", ":")).encode()
    return FRAME.pack(len(head), len(payload)) + head + payload


def send_frame(sock: socket.socket, header: dict[str, Any], payload: bytes = b"") -> None:
    sock.sendall(encode_frame(header, payload))


def recv_frame(sock: socket.socket) -> tuple[dict[str, Any], bytes]:
    hlen, plen = FRAME.unpack(_recv_exact(sock, FRAME.size))
    if hlen > MAX_HEADER or plen > MAX_PAYLOAD:
        raise WireError(f"corrupt frame (header {hlen} bytes, payload {plen} bytes)")
    body = _recv_exact(sock, hlen + plen)  # one read for both (they arrive together)
    return json.loads(body[:hlen]), body[hlen:]


Handler = Callable[[dict[str, Any], bytes], tuple[dict[str, Any], bytes]]


class WireServer:
    """A shard's listener: one thread per connection, each frame answered by ``handler``.

    Binds ``host`` on a free port; ``endpoint`` is what ``describe`` hands to fronts. The
    threads are daemons: the shard process ending ends them.
    """

    def __init__(self, handler: Handler, host: str = "127.0.0.1") -> None:
        self.handler = handler
        self.secret = secrets.token_bytes(SECRET_BYTES)
        self._sock = socket.create_server((host, 0), backlog=64)
        self.endpoint = Endpoint(host, int(self._sock.getsockname()[1]), self.secret)
        threading.Thread(target=self._accept, name="shard-wire-accept", daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:  # closed
                return
            threading.Thread(target=self._serve, args=(conn,), name="shard-wire", daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            try:
                if not hmac.compare_digest(_recv_exact(conn, SECRET_BYTES), self.secret):
                    return
                while True:
                    header, payload = recv_frame(conn)
                    try:
                        out_head, out_payload = self.handler(header, payload)
                    except Exception as exc:  # noqa: BLE001 - reported to the caller, who names the shard
                        out_head, out_payload = {"error": f"{type(exc).__name__}: {exc}"}, b""
                    send_frame(conn, out_head, out_payload)
            except (OSError, WireError, ValueError):
                return  # the client went away or sent garbage: drop the connection

    def close(self) -> None:
        self._sock.close()


class WireClient:
    """Connections to one shard, reused across queries (one request in flight on each).

    ``send`` takes an idle connection (or opens one) and writes the request; ``receive``
    reads its answer within a deadline and returns the connection to the pool, or closes
    it when anything went wrong.
    """

    def __init__(self, endpoint: Endpoint) -> None:
        self.endpoint = endpoint
        self._idle: list[socket.socket] = []
        self._lock = threading.Lock()

    def _connect(self, timeout_s: float) -> socket.socket:
        sock = socket.create_connection((self.endpoint.host, self.endpoint.port), timeout=timeout_s)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.sendall(self.endpoint.secret)
        return sock

    def send(self, frame: bytes, timeout_s: float) -> socket.socket:
        """Write one encoded request (``encode_frame``) on an idle or new connection."""
        with self._lock:
            sock = self._idle.pop() if self._idle else None
        try:
            if sock is None:
                sock = self._connect(timeout_s)
            sock.settimeout(timeout_s)
            sock.sendall(frame)
            return sock
        except OSError as exc:
            if sock is not None:
                sock.close()
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
        with self._lock:
            self._idle.append(sock)
        return got

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for sock in idle:
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


__all__ = ["Endpoint", "WireClient", "WireError", "WireServer", "encode_frame", "recv_frame", "scored_frame", "scored_parts", "send_frame"]
