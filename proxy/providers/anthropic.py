"""``kind: anthropic``: Anthropic's Messages API as a target of any route.

Chat completions are translated to the Messages API on the way up and back to
the OpenAI shape on the way down (``chat_to_anthropic``, ``anthropic_to_chat``); ``/v1/messages`` calls
go up as they are, with only the model swapped. The key travels in
``x-api-key`` with ``anthropic-version``. Anthropic's 529 (overloaded) is a 5xx
and so failover-safe under the one rule in ``classify.py``; its "prompt is too
long" 400 is a context overflow. A request with no faithful Messages
equivalent (``n > 1``, embeddings…) raises :class:`TranslationError` from
:meth:`AnthropicAdapter.build`, which the walker records as an
``untranslatable`` attempt before moving on.
"""

from __future__ import annotations

import time

import orjson

from ..config import Provider, Target
from ..translate.anthropic_to_chat import (
    AnthropicStreamToOpenAI,
    anthropic_error_to_openai,
    anthropic_to_openai_response,
    is_anthropic_context_overflow,
)
from ..translate.chat_to_anthropic import TranslationError, json_tool_of, openai_to_anthropic_request
from ..translate.first_token import AnthropicFirstToken, FirstToken
from ..translate.usage_taps import AnthropicUsageTap
from .base import Call, StreamTranslator, UpstreamRequest

__all__ = ["AnthropicAdapter"]


def anthropic_headers(provider: Provider, beta: str | None) -> dict[str, str]:
    """What every call to Anthropic carries: its version, the provider's headers and key, and the
    opt-in features the client asked Anthropic for (``anthropic-beta``: prompt caching, tools…)."""
    headers = {"content-type": "application/json", "anthropic-version": provider.anthropic_version}
    if provider.headers:
        headers.update(provider.headers)
    if provider.api_key:
        headers["x-api-key"] = provider.api_key
    if beta:
        headers["anthropic-beta"] = beta
    return headers


class AnthropicAdapter:
    def build(self, provider: Provider, target: Target, call: Call) -> UpstreamRequest:
        if call.op == "messages":
            body = dict(call.body)
            body["model"] = target.model
        elif call.op == "chat":
            body = openai_to_anthropic_request(call.body, target.model, provider.default_max_tokens)
        else:
            raise TranslationError(
                "model", f"Anthropic targets serve chat completions and messages, not {call.op}; "
                "use a route whose targets serve it"
            )
        headers = anthropic_headers(provider, call.beta)
        return UpstreamRequest("POST", provider.base_url + "/messages", headers, orjson.dumps(body))

    def is_context_overflow(self, status: int, body: bytes) -> bool:
        return is_anthropic_context_overflow(status, body)

    def error_body(self, status: int, body: bytes) -> bytes:
        return anthropic_error_to_openai(status, body)

    def client_error(self, call: Call, status: int, body: bytes) -> bytes:
        """A 4xx for the client: as it is to an Anthropic client, else in the OpenAI shape."""
        return body if call.op == "messages" else anthropic_error_to_openai(status, body)

    def translate_body(self, call: Call, target: Target, body: bytes) -> bytes:
        if call.op == "messages":
            return body
        answer = anthropic_to_openai_response(orjson.loads(body), target.model, created=int(time.time()),
                                              json_tool=json_tool_of(call.body))
        return orjson.dumps(answer)

    def stream_translator(self, call: Call, target: Target) -> StreamTranslator:
        if call.op == "messages":
            return AnthropicUsageTap()
        return AnthropicStreamToOpenAI(target.model, call.wants_usage, created=int(time.time()),
                                       json_tool=json_tool_of(call.body))

    def first_token(self, call: Call) -> FirstToken:
        return AnthropicFirstToken()
