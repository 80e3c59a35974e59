"""Chat answers to Responses: a ``chat.completion`` (buffered or streamed) as a Responses API answer.

The way back for ``/v1/responses`` clients (Codex CLI, the Agents SDK) served by a
target's chat API, whose request ``responses_to_chat`` built:

- :func:`chat_to_response` reshapes a buffered ``chat.completion``;
- :class:`ChatStreamToResponses` turns chat chunks into the Responses event
  sequence as they arrive, with sequence numbers, and ends a broken stream with
  ``error`` and ``response.failed``.

Pure functions and one sans-I/O stream translator. docs/apis.md's "Responses API"
table maps both halves.
"""

from __future__ import annotations

import os
import random
import time
from typing import Any

from ..errors import StreamError
from .responses_to_chat import flat_tool_names
from .sse import ChatChunkFeed, SseDecoder, event_frame
from .usage import usage_from_chat

__all__ = [
    "ChatStreamToResponses",
    "ResponsesStreamError",
    "chat_to_response",
    "error_payload",
    "response_usage",
]

Json = dict[str, Any]

# Chat finish_reason -> (Responses status, incomplete_details.reason).
_STATUS = {
    "length": ("incomplete", "max_output_tokens"),
    "content_filter": ("incomplete", "content_filter"),
}


class ResponsesStreamError(StreamError):
    """An ``error`` payload (or broken framing) inside a chat stream already committed."""


_ids = random.Random()  # seeded from os.urandom once; ids need to be unique, not secret
# A worker forked from the supervisor (forked.py) draws its own: the sequence was each worker's alike.
os.register_at_fork(after_in_child=_ids.seed)


def error_payload(message: str) -> Json:
    """The ``error`` event of a stream that broke after commit, in OpenAI's flat shape. (The Open
    Responses spec nests these fields under ``error``; the openai SDK raises on any event with an
    ``error`` key instead of yielding it, and the ``response.failed`` after it would be lost.)"""
    return {"type": "error", "code": "stream_interrupted", "message": message, "param": None}


def _new_id(prefix: str) -> str:
    return f"{prefix}_{_ids.getrandbits(96):024x}"


# --- response: chat -> Responses --------------------------------------------------------------


def response_usage(usage: Json) -> Json:
    """Chat usage in the Responses shape (cached prompt tokens stay inside input_tokens)."""
    prompt = usage.get("prompt_tokens") or 0
    completion = usage.get("completion_tokens") or 0
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    reasoning = (usage.get("completion_tokens_details") or {}).get("reasoning_tokens") or 0
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": 0},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": reasoning},
        "total_tokens": prompt + completion,
    }


def _envelope(request: Json, model: str, rid: str, created: float) -> Json:
    """The Response object's fields that echo the request, in the order OpenAI sends them.

    Every field the Open Responses spec requires is present, even when the request did not
    set it: sampling knobs the client left out are the defaults the target used (1.0 and
    0), and ``completed_at`` is null until the response completes."""
    raw = request.get("text")
    text: Json = raw if isinstance(raw, dict) else {}
    return {
        "id": rid,
        "object": "response",
        "created_at": int(created),
        "status": "in_progress",
        "completed_at": None,
        "background": False,
        "error": None,
        "incomplete_details": None,
        "instructions": request.get("instructions"),
        "max_output_tokens": request.get("max_output_tokens"),
        "max_tool_calls": None,  # refused when set (responses_to_chat): no chat equivalent
        "model": model,
        "output": [],
        "parallel_tool_calls": request.get("parallel_tool_calls", True),
        "previous_response_id": None,
        "prompt_cache_key": _string(request.get("prompt_cache_key")),
        "reasoning": {"effort": None, "summary": None, **_object(request.get("reasoning"))},
        "safety_identifier": _string(request.get("safety_identifier")),
        "service_tier": "default",
        "store": False,  # nothing is stored: previous_response_id cannot refer to this one
        "temperature": _number(request.get("temperature"), 1.0),
        "text": {**text, "format": _echo_format(text.get("format"))},
        "tool_choice": request.get("tool_choice") or "auto",
        "tools": [_echo_tool(tool) for tool in request.get("tools") or []],
        "top_logprobs": 0,  # refused when set (responses_to_chat): log probabilities are not translated
        "top_p": _number(request.get("top_p"), 1.0),
        "presence_penalty": _number(request.get("presence_penalty"), 0.0),
        "frequency_penalty": _number(request.get("frequency_penalty"), 0.0),
        "truncation": request.get("truncation") or "disabled",
        "usage": None,
        "user": request.get("user"),
        "metadata": request.get("metadata") or {},
    }


def _object(value: Any) -> Json:
    return value if isinstance(value, dict) else {}


