"""The in-process simulated provider: OpenAI shape, so it reuses the OpenAI adapter."""

from __future__ import annotations

import orjson

from ..config import Provider, Target
from .base import PATHS, Call, UpstreamRequest
from .openai import OpenAIAdapter, with_usage


class SimulatedAdapter(OpenAIAdapter):
    def build(self, provider: Provider, target: Target, call: Call) -> UpstreamRequest:
        body = dict(call.body)
        body["model"] = target.model
        with_usage(body, call)
        url = f"sim://{provider.name}{PATHS[call.op]}"
        return UpstreamRequest("POST", url, {}, orjson.dumps(body), {"op": call.op})
