"""What a stream relayed as it is may carry: its answer lines, and nothing an upstream put beside them.

A passthrough stream (OpenAI to OpenAI-compatible, Anthropic to Anthropic, a provider's own Responses
stream) goes to the client as the upstream wrote it, less what is not its answer: SSE comments' text,
``id:`` and ``retry:`` lines, an ``event:`` name no API uses (docs/apis.md). The taps
(``usage_taps.py``, ``responses_via_chat.py``) call ``answer_lines`` on every block.
"""

from __future__ import annotations

import re

from ..bounds import MAX_EVENT_CONTAINERS, containers_past
from .sse import json_object, split_events

__all__ = ["KEEP_ALIVE", "answer_lines"]

# A line of a block that is neither a ``data`` line nor an ``event`` line of a plain name, nor blank
# (searched from each newline: the block's first line is looked at apart). The APIs' event names are
# lower case words joined by ``_`` and ``.`` (``content_block_delta``, ``response.output_text.delta``);
# any other name is an upstream's own, which may carry anything (a key has capitals or digits).
_ASIDE = re.compile(rb"\n(?!data[:\r\n]|event: ?[a-z_.]{1,64}\r?(?:\n|\Z)|\r?\n|\Z)")
_PLAIN_EVENT = re.compile(rb"event: ?[a-z_.]{1,64}\r?(?:\n|\Z)")
KEEP_ALIVE = b":\n\n"


def _answer_line(line: bytes) -> bool:
    """A ``data`` line, an ``event`` line of a plain name, or a blank one (``\r`` left by a CRLF)."""
    return (line.startswith(b"data:") or line.rstrip(b"\r") in (b"", b"data")
            or _PLAIN_EVENT.match(line) is not None)


_PLAIN_SEEN: dict[bytes, bool] = {}  # an event line's verdict: a stream repeats a handful of names
_PLAIN_SEEN_MAX = 256


def _one_event(block: bytes) -> bool:
    """``block`` is one event of a ``data`` line, after an ``event`` line of a plain name or not,
    and its blank line (``data: {...}\\n\\n``): what a token-paced stream sends in every read.
    Then ``answer_lines`` has nothing to take out, found with two byte searches and no regex (the
    regexes' fixed cost is about 1.4k instructions a search: a paced stream pays it every event)."""
    end = len(block) - 2
    first = block.find(b"\n")
    if first == end:
        return block[-1] == 10 and block.startswith(b"data:")
    if first < 0 or block.find(b"\n", first + 1) != end or block[-1] != 10 or not block.startswith(b"data:", first + 1):
        return False
    line = block[:first]
    plain = _PLAIN_SEEN.get(line)
    if plain is None:
        plain = _PLAIN_EVENT.match(line) is not None
        if len(_PLAIN_SEEN) < _PLAIN_SEEN_MAX:
            _PLAIN_SEEN[line] = plain
    return plain


_PLAIN_NAME = re.compile(r"[a-z_.]{1,64}")


def _named_by_type(event: bytes, lines: list[bytes]) -> list[bytes]:
    """``lines`` of an event whose ``event:`` name was dropped (no API uses it), named by its data's
    ``type`` when that is a plain name: Anthropic names every event by its type, and its SDK reads an
    event by its name, ignoring one without (a ``content_block_delta`` under ``event: X-SECRET`` lost
    its text silently). Only a block that had an odd name comes here."""
    if not (event.startswith(b"event:") or event.find(b"\nevent:") >= 0) or any(
            line.startswith(b"event:") for line in lines):
        return lines
    payload = json_object(event) if not containers_past(event, MAX_EVENT_CONTAINERS) else None  # usage_taps ends it
    kind = payload.get("type") if payload is not None else None
    if not isinstance(kind, str) or _PLAIN_NAME.fullmatch(kind) is None:
        return lines
    return [b"event: " + kind.encode(), *lines]


def answer_lines(block: bytes, by_type: bool = False) -> bytes:
    """``block`` with only what a client reads as the answer: ``data`` and ``event`` lines.

    A passthrough stream is otherwise relayed as it is, and an upstream's SSE comments
    (``: ...``), ``id:`` and ``retry:`` lines are not its answer: they may carry anything, the
    key it was sent included, and no client of an LLM API needs them; nor is an ``event:`` name that
    no API uses. A comment's text is cut (an event that was only comments becomes a bare ``:``, so
    a keep-alive still keeps the connection alive); any other line is dropped. Costs a search per
    block when there is none. ``by_type`` (an Anthropic stream): an event whose name was dropped is
    named by its data's ``type`` instead (``_named_by_type``)."""
    if not block or _one_event(block) or ((block.startswith(b"data:") or _PLAIN_EVENT.match(block) is not None)
                                          and _ASIDE.search(block) is None):
        return block
    out = []
    for event in split_events(block):
        lines = [line for line in event.split(b"\n") if _answer_line(line)]
        if by_type:
            lines = _named_by_type(event, lines)
        if any(line.startswith((b"data", b"event:")) for line in lines):
            out.append(b"\n".join(lines))  # its blank lines kept: it ends as it ended
        elif event.lstrip().startswith(b":"):
            out.append(KEEP_ALIVE)
    return b"".join(out)
