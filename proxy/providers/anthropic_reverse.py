"""The ``/v1/messages`` direction: Anthropic-speaking clients, OpenAI-compatible targets.

Translates a Messages API request into a ``chat.completions`` request, and the
OpenAI answer (buffered, streamed, or an error) back into Anthropic's shape, so
the ``anthropic`` SDK and agents built on it can use any target of a route.
Pure functions and one sans-I/O stream translator; the other direction lives in
``anthropic_wire``, whose SSE decoder this module shares.
"""

from __future__ import annotations

from typing import Any

from ..errors import StreamError
from .anthropic_wire import TranslationError, tool_call_of, tool_use_of
from .sse import ChatChunkFeed, SseDecoder, event_frame
from .tokens import token_count
from .usage import usage_from_chat

__all__ = [
    "OpenAIStreamError",
    "OpenAIStreamToAnthropic",
    "anthropic_to_openai_request",
    "openai_to_anthropic_response",
]

Json = dict[str, Any]


class OpenAIStreamError(StreamError):
    """An ``error`` payload (or broken framing) inside an OpenAI stream already committed."""


# OpenAI finish_reason -> Anthropic stop_reason. OpenAI does not say which stop sequence
# matched, so "stop" is always end_turn.
STOP_REASONS = {
    "stop": "end_turn",
    "length": "max_tokens",
    "tool_calls": "tool_use",
    "function_call": "tool_use",
    "content_filter": "refusal",
}

# --- request: Anthropic -> OpenAI -------------------------------------------------------------


def anthropic_to_openai_request(body: Json, model: str) -> Json:
    """Build a ``chat.completions`` request; a stream asks for usage so calls can be priced."""
    messages: list[Json] = []
    system = _joined_text(body.get("system"), "system")
    if system:
        messages.append({"role": "system", "content": system})
    for i, message in enumerate(body.get("messages") or []):
        role = message.get("role")
        if role == "user":
            messages.extend(_user_messages(message.get("content"), i))
        elif role == "assistant":
            messages.append(_assistant_message(message.get("content"), i))
        else:
            raise TranslationError(f"messages[{i}].role {role!r} is not supported")

    out: Json = {"model": model, "messages": messages}
    if body.get("max_tokens") is not None:
        # max_tokens, not max_completion_tokens: most OpenAI-compatible servers know only it.
        out["max_tokens"] = body["max_tokens"]
    for key in ("temperature", "top_p"):
        if body.get(key) is not None:
            out[key] = body[key]
    if body.get("stop_sequences"):
        out["stop"] = list(body["stop_sequences"])
    if body.get("stream"):
        out["stream"] = True
        out["stream_options"] = {"include_usage": True}
    user_id = (body.get("metadata") or {}).get("user_id")
    if user_id:
        out["user"] = user_id
    if body.get("tools"):
        out["tools"] = [_tool(tool, i) for i, tool in enumerate(body["tools"])]
        choice = body.get("tool_choice") or {}
        if choice:
            out["tool_choice"] = _tool_choice(choice)
        if choice.get("disable_parallel_tool_use"):
            out["parallel_tool_calls"] = False
    return out


def _joined_text(content: Any, where: str) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    texts = []
    for block in content:
        if block.get("type") != "text":
            raise TranslationError(f"{where}: only text blocks are supported here")
        texts.append(block.get("text") or "")
    return "\n\n".join(t for t in texts if t)


