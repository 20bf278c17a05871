"""A real chat-completions server on 127.0.0.1 with scripted replies (for the LLM layers).

``ChatServer.script`` maps the request body to ``(status, body_bytes)``; helpers build the
usual replies: an answer, a 5xx, garbage (not JSON), JSON without choices, and a slow
reply that only comes after the test releases it (the client's timeout fires first; no
wall-clock window is asserted). Every request body is recorded in ``bodies``.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


def answer(text: Any) -> tuple[int, bytes]:
    return 200, json.dumps({"choices": [{"message": {"role": "assistant", "content": text}}]}).encode()


def server_error() -> tuple[int, bytes]:
    return 503, b"upstream overloaded"


def garbage() -> tuple[int, bytes]:
    return 200, b"<html>\x00not json"


def no_choices() -> tuple[int, bytes]:
    return 200, json.dumps({"object": "error"}).encode()


class ChatServer:
    def __init__(self) -> None:
        self.bodies: list[str] = []
        self.script: Callable[[dict[str, Any]], tuple[int, bytes]] = lambda body: answer("")
        self.release = threading.Event()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a: Any) -> None:
                pass

            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers["Content-Length"])).decode("utf-8")
                server.bodies.append(raw)
                status, data = server.script(json.loads(raw))
                if status == 0:  # slow: hold the reply until released
                    server.release.wait(30)
                    status, data = answer("too late")
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def __enter__(self) -> ChatServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()


def slow() -> tuple[int, bytes]:
    return 0, b""


def system_of(body: dict[str, Any]) -> str:
    return next((m["content"] for m in body["messages"] if m["role"] == "system"), "")


def user_of(body: dict[str, Any]) -> str:
    return next((m["content"] for m in reversed(body["messages"]) if m["role"] == "user"), "")
