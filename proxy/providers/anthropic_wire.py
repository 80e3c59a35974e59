"""Anthropic Messages API wire format, seen from an OpenAI-shaped gateway.

Translates an OpenAI ``chat.completions`` request into a Messages API request,
and the Messages answer (buffered, streamed, or an error) back into the OpenAI
shape. Pure functions and one sans-I/O stream translator: bodies are decoded
dicts, stream pieces are bytes, nothing here dials or awaits. The opposite
direction (clients calling ``/v1/messages``) lives in ``anthropic_reverse``.
"""

from __future__ import annotations

from typing import Any

import orjson

from ..errors import FirstbyteError, StreamError, error_body, error_type
from .base import openai_error_event
from .sse import DONE, SseDecoder, data_frame
from .tokens import says_context_overflow, token_count
from .usage import usage_from_anthropic

__all__ = [
    "AnthropicStreamError",
    "AnthropicStreamToOpenAI",
    "TranslationError",
    "anthropic_error_to_openai",
    "anthropic_to_openai_response",
    "is_anthropic_context_overflow",
    "openai_to_anthropic_request",
    "parse_arguments",
]

Json = dict[str, Any]


def tool_call_of(block: Json) -> Json:
    """An Anthropic ``tool_use`` block as an OpenAI ``tool_calls`` item."""
    return {
        "id": block.get("id"),
        "type": "function",
        "function": {"name": block.get("name"), "arguments": orjson.dumps(block.get("input") or {}).decode()},
    }


def tool_use_of(call: Json) -> Json:
    """An OpenAI tool call as an Anthropic ``tool_use`` block (its arguments parsed)."""
    function = call.get("function") or {}
    return {"type": "tool_use", "id": call.get("id"), "name": function.get("name"),
            "input": parse_arguments(function.get("arguments"))}


class TranslationError(FirstbyteError):
    """A request that has no faithful equivalent in the other API (answer it as a 400)."""


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

# What Anthropic says when the prompt does not fit the model's context window.
# --- request: OpenAI -> Anthropic -------------------------------------------------------------


def openai_to_anthropic_request(body: Json, model: str, default_max_tokens: int) -> Json:
    """Build a Messages API request; Anthropic requires ``max_tokens``, hence the default."""
    if body.get("n") not in (None, 1):
        raise TranslationError("n > 1 is not supported by Anthropic targets")
    system: list[str] = []
    turns: list[Json] = []
    for i, message in enumerate(body.get("messages") or []):
        role = message.get("role")
        if role in ("system", "developer"):
            text = _text_of(message.get("content"), f"messages[{i}]")
            if text:
                system.append(text)
        elif role == "user":
            _add_turn(turns, "user", _user_content(message.get("content"), i))
        elif role == "assistant":
            _add_turn(turns, "assistant", _assistant_content(message, i))
        elif role == "tool":
            _add_turn(turns, "user", [_tool_result(message, i)])
        else:
            raise TranslationError(f"messages[{i}].role {role!r} is not supported")

    out: Json = {"model": model, "messages": turns}
    if system:
        out["system"] = "\n\n".join(system)
    max_tokens = body.get("max_completion_tokens") or body.get("max_tokens")
    out["max_tokens"] = max_tokens or default_max_tokens
    if body.get("temperature") is not None:
        # OpenAI allows 0..2, Anthropic 0..1: clamp rather than fail a request other targets take.
        out["temperature"] = min(max(body["temperature"], 0), 1)
    if body.get("top_p") is not None:
        out["top_p"] = body["top_p"]
    stop = body.get("stop")
    if stop:
        out["stop_sequences"] = [stop] if isinstance(stop, str) else list(stop)
    if body.get("stream") is not None:
        out["stream"] = bool(body["stream"])
    if body.get("user"):
        out["metadata"] = {"user_id": body["user"]}
    if body.get("tools"):
        out["tools"] = [_tool(tool, i) for i, tool in enumerate(body["tools"])]
        choice = _tool_choice(body.get("tool_choice"))
        if body.get("parallel_tool_calls") is False:
            choice = choice or {"type": "auto"}
            if choice["type"] != "none":
                choice["disable_parallel_tool_use"] = True
        if choice:
            out["tool_choice"] = choice
    return out