def _echo_format(fmt: Any) -> Json:
    """``text.format`` as the spec echoes it: a ``json_schema`` one with its ``description`` and
    ``strict`` always present."""
    if not isinstance(fmt, dict):
        return {"type": "text"}
    if fmt.get("type") == "json_schema":
        return {"description": None, "strict": False, **fmt}
    return fmt


def _number(value: Any, default: float) -> float:
    return value if isinstance(value, int | float) and not isinstance(value, bool) else default


def _string(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _echo_tool(tool: Any) -> Any:
    """A function tool as the spec echoes it: ``description``, ``parameters`` and ``strict``
    always present (null when the request left them out)."""
    if not isinstance(tool, dict) or tool.get("type") != "function":
        return tool
    return {"type": "function", "name": tool.get("name"), "description": tool.get("description"),
            "parameters": tool.get("parameters"), "strict": tool.get("strict"), **tool}


def _finished(envelope: Json, finish: str | None, output: list[Json], usage: Json | None) -> Json:
    status, reason = _STATUS.get(finish or "", ("completed", None))
    envelope["status"] = status
    envelope["incomplete_details"] = {"reason": reason} if reason else None
    envelope["output"] = output
    envelope["usage"] = response_usage(usage) if usage is not None else None
    if status == "completed":
        envelope["completed_at"] = int(time.time())
    return envelope


def _message_item(item_id: str, text: str, refusal: str | None = None, status: str = "completed") -> Json:
    content: list[Json] = []
    if text or not refusal:
        content.append({"type": "output_text", "text": text, "annotations": [], "logprobs": []})
    if refusal:
        content.append({"type": "refusal", "refusal": refusal})
    return {"id": item_id, "type": "message", "status": status, "role": "assistant", "content": content}


def _call_item(item_id: str, call_id: str, name: str, arguments: str,
               names: dict[str, tuple[str, str]], status: str = "completed") -> Json:
    item: Json = {"id": item_id, "type": "function_call", "status": status, "arguments": arguments,
                  "call_id": call_id, "name": name}
    if name in names:
        item["namespace"], item["name"] = names[name]
    return item


def chat_to_response(chat: Json, request: Json, model: str) -> Json:
    """Reshape a buffered ``chat.completion`` as a Response (only the first choice: the
    Responses API has no ``n``)."""
    choice = (chat.get("choices") or [{}])[0]
    message = choice.get("message") or {}
    rid = _new_id("resp")
    output: list[Json] = []
    if message.get("content") or message.get("refusal") or not message.get("tool_calls"):
        output.append(_message_item(_new_id("msg"), message.get("content") or "", message.get("refusal")))
    names = flat_tool_names(request)
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        output.append(_call_item(_new_id("fc"), call.get("id") or _new_id("call"), function.get("name") or "",
                                 function.get("arguments") or "{}", names))
    envelope = _envelope(request, model, rid, chat.get("created") or time.time())
    usage = chat.get("usage") if isinstance(chat.get("usage"), dict) else None
    return _finished(envelope, choice.get("finish_reason"), output, usage)


# --- stream: chat -> Responses ----------------------------------------------------------------


class ChatStreamToResponses(ChatChunkFeed):
    """Translate chat chunks into Responses events as they arrive.

    Each text run and each tool call is one output item: an item opens with
    ``output_item.added`` (and, for text, ``content_part.added``), grows by
    deltas, and closes with its ``…done`` events when the next item opens or the
    stream ends. ``response.created`` and ``response.in_progress`` wait for the
    first chunk with content, so a role-only first chunk sends nothing yet.
    ``response.completed`` waits for ``[DONE]``: the usage chunk comes after the
    finish_reason.
    """

    stream_error = ResponsesStreamError

    def __init__(self, request: Json, model: str) -> None:
        self.usage: dict[str, int] | None = None
        self.done = False
        self._request = request
        self._model = model
        self._names = flat_tool_names(request)
        self._decoder = SseDecoder()
        self._seq = 0
        self._envelope: Json | None = None
        self._output: list[Json] = []
        self._open: Json | None = None  # the item being streamed
        self._open_key: tuple[str, int] | None = None  # ("text", 0) or ("tool", chat index)
        self._text: list[str] = []
        self._finish: str | None = None
        self._chat_usage: Json | None = None

    def finish(self) -> bytes:
        """Complete the response for an upstream that ended after its finish_reason without
        ``[DONE]``; ``b""`` (and not done) when no finish_reason came: that is a cut."""
        if self.done or self._finish is None:
            return b""
        return self._start() + self._end()

    def error_event(self, message: str) -> bytes:
        """The end of a stream that broke after commit: ``error``, then ``response.failed``."""
        out = self._start() + self._close("incomplete")
        out += self._event(error_payload(message))
        assert self._envelope is not None
        failed = _finished(self._envelope, None, self._output, self._chat_usage)
        failed["status"] = "failed"
        failed["error"] = {"code": "server_error", "message": message}
        self.done = True
        return out + self._event({"type": "response.failed", "response": failed})

    # -- chunks --

    def _on_chunk(self, chunk: Json) -> bytes:
        if isinstance(chunk.get("error"), dict):
            error = chunk["error"]
            raise ResponsesStreamError(str(error.get("message") or "upstream stream error"),
                                       str(error.get("type") or "api_error"))
        out = b""
        if isinstance(chunk.get("usage"), dict):
            self._chat_usage = chunk["usage"]
            self.usage = usage_from_chat(self._chat_usage)
        for choice in chunk.get("choices") or []:
            if choice.get("index", 0) != 0:
                continue  # the Responses API has no n: the first choice is the answer
            delta = choice.get("delta") or {}
            text = delta.get("content")
            if text:
                out += self._start() + self._text_delta(text)
            for call in delta.get("tool_calls") or []:
                out += self._start() + self._tool_delta(call)
            if choice.get("finish_reason"):
                self._finish = choice["finish_reason"]
        return out

    def _event(self, payload: Json) -> bytes:
        payload["sequence_number"] = self._seq
        self._seq += 1
        return event_frame(payload["type"], payload)

    def _start(self) -> bytes:
        if self._envelope is not None:
            return b""
        self._envelope = _envelope(self._request, self._model, _new_id("resp"), time.time())
        snapshot = dict(self._envelope)
        return (self._event({"type": "response.created", "response": snapshot})
                + self._event({"type": "response.in_progress", "response": snapshot}))

    def _open_message(self) -> bytes:
        out = self._close()
        item = self._open = _message_item(_new_id("msg"), "", status="in_progress")
        item["content"] = []
        self._open_key = ("text", 0)
        self._text = []
        out += self._event({"type": "response.output_item.added", "output_index": len(self._output),
                            "item": dict(item, content=[])})
        return out + self._event({"type": "response.content_part.added", "item_id": item["id"],
                                  "output_index": len(self._output), "content_index": 0,
                                  "part": {"type": "output_text", "text": "", "annotations": [],
                                           "logprobs": []}})

    def _text_delta(self, text: str) -> bytes:
        out = self._open_message() if self._open_key != ("text", 0) else b""
        assert self._open is not None
        self._text.append(text)
        return out + self._event({"type": "response.output_text.delta", "item_id": self._open["id"],
                                  "output_index": len(self._output), "content_index": 0, "delta": text,
                                  "logprobs": []})

    def _tool_delta(self, call: Json) -> bytes:
        index = call.get("index", 0)
        function = call.get("function") or {}
        out = b""
        if self._open_key != ("tool", index):
            out += self._close()
            item = self._open = _call_item(_new_id("fc"), call.get("id") or _new_id("call"),
                                           function.get("name") or "", "", self._names, status="in_progress")
            self._open_key = ("tool", index)
            self._text = []
            out += self._event({"type": "response.output_item.added", "output_index": len(self._output),
                                "item": dict(item)})
        assert self._open is not None
        arguments = function.get("arguments")
        if arguments:
            self._text.append(arguments)
            out += self._event({"type": "response.function_call_arguments.delta", "item_id": self._open["id"],
                                "output_index": len(self._output), "delta": arguments})
        return out

    def _close(self, status: str = "completed") -> bytes:
        """Close the open item with its ``…done`` events and add it to the output."""
        item, self._open, self._open_key = self._open, None, None
        if item is None:
            return b""
        index = len(self._output)
        text = "".join(self._text)
        out = b""
        item["status"] = status
        if item["type"] == "message":
            part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
            out += self._event({"type": "response.output_text.done", "item_id": item["id"],
                                "output_index": index, "content_index": 0, "text": text, "logprobs": []})
            out += self._event({"type": "response.content_part.done", "item_id": item["id"],
                                "output_index": index, "content_index": 0, "part": part})
            item["content"] = [part]
        else:
            item["arguments"] = text
            out += self._event({"type": "response.function_call_arguments.done", "item_id": item["id"],
                                "output_index": index, "name": item["name"], "arguments": text})
        self._output.append(item)
        return out + self._event({"type": "response.output_item.done", "output_index": index, "item": item})

    def _end(self) -> bytes:
        out = self._close()
        if not self._output:  # an empty answer is still one (empty) message, as OpenAI sends it
            out += self._open_message() + self._close()
        assert self._envelope is not None
        final = _finished(self._envelope, self._finish, self._output, self._chat_usage)
        kind = "response.completed" if final["status"] == "completed" else "response.incomplete"
        self.done = True
        return out + self._event({"type": kind, "response": final})
