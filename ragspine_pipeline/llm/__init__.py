"""LLM providers: protocol, OpenAI-compatible HTTP provider, scripted provider."""

from .http import HTTPServiceError
from .provider import LLMProvider, OpenAICompatibleProvider, ScriptedProvider

__all__ = ["HTTPServiceError", "LLMProvider", "OpenAICompatibleProvider", "ScriptedProvider"]