def _user_messages(content: Any, i: int) -> list[Json]:
    """One Anthropic user turn becomes tool messages (which must follow the assistant's
    tool calls directly) and then a user message with everything else. Images inside a
    tool result cannot sit in an OpenAI tool message, so they move to that user message."""
    if content is None or isinstance(content, str):
        return [{"role": "user", "content": content or ""}]
    tools: list[Json] = []
    parts: list[Json] = []
    for block in content:
        if block.get("type") == "tool_result":
            result = block.get("content")
            texts: list[str] = []
            if isinstance(result, str):
                texts.append(result)
            for inner in result if isinstance(result, list) else []:
                if inner.get("type") == "text":
                    texts.append(inner.get("text") or "")
                else:
                    parts.append(_user_part(inner, i))
            tools.append(
                {
                    "role": "tool",
                    "tool_call_id": block.get("tool_use_id"),
                    "content": "\n\n".join(t for t in texts if t),
                }
            )
        else:
            parts.append(_user_part(block, i))
    return tools + ([{"role": "user", "content": parts}] if parts else [])


def _user_part(block: Json, i: int) -> Json:
    kind = block.get("type")
    if kind == "text":
        return {"type": "text", "text": block.get("text") or ""}
    if kind == "image":
        source = block.get("source") or {}
        if source.get("type") == "base64":
            url = f"data:{source.get('media_type')};base64,{source.get('data')}"
        elif source.get("type") == "url":
            url = source.get("url") or ""
        else:
            raise TranslationError(f"messages[{i}]: image source {source.get('type')!r}")
        return {"type": "image_url", "image_url": {"url": url}}
    raise TranslationError(f"messages[{i}]: content block {kind!r} has no OpenAI equivalent")


def _assistant_message(content: Any, i: int) -> Json:
    if content is None or isinstance(content, str):
        return {"role": "assistant", "content": content or ""}
    texts: list[str] = []
    calls: list[Json] = []
    for block in content:
        kind = block.get("type")
        if kind == "text":
            texts.append(block.get("text") or "")
        elif kind == "tool_use":
            calls.append(tool_call_of(block))
        elif kind not in ("thinking", "redacted_thinking"):  # signed reasoning stays behind
            raise TranslationError(f"messages[{i}]: content block {kind!r} is not supported")
    message: Json = {"role": "assistant", "content": "".join(texts) if texts or not calls else None}
    if calls:
        message["tool_calls"] = calls
    return message


def _tool(tool: Json, i: int) -> Json:
    if tool.get("type") not in (None, "custom") or "input_schema" not in tool:
        raise TranslationError(f"tools[{i}]: server tool {tool.get('type')!r} is not supported")
    function: Json = {"name": tool.get("name")}
    if tool.get("description"):
        function["description"] = tool["description"]
    function["parameters"] = tool["input_schema"]
    return {"type": "function", "function": function}


def _tool_choice(choice: Json) -> Any:
    kind = choice.get("type")
    if kind in ("auto", "none"):
        return kind
    if kind == "any":
        return "required"
    if kind == "tool":
        return {"type": "function", "function": {"name": choice.get("name")}}
    raise TranslationError(f"tool_choice {choice!r} is not supported")


# --- response: OpenAI -> Anthropic ------------------------------------------------------------


def openai_to_anthropic_response(body: Json, model: str) -> Json:
    """Reshape a buffered ``chat.completion`` as a Messages answer (id kept as is)."""
    choices = body.get("choices") or [{}]
    choice = choices[0]
    message = choice.get("message") or {}
    content: list[Json] = []
    if message.get("content"):
        content.append({"type": "text", "text": message["content"]})
    content.extend(tool_use_of(call) for call in message.get("tool_calls") or [])
    return {
        "id": body.get("id"),
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop_reason(choice.get("finish_reason")),
        "stop_sequence": None,
        "usage": anthropic_usage(body.get("usage") or {}),
    }


def stop_reason(finish: str | None) -> str:
    return STOP_REASONS.get(finish or "", "end_turn")


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

    def __init__(self, model: str) -> None:
        self.model = model
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
                self._stop_reason = stop_reason(choice["finish_reason"])
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
                "delta": {"stop_reason": self._stop_reason or "end_turn", "stop_sequence": None},
                "usage": usage,
            },
        )
        self.done = True
        return out + _event("message_stop", {})
