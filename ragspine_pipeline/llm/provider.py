"""LLMProvider protocol and its two implementations.

* ``OpenAICompatibleProvider`` — any ``/v1/chat/completions`` endpoint (vLLM, llama.cpp
  server, Ollama, OpenAI). Stdlib HTTP only.
* ``ScriptedProvider`` — replays fixed answers or a callable; for tests and demos.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from .http import HTTPServiceError, post_json


@runtime_checkable
class LLMProvider(Protocol):
    def complete(self, prompt: str, *, system: str | None = None, max_tokens: int = 512,
                 temperature: float = 0.0) -> str: ...


@dataclass
class ScriptedProvider:
    """Answers from a list (cycled) or a callable(prompt) -> str; records every prompt."""

    responses: Sequence[str] | Callable[[str], str] = ("",)
    prompts: list[str] = field(default_factory=list)

    def complete(self, prompt: str, *, system: str | None = None, max_tokens: int = 512,
                 temperature: float = 0.0) -> str:
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
            base_url=os.environ.get("RAGSPINE_LLM_BASE_URL", cls.base_url),
            model=os.environ.get("RAGSPINE_LLM_MODEL", cls.model),
            api_key=os.environ.get("RAGSPINE_LLM_API_KEY"),
        )

    def complete(self, prompt: str, *, system: str | None = None, max_tokens: int = 512,
                 temperature: float = 0.0) -> str:
        messages = ([{"role": "system", "content": system}] if system else []) + [
            {"role": "user", "content": prompt}
        ]
        out = post_json(
            self.base_url.rstrip("/") + "/chat/completions",
            {"model": self.model, "messages": messages, "max_tokens": max_tokens,
             "temperature": temperature},
            api_key=self.api_key, timeout=self.timeout,
        )
        try:
            content = out["choices"][0]["message"]["content"]
        except (KeyError, IndexError, TypeError):
            raise HTTPServiceError(f"chat completion without choices[0].message.content: {out!r:.200}") from None
        if not isinstance(content, str):
            raise HTTPServiceError("chat completion content is not a string")
        return content
