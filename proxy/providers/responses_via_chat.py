"""Responses clients via chat targets: ``/v1/responses`` as it is to targets that speak it, via chat to the rest.

- :class:`PassthroughResponses` (``kind: openai`` with ``responses: true``): the
  body goes to ``{base_url}/responses`` with only the model swapped; the stream
  is counted by :class:`ResponsesUsageTap` on its way through.
- :class:`TranslatedResponses` wraps any kind's chat adapter (``openai``,
  ``azure``, ``simulated``, ``anthropic``): the request becomes a chat
  completion (``responses_to_chat``, back with ``chat_to_responses``), the inner adapter builds the
  call and reads the answer into the OpenAI chat shape as it does for
  ``/v1/chat/completions``, and that is reshaped as a Response, streamed event
  by event. Errors stay in the OpenAI shape, which is also the Responses API's.
"""

from __future__ import annotations

import re
from dataclasses import replace

import orjson

from ..bounds import MAX_ANSWER_CONTAINERS
from ..config import Provider, Target
from ..errors import StreamError
from ..translate.chat_to_anthropic import TranslationError
from ..translate.chat_to_responses import ChatStreamToResponses, ResponsesStreamError, chat_to_response, error_payload
from ..translate.chunk_types import DEEP_BYTES
from ..translate.first_token import FirstToken, ResponsesFirstToken
from ..translate.passthrough import answer_lines
from ..translate.responses_to_chat import responses_to_chat
from ..translate.sse import EventFramer, event_frame, json_object, split_events
from ..translate.usage import usage_from_responses
from ..translate.usage_taps import raise_on_deep, raise_on_many
from .base import Adapter, Call, StreamTranslator, UpstreamRequest
from .openai import OpenAIAdapter

__all__ = ["PassthroughResponses", "ResponsesUsageTap", "TranslatedResponses"]

_TERMINAL = (b'"response.completed"', b'"response.failed"', b'"response.incomplete"')
_SEQUENCE = re.compile(rb'"sequence_number"\s*:\s*(\d+)')


class ResponsesUsageTap:
    """Count a Responses stream relayed as it is: done at its terminal event, whose
    ``response.usage`` holds the counts; an ``error`` event fails the stream, and so does an event
    nested past what a client's parser reads (the openai SDK raised ``RecursionError``)."""

    def __init__(self) -> None:
        self.usage: dict[str, int] | None = None
        self.done = False
        self._framer = EventFramer()
        self._last = b""

    def feed(self, data: bytes) -> bytes:
        block = answer_lines(self._framer.complete(data))
        if len(block) >= DEEP_BYTES:  # nested past a client's parser (usage_taps.py); shorter cannot be
            self._deep(block)
        if block:
            self._last = block
        if any(marker in block for marker in _TERMINAL):
            self.done = True
            self._count(block)
        elif block.find(b'"type":"error"') >= 0 or block.find(b'"type": "error"') >= 0:  # find: usage_taps.py
            exc = ResponsesStreamError("the upstream's Responses stream sent an error event")
            exc.partial = block  # the upstream's own error event is the client's to see
            raise exc
        return block

    def _deep(self, block: bytes) -> None:
        """An event nested past what a client's parser reads, or with more objects and arrays than a whole
        answer holds (the closing events carry the answer: ``MAX_ANSWER_CONTAINERS``), ends the stream,
        unparsed; the error event is numbered after the events relayed before it."""
        try:
            raise_on_many(block, ResponsesStreamError, MAX_ANSWER_CONTAINERS)
            raise_on_deep(block, ResponsesStreamError)
        except ResponsesStreamError as exc:
            self._last = exc.partial or self._last
            raise

    def finish(self) -> bytes:
        return answer_lines(self._framer.rest())

    def error_event(self, message: str) -> bytes:
        """An ``error`` event numbered after the last one relayed."""
        found = _SEQUENCE.findall(self._last)
        seq = int(found[-1]) + 1 if found else 0
        event = {**error_payload(message), "sequence_number": seq}
        return event_frame("error", event)

    def _count(self, block: bytes) -> None:
        for event in split_events(block):
            if event.find(b'"usage"') < 0:
                continue
            payload = json_object(event)
            response = payload.get("response") if payload is not None else None
            usage = response.get("usage") if isinstance(response, dict) else None
            if isinstance(usage, dict):
                self.usage = usage_from_responses(usage)


