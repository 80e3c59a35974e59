"""Chat answers to Messages: an OpenAI answer (buffered, streamed, or an error) in Anthropic's shape.

The way back for ``/v1/messages`` clients (the ``anthropic`` SDK and agents built
on it) served by an OpenAI-shaped target, whose request ``messages_to_chat``
built. Pure functions and one sans-I/O stream translator.
"""

from __future__ import annotations

from typing import Any

from ..errors import StreamError
from .chat_to_anthropic import tool_use_of
from .sse import ChatChunkFeed, SseDecoder, event_frame
from .tokens import token_count
from .usage import usage_from_chat

__all__ = [
    "OpenAIStreamError",
    "OpenAIStreamToAnthropic",
    "openai_to_anthropic_response",
]

Json = dict[str, Any]


class OpenAIStreamError(StreamError):
    """An ``error`` payload (or broken framing) inside an OpenAI stream already committed."""


# OpenAI finish_reason -> Anthropic stop_reason. OpenAI does not say which stop sequence
# matched, so "stop" is end_turn unless the server says (``matched_stop``).
STOP_REASONS = {
    "stop": "end_turn",
    "length": "max_tokens",
    "tool_calls": "tool_use",
    "function_call": "tool_use",
    "content_filter": "refusal",
}

# --- response: OpenAI -> Anthropic ------------------------------------------------------------


def openai_to_anthropic_response(body: Json, model: str, stops: list[str] | None = None) -> Json:
    """Reshape a buffered ``chat.completion`` as a Messages answer (id kept as is); ``stops`` are
    the request's ``stop_sequences``."""
    choices = body.get("choices") or [{}]
    choice = choices[0]
    message = choice.get("message") or {}
    content: list[Json] = []
    if message.get("content"):
        content.append({"type": "text", "text": message["content"]})
    content.extend(tool_use_of(call) for call in message.get("tool_calls") or [])
    matched = matched_stop(choice, stops or [])
    return {
        "id": body.get("id"),
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": "stop_sequence" if matched else stop_reason(choice.get("finish_reason")),
        "stop_sequence": matched,
        "usage": anthropic_usage(body.get("usage") or {}),
    }


def stop_reason(finish: str | None) -> str:
    return STOP_REASONS.get(finish or "", "end_turn")


def matched_stop(choice: Json, stops: list[str]) -> str | None:
    """The stop sequence that ended a ``stop`` answer, when the server says which: vLLM's
    ``stop_reason`` or SGLang's ``matched_stop``, holding one of the request's sequences."""
    if choice.get("finish_reason") != "stop":
        return None
    for key in ("stop_reason", "matched_stop"):
        value = choice.get(key)
        if isinstance(value, str) and value in stops:
            return value
    return None


def anthropic_usage(usage: Json) -> Json:
    """OpenAI's prompt_tokens include cached ones; Anthropic counts cache reads apart."""
    prompt = token_count(usage.get("prompt_tokens"))
    details = usage.get("prompt_tokens_details")
    cached = min(prompt, token_count(details.get("cached_tokens"))) if isinstance(details, dict) else 0
    out: Json = {
        "input_tokens": prompt - cached,
        "output_tokens": token_count(usage.get("completion_tokens")),
    }
    if cached:
        out["cache_read_input_tokens"] = cached
    return out


# --- stream: OpenAI -> Anthropic --------------------------------------------------------------


def _event(kind: str, payload: Json) -> bytes:
    return event_frame(kind, {"type": kind, **payload})


def error_event(message: str) -> bytes:
    """The event that ends a broken stream on ``/v1/messages``, in Anthropic's shape."""
    return _event("error", {"error": {"type": "api_error", "message": message}})