def _text_of(content: Any, where: str) -> str:
    """System and tool contents come as a string or a list of text parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    texts = []
    for part in content:
        if part.get("type") != "text":
            raise TranslationError(f"{where}: only text parts are supported here")
        texts.append(part.get("text") or "")
    return "\n\n".join(t for t in texts if t)


def _add_turn(turns: list[Json], role: str, content: str | list[Json]) -> None:
    """Append a turn, merging into the previous one of the same role: Anthropic wants
    strictly alternating roles, OpenAI does not (tool results, then a user note)."""
    if not content:
        return
    if turns and turns[-1]["role"] == role:
        previous = turns[-1]["content"]
        turns[-1]["content"] = _as_blocks(previous) + _as_blocks(content)
    else:
        turns.append({"role": role, "content": content})


def _as_blocks(content: str | list[Json]) -> list[Json]:
    return [{"type": "text", "text": content}] if isinstance(content, str) else content


def _user_content(content: Any, i: int) -> str | list[Json]:
    if content is None or isinstance(content, str):
        return content or ""
    blocks = []
    for part in content:
        kind = part.get("type")
        if kind == "text":
            if part.get("text"):
                blocks.append({"type": "text", "text": part["text"]})
        elif kind == "image_url":
            image = part.get("image_url")
            url = image if isinstance(image, str) else (image or {}).get("url", "")
            blocks.append(_image_block(url, i))
        else:
            raise TranslationError(f"messages[{i}]: content part {kind!r} has no Anthropic equivalent")
    return blocks


def _image_block(url: str, i: int) -> Json:
    if url.startswith("data:"):
        header, comma, data = url[5:].partition(",")
        media_type, _, params = header.partition(";")
        if not comma or "base64" not in params.split(";"):
            raise TranslationError(f"messages[{i}]: image data URL must be base64-encoded")
        return {
            "type": "image",
            "source": {"type": "base64", "media_type": media_type, "data": data},
        }
    if url.startswith(("http://", "https://")):
        return {"type": "image", "source": {"type": "url", "url": url}}
    raise TranslationError(f"messages[{i}]: image_url must be a data: or http(s) URL")


def _assistant_content(message: Json, i: int) -> str | list[Json]:
    text = _text_of(message.get("content"), f"messages[{i}]")
    calls = message.get("tool_calls") or []
    if not calls:
        return text
    blocks: list[Json] = [{"type": "text", "text": text}] if text else []
    blocks.extend(tool_use_of(call) for call in calls)
    return blocks


def parse_arguments(arguments: Any) -> Json:
    """Tool arguments are a JSON string in OpenAI, an object in Anthropic. Models do emit
    broken JSON, and clients echo it back in history: keep it under ``_raw`` rather than
    refuse the whole conversation."""
    if isinstance(arguments, dict):
        return arguments
    if not arguments:
        return {}
    try:
        value = orjson.loads(arguments)
    except orjson.JSONDecodeError:
        return {"_raw": arguments}
    return value if isinstance(value, dict) else {"_raw": arguments}


def _tool_result(message: Json, i: int) -> Json:
    content = message.get("content")
    if isinstance(content, list):
        _text_of(content, f"messages[{i}]")  # refuses non-text parts
        content = [{"type": "text", "text": p["text"]} for p in content if p.get("text")]
    block: Json = {"type": "tool_result", "tool_use_id": message.get("tool_call_id")}
    if content:
        block["content"] = content
    return block


def _tool(tool: Json, i: int) -> Json:
    if tool.get("type") != "function":
        raise TranslationError(f"tools[{i}]: only function tools are supported")
    function = tool.get("function") or {}
    out: Json = {"name": function.get("name")}
    if function.get("description"):
        out["description"] = function["description"]
    out["input_schema"] = function.get("parameters") or {"type": "object", "properties": {}}
    return out


def _tool_choice(choice: Any) -> Json | None:
    if choice is None:
        return None
    if choice == "auto":
        return {"type": "auto"}
    if choice == "required":
        return {"type": "any"}
    if choice == "none":
        # Dropping the tools instead would break a history holding tool_use blocks.
        return {"type": "none"}
    if isinstance(choice, dict) and choice.get("type") == "function":
        return {"type": "tool", "name": (choice.get("function") or {}).get("name")}
    raise TranslationError(f"tool_choice {choice!r} is not supported")


# --- response: Anthropic -> OpenAI ------------------------------------------------------------


def anthropic_to_openai_response(body: Json, model: str, *, created: int = 0) -> Json:
    """Reshape a buffered Messages answer as a ``chat.completion`` (the id is kept as is,
    so it can be matched with Anthropic's own logs)."""
    texts: list[str] = []
    calls: list[Json] = []
    for block in body.get("content") or []:
        if block.get("type") == "text":
            texts.append(block.get("text") or "")
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
                "finish_reason": finish_reason(body.get("stop_reason")),
            }
        ],
        "usage": usage_from_anthropic(body.get("usage") or {}),
    }


