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
    "JSON_TOOL",
    "TranslationError",
    "json_tool_of",
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
    """A request that has no faithful equivalent in the other API (answer it as a 400).

    ``param`` names the request field at fault (``messages[2].content``), for the error's
    ``param``; the message says what the client can do instead."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param
        self.message = message


# --- request: OpenAI -> Anthropic -------------------------------------------------------------


def openai_to_anthropic_request(body: Json, model: str, default_max_tokens: int) -> Json:
    """Build a Messages API request; Anthropic requires ``max_tokens``, hence the default."""
    if body.get("n") not in (None, 1):
        raise TranslationError("n", "n > 1 has no Anthropic equivalent; send n: 1 (or several requests)")
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
            raise TranslationError(f"messages[{i}].role", f"role {role!r} has no Anthropic equivalent; use "
                                   "system, developer, user, assistant or tool")

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
    _add_tools(out, body)
    return out


def _add_tools(out: Json, body: Json) -> None:
    """The client's tools and tool_choice, or the forced tool of a JSON answer."""
    json_tool = _json_tool(body.get("response_format"), bool(body.get("tools")))
    if json_tool is not None:
        out["tools"], out["tool_choice"] = [json_tool], {"type": "tool", "name": JSON_TOOL}
    elif body.get("tools"):
        out["tools"] = [_tool(tool, i) for i, tool in enumerate(body["tools"])]
        choice = _tool_choice(body.get("tool_choice"))
        if body.get("parallel_tool_calls") is False:
            choice = choice or {"type": "auto"}
            if choice["type"] != "none":
                choice["disable_parallel_tool_use"] = True
        if choice:
            out["tool_choice"] = choice


# --- structured output: response_format as a forced tool ------------------------------------------

# The tool an Anthropic target is made to call when the client asked for JSON: its input is the
# answer (the tool's schema is the client's), and the way back makes it the message's content.
JSON_TOOL = "json_answer"


def json_tool_of(body: Json) -> str | None:
    """``JSON_TOOL`` when the request asked for JSON output, so the answer's tool call is read back
    as its content. ``body`` is the client's: chat (``response_format``) or Responses
    (``text.format``), which reaches the Anthropic adapter through its chat translation."""
    fmt = body.get("response_format")
    if not isinstance(fmt, dict):
        text = body.get("text")
        fmt = text.get("format") if isinstance(text, dict) else None
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    return JSON_TOOL if kind in ("json_schema", "json_object") else None


def _json_tool(fmt: Any, has_tools: bool) -> Json | None:
    """The forced tool that carries a ``json_schema`` or ``json_object`` answer (Anthropic has no
    response_format; other gateways do the same), or None for text."""
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind in (None, "text"):
        return None
    if kind not in ("json_schema", "json_object"):
        raise TranslationError("response_format.type", f"response_format type {kind!r} has no Anthropic "
                               "equivalent; use text, json_object or json_schema")
    if has_tools:
        raise TranslationError("response_format", "response_format together with tools has no Anthropic "
                               "equivalent (the answer is sent as a forced tool call); send one of the two, "
                               "or route to an OpenAI-compatible target")
    spec = fmt.get("json_schema") if kind == "json_schema" else None
    schema = (spec or {}).get("schema") if isinstance(spec, dict) else None
    if schema is None:
        schema = {"type": "object"}
    elif not isinstance(schema, dict) or schema.get("type") != "object":
        raise TranslationError("response_format.json_schema.schema", "an Anthropic target takes a JSON schema "
                               "whose top level is an object; wrap the value in an object property")
    description = "Answer by calling this tool: its input is the whole answer, as JSON."
    if isinstance(spec, dict) and isinstance(spec.get("description"), str):
        description += " " + spec["description"]
    return {"name": JSON_TOOL, "description": description, "input_schema": schema}


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
            raise TranslationError(where, f"only text {unit} can be translated here; send text")
        texts.append(part.get("text") or "")
    return "\n\n".join(t for t in texts if t)


def _add_turn(turns: list[Json], role: str, content: str | list[Json]) -> None:
    """Append a turn, merging into the previous one of the same role: Anthropic wants
    strictly alternating roles, OpenAI does not (tool results, then a user note). A merged turn's
    list is this translation's own, so it grows in place: copying it at each merge made 40,000
    one-line messages quadratic, and the event loop stood still for seconds."""
    if not content:
        return
    if turns and turns[-1]["role"] == role:
        previous = turns[-1]["content"]
        if isinstance(previous, str):
            previous = turns[-1]["content"] = _as_blocks(previous)
        previous.extend(_as_blocks(content))
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
            raise TranslationError(f"messages[{i}].content", f"content part {kind!r} has no Anthropic "
                                   "equivalent; send text or image_url parts")
    return blocks


def _image_block(url: str, i: int) -> Json:
    if url.startswith("data:"):
        header, comma, data = url[5:].partition(",")
        media_type, _, params = header.partition(";")
        if not comma or "base64" not in params.split(";"):
            raise TranslationError(f"messages[{i}].content", "an image data URL must be base64-encoded "
                                   "(data:image/png;base64,...)")
        return {
            "type": "image",
            "source": {"type": "base64", "media_type": media_type, "data": data},
        }
    if url.startswith(("http://", "https://")):
        return {"type": "image", "source": {"type": "url", "url": url}}
    raise TranslationError(f"messages[{i}].content", "image_url must be a data: or http(s) URL")


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
        raise TranslationError(f"tools[{i}].type", "only function tools have an Anthropic equivalent; "
                               "leave this tool out")
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
    raise TranslationError("tool_choice", f"tool_choice {choice!r} has no Anthropic equivalent; use auto, "
                           "none, required or a function")
