"""OpenAI's Responses API (``POST /v1/responses``) for targets that only speak chat completions.

Codex CLI, the OpenAI Agents SDK and ``client.responses.create`` speak the
Responses API. A target that declares it (``responses: true`` on an OpenAI
provider) gets the request as it is; every other target gets it translated to
its chat API here, and its answer (buffered or streamed) translated back:

- :func:`responses_to_chat` builds the ``chat.completions`` request, or raises
  :class:`TranslationError` for what has no faithful equivalent without a
  response store or hosted tools (``previous_response_id``, ``background``,
  built-in tools…), which the walker records as an ``untranslatable`` attempt;
- :func:`chat_to_response` reshapes a buffered ``chat.completion``;
- :class:`ChatStreamToResponses` turns chat chunks into the Responses event
  sequence as they arrive, with sequence numbers, and ends a broken stream with
  ``error`` and ``response.failed``.

Pure functions and one sans-I/O stream translator, like ``anthropic_reverse``
for ``/v1/messages``. The README's "Responses API" table is this module's map.
"""

from __future__ import annotations

import random
import time
from typing import Any

from ..errors import StreamError
from .anthropic_wire import TranslationError
from .sse import ChatChunkFeed, SseDecoder, event_frame
from .usage import usage_from_chat

__all__ = [
    "ChatStreamToResponses",
    "ResponsesStreamError",
    "chat_to_response",
    "flat_tool_names",
    "response_usage",
    "responses_to_chat",
]

Json = dict[str, Any]

# Separator of a namespace tool's flattened chat name (``crm__lookup``); chat function names
# allow only letters, digits, ``_`` and ``-``.
NAMESPACE_SEP = "__"

# Request keys carried to the chat request as they are.
_SAME = ("temperature", "top_p")
# Request keys that need a stored response, hosted execution or output we cannot rebuild:
# key -> why, for the untranslatable reason.
_NEEDS = {
    "previous_response_id": "needs a response store (send the whole conversation as input instead)",
    "conversation": "needs a conversation store (send the whole conversation as input instead)",
    "background": "needs background execution and a response store",
    "prompt": "needs stored prompt templates",
    "top_logprobs": "log probabilities are not translated back",
    "max_tool_calls": "has no chat completions equivalent",
}
# Chat finish_reason -> (Responses status, incomplete_details.reason).
_STATUS = {
    "length": ("incomplete", "max_output_tokens"),
    "content_filter": ("incomplete", "content_filter"),
}


class ResponsesStreamError(StreamError):
    """An ``error`` payload (or broken framing) inside a chat stream already committed."""


_ids = random.Random()  # seeded from os.urandom once; ids need to be unique, not secret


def _new_id(prefix: str) -> str:
    return f"{prefix}_{_ids.getrandbits(96):024x}"


# --- request: Responses -> chat ---------------------------------------------------------------


def responses_to_chat(body: Json, model: str, *, reasoning: bool = True) -> Json:
    """Build the ``chat.completions`` request for ``body``; ``reasoning`` says whether the
    target takes ``reasoning_effort`` (OpenAI-compatible targets do)."""
    for key, why in _NEEDS.items():
        value = body.get(key)
        if value is not None and value is not False:
            raise TranslationError(f"'{key}' {why}; only a target with responses: true can take it")
    messages: list[Json] = []
    instructions = body.get("instructions")
    if isinstance(instructions, str) and instructions:
        messages.append({"role": "system", "content": instructions})
    elif instructions:
        raise TranslationError("'instructions' as a list of items is not supported; send a string")
    raw = body.get("input")
    if isinstance(raw, str):
        messages.append({"role": "user", "content": raw})
    elif isinstance(raw, list):
        for i, item in enumerate(raw):
            _add_item(messages, item, i)
    elif raw is not None:
        raise TranslationError("'input' must be a string or a list of items")

    out: Json = {"model": model, "messages": messages}
    if body.get("max_output_tokens") is not None:
        # max_tokens, not max_completion_tokens: most OpenAI-compatible servers know only it.
        out["max_tokens"] = body["max_output_tokens"]
    for key in _SAME:
        if body.get(key) is not None:
            out[key] = body[key]
    user = body.get("user") or body.get("safety_identifier")
    if isinstance(user, str) and user:
        out["user"] = user
    effort = (body.get("reasoning") or {}).get("effort")
    if reasoning and isinstance(effort, str):
        out["reasoning_effort"] = effort
    response_format = _response_format((body.get("text") or {}).get("format"))
    if response_format is not None:
        out["response_format"] = response_format
    tools = body.get("tools") or []
    if tools:
        out["tools"] = [chat for i, tool in enumerate(tools) for chat in _tools(tool, i)]
        if body.get("parallel_tool_calls") is not None:
            out["parallel_tool_calls"] = body["parallel_tool_calls"]
    choice = body.get("tool_choice")
    if choice is not None and (tools or choice == "none"):
        out["tool_choice"] = _tool_choice(choice)
    if body.get("stream"):
        out["stream"] = True
        out["stream_options"] = {"include_usage": True}
    return out


