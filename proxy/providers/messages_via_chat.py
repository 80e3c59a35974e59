"""Messages clients via chat targets: ``/v1/messages`` served by an OpenAI-shaped kind.

For ``openai``, ``simulated`` and every kind but ``anthropic``.

Wraps that kind's own adapter: the Anthropic request becomes a chat completion
(``messages_to_chat``, back with ``chat_to_messages``), the inner adapter builds the upstream call, and the
answer comes back as a Messages answer, streamed event by event. Errors stay in
the OpenAI shape here; the ``/v1/messages`` handler reshapes whatever error
the client finally gets, firstbyte's own included, in one place.
"""

from __future__ import annotations

from dataclasses import replace

import orjson

from ..config import Provider, Target
from ..translate.chat_to_messages import OpenAIStreamToAnthropic, openai_to_anthropic_response
from ..translate.chat_to_messages import error_event as anthropic_error_event
from ..translate.first_token import FirstToken
from ..translate.messages_to_chat import anthropic_to_openai_request
from .base import Adapter, Call, StreamTranslator, UpstreamRequest

__all__ = ["ReverseMessages"]


class _MessagesStream(OpenAIStreamToAnthropic):
    """The reverse stream translator, plus the relay's closing error event in Anthropic's shape."""

    def error_event(self, message: str) -> bytes:
        return anthropic_error_event(message)


def _stops(call: Call) -> list[str]:
    stops = call.body.get("stop_sequences")
    return [s for s in stops if isinstance(s, str)] if isinstance(stops, list) else []


class ReverseMessages:
    def __init__(self, inner: Adapter) -> None:
        self.inner = inner

    def build(self, provider: Provider, target: Target, call: Call) -> UpstreamRequest:
        chat = anthropic_to_openai_request(call.body, target.model)
        return self.inner.build(provider, target, replace(call, op="chat", body=chat))

    def is_context_overflow(self, status: int, body: bytes) -> bool:
        return self.inner.is_context_overflow(status, body)

    def error_body(self, status: int, body: bytes) -> bytes:
        return self.inner.error_body(status, body)

    def client_error(self, call: Call, status: int, body: bytes) -> bytes:
        return body

    def translate_body(self, call: Call, target: Target, body: bytes) -> bytes:
        return orjson.dumps(openai_to_anthropic_response(orjson.loads(body), target.model, _stops(call)))

    def stream_translator(self, call: Call, target: Target) -> StreamTranslator:
        return _MessagesStream(target.model, _stops(call))

    def first_token(self, call: Call) -> FirstToken:
        return self.inner.first_token(call)  # the upstream speaks the inner kind's stream
