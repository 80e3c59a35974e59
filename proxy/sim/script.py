"""What the simulated model says: answers that behave like a model's for clients.

So an agent can be tried end to end with no key, the simulator honours what a
client asks of a model: it calls a tool when asked to (the last user message
names it) or when ``tool_choice`` forces one, with arguments built from the
tool's JSON schema; it answers in text after a tool result; it writes valid,
schema-shaped JSON for ``response_format``; and it keeps ``n``, ``stop`` and
``max_tokens``. ``/v1/messages`` and ``/v1/responses`` reach the simulator as
chat completions, so they get all of this too.

Pure: a request body in, a :class:`Script` (what each choice says, piece by
piece) out. ``simulator.py`` paces and frames it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import orjson

__all__ = ["Script", "ToolCall", "example_of", "needs_script", "script_for"]

Json = dict[str, Any]

# Body keys that make an answer more than the plain token run (the benchmarks' path).
_KEYS = frozenset({"tools", "tool_choice", "response_format", "n", "stop", "max_tokens",
                   "max_completion_tokens"})
MAX_N = 8
# A schema's own numbers are the client's: an answer built from them stays small whatever they say.
MAX_ITEMS = 16
MAX_TEXT = 1024
MAX_VALUES = 2000
MAX_EXACT = 2**53


@dataclass(slots=True)
class ToolCall:
    id: str
    name: str
    arguments: list[str]  # the JSON text in pieces, as a model streams it


@dataclass(slots=True)
class Choice:
    pieces: list[str] = field(default_factory=list)  # text, one token a piece
    calls: list[ToolCall] = field(default_factory=list)
    finish: str = "stop"

    @property
    def tokens(self) -> int:
        return len(self.pieces) + sum(len(c.arguments) for c in self.calls)


@dataclass(slots=True)
class Script:
    choices: list[Choice]

    @property
    def tokens(self) -> int:
        return sum(c.tokens for c in self.choices)


_LIMITS = frozenset({"max_tokens", "max_completion_tokens"})


def needs_script(body: Json, plain: int) -> bool:
    """True when the plain run of ``plain`` tokens would not honour the request. A budget it
    fits in (the benchmarks send ``max_tokens: 16`` for 16 tokens) keeps the plain path."""
    keys = _KEYS.intersection(body)
    if not keys:
        return _last_role(body) == "tool"
    if keys <= _LIMITS:
        limit = body.get("max_completion_tokens") or body.get("max_tokens")
        return (isinstance(limit, int) and limit < plain) or _last_role(body) == "tool"
    return True


def script_for(op: str, body: Json, words: list[str], seed: int = 0) -> Script:
    """What each of the ``n`` choices says to ``body``; ``words`` is the plain answer."""
    n = body.get("n")
    n = n if isinstance(n, int) and 1 <= n <= MAX_N else 1
    limit = body.get("max_completion_tokens") or body.get("max_tokens")
    limit = limit if isinstance(limit, int) and limit > 0 else None
    stops = body.get("stop")
    stops = [stops] if isinstance(stops, str) else [s for s in stops or [] if isinstance(s, str) and s]
    choices = []
    for i in range(n):
        choice = Choice()
        tool = _tool_to_call(body) if op == "chat" else None
        if tool is not None:
            name, schema = tool
            arguments = orjson.dumps(example_of(schema, schema)).decode()
            choice.calls.append(ToolCall(f"call_sim{seed:x}{i}", name, _split(arguments, len(words))))
            choice.finish = "tool_calls"
        else:
            text = _json_answer(body) if op == "chat" else None
            if text is not None:
                choice.pieces = _split(text, len(words))
            else:
                result = _tool_result(body) if op == "chat" else None
                choice.pieces = [f"{w} " for w in result.split()] if result is not None else list(words)
            _apply_stop(choice, stops)
        if limit is not None and choice.tokens > limit:
            choice.pieces = choice.pieces[:limit]
            for call in choice.calls:
                call.arguments = call.arguments[: max(0, limit - len(choice.pieces))]
            choice.finish = "length"
        choices.append(choice)
    return Script(choices)


def _last_role(body: Json) -> Any:
    messages = body.get("messages")
    if isinstance(messages, list) and messages and isinstance(messages[-1], dict):
        return messages[-1].get("role")
    return None


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(p.get("text") or "" for p in content if isinstance(p, dict))
    return ""


def _tools(body: Json) -> list[tuple[str, Json]]:
    out = []
    for tool in body.get("tools") or []:
        function = tool.get("function") if isinstance(tool, dict) else None
        if isinstance(function, dict) and isinstance(function.get("name"), str):
            schema = function.get("parameters")
            out.append((function["name"], schema if isinstance(schema, dict) else {"type": "object"}))
    return out


def _tool_to_call(body: Json) -> tuple[str, Json] | None:
    """The tool this turn calls: a forced one, else (unless ``none``) one the last user message
    names, or a word of whose name (of four letters or more) it says, but not right after a tool
    result (then the model answers)."""
    tools = _tools(body)
    if not tools:
        return None
    choice = body.get("tool_choice")
    if choice == "none":
        return None
    if isinstance(choice, dict):
        wanted = (choice.get("function") or {}).get("name")
        return next((t for t in tools if t[0] == wanted), None)
    if _last_role(body) == "tool" and choice != "required":
        return None
    asked = ""
    for message in reversed(body.get("messages") or []):
        if isinstance(message, dict) and message.get("role") == "user":
            asked = _text_of(message.get("content")).lower()
            break
    for name, schema in tools:
        if name.lower() in asked or name.lower().replace("_", " ") in asked:
            return name, schema
    words = set(re.findall(r"[a-z]{4,}", asked))
    for name, schema in tools:  # "weather in Oslo?" calls get_weather, as a model would
        if words & set(re.findall(r"[a-z]{4,}", name.lower())):
            return name, schema
    return tools[0] if choice == "required" else None


def _tool_result(body: Json) -> str | None:
    """After a tool result, the answer says what the tool returned."""
    if _last_role(body) != "tool":
        return None
    result = _text_of(body["messages"][-1].get("content")).strip()
    return f"The tool returned: {result[:400]}" if result else "The tool returned nothing."


def _json_answer(body: Json) -> str | None:
    fmt = body.get("response_format")
    if not isinstance(fmt, dict):
        return None
    if fmt.get("type") == "json_object":
        return orjson.dumps({"answer": "simulated"}).decode()
    if fmt.get("type") == "json_schema":
        schema = (fmt.get("json_schema") or {}).get("schema") or {"type": "object"}
        return orjson.dumps(example_of(schema, schema)).decode()
    return None


def _split(text: str, pieces: int) -> list[str]:
    """``text`` in about ``pieces`` parts (at least one), as a model streams it."""
    size = max(1, -(-len(text) // max(1, pieces)))
    return [text[i : i + size] for i in range(0, len(text), size)] or [""]


def _apply_stop(choice: Choice, stops: list[str]) -> None:
    """Cut the text at the first stop sequence (which is not part of the answer)."""
    if not stops:
        return
    text = "".join(choice.pieces)
    cut = min((i for s in stops if (i := text.find(s)) >= 0), default=-1)
    if cut < 0:
        return
    kept, size = [], 0
    for piece in choice.pieces:
        if size + len(piece) >= cut:
            if cut > size:
                kept.append(piece[: cut - size])
            break
        kept.append(piece)
        size += len(piece)
    choice.pieces = kept


_FORMATS = {"date": "2026-01-01", "date-time": "2026-01-01T00:00:00Z", "time": "00:00:00",
            "email": "sim@example.com", "uri": "https://example.com/", "uuid": "00000000-0000-4000-8000-000000000000"}


def example_of(schema: Any, root: Json, depth: int = 0) -> Any:
    """A value that satisfies ``schema`` (the JSON Schema subset tools and structured outputs use:
    types, properties, items, enum, const, $ref into $defs, anyOf/oneOf/allOf, bounds).

    The schema is the client's, checked only to be an object (``server/shapes.py``): a keyword of
    another type counts as absent, and the answer stays within ``MAX_VALUES`` values however the
    schema nests, repeats or refers to itself."""
    return _example(schema, root, depth, [MAX_VALUES])


def _example(schema: Any, root: Json, depth: int, left: list[int]) -> Any:
    left[0] -= 1
    if not isinstance(schema, dict) or depth > 12 or left[0] < 0:
        return None
    if "$ref" in schema:
        return _example(_resolve(schema["$ref"], root), root, depth + 1, left)
    for key in ("const", "default"):
        if key in schema:
            return schema[key]
    for key in ("enum", "examples"):
        if _list(schema.get(key)):
            return schema[key][0]
    for key in ("anyOf", "oneOf"):
        options = [o for o in _list(schema.get(key)) if isinstance(o, dict) and o.get("type") != "null"]
        if options:
            return _example(options[0], root, depth + 1, left)
    if _list(schema.get("allOf")):
        merged: Json = {}
        for part in schema["allOf"]:
            part = _resolve(part["$ref"], root) if isinstance(part, dict) and "$ref" in part else part
            if isinstance(part, dict):
                merged = {**merged, **part, "properties": {**_dict(merged.get("properties")),
                                                           **_dict(part.get("properties"))}}
        return _example(merged, root, depth + 1, left)
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind is None:
        kind = "object" if "properties" in schema else "string"
    if kind == "object":
        props = _dict(schema.get("properties"))
        return {name: _example(sub, root, depth + 1, left) for name, sub in props.items()}
    if kind == "array":
        count = min(max(1, _int(schema.get("minItems"))), MAX_ITEMS)
        return [_example(schema.get("items") or {}, root, depth + 1, left) for _ in range(count)]
    if kind in ("integer", "number"):
        return _number(schema, kind == "integer")
    if kind == "boolean":
        return True
    if kind == "null":
        return None
    fmt = schema.get("format")
    text = _FORMATS.get(fmt, "sim") if isinstance(fmt, str) else "sim"
    low, high = min(_int(schema.get("minLength")), MAX_TEXT), schema.get("maxLength")
    if len(text) < low:
        text += "x" * (low - len(text))
    if type(high) is int:
        text = text[:high]
    return text


def _number(schema: Json, integer: bool) -> int | float:
    value: float = 1
    low = _number_or_none(schema.get("minimum"))
    bound = _number_or_none(schema.get("exclusiveMinimum"))
    if low is None and bound is not None:
        low = bound + (1 if integer else 0.5)
    high = _number_or_none(schema.get("maximum"))
    bound = _number_or_none(schema.get("exclusiveMaximum"))
    if high is None and bound is not None:
        high = bound - (1 if integer else 0.5)
    if isinstance(low, int | float) and value < low:
        value = low
    if isinstance(high, int | float) and value > high:
        value = high
    # Within what JSON numbers carry exactly (a bound of 1e30 would make an integer no encoder writes).
    value = min(max(value, -MAX_EXACT), MAX_EXACT)
    # A whole number satisfies "number" too, and clients typed as integers parse it.
    return int(value) if integer or float(value).is_integer() else float(value)


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _dict(value: Any) -> Json:
    return value if isinstance(value, dict) else {}


def _int(value: Any) -> int:
    return value if type(value) is int else 0


def _number_or_none(value: Any) -> float | None:
    return value if type(value) in (int, float) else None


def _resolve(ref: Any, root: Json) -> Any:
    if not isinstance(ref, str) or not ref.startswith("#/"):
        return {}
    node: Any = root
    for part in ref[2:].split("/"):
        node = node.get(part) if isinstance(node, dict) else None
    return node or {}
