"""Anthropic answers to chat: a Messages answer (buffered, streamed, or an error) in the OpenAI shape.

The way back for chat clients served by an ``anthropic`` target, whose request
``chat_to_anthropic`` built. Pure functions and one sans-I/O stream translator:
bodies are decoded dicts, stream pieces are bytes, nothing here dials or awaits.
"""

from __future__ import annotations

from typing import Any

import orjson

from ..errors import StreamError, error_body, error_type
from .chat_to_anthropic import tool_call_of
from .sse import DONE, JsonEventFeed, SseDecoder, data_frame, openai_error_event
from .tokens import says_context_overflow, token_count
from .usage import usage_from_anthropic

__all__ = [
    "AnthropicStreamError",
    "AnthropicStreamToOpenAI",
    "anthropic_error_to_openai",
    "anthropic_to_openai_response",
    "is_anthropic_context_overflow",
]

Json = dict[str, Any]


class AnthropicStreamError(StreamError):
    """An ``error`` event (or broken framing) inside an Anthropic stream already committed."""


# Anthropic stop_reason -> OpenAI finish_reason. Unknown reasons end as "stop".
FINISH_REASONS = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "pause_turn": "stop",
    "max_tokens": "length",
    "model_context_window_exceeded": "length",
    "tool_use": "tool_calls",
    "refusal": "content_filter",
}


# --- response: Anthropic -> OpenAI ------------------------------------------------------------


def anthropic_to_openai_response(body: Json, model: str, *, created: int = 0, json_tool: str | None = None) -> Json:
    """Reshape a buffered Messages answer as a ``chat.completion`` (the id is kept as is,
    so it can be matched with Anthropic's own logs). ``json_tool``: the forced tool that carried
    a JSON answer (``chat_to_anthropic.JSON_TOOL``); its input is the message's content."""
    texts: list[str] = []
    calls: list[Json] = []
    for block in body.get("content") or []:
        if block.get("type") == "text" and json_tool is None:  # a JSON answer is the tool's input alone
            texts.append(block.get("text") or "")
        elif block.get("type") == "tool_use" and json_tool is not None and block.get("name") == json_tool:
            texts.append(orjson.dumps(block.get("input") or {}).decode())
        elif block.get("type") == "tool_use":
            calls.append(tool_call_of(block))
    message: Json = {"role": "assistant", "content": "".join(texts) if texts or not calls else None}
    if calls:
        message["tool_calls"] = calls
    return {
        "id": body.get("id"),
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "logprobs": None,
                "finish_reason": finish_reason(body.get("stop_reason"), bool(calls)),
            }
        ],
        "usage": usage_from_anthropic(body.get("usage") or {}),
    }


def finish_reason(stop_reason: str | None, calls: bool = True) -> str:
    """``calls``: the answer holds tool calls the client sees; a forced JSON tool's stop is a ``stop``."""
    if stop_reason == "tool_use" and not calls:
        return "stop"
    return FINISH_REASONS.get(stop_reason or "", "stop")


# --- streams ----------------------------------------------------------------------------------


