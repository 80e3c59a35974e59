"""The shape of each endpoint's body, checked at the edge before anything reads it.

The translators (``providers/``) and the simulator read client bodies as the APIs
define them: ``messages`` is a list of objects, a content part has a string ``type``,
``stop`` is a string or a list of strings. A body that breaks that must be refused
here, as a 400 ``invalid_request_error`` naming the field in ``param``
(``messages[0].content``), never found out deep inside a translator as a 500.

The table below (one entry per endpoint) lists every field firstbyte, a translator
or the simulator reads, with the shape they can handle. Fields it does not list go
upstream as they are: their meaning is the provider's to judge. A listed field
that is absent or ``null`` is fine (the APIs treat ``null`` as "not given") unless
it is :func:`required`. A union accepts each of its shapes by the JSON type of the
value, so checking costs one ``type()`` look-up per value, and the path of a wrong
value is built only when one is found.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["BODIES", "WrongShape", "check_body"]


class WrongShape(Exception):
    """A value that is not of its field's shape; ``path`` is filled in as the error rises."""

    def __init__(self, expected: str, value: Any, missing: bool = False) -> None:
        super().__init__(expected)
        self.expected = expected
        self.value = value
        self.missing = missing
        self.path: list[str | int] = []  # innermost first

    @property
    def param(self) -> str:
        """The field as OpenAI names it in ``param``: ``messages[0].content``."""
        out = ""
        for key in reversed(self.path):
            out += f"[{key}]" if isinstance(key, int) else (f".{key}" if out else key)
        return out

    def message(self) -> str:
        if self.missing:
            return f"Missing required parameter: '{self.param}'."
        return (f"Invalid type for '{self.param}': expected {self.expected}, "
                f"but got {_kind(self.value)} instead.")


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    return "an array" if isinstance(value, list) else "an object"


class Shape:
    """What a value must be: ``types`` are the JSON types (as Python types) it may have."""

    __slots__ = ("says", "types")

    def __init__(self, says: str, types: tuple[type, ...]) -> None:
        self.says = says
        self.types = types

    def check(self, value: Any) -> None:
        if type(value) not in self.types:
            raise WrongShape(self.says, value)


class ListOf(Shape):
    __slots__ = ("item",)

    def __init__(self, item: Shape, says: str | None = None) -> None:
        super().__init__(says or f"an array of {_plural(item.says)}", (list,))
        self.item = item

    def check(self, value: Any) -> None:
        if type(value) is not list:
            raise WrongShape(self.says, value)
        item = self.item
        if type(item) is Shape:  # a leaf: no call per item
            types = item.types
            for i, x in enumerate(value):
                if type(x) not in types:
                    exc = WrongShape(item.says, x)
                    exc.path.append(i)
                    raise exc
            return
        for i, x in enumerate(value):
            try:
                item.check(x)
            except WrongShape as exc:
                exc.path.append(i)
                raise


class Obj(Shape):
    """An object; ``fields`` are the keys firstbyte reads (others pass unchecked)."""

    __slots__ = ("fields", "required")

    def __init__(self, says: str, fields: Mapping[str, Shape], required: tuple[str, ...] = ()) -> None:
        super().__init__(says, (dict,))
        self.fields = dict(fields)
        self.required = required

    def check(self, value: Any) -> None:
        if type(value) is not dict:
            raise WrongShape(self.says, value)
        for key in self.required:
            if value.get(key) is None:
                exc = WrongShape(self.fields[key].says, value.get(key), missing=key not in value)
                exc.path.append(key)
                raise exc
        fields = self.fields
        for key, field in value.items():  # the body's keys, usually fewer than the table's
            shape = fields.get(key)
            if shape is None or field is None:
                continue
            if type(shape) is Shape:  # a leaf: no call
                if type(field) not in shape.types:
                    exc = WrongShape(shape.says, field)
                    exc.path.append(key)
                    raise exc
                continue
            try:
                shape.check(field)
            except WrongShape as exc:
                exc.path.append(key)
                raise


