"""LLMProvider protocol and its two implementations.

The protocol is the spec's: ``chat(messages, **options) -> str``, where ``messages`` is
the OpenAI-style list of ``{"role": ..., "content": ...}`` dicts and ``options`` are
generation settings (``max_tokens``, ``temperature``, ...) passed through to the model.

* ``OpenAICompatibleProvider`` — any ``/v1/chat/completions`` endpoint (vLLM, llama.cpp
  server, Ollama, OpenAI). Stdlib HTTP only.
* ``ScriptedProvider`` — replays fixed answers or a callable; for tests and demos.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from .. import settings
from .http import HTTPServiceError, post_json

ROLES = ("system", "user", "assistant", "tool")


@runtime_checkable
class LLMProvider(Protocol):
    """A chat model: the messages in, the assistant's text out."""

    def chat(self, messages: Sequence[Mapping[str, str]], **options: Any) -> str: ...


def check_messages(messages: Any) -> list[dict[str, str]]:
    """Validated copy of a chat message list; a malformed list is a TypeError/ValueError
    here rather than an opaque HTTP 400 from the server."""
    if isinstance(messages, str | bytes | Mapping) or not isinstance(messages, Sequence):
        raise TypeError("messages must be a list of {'role': ..., 'content': ...} dicts")
    if not messages:
        raise ValueError("messages must not be empty")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping) or not isinstance(m.get("content"), str):
            raise TypeError(f"message {i} needs a string 'content'")
        if m.get("role") not in ROLES:
            raise ValueError(f"message {i}: role must be one of {ROLES} (got {m.get('role')!r})")
        out.append({"role": m["role"], "content": m["content"]})
    return out


def last_user_text(messages: Sequence[Mapping[str, str]]) -> str:
    """The content of the last user message ('' when there is none)."""
    return next((m["content"] for m in reversed(messages) if m.get("role") == "user"), "")


@dataclass
class ScriptedProvider:
    """Answers from a list (cycled) or a callable(prompt) -> str.

    Records every call: ``prompts`` holds the last user message of each call (what a
    test asserts on), ``calls`` the whole message list and options.
    """

    responses: Sequence[str] | Callable[[str], str] = ("",)
    prompts: list[str] = field(default_factory=list)
    calls: list[tuple[list[dict[str, str]], dict[str, Any]]] = field(default_factory=list)

    def chat(self, messages: Sequence[Mapping[str, str]], **options: Any) -> str:
        msgs = check_messages(messages)
        prompt = last_user_text(msgs)
        self.calls.append((msgs, dict(options)))
        self.prompts.append(prompt)
        if callable(self.responses):
            return self.responses(prompt)
        return self.responses[(len(self.prompts) - 1) % len(self.responses)]


@dataclass
class OpenAICompatibleProvider:
    base_url: str = "http://127.0.0.1:8000/v1"
    model: str = "default"
    api_key: str | None = None
    timeout: float = 60.0

    @classmethod
    def from_env(cls) -> OpenAICompatibleProvider:
        return cls(
            base_url=settings.get("RAGSPINE_LLM_BASE_URL") or cls.base_url,
            model=settings.get("RAGSPINE_LLM_MODEL"),
            api_key=settings.get("RAGSPINE_LLM_API_KEY"),
        )

    def chat(self, messages: Sequence[Mapping[str, str]], **options: Any) -> str:
        """POST the messages to ``/chat/completions``; ``options`` go into the payload
        (``max_tokens``, ``temperature``, ``stop`` ...); the model field stays ours."""
        payload: dict[str, Any] = {**options, "model": self.model, "messages": check_messages(messages)}
        out = post_json(self.base_url.rstrip("/") + "/chat/completions", payload,
                        api_key=self.api_key, timeout=self.timeout)
        try:
            content = out["choices"][0]["message"]["content"]
        except (KeyError, IndexError, TypeError):
            raise HTTPServiceError(f"chat completion without choices[0].message.content: {out!r:.200}") from None
        if not isinstance(content, str):
            raise HTTPServiceError("chat completion content is not a string")
        return content


LLM_BASE_URL_ENV = "RAGSPINE_LLM_BASE_URL"


def provider_from_env() -> OpenAICompatibleProvider | None:
    """The service's LLM: an OpenAI-compatible endpoint when ``RAGSPINE_LLM_BASE_URL`` is
    set (``RAGSPINE_LLM_MODEL``, ``RAGSPINE_LLM_API_KEY``, ``RAGSPINE_LLM_TIMEOUT`` seconds),
    else None — nothing is contacted at run time unless configured."""
    if not settings.get(LLM_BASE_URL_ENV):
        return None
    p = OpenAICompatibleProvider.from_env()
    p.timeout = settings.get("RAGSPINE_LLM_TIMEOUT")  # seconds; a bad value is a SettingsError
    return p
