"""Provider adapters, by kind: the only code that knows a provider's wire format."""

from __future__ import annotations

from .anthropic import AnthropicAdapter
from .base import Adapter, Call, UpstreamRequest
from .messages import ReverseMessages
from .openai import OpenAIAdapter
from .simulated import SimulatedAdapter

ADAPTERS: dict[str, Adapter] = {
    "openai": OpenAIAdapter(),
    "simulated": SimulatedAdapter(),
    "anthropic": AnthropicAdapter(),
}

# /v1/messages to a kind that speaks the OpenAI shape goes through the reverse translation.
_MESSAGES: dict[str, Adapter] = {
    kind: ReverseMessages(adapter) for kind, adapter in ADAPTERS.items() if kind != "anthropic"
}


def adapter_for(kind: str, op: str) -> Adapter:
    """The adapter for a provider kind and the client's operation."""
    if op == "messages" and kind in _MESSAGES:
        return _MESSAGES[kind]
    return ADAPTERS[kind]


__all__ = ["ADAPTERS", "Adapter", "Call", "UpstreamRequest", "adapter_for"]