class OpenAIStreamToAnthropic(ChatChunkFeed):
    """Translate OpenAI chunks into Anthropic events as they arrive. Anthropic wants one
    content block at a time, so a text run or a tool call opens a block and whatever
    comes next closes it. The closing message_delta waits for ``[DONE]`` because OpenAI
    sends usage in a chunk of its own after the finish_reason."""

    stream_error = OpenAIStreamError
    malformed = "malformed OpenAI stream chunk"

    def __init__(self, model: str, stops: list[str] | None = None) -> None:
        self.model = model
        self._stops = stops or []
        self._stop_sequence: str | None = None
        self.usage: dict[str, int] | None = None
        self.done = False
        self._decoder = SseDecoder()
        self._started = False
        self._block: tuple[str, int, str | None] | None = None  # kind, OpenAI index, id
        self._blocks = 0
        self._stop_reason: str | None = None
        self._upstream_usage: Json = {}

    def finish(self) -> bytes:
        """Close the message for an upstream that ended after its finish_reason without
        ``[DONE]``; returns ``b""`` (and stays not done) if no finish_reason came, so the
        caller treats it as the cut it is."""
        if self.done or self._stop_reason is None:
            return b""
        return self._start() + self._end()

    def _on_chunk(self, chunk: Json) -> bytes:
        if isinstance(chunk.get("error"), dict):
            error = chunk["error"]
            raise OpenAIStreamError(
                str(error.get("message") or "upstream stream error"),
                str(error.get("type") or "api_error"),
            )
        out = self._start(chunk.get("id"))
        if isinstance(chunk.get("usage"), dict):
            self._upstream_usage = chunk["usage"]
            self.usage = usage_from_chat(self._upstream_usage)
        for choice in chunk.get("choices") or []:
            if choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            if delta.get("content"):
                out += self._open("text", 0, None)
                out += self._delta({"type": "text_delta", "text": delta["content"]})
            for call in delta.get("tool_calls") or []:
                out += self._on_tool_call(call)
            if choice.get("finish_reason"):
                self._stop_sequence = matched_stop(choice, self._stops)
                self._stop_reason = "stop_sequence" if self._stop_sequence else stop_reason(choice["finish_reason"])
        return out

    def _on_tool_call(self, call: Json) -> bytes:
        index, call_id = call.get("index", 0), call.get("id")
        function = call.get("function") or {}
        out = b""
        block = self._block
        same = block is not None and block[:2] == ("tool", index) and call_id in (None, block[2])
        if not same:
            out += self._open("tool", index, call_id, function.get("name"))
        if function.get("arguments"):
            out += self._delta({"type": "input_json_delta", "partial_json": function["arguments"]})
        return out

    def _start(self, message_id: str | None = None) -> bytes:
        if self._started:
            return b""
        self._started = True
        message: Json = {
            "id": message_id or "msg_firstbyte",
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": 0, "output_tokens": 0},
        }
        return _event("message_start", {"message": message})

    def _open(self, kind: str, index: int, call_id: str | None, name: str | None = None) -> bytes:
        """Open a block unless this very block is already open (a text run continuing)."""
        if self._block is not None and self._block[0] == kind == "text":
            return b""
        out = self._close()
        self._block = (kind, index, call_id)
        if kind == "text":
            block: Json = {"type": "text", "text": ""}
        else:
            block = {"type": "tool_use", "id": call_id, "name": name, "input": {}}
        return out + _event("content_block_start", {"index": self._blocks, "content_block": block})

    def _delta(self, delta: Json) -> bytes:
        return _event("content_block_delta", {"index": self._blocks, "delta": delta})

    def _close(self) -> bytes:
        if self._block is None:
            return b""
        self._block = None
        self._blocks += 1
        return _event("content_block_stop", {"index": self._blocks - 1})

    def _end(self) -> bytes:
        usage = anthropic_usage(self._upstream_usage)
        out = self._close() + _event(
            "message_delta",
            {
                "delta": {"stop_reason": self._stop_reason or "end_turn", "stop_sequence": self._stop_sequence},
                "usage": usage,
            },
        )
        self.done = True
        return out + _event("message_stop", {})
