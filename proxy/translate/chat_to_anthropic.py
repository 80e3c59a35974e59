"""Chat requests to Anthropic: a ``chat.completions`` request as a Messages API request.

So chat clients can use an ``anthropic`` target; ``anthropic_to_chat`` brings its
answer back. Also the tool-call shapes both Anthropic translators share
(``tool_call_of``, ``tool_use_of``) and :class:`TranslationError`, raised by every
request translator for what has no faithful equivalent. Pure functions on
decoded dicts: nothing here dials or awaits. The opposite direction (clients
calling ``/v1/messages``) is ``messages_to_chat`` and ``chat_to_messages``.
"""

from __future__ import annotations

from typing import Any

import orjson

from ..errors import FirstbyteError

__all__ = [
    "TranslationError",
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
            text = text_of(message.get("content"), f"messages[{i}]")
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


def text_of(content: Any, where: str, unit: str = "parts") -> str:
    """System and tool contents come as a string or a list of text items (``unit`` is each API's
    word for them, in the refusal); any other item is refused, not dropped."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    texts = []
    for part in content:
        if part.get("type") != "text":
            raise TranslationError(f"{where}: only text {unit} are supported here")
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
    text = text_of(message.get("content"), f"messages[{i}]")
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
        text_of(content, f"messages[{i}]")  # refuses non-text parts
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