def _add_item(messages: list[Json], item: Any, i: int) -> None:
    if not isinstance(item, dict):
        raise TranslationError(f"input[{i}] must be an object")
    kind = item.get("type", "message")
    if kind == "message":
        messages.append(_message(item, i))
    elif kind == "function_call":
        call = {
            "id": item.get("call_id"),
            "type": "function",
            "function": {"name": _flat(item.get("name"), item.get("namespace")),
                         "arguments": item.get("arguments") or "{}"},
        }
        last = messages[-1] if messages else None
        if last is not None and last.get("role") == "assistant":
            last.setdefault("tool_calls", []).append(call)  # one assistant turn: text and its calls
        else:
            messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
    elif kind == "function_call_output":
        messages.append({"role": "tool", "tool_call_id": item.get("call_id"),
                         "content": _text(item.get("output"), f"input[{i}].output")})
    elif kind == "reasoning":
        pass  # another model's reasoning (often encrypted) stays behind, as on /v1/messages
    else:
        raise TranslationError(f"input[{i}]: item type {kind!r} has no chat completions equivalent")


def _message(item: Json, i: int) -> Json:
    role = item.get("role")
    content = item.get("content")
    if role in ("system", "developer"):
        # "system", not "developer": most OpenAI-compatible servers know only the former.
        return {"role": "system", "content": _text(content, f"input[{i}].content")}
    if role == "assistant":
        return {"role": "assistant", "content": _text(content, f"input[{i}].content")}
    if role != "user":
        raise TranslationError(f"input[{i}].role {role!r} is not supported")
    if content is None or isinstance(content, str):
        return {"role": "user", "content": content or ""}
    parts = [_user_part(part, i) for part in content]
    if all(p["type"] == "text" for p in parts):
        return {"role": "user", "content": "\n\n".join(p["text"] for p in parts)}
    return {"role": "user", "content": parts}


def _user_part(part: Json, i: int) -> Json:
    kind = part.get("type")
    if kind in ("input_text", "output_text", "text"):
        return {"type": "text", "text": part.get("text") or ""}
    if kind == "input_image":
        url = part.get("image_url")
        if not isinstance(url, str) or not url:
            raise TranslationError(f"input[{i}]: an input_image by file_id needs the Files API")
        image: Json = {"url": url}
        if part.get("detail") in ("low", "high"):
            image["detail"] = part["detail"]
        return {"type": "image_url", "image_url": image}
    raise TranslationError(f"input[{i}]: content part {kind!r} has no chat completions equivalent")


def _text(content: Any, where: str) -> str:
    """Text-only content (system turns, assistant history, tool output) as one string."""
    if content is None or isinstance(content, str):
        return content or ""
    texts = []
    for part in content if isinstance(content, list) else [content]:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in ("input_text", "output_text", "text"):
            texts.append(part.get("text") or "")
        elif kind == "refusal":
            texts.append(part.get("refusal") or "")
        else:
            raise TranslationError(f"{where}: content part {kind!r} has no chat completions equivalent here")
    return "".join(texts)