class PassthroughResponses(OpenAIAdapter):
    """An OpenAI provider that serves the Responses API itself (``responses: true``)."""

    def stream_translator(self, call: Call, target: Target) -> StreamTranslator:
        return ResponsesUsageTap()

    def first_token(self, call: Call) -> FirstToken:
        return ResponsesFirstToken()  # the upstream streams Responses events, not chat chunks


class _Chained:
    """The inner adapter's stream translator (its answer in the chat shape), then ours."""

    def __init__(self, inner: StreamTranslator | None, outer: ChatStreamToResponses) -> None:
        self.inner = inner
        self.outer = outer
        self.done = False
        self.usage: dict[str, int] | None = None

    def feed(self, data: bytes) -> bytes:
        if self.inner is not None:
            try:
                data = self.inner.feed(data)
            except StreamError as exc:
                exc.partial = self._partial(exc.partial)
                raise
        out = self.outer.feed(data)
        self.done, self.usage = self.outer.done, self.outer.usage
        return out

    def finish(self) -> bytes:
        out = self.outer.feed(self.inner.finish()) if self.inner is not None else b""
        out += self.outer.finish()
        self.done, self.usage = self.outer.done, self.outer.usage
        return out

    def error_event(self, message: str) -> bytes:
        return self.outer.error_event(message)

    def _partial(self, chat: bytes) -> bytes:
        try:
            return self.outer.feed(chat)
        except StreamError as exc:
            return exc.partial


class TranslatedResponses:
    """``/v1/responses`` to a target that speaks only chat completions (of any kind)."""

    def __init__(self, inner: Adapter, *, reasoning: bool = True) -> None:
        self.inner = inner
        self.reasoning = reasoning  # the kind takes reasoning_effort (OpenAI-compatible ones do)

    def _chat(self, call: Call, model: str) -> Call:
        chat = responses_to_chat(call.body, model, reasoning=self.reasoning)
        return replace(call, op="chat", body=chat, wants_usage=True)

    def build(self, provider: Provider, target: Target, call: Call) -> UpstreamRequest:
        try:
            return self.inner.build(provider, target, self._chat(call, target.model))
        except TranslationError as exc:
            # The inner kind refused the chat request this one became: name the client's field.
            if exc.param.startswith("response_format"):
                param = "text.format" + exc.param[len("response_format"):].replace("json_schema.", "")
                raise TranslationError(param, exc.message.replace("response_format", "text.format")) from exc
            raise

    def is_context_overflow(self, status: int, body: bytes) -> bool:
        return self.inner.is_context_overflow(status, body)

    def error_body(self, status: int, body: bytes) -> bytes:
        return self.inner.error_body(status, body)

    def client_error(self, call: Call, status: int, body: bytes) -> bytes:
        return self.inner.client_error(replace(call, op="chat"), status, body)

    def translate_body(self, call: Call, target: Target, body: bytes) -> bytes:
        chat = self.inner.translate_body(replace(call, op="chat"), target, body)
        return orjson.dumps(chat_to_response(orjson.loads(chat), call.body, target.model))

    def first_token(self, call: Call) -> FirstToken:
        return self.inner.first_token(replace(call, op="chat"))  # the upstream speaks its chat stream

    def stream_translator(self, call: Call, target: Target) -> StreamTranslator:
        chat_call = replace(call, op="chat", wants_usage=True)
        return _Chained(self.inner.stream_translator(chat_call, target),
                        ChatStreamToResponses(call.body, target.model))