def finish_reason(stop_reason: str | None) -> str:
    return FINISH_REASONS.get(stop_reason or "", "stop")


# --- streams ----------------------------------------------------------------------------------


class AnthropicStreamToOpenAI:
    """Translate an Anthropic event stream into OpenAI ``chat.completion.chunk`` events as
    they arrive, so the client's first chunk is Anthropic's first event, not its last."""

    def __init__(self, model: str, include_usage: bool, created: int = 0) -> None:
        self.model = model
        self.include_usage = include_usage
        self.created = created
        self.usage: dict[str, int] | None = None
        self.done = False
        self._decoder = SseDecoder()
        self._id = ""
        self._upstream_usage: Json = {}
        self._tool_index: dict[int, int] = {}  # Anthropic block index -> OpenAI tool_calls index
        self._finished = False

    def feed(self, data: bytes) -> bytes:
        """Return the complete OpenAI events that ``data`` finishes (maybe ``b""``); raise
        ``AnthropicStreamError`` on an ``error`` event."""
        out = bytearray()
        try:
            for name, raw in self._decoder.feed(data):
                if self.done:
                    break
                try:
                    event = orjson.loads(raw)
                except orjson.JSONDecodeError as exc:
                    raise AnthropicStreamError(
                        f"malformed Anthropic stream event: {raw[:200]!r}", "invalid_stream"
                    ) from exc
                out += self._on_event(event.get("type") or name, event)
        except AnthropicStreamError as exc:
            exc.partial = bytes(out)
            raise
        return bytes(out)

    def finish(self) -> bytes:
        """Nothing is held back: an end without ``message_stop`` is the cut the relay reports."""
        return b""

    def error_event(self, message: str) -> bytes:
        return openai_error_event(message)

    def _on_event(self, kind: str | None, event: Json) -> bytes:
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
            return self._chunk({}, finish_reason(reason))
        if kind == "message_stop":
            return self._on_stop()
        if kind == "error":
            error = event.get("error") or {}
            raise AnthropicStreamError(
                error.get("message") or "Anthropic stream error", error.get("type") or "api_error"
            )
        return b""  # ping, content_block_stop, and event types added later

    def _on_block_start(self, index: int, block: Json) -> bytes:
        if block.get("type") == "text" and block.get("text"):
            return self._chunk({"content": block["text"]})
        if block.get("type") != "tool_use":
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
        if delta.get("type") == "text_delta" and delta.get("text"):
            return self._chunk({"content": delta["text"]})
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
