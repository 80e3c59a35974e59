"""Token counts as upstreams send them, made safe to add up.

An upstream's ``usage`` is its own JSON: a count may come as a string, a float,
null or a negative number. Every place that reads a count goes through
:func:`token_count`, so a strange one costs that count (it is unknown, 0) and
never the answer, its access-log line or its ledger row.
"""

from __future__ import annotations

__all__ = ["says_context_overflow", "token_count"]

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
