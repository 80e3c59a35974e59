"""Messages requests to chat: a ``/v1/messages`` request as a ``chat.completions`` request.

So the ``anthropic`` SDK and agents built on it can use any OpenAI-shaped target
of a route; ``chat_to_messages`` brings the answer back. Pure functions; the
other direction (chat clients, Anthropic targets) is ``chat_to_anthropic``.
"""

from __future__ import annotations

from typing import Any

from .chat_to_anthropic import TranslationError, text_of, tool_call_of

__all__ = [
    "anthropic_to_openai_request",
]

Json = dict[str, Any]


# --- request: Anthropic -> OpenAI -------------------------------------------------------------


def anthropic_to_openai_request(body: Json, model: str) -> Json:
    """Build a ``chat.completions`` request; a stream asks for usage so calls can be priced."""
    messages: list[Json] = []
    system = text_of(body.get("system"), "system", "blocks")
    if system:
        messages.append({"role": "system", "content": system})
    for i, message in enumerate(body.get("messages") or []):
        role = message.get("role")
        if role == "user":
            messages.extend(_user_messages(message.get("content"), i))
        elif role == "assistant":
            messages.append(_assistant_message(message.get("content"), i))
        else:
            raise TranslationError(f"messages[{i}].role", f"role {role!r} is not a Messages API role; "
                                   "use user or assistant")

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
    response_format = _response_format(body)
    if response_format is not None:
        out["response_format"] = response_format
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


def _response_format(body: Json) -> Json | None:
    """Anthropic's structured output (``output_config.format``, or the beta's ``output_format``) as
    the chat API's ``response_format``: the same JSON schema, strict."""
    config = body.get("output_config")
    fmt = config.get("format") if isinstance(config, dict) else None
    fmt = fmt if fmt is not None else body.get("output_format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict) or fmt.get("type") != "json_schema" or not isinstance(fmt.get("schema"), dict):
        raise TranslationError("output_config.format", "only a json_schema format with a schema has a chat "
                               "completions equivalent; send {type: json_schema, schema: {...}}")
    return {"type": "json_schema", "json_schema": {"name": "output", "schema": fmt["schema"], "strict": True}}


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
            raise TranslationError(f"messages[{i}].content", f"image source {source.get('type')!r} has no "
                                   "chat completions equivalent; send base64 or url")
        return {"type": "image_url", "image_url": {"url": url}}
    raise TranslationError(f"messages[{i}].content", f"content block {kind!r} has no chat completions "
                           "equivalent; send text or image blocks")


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
            raise TranslationError(f"messages[{i}].content", f"content block {kind!r} has no chat "
                                   "completions equivalent; send text and tool_use blocks")
    message: Json = {"role": "assistant", "content": "".join(texts) if texts or not calls else None}
    if calls:
        message["tool_calls"] = calls
    return message


def _tool(tool: Json, i: int) -> Json:
    if tool.get("type") not in (None, "custom") or "input_schema" not in tool:
        raise TranslationError(f"tools[{i}]", f"server tool {tool.get('type')!r} runs on Anthropic's side; "
                               "leave it out or route to an Anthropic target")
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
    raise TranslationError("tool_choice", f"tool_choice {choice!r} has no chat completions equivalent; "
                           "use auto, any, none or tool")
