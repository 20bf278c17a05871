"""Minimal JSON-over-HTTP client (stdlib only) shared by the OpenAI-compatible adapters."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any


class HTTPServiceError(RuntimeError):
    """An HTTP endpoint failed or answered something that is not the expected JSON."""


def post_json(url: str, payload: dict[str, Any], *, api_key: str | None = None,
              timeout: float = 30.0) -> dict[str, Any]:
    data = json.dumps(payload).encode("utf-8")
    req = urllib.request.Request(url, data=data, method="POST")
    req.add_header("Content-Type", "application/json")
    if api_key:
        req.add_header("Authorization", f"Bearer {api_key}")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            body = resp.read()
    except urllib.error.HTTPError as exc:
        detail = exc.read()[:500].decode("utf-8", "replace")
        raise HTTPServiceError(f"{url} answered HTTP {exc.code}: {detail}") from None
    except (urllib.error.URLError, TimeoutError, OSError) as exc:
        raise HTTPServiceError(f"{url} unreachable: {exc}") from None
    try:
        out = json.loads(body)
    except json.JSONDecodeError:
        raise HTTPServiceError(f"{url} answered non-JSON: {body[:200]!r}") from None
    if not isinstance(out, dict):
        raise HTTPServiceError(f"{url} answered JSON that is not an object")
    return out
