"""Token counts as upstreams send them, made safe to add up, and the one estimate of a request's size.

An upstream's ``usage`` is its own JSON: a count may come as a string, a float,
null or a negative number. Every place that reads a count goes through
:func:`token_count`, so a strange one costs that count (it is unknown, 0) and
never the answer, its access-log line or its ledger row.

Where no upstream counts, :func:`estimate_tokens` estimates: characters / 4 of the request's text.
The context-window check and ``/v1/messages/count_tokens`` both use it, so one body has one size.
"""

from __future__ import annotations

from typing import Any

__all__ = ["CHARS_PER_TOKEN", "estimate_tokens", "says_context_overflow", "text_chars", "token_count"]

CHARS_PER_TOKEN = 4  # a deliberately rough estimate: only used against declared context windows
# Keys whose values are structure or binary payloads, not text a model reads as tokens.
_NOT_TEXT = frozenset({"type", "role", "id", "tool_use_id", "tool_call_id", "cache_control", "image_url",
                       "source", "input_audio", "file", "file_id", "detail", "media_type"})

# How providers word a prompt that does not fit (OpenAI, vLLM, Groq, Anthropic…), lower case: a 400
# saying one of these is failover-safe, since a target with a bigger window may take it.
OVERFLOW_MARKERS = (
    b"context_length_exceeded",
    b"maximum context length",
    b"context length",
    b"context window",
    b"too many tokens",
    b"prompt is too long",
    b"exceed context limit",
)
_MAX_DIGITS = 15  # more than any real count; bounds int() on a hostile string


def token_count(value: object) -> int:
    """A non-negative int count; a digit string is read as its number, anything else is 0."""
    if type(value) is int:
        return value if value >= 0 else 0
    if isinstance(value, str) and 0 < len(value) <= _MAX_DIGITS and value.isascii() and value.isdigit():
        return int(value)
    return 0


def says_context_overflow(text: bytes) -> bool:
    """Does an error's text (its first 4 KiB) say the prompt does not fit the context window?"""
    lowered = text[:4096].lower()
    return any(marker in lowered for marker in OVERFLOW_MARKERS)


def text_chars(value: Any) -> int:
    """Characters of text in a request part (messages, system, tools, input), structure and images
    (``_NOT_TEXT``) left out."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, list):
        return sum(text_chars(v) for v in value)
    if isinstance(value, dict):
        return sum(text_chars(v) for k, v in value.items() if k not in _NOT_TEXT)
    return 0


def estimate_tokens(*parts: Any) -> int:
    """The estimated input tokens of a request's text parts: characters / 4."""
    return sum(text_chars(part) for part in parts) // CHARS_PER_TOKEN