class AnthropicStreamToOpenAI(JsonEventFeed):
    """Translate an Anthropic event stream into OpenAI ``chat.completion.chunk`` events as
    they arrive, so the client's first chunk is Anthropic's first event, not its last."""

    stream_error = AnthropicStreamError
    malformed = "malformed Anthropic stream event"

    def __init__(self, model: str, include_usage: bool, created: int = 0, json_tool: str | None = None) -> None:
        self.model = model
        self.json_tool = json_tool  # its input streams as the message's content (a JSON answer)
        self._json_blocks: set[int] = set()
        self.include_usage = include_usage
        self.created = created
        self.usage: dict[str, int] | None = None
        self.done = False
        self._decoder = SseDecoder()
        self._id = ""
        self._upstream_usage: Json = {}
        self._tool_index: dict[int, int] = {}  # Anthropic block index -> OpenAI tool_calls index
        self._finished = False

    # feed (JsonEventFeed): the complete OpenAI events the data finishes (maybe b""); an ``error``
    # event raises AnthropicStreamError

    def finish(self) -> bytes:
        """Nothing is held back: an end without ``message_stop`` is the cut the relay reports."""
        return b""

    def error_event(self, message: str) -> bytes:
        return openai_error_event(message)

    def _on_event(self, name: str | None, event: Any) -> bytes:
        return self._on_anthropic(event.get("type") or name, event)

    def _on_anthropic(self, kind: str | None, event: Json) -> bytes:
        if kind == "message_start":
            message = event.get("message") or {}
            self._id = message.get("id") or ""
            self._count(message.get("usage") or {})
            return self._chunk({"role": "assistant", "content": ""})
        if kind == "content_block_start":
            return self._on_block_start(event.get("index", 0), event.get("content_block") or {})
        if kind == "content_block_delta":
            return self._on_block_delta(event.get("index", 0), event.get("delta") or {})
        if kind == "message_delta":
            self._count(event.get("usage") or {})
            reason = (event.get("delta") or {}).get("stop_reason")
            if reason is None:
                return b""
            self._finished = True
            return self._chunk({}, finish_reason(reason, bool(self._tool_index)))
        if kind == "message_stop":
            return self._on_stop()
        if kind == "error":
            error = event.get("error") or {}
            raise AnthropicStreamError(
                error.get("message") or "Anthropic stream error", error.get("type") or "api_error"
            )
        return b""  # ping, content_block_stop, and event types added later

    def _on_block_start(self, index: int, block: Json) -> bytes:
        if block.get("type") == "text" and block.get("text") and self.json_tool is None:
            return self._chunk({"content": _text(block["text"])})
        if block.get("type") != "tool_use":
            return b""
        if self.json_tool is not None and block.get("name") == self.json_tool:
            self._json_blocks.add(index)
            return b""
        self._tool_index[index] = tool_index = len(self._tool_index)
        call = {
            "index": tool_index,
            "id": block.get("id"),
            "type": "function",
            "function": {"name": block.get("name"), "arguments": ""},
        }
        return self._chunk({"tool_calls": [call]})

    def _on_block_delta(self, index: int, delta: Json) -> bytes:
        if delta.get("type") == "text_delta" and delta.get("text") and self.json_tool is None:
            return self._chunk({"content": _text(delta["text"])})
        if index in self._json_blocks and delta.get("type") == "input_json_delta":
            text = delta.get("partial_json")
            return self._chunk({"content": _text(text)}) if text else b""
        if delta.get("type") == "input_json_delta" and delta.get("partial_json"):
            call = {
                "index": self._tool_index.get(index, 0),
                "function": {"arguments": delta["partial_json"]},
            }
            return self._chunk({"tool_calls": [call]})
        return b""  # thinking, signature and citation deltas have no OpenAI place

    def _on_stop(self) -> bytes:
        out = b"" if self._finished else self._chunk({}, "stop")
        if self.include_usage and self.usage is not None:
            out += data_frame(
                {
                    "id": self._id,
                    "object": "chat.completion.chunk",
                    "created": self.created,
                    "model": self.model,
                    "choices": [],
                    "usage": self.usage,
                }
            )
        self.done = True
        return out + DONE

    def _count(self, usage: Json) -> None:
        """message_delta counts are cumulative and may omit fields: overwrite what is given."""
        if isinstance(usage, dict):
            self._upstream_usage.update({k: token_count(v) for k, v in usage.items() if isinstance(v, int | str)})
        self.usage = usage_from_anthropic(self._upstream_usage)

    def _chunk(self, delta: Json, finish: str | None = None) -> bytes:
        return data_frame(
            {
                "id": self._id,
                "object": "chat.completion.chunk",
                "created": self.created,
                "model": self.model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
            }
        )


# --- errors -----------------------------------------------------------------------------------


def _error_fields(body: bytes) -> tuple[str | None, str | None]:
    """(type, message) of an Anthropic- or OpenAI-shaped error body, if it is one."""
    try:
        data = orjson.loads(body) if body else None
    except orjson.JSONDecodeError:
        return None, None
    error = data.get("error") if isinstance(data, dict) else None
    if not isinstance(error, dict) or not isinstance(error.get("message"), str):
        return None, None
    kind = error.get("type")
    return (kind if isinstance(kind, str) else None), error["message"]


def is_anthropic_context_overflow(status: int, body: bytes) -> bool:
    """A 400 saying the prompt does not fit: failover-safe, a bigger window may take it."""
    if status != 400:
        return False
    _, message = _error_fields(body)
    return says_context_overflow(message.encode() if message is not None else body[:2000])


def anthropic_error_to_openai(status: int, body: bytes) -> bytes:
    """Normalise an Anthropic error to the OpenAI shape, keeping Anthropic's error type
    (``overloaded_error``, ``rate_limit_error``…) since OpenAI clients read the message."""
    kind, message = _error_fields(body)
    code = "context_length_exceeded" if is_anthropic_context_overflow(status, body) else None
    if message is not None:
        return error_body(message, kind or error_type(status), code=code)
    text = body[:500].decode("utf-8", "replace").strip()
    message = f"Anthropic upstream answered {status}" + (f": {text}" if text else "")
    return error_body(message, error_type(status), code=code or f"upstream_{status}")


def _text(value: Any) -> str:
    """Text an Anthropic event carries, for a chat chunk's ``content``: a string, or the event is of
    the wrong types (a TypeError, which the feed tells as such) and never ``"content": 5``."""
    if type(value) is not str:
        raise TypeError(value)
    return value
