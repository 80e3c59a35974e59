"""Token counts of one call, in one record whatever the answer's shape.

Usage comes from the answer the client got: a buffered body in the client's
shape (OpenAI's ``usage`` or, on ``/v1/messages``, Anthropic's), or the stream
translator that counted it on the way through. What the counts cost is
``routing/cost.py``'s.
"""

from __future__ import annotations

import re
from typing import Any

import orjson

from .tokens import token_count

__all__ = ["counted", "usage_from_anthropic", "usage_from_chat", "usage_from_responses",
           "usage_of_body"]

Usage = dict[str, int]

_USAGE = re.compile(rb'"usage"\s*:\s*\{')
WHOLE_BODY_LIMIT = 32 * 1024  # above this, decode only the usage object, not the whole answer


def usage_of_body(op: str, body: bytes) -> Usage | None:
    """OpenAI-shape counts (prompt, completion, total) from a buffered answer, if it has them."""
    if len(body) > WHOLE_BODY_LIMIT:
        usage = _last_usage_object(body)
    else:
        if _USAGE.search(body) is None:
            return None
        try:
            data = orjson.loads(body)
        except orjson.JSONDecodeError:
            return None
        usage = data.get("usage") if isinstance(data, dict) else None
    if not isinstance(usage, dict):
        return None
    if op == "messages":
        return usage_from_anthropic(usage)
    if op == "responses":
        return usage_from_responses(usage)
    return usage_from_chat(usage)


def counted(prompt: int, completion: int) -> Usage:
    """The one usage record the observers, the ledger and the price read, whatever the answer's shape."""
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def usage_from_chat(usage: dict[str, Any]) -> Usage:
    return counted(token_count(usage.get("prompt_tokens")), token_count(usage.get("completion_tokens")))


def usage_from_responses(usage: dict[str, Any]) -> Usage:
    """The Responses API counts input and output tokens (cached ones inside input)."""
    return counted(token_count(usage.get("input_tokens")), token_count(usage.get("output_tokens")))


def usage_from_anthropic(usage: Any) -> Usage:
    """Anthropic counts cache reads and writes apart from ``input_tokens``; OpenAI's
    ``prompt_tokens`` includes them, and so does the price of a call."""
    if not isinstance(usage, dict):  # an upstream's JSON: anything may stand here
        usage = {}
    prompt = (
        token_count(usage.get("input_tokens"))
        + token_count(usage.get("cache_creation_input_tokens"))
        + token_count(usage.get("cache_read_input_tokens"))
    )
    return counted(prompt, token_count(usage.get("output_tokens")))


def _last_usage_object(body: bytes) -> object:
    """The ``usage`` object of a large answer without decoding the whole answer.

    An unescaped ``"usage":{`` can only be a key (inside strings quotes are
    escaped), and providers put the top-level one last; its object is cut out by
    matching braces outside strings and decoded alone.
    """
    last = None
    for last in _USAGE.finditer(body):  # noqa: B007 - only the last match matters
        pass
    if last is None:
        return None
    start = last.end() - 1
    depth, in_string, escaped = 0, False, False
    for i in range(start, min(len(body), start + 4096)):
        c = body[i]
        if in_string:
            if escaped:
                escaped = False
            elif c == 0x5C:
                escaped = True
            elif c == 0x22:
                in_string = False
        elif c == 0x22:
            in_string = True
        elif c == 0x7B:
            depth += 1
        elif c == 0x7D:
            depth -= 1
            if depth == 0:
                try:
                    return orjson.loads(body[start : i + 1])
                except orjson.JSONDecodeError:
                    return None
    return None

