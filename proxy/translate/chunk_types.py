"""Whether an OpenAI chat (or completions) stream chunk has the types its API gives its fields.

A client SDK reads ``choices`` as a list, ``delta`` as an object and its text fields as strings; a
chunk that says otherwise (``"choices": "oops"``, ``"content": 5``) breaks it, or, translated to
``/v1/messages``, becomes an Anthropic event of the wrong types (``"text": 5``). Read before the first
token by the gate (a failover: ``first_token.py``), after it by the passthrough tap and the
translators (the stream ends with an error event), per docs/DESIGN.md's failure rules.

``SUSPECT`` finds, without parsing, a block that may hold such a chunk: one of those keys followed
by a value of another kind (not a list, an object, a string or null as the key wants). Quotes inside
a JSON string are escaped, so answer text cannot match it; a match is only a reason to parse the
event and ask :func:`chunk_problem`, which decides. It cost 3.2 µs a chunk against the passthrough tap's
whole 7.0 (a loaded 2-core box, process time), so a passthrough stream after its first token is searched
with ``RELAYED_SUSPECT`` only, which has a literal start (a C-speed scan) and finds what client SDKs
trip on first, ``choices`` that is not a list and ``content`` that is not a string: 1.2 µs (a 64 KB read
of 256 chunks: 154 µs of the tap's 393). Two searches of one literal each cost the same; an alternation
without a literal start, 5x more.
"""

from __future__ import annotations

import re
from typing import Any

from ..bounds import MAX_CHUNK_DEPTH, MAX_EVENT_CONTAINERS, json_deeper_than

__all__ = ["DEEP_BYTES", "MANY_BYTES", "RELAYED_SUSPECT", "SUSPECT", "TEXT_SUSPECT", "TOO_DEEP", "chunk_problem",
           "nested_too_deep", "text_problem", "too_many"]

# Spelt by each key's first letter: a quote is then let go after one look at the next byte, where a
# group of alternatives was tried one by one at every quote (the gate's search of a first event:
# 17k instructions, 12k so).
SUSPECT = re.compile(rb'"(?:c(?:hoices"\s*:\s*(?:[^\[\sn]|\[\s*[^{\]\s])|ontent"\s*:\s*[^"\sn\[])'
                     rb'|t(?:ool_calls"\s*:\s*[^\[\sn]|ext"\s*:\s*[^"\sn\[])'
                     rb'|delta"\s*:\s*[^{\sn]'
                     rb'|r(?:ole|efusal|easoning_content)"\s*:\s*[^"\sn\[]'
                     rb'|finish_reason"\s*:\s*[^"\sn\[])')

RELAYED_SUSPECT = re.compile(rb'"c(?:ontent"\s*:\s*[^"\sn\[]|hoices"\s*:\s*[^\[\sn])')

# An Anthropic event whose ``text`` may not be a string (``"type":"text"`` is followed by no colon): a literal
# start, so a passthrough Anthropic stream is searched with it after its first token at C speed.
TEXT_SUSPECT = re.compile(rb'"text"\s*:\s*[^"\s]')

# An event's JSON nested past what a client's parser reads (bounds.py): told so, in words a person can act on.
TOO_DEEP = (f"an upstream event nests its JSON more than {MAX_CHUNK_DEPTH} levels deep, past what a client's "
            f"parser reads")
DEEP_BYTES = 2 * MAX_CHUNK_DEPTH  # a level takes a bracket to open and one to close: shorter cannot be too deep


def nested_too_deep(raw: bytes) -> bool:
    """Does ``raw``, an event's JSON data, nest past ``MAX_CHUNK_DEPTH``? Its length and two C-speed bracket
    counts answer for nearly every event; only one with that many brackets is read, from its bytes
    (``json_deeper_than``: its cost follows the bytes, where walking the parsed containers cost ~2 us each)."""
    return (len(raw) >= DEEP_BYTES and raw.count(b"[") + raw.count(b"{") > MAX_CHUNK_DEPTH
            and json_deeper_than(raw, MAX_CHUNK_DEPTH))

# An event's data holds more objects and arrays than MAX_EVENT_CONTAINERS only when it is longer than this
# (a container takes two bytes): a read shorter than it is cleared with one comparison.
MANY_BYTES = 2 * MAX_EVENT_CONTAINERS


def too_many(count: int, limit: int = MAX_EVENT_CONTAINERS) -> str:
    """An event with more objects and arrays than ``limit`` (``bounds.containers_past``), in words a person
    can act on: ended unparsed, as an event nested too deep is."""
    usual = " (a real one holds a few hundred)" if limit == MAX_EVENT_CONTAINERS else ""
    return (f"an upstream event holds {count:,} JSON objects and arrays, more than the {limit:,} firstbyte reads "
            f"in one event{usual}")


_DELTA_TEXT = ("content", "role", "refusal", "reasoning_content")


def chunk_problem(chunk: dict[str, Any]) -> str | None:
    """What is wrongly typed in ``chunk``, in words a person can act on; None when nothing is.
    A chunk without ``choices`` (an error, a usage chunk) is not this function's to judge."""
    choices = chunk.get("choices")
    if choices is None:
        return None
    if type(choices) is not list:
        return f"choices is {_kind(choices)}, not a list"
    for choice in choices:
        if type(choice) is not dict:
            return f"a choice is {_kind(choice)}, not an object"
        delta = choice.get("delta")
        if delta is not None:
            if type(delta) is not dict:
                return f"delta is {_kind(delta)}, not an object"
            for key in _DELTA_TEXT:
                value = delta.get(key)
                if value is not None and type(value) is not str:
                    return f"delta.{key} is {_kind(value)}, not a string"
            calls = delta.get("tool_calls")
            if calls is not None and type(calls) is not list:
                return f"delta.tool_calls is {_kind(calls)}, not a list"
        for key in ("finish_reason", "text"):
            value = choice.get(key)
            if value is not None and type(value) is not str:
                return f"a choice's {key} is {_kind(value)}, not a string"
    return None


def text_problem(payload: dict[str, Any]) -> str | None:
    """An Anthropic text delta or text block whose text is not a string (the anthropic SDK joins the
    texts: ``"text": 5`` is its TypeError; translated, ``"content": 5``); None when there is none."""
    part = payload.get("delta") if payload.get("type") == "content_block_delta" else payload.get("content_block")
    if type(part) is dict and part.get("type") in ("text_delta", "text"):
        text = part.get("text")
        if text is not None and type(text) is not str:
            return f"{part['type']}.text is not a string"
    return None


def _kind(value: Any) -> str:
    """A JSON value's kind as the JSON spec names it (never Python's type names)."""
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    return "an object" if isinstance(value, dict) else "null"
