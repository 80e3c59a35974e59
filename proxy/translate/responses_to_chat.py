"""Responses requests to chat: a ``POST /v1/responses`` request as a ``chat.completions`` request.

Codex CLI, the OpenAI Agents SDK and ``client.responses.create`` speak the
Responses API. A target that declares it (``responses: true`` on an OpenAI
provider) gets the request as it is; every other target gets it translated to
its chat API here, and ``chat_to_responses`` brings the answer back.
:func:`responses_to_chat` builds the ``chat.completions`` request, or raises
:class:`TranslationError` for what has no faithful equivalent without a
response store or hosted tools (``previous_response_id``, ``background``,
built-in tools…), which the walker records as an ``untranslatable`` attempt.

Pure functions, like ``messages_to_chat`` for ``/v1/messages``. docs/apis.md's
"Responses API" table is this module's map.
"""

from __future__ import annotations

from typing import Any

from .chat_to_anthropic import TranslationError

__all__ = [
    "flat_tool_names",
    "responses_to_chat",
]

Json = dict[str, Any]

# Separator of a namespace tool's flattened chat name (``crm__lookup``); chat function names
# allow only letters, digits, ``_`` and ``-``.
NAMESPACE_SEP = "__"

# Request keys carried to the chat request as they are.
_SAME = ("temperature", "top_p", "presence_penalty", "frequency_penalty")
# Request keys that need a stored response, hosted execution or output we cannot rebuild:
# key -> why, for the untranslatable reason.
_NEEDS = {
    "previous_response_id": "needs a response store; send the whole conversation as input instead "
                            "(with store: false), or route to a provider with responses: true",
    "conversation": "needs a conversation store; send the whole conversation as input instead, or "
                    "route to a provider with responses: true",
    "background": "needs background execution and a response store; leave it out (or false), or route "
                  "to a provider with responses: true",
    "prompt": "needs stored prompt templates; send instructions and input instead, or route to a "
              "provider with responses: true",
    "top_logprobs": "log probabilities are not translated back; leave it out (or 0), or route to a "
                    "provider with responses: true",
    "max_tool_calls": "has no chat completions equivalent; leave it out, or route to a provider with "
                      "responses: true",
}


# --- request: Responses -> chat ---------------------------------------------------------------


def responses_to_chat(body: Json, model: str, *, reasoning: bool = True) -> Json:
    """Build the ``chat.completions`` request for ``body``; ``reasoning`` says whether the
    target takes ``reasoning_effort`` (OpenAI-compatible targets do)."""
    _refuse_what_needs_a_store(body)
    messages: list[Json] = []
    instructions = body.get("instructions")
    if isinstance(instructions, str) and instructions:
        messages.append({"role": "system", "content": instructions})
    elif instructions:
        raise TranslationError("instructions", "'instructions' as a list of items has no chat completions "
                               "equivalent; send a string, or the items as input")
    raw = body.get("input")
    if isinstance(raw, str):
        messages.append({"role": "user", "content": raw})
    elif isinstance(raw, list):
        for i, item in enumerate(raw):
            _add_item(messages, item, i)
    elif raw is not None:
        raise TranslationError("input", "'input' must be a string or a list of items")

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


def _refuse_what_needs_a_store(body: Json) -> None:
    for key, why in _NEEDS.items():
        value = body.get(key)
        if value is not None and value is not False and value != 0:  # 0 and false ask for nothing
            raise TranslationError(key, f"'{key}' {why}")


def _add_item(messages: list[Json], item: Any, i: int) -> None:
    if not isinstance(item, dict):
        raise TranslationError(f"input[{i}]", f"input[{i}] must be an object (an item)")
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
        raise TranslationError(f"input[{i}].type", f"item type {kind!r} has no chat completions equivalent; "
                               "send message, function_call and function_call_output items, or route to a "
                               "provider with responses: true")


def _message(item: Json, i: int) -> Json:
    role = item.get("role")
    content = item.get("content")
    if role in ("system", "developer"):
        # "system", not "developer": most OpenAI-compatible servers know only the former.
        return {"role": "system", "content": _text(content, f"input[{i}].content")}
    if role == "assistant":
        return {"role": "assistant", "content": _text(content, f"input[{i}].content")}
    if role != "user":
        raise TranslationError(f"input[{i}].role", f"role {role!r} is not a Responses API role; use user, "
                               "assistant, system or developer")
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
            raise TranslationError(f"input[{i}].content", "an input_image by file_id needs the Files API; "
                                   "send image_url (an http(s) or data: URL)")
        image: Json = {"url": url}
        if part.get("detail") in ("low", "high"):
            image["detail"] = part["detail"]
        return {"type": "image_url", "image_url": image}
    raise TranslationError(f"input[{i}].content", f"content part {kind!r} has no chat completions "
                           "equivalent; send input_text or input_image parts")


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
            raise TranslationError(where, f"content part {kind!r} has no chat completions equivalent here; "
                                   "send text parts")
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
                raise TranslationError(f"tools[{i}].tools[{j}]", "only function tools have a chat completions "
                                       "equivalent inside a namespace; leave this one out")
            out.append(_function(inner, _flat(inner.get("name"), tool.get("name"))))
        return out
    hint = " (Codex CLI: web_search = \"disabled\" in config.toml)" if str(kind).startswith("web_search") else ""
    raise TranslationError(
        f"tools[{i}]", f"built-in tool {kind!r} runs on OpenAI's side and has no chat completions "
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
    raise TranslationError("tool_choice", f"tool_choice {choice!r} has no chat completions equivalent; "
                           "use auto, none, required or a function")


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
    raise TranslationError("text.format.type", f"text.format type {fmt.get('type')!r} has no chat "
                           "completions equivalent; use text, json_object or json_schema")
