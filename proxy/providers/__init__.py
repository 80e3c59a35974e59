"""Provider adapters, by kind, and the registry of kinds: what to build and read for each provider.

An adapter knows its provider's wire format and puts the translators of ``translate/`` together for
each client operation; the ``*_via_chat`` adapters serve ``/v1/messages`` and ``/v1/responses`` through a
kind's chat API. A kind served in process (``simulated``) registers its transport here too.
"""

from __future__ import annotations

from collections.abc import Callable

from ..upstream.transport import Transport
from .anthropic import AnthropicAdapter
from .azure import AzureAdapter
from .base import Adapter, Call, UpstreamRequest
from .messages_via_chat import ReverseMessages
from .openai import OpenAIAdapter
from .responses_via_chat import PassthroughResponses, TranslatedResponses
from .simulated import SimTransport, SimulatedAdapter

ADAPTERS: dict[str, Adapter] = {
    "openai": OpenAIAdapter(),
    "azure": AzureAdapter(),
    "simulated": SimulatedAdapter(),
    "anthropic": AnthropicAdapter(),
}

# /v1/messages to a kind that speaks the OpenAI shape goes through the reverse translation.
_MESSAGES: dict[str, Adapter] = {
    kind: ReverseMessages(adapter) for kind, adapter in ADAPTERS.items() if kind != "anthropic"
}

# /v1/responses: as it is to a provider that serves it (responses: true), else through its chat API.
_RESPONSES: dict[str, Adapter] = {
    kind: TranslatedResponses(adapter, reasoning=kind in ("openai", "azure"))
    for kind, adapter in ADAPTERS.items()
}
_PASSTHROUGH_RESPONSES = PassthroughResponses()

# Kinds served in this process rather than over HTTP bring their own transport, one per gateway.
IN_PROCESS: dict[str, Callable[[], Transport]] = {"simulated": SimTransport}


def transports(http: Transport) -> dict[str, Transport]:
    """The transport for each provider kind: ``http`` for all but those served in process."""
    return {kind: IN_PROCESS[kind]() if kind in IN_PROCESS else http for kind in ADAPTERS}


def adapter_for(kind: str, op: str, responses: bool = False) -> Adapter:
    """The adapter for a provider kind and the client's operation; ``responses`` is the
    provider's own ``responses: true`` (it serves ``/v1/responses`` itself)."""
    if op == "messages" and kind in _MESSAGES:
        return _MESSAGES[kind]
    if op == "responses":
        return _PASSTHROUGH_RESPONSES if responses else _RESPONSES[kind]
    return ADAPTERS[kind]


__all__ = ["ADAPTERS", "Adapter", "Call", "UpstreamRequest", "adapter_for", "transports"]