class OneOf(Shape):
    """A union of shapes of different JSON types, picked by the value's type."""

    __slots__ = ("by_type",)

    def __init__(self, *shapes: Shape, says: str | None = None) -> None:
        super().__init__(says or _either([s.says for s in shapes]), tuple(t for s in shapes for t in s.types))
        self.by_type = {t: s for s in shapes for t in s.types}

    def check(self, value: Any) -> None:
        shape = self.by_type.get(type(value))
        if shape is None:
            raise WrongShape(self.says, value)
        if type(shape) is not Shape:
            shape.check(value)


def _plural(says: str) -> str:
    for article in ("an ", "a "):
        if says.startswith(article):
            return says[len(article):] + "s"
    return says


def _either(says: list[str]) -> str:
    return says[0] if len(says) == 1 else ", ".join(says[:-1]) + " or " + says[-1]


STR = Shape("a string", (str,))
INT = Shape("an integer", (int,))  # type() is exact: a boolean is not an integer here
NUM = Shape("a number", (int, float))
BOOL = Shape("a boolean", (bool,))
ANY_OBJ = Shape("an object", (dict,))
NULL = Shape("null", (type(None),))
STRINGS = OneOf(STR, ListOf(STR))


# --- OpenAI chat completions -----------------------------------------------------------------

_IMAGE_URL = Obj("an object", {"url": STR, "detail": STR}, required=("url",))
_CHAT_PART = Obj("a content part object", {"type": STR, "text": STR, "image_url": OneOf(STR, _IMAGE_URL)})
_CHAT_CONTENT = OneOf(STR, ListOf(_CHAT_PART), says="a string or an array of content parts")
_FUNCTION_CALL = Obj("an object", {"name": STR, "arguments": OneOf(STR, ANY_OBJ)})
_TOOL_CALL = Obj("a tool call object", {"id": STR, "type": STR, "function": _FUNCTION_CALL})
_CHAT_MESSAGE = Obj("a message object", {"role": STR, "content": _CHAT_CONTENT, "tool_calls": ListOf(_TOOL_CALL),
                                         "tool_call_id": STR, "name": STR}, required=("role",))
_FUNCTION = Obj("an object", {"name": STR, "description": STR, "parameters": ANY_OBJ})
_CHAT_TOOL = Obj("a tool object", {"type": STR, "function": _FUNCTION})
_NAMED = Obj("an object", {"name": STR})
_CHAT_TOOL_CHOICE = OneOf(STR, Obj("an object", {"type": STR, "function": _NAMED}))
_JSON_SCHEMA = Obj("an object", {"name": STR, "schema": ANY_OBJ, "strict": BOOL, "description": STR})
_STREAM_OPTIONS = Obj("an object", {"include_usage": BOOL})
_COMMON = {"model": STR, "stream": BOOL, "stream_options": _STREAM_OPTIONS, "n": INT, "max_tokens": INT,
           "temperature": NUM, "top_p": NUM, "user": STR, "stop": STRINGS}

CHAT = Obj("a JSON object", {
    **_COMMON,
    "messages": ListOf(_CHAT_MESSAGE),
    "max_completion_tokens": INT,
    "tools": ListOf(_CHAT_TOOL),
    "tool_choice": _CHAT_TOOL_CHOICE,
    "parallel_tool_calls": BOOL,
    "response_format": Obj("an object", {"type": STR, "json_schema": _JSON_SCHEMA}),
}, required=("messages",))

# --- OpenAI completions and embeddings ---------------------------------------------------------

_TOKENS = ListOf(INT, "an array of integers")
_PROMPT = OneOf(STR, ListOf(OneOf(STR, _TOKENS), "an array of strings or token arrays"),
                says="a string, an array of strings or an array of token arrays")
COMPLETIONS = Obj("a JSON object", {**_COMMON, "prompt": _PROMPT})
EMBEDDINGS = Obj("a JSON object", {"model": STR, "input": _PROMPT}, required=("input",))

# --- Anthropic messages (and count_tokens) -----------------------------------------------------