def _flat(name: Any, namespace: Any) -> Any:
    return f"{namespace}{NAMESPACE_SEP}{name}" if namespace else name


def _function(tool: Json, name: str) -> Json:
    function: Json = {"name": name}
    if tool.get("description"):
        function["description"] = tool["description"]
    function["parameters"] = tool.get("parameters") or {"type": "object", "properties": {}}
    if tool.get("strict") is not None:
        function["strict"] = tool["strict"]
    return {"type": "function", "function": function}


def _tools(tool: Json, i: int) -> list[Json]:
    kind = tool.get("type")
    if kind == "function":
        return [_function(tool, tool.get("name") or "")]
    if kind == "namespace":  # a group of function tools: flattened as namespace__name
        out = []
        for j, inner in enumerate(tool.get("tools") or []):
            if inner.get("type") != "function":
                raise TranslationError(f"tools[{i}].tools[{j}]: only function tools are supported")
            out.append(_function(inner, _flat(inner.get("name"), tool.get("name"))))
        return out
    hint = " (Codex CLI: web_search = \"disabled\" in config.toml)" if str(kind).startswith("web_search") else ""
    raise TranslationError(
        f"tools[{i}]: built-in tool {kind!r} runs on OpenAI's side and has no chat completions "
        f"equivalent; leave it out{hint} or route to a provider with responses: true"
    )


def flat_tool_names(body: Json) -> dict[str, tuple[str, str]]:
    """Flattened chat name -> (namespace, name), to give a tool call its namespace back."""
    names: dict[str, tuple[str, str]] = {}
    for tool in body.get("tools") or []:
        if isinstance(tool, dict) and tool.get("type") == "namespace":
            for inner in tool.get("tools") or []:
                if isinstance(inner, dict):
                    names[_flat(inner.get("name"), tool.get("name"))] = (str(tool.get("name")),
                                                                         str(inner.get("name")))
    return names


def _tool_choice(choice: Any) -> Any:
    if choice in ("auto", "none", "required"):
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function":
        return {"type": "function", "function": {"name": _flat(choice.get("name"), choice.get("namespace"))}}
    raise TranslationError(f"tool_choice {choice!r} has no chat completions equivalent")


def _response_format(fmt: Any) -> Json | None:
    if not isinstance(fmt, dict) or fmt.get("type") in (None, "text"):
        return None
    if fmt.get("type") == "json_object":
        return {"type": "json_object"}
    if fmt.get("type") == "json_schema":
        schema: Json = {"name": fmt.get("name") or "response", "schema": fmt.get("schema") or {}}
        for key in ("strict", "description"):
            if fmt.get(key) is not None:
                schema[key] = fmt[key]
        return {"type": "json_schema", "json_schema": schema}
    raise TranslationError(f"text.format type {fmt.get('type')!r} has no chat completions equivalent")


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
    """The Response object's fields that echo the request, in the order OpenAI sends them."""
    raw = request.get("text")
    text: Json = raw if isinstance(raw, dict) else {}
    return {
        "id": rid,
        "object": "response",
        "created_at": int(created),
        "status": "in_progress",
        "background": False,
        "error": None,
        "incomplete_details": None,
        "instructions": request.get("instructions"),
        "max_output_tokens": request.get("max_output_tokens"),
        "model": model,
        "output": [],
        "parallel_tool_calls": request.get("parallel_tool_calls", True),
        "previous_response_id": None,
        "reasoning": request.get("reasoning") or {"effort": None, "summary": None},
        "store": False,  # nothing is stored: previous_response_id cannot refer to this one
        "temperature": request.get("temperature"),
        "text": {**text, "format": text.get("format") or {"type": "text"}},
        "tool_choice": request.get("tool_choice") or "auto",
        "tools": request.get("tools") or [],
        "top_p": request.get("top_p"),
        "truncation": request.get("truncation") or "disabled",
        "usage": None,
        "user": request.get("user"),
        "metadata": request.get("metadata") or {},
    }


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
        out += self._event({"type": "error", "code": "stream_interrupted", "message": message, "param": None})
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
