"""The in-process simulated provider: OpenAI shape, so it reuses the OpenAI adapter.

The simulator runs in this process, so the body is handed over as it is rather
than serialised and parsed again, through the kind's own transport (``sim/transport.py``),
which the registry hands the gateway: nothing else of the gateway knows the simulator.
"""

from __future__ import annotations

from ..config import Provider, Target
from ..sim.transport import SimTransport
from .base import PATHS, Call, UpstreamRequest
from .openai import OpenAIAdapter, upstream_body

__all__ = ["SimTransport", "SimulatedAdapter"]


class SimulatedAdapter(OpenAIAdapter):
    def build(self, provider: Provider, target: Target, call: Call) -> UpstreamRequest:
        url = f"sim://{provider.name}{PATHS[call.op]}"
        return UpstreamRequest("POST", url, {}, b"", {"op": call.op, "json": upstream_body(target, call)})
