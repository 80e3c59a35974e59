"""OpenAI-compatible providers (OpenAI, Groq, OpenRouter, vLLM, Ollama…).

The client already speaks this shape, so the adapter only swaps the model for
the target's upstream model and puts the provider's key in ``Authorization``;
answers pass through byte for byte, except that a stream always asks for
``stream_options.include_usage`` (to price the call) and the usage-only chunk
that brings is removed again when the client did not ask for it.
"""

from __future__ import annotations

from typing import Any

import orjson

from ..config import Provider, Target
from ..errors import normalise_upstream_error
from ..translate.first_token import FirstToken, OpenAIFirstToken
from ..translate.tokens import says_context_overflow
from ..translate.usage_taps import OpenAIUsageTap
from .base import PATHS, Call, StreamTranslator, UpstreamRequest


def is_openai_error(body: bytes) -> bool:
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return False
    return isinstance(data, dict) and isinstance(data.get("error"), dict)


class OpenAIAdapter:
    def build(self, provider: Provider, target: Target, call: Call) -> UpstreamRequest:
        body = upstream_body(target, call)
        headers = {"content-type": "application/json"}
        if provider.headers:
            headers.update(provider.headers)
        if provider.api_key:
            headers["authorization"] = f"Bearer {provider.api_key}"
        return UpstreamRequest("POST", provider.base_url + PATHS[call.op], headers, orjson.dumps(body))

    def is_context_overflow(self, status: int, body: bytes) -> bool:
        return status == 400 and says_context_overflow(body)

    def error_body(self, status: int, body: bytes) -> bytes:
        return normalise_upstream_error(status, body, f"upstream answered {status}")

    def client_error(self, call: Call, status: int, body: bytes) -> bytes:
        """An OpenAI-shape error as it is; anything else (an HTML 403 from a proxy) in that shape."""
        return body if is_openai_error(body) else normalise_upstream_error(status, body, f"upstream answered {status}")

    def translate_body(self, call: Call, target: Target, body: bytes) -> bytes:
        return body

    def stream_translator(self, call: Call, target: Target) -> StreamTranslator:
        return OpenAIUsageTap(keep_usage_chunk=call.wants_usage)

    def first_token(self, call: Call) -> FirstToken:
        return OpenAIFirstToken()


def upstream_body(target: Target, call: Call) -> dict[str, Any]:
    """The client's body with the target's upstream model; a streamed chat or completion also
    asks for its usage chunk, keeping the client's other stream options."""
    body = dict(call.body)
    body["model"] = target.model
    if call.stream and call.op in ("chat", "completions"):
        options = body.get("stream_options")
        body["stream_options"] = {**(options if isinstance(options, dict) else {}), "include_usage": True}
    return body
