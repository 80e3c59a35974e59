"""Provider adapters, by kind: the only code that knows a provider's wire format."""

from __future__ import annotations

from .base import Adapter, Call, UpstreamRequest
from .openai import OpenAIAdapter
from .simulated import SimulatedAdapter

ADAPTERS: dict[str, Adapter] = {
    "openai": OpenAIAdapter(),
    "simulated": SimulatedAdapter(),
}

__all__ = ["ADAPTERS", "Adapter", "Call", "UpstreamRequest"]