_SOURCE = Obj("an object", {"type": STR, "media_type": STR, "data": STR, "url": STR})
_BLOCK = Obj("a content block object", {"type": STR, "text": STR, "source": _SOURCE, "id": STR, "name": STR,
                                        "input": ANY_OBJ, "tool_use_id": STR, "thinking": STR})
_BLOCKS = ListOf(_BLOCK)
_BLOCK.fields["content"] = OneOf(STR, _BLOCKS)  # a tool_result holds blocks of its own
_ANTHROPIC_CONTENT = OneOf(STR, _BLOCKS, says="a string or an array of content blocks")
_ANTHROPIC_MESSAGE = Obj("a message object", {"role": STR, "content": _ANTHROPIC_CONTENT}, required=("role",))
_ANTHROPIC_TOOL = Obj("a tool object", {"type": STR, "name": STR, "description": STR, "input_schema": ANY_OBJ})
_ANTHROPIC_TOOL_CHOICE = Obj("an object", {"type": STR, "name": STR, "disable_parallel_tool_use": BOOL})

MESSAGES = Obj("a JSON object", {
    "model": STR,
    "stream": BOOL,
    "max_tokens": INT,
    "system": _ANTHROPIC_CONTENT,
    "messages": ListOf(_ANTHROPIC_MESSAGE),
    "tools": ListOf(_ANTHROPIC_TOOL),
    "tool_choice": _ANTHROPIC_TOOL_CHOICE,
    "stop_sequences": ListOf(STR),
    "temperature": NUM,
    "top_p": NUM,
    "metadata": Obj("an object", {"user_id": STR}),
}, required=("messages",))

# --- OpenAI Responses --------------------------------------------------------------------------

_RESPONSES_PART = Obj("a content part object", {"type": STR, "text": STR, "image_url": STR, "detail": STR,
                                                "refusal": STR})
_RESPONSES_CONTENT = OneOf(STR, ListOf(_RESPONSES_PART), says="a string or an array of content parts")
_ITEM = Obj("an input item object", {"type": STR, "role": STR, "content": _RESPONSES_CONTENT, "call_id": STR,
                                     "name": STR, "namespace": STR, "arguments": STR, "output": _RESPONSES_CONTENT})
_RESPONSES_TOOL = Obj("a tool object", {"type": STR, "name": STR, "description": STR, "parameters": ANY_OBJ,
                                        "strict": BOOL})
_RESPONSES_TOOL.fields["tools"] = ListOf(_RESPONSES_TOOL)  # a namespace's functions
_FORMAT = Obj("an object", {"type": STR, "name": STR, "schema": ANY_OBJ, "strict": BOOL, "description": STR})

RESPONSES = Obj("a JSON object", {
    "model": STR,
    "stream": BOOL,
    "input": OneOf(STR, ListOf(_ITEM), says="a string or an array of input items"),
    "instructions": OneOf(STR, ListOf(ANY_OBJ), says="a string or an array of input items"),
    "tools": ListOf(_RESPONSES_TOOL),
    "tool_choice": OneOf(STR, Obj("an object", {"type": STR, "name": STR, "namespace": STR})),
    "parallel_tool_calls": BOOL,
    "max_output_tokens": INT,
    "temperature": NUM,
    "top_p": NUM,
    "user": STR,
    "safety_identifier": STR,
    "reasoning": Obj("an object", {"effort": STR, "summary": STR}),
    "text": Obj("an object", {"format": _FORMAT}),
    "truncation": STR,
    "metadata": ANY_OBJ,
})

# The operation (``Call.op``) -> the shape of its body.
BODIES: dict[str, Obj] = {"chat": CHAT, "completions": COMPLETIONS, "embeddings": EMBEDDINGS,
                          "messages": MESSAGES, "responses": RESPONSES}


def check_body(op: str, body: dict[str, Any]) -> None:
    """Raise :class:`WrongShape` (with its ``param``) when ``body`` breaks its endpoint's table."""
    shape = BODIES.get(op)
    if shape is not None:
        shape.check(body)
