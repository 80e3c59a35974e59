"""Upstream streams to usage: taps that count passthrough streams already in the client's shape.

A passthrough stream still has to be counted, so these sit where a translator
would (``lease.translator``) and return the bytes they are fed, whole events at
a time. They only look inside an event when its block holds a usage object,
which in practice is the last event or two of a stream: a regex search over
each block is the whole cost of the common case. What is not the answer (SSE
comments' text, ``id:`` and ``retry:`` lines) is taken out (``passthrough.answer_lines``).

A key is looked for with ``block.find(key) >= 0``, not ``key in block``: on bytes, ``in`` first
tries the key as an integer and raises and drops a TypeError (CPython 3.11), which cost more than
the search itself (about 1,100 instructions of 2,800 on a 200-byte event, callgrind).

``OpenAIUsageTap`` also removes the usage-only chunk that firstbyte asked for
(``stream_options.include_usage``) when the client itself did not ask for it,
so such a client sees the stream it would have had without firstbyte.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import orjson

from ..bounds import MAX_CHUNK_DEPTH, MAX_EVENT_CONTAINERS, containers_past
from ..errors import StreamError
from .anthropic_to_chat import AnthropicStreamError
from .chat_to_messages import OpenAIStreamError
from .chat_to_messages import error_event as anthropic_error_event
from .chunk_types import (
    DEEP_BYTES,
    MANY_BYTES,
    RELAYED_SUSPECT,
    SUSPECT,
    TEXT_SUSPECT,
    TOO_DEEP,
    chunk_problem,
    nested_too_deep,
    text_problem,
    too_many,
)
from .first_token import error_of
from .passthrough import answer_lines
from .sse import (
    INVALID_STREAM,
    WRONG_TYPES,
    EventFramer,
    data_frame,
    data_of,
    event_around,
    json_object,
    openai_error_event,
    split_events,
)
from .tokens import token_count
from .usage import usage_from_anthropic, usage_from_chat

__all__ = ["AnthropicUsageTap", "OpenAIUsageTap", "raise_on_deep", "raise_on_many"]

_USAGE_OBJECT = re.compile(rb'"usage"\s*:\s*\{')


def _usage_objects(block: bytes) -> list[int]:
    """Where ``"usage": {`` objects start, in order; ``"usage": null`` is passed over.

    Searched from the end, where the usage chunk is (it comes last, before
    ``[DONE]``): a C-speed ``rfind`` per ``"usage"`` key instead of a regex over
    the block."""
    found: list[int] = []
    at = block.rfind(b'"usage"')
    while at >= 0:
        if _USAGE_OBJECT.match(block, at):
            found.append(at)
        at = block.rfind(b'"usage"', 0, at)
    found.reverse()
    return found


# A finish_reason that ends a choice; OpenRouter's "error" ends it in failure (as first_token.py reads it).
_FINISHED = re.compile(rb'"finish_reason"\s*:\s*"(?!error")')
DONE_TAIL = 32  # the [DONE] event is the block's last event when it is there: look at the tail only


class OpenAIUsageTap:
    """Count an OpenAI-shape stream's usage; drop the usage-only chunk unless it was asked for."""

    def __init__(self, keep_usage_chunk: bool) -> None:
        self.keep = keep_usage_chunk
        self.usage: dict[str, int] | None = None
        self.done = False
        self._finished = False  # a choice has said its finish_reason: the answer is whole without [DONE]
        self._framer = EventFramer()

    def feed(self, data: bytes) -> bytes:
        framer = self._framer
        # The common case: a read that ends on an event boundary, with nothing held back and no CR (a lone
        # one ends a line for the client: the framer makes it an LF). ``13 in``: an int is a memchr, where a
        # bytes key first raised and dropped a TypeError (module docstring).
        whole = not framer.pending and data.endswith(b"\n\n") and 13 not in data
        if whole and data.startswith(b"data: {") and data.find(b"\n", 0, -2) < 0:
            # One event of one JSON data line, a paced stream's every read: not [DONE] and nothing to
            # take out, seen without answer_lines' regex or the [DONE] search (~5k instructions a read).
            block = data
        else:
            block = answer_lines(data if whole else framer.complete(data))  # no comment's text, no id: line
            if block.find(b"[DONE]", -DONE_TAIL) >= 0:
                self.done = True
        if len(block) > MANY_BYTES:  # before anything below parses an event; shorter is cleared by this comparison
            raise_on_many(block, OpenAIStreamError)
        if not self.done and not self._finished and _FINISHED.search(block) is not None:
            self._finished = True
        if block.find(b'"error"') >= 0:  # an answer's text cannot hold it: its quotes are escaped
            _raise_on_error_envelope(block)
        if RELAYED_SUSPECT.search(block) is not None:  # a field of another type, maybe: parsed only then
            _raise_on_wrong(block, SUSPECT, chunk_problem, OpenAIStreamError)
        if len(block) >= DEEP_BYTES:  # shorter cannot nest too deep: a paced stream's read pays one comparison
            raise_on_deep(block, OpenAIStreamError)
        if block.find(b'"usage"') < 0:
            return block
        found = _usage_objects(block)
        if not found:
            return block
        # Look only at the events that hold a usage object, not at every event of the block.
        out, cut = [], 0
        for at in found:
            start, end = event_around(block, at)
            if start < cut:
                continue  # a second usage object inside an event already looked at
            instead = self._count(block[start:end])
            if instead is not None:
                out.append(block[cut:start])
                out.append(instead)
                cut = end
        if cut:
            out.append(block[cut:])
            block = b"".join(out)
        return block

    def finish(self) -> bytes:
        """The upstream's body ended without ``[DONE]``. The answer is whole when a choice has said
        its ``finish_reason`` (some OpenAI-compatible servers end so: TGI before 2.2, mistral.rs,
        llama-box, text-generation-webui had releases without ``[DONE]``); else it is a cut, which
        the relay tells the client and counts (it stays not ``done``)."""
        rest = answer_lines(self._framer.rest())
        self.done = self._finished or _FINISHED.search(rest) is not None
        return rest

    def error_event(self, message: str) -> bytes:
        return openai_error_event(message)

    def _count(self, event: bytes) -> bytes | None:
        """Record the event's usage; what the client gets instead of the event when it did not ask
        for usage (``b""``: nothing), or None to pass it as it is.

        The usage chunk is dropped whether its ``choices`` is empty (OpenAI) or holds choices that
        say nothing (LiteLLM's ``[{"index": 0, "delta": {}}]``); usage riding on a chunk that says
        something is cut from it, and the rest goes on."""
        chunk = json_object(event)
        usage = chunk.get("usage") if chunk is not None else None
        if chunk is None or not isinstance(usage, dict):
            return None
        self.usage = usage_from_chat(usage)
        if self.keep:
            return None
        choices = chunk.get("choices")
        if not isinstance(choices, list) or all(_says_nothing(choice) for choice in choices):
            return b""
        del chunk["usage"]
        return data_frame(chunk)


def _says_nothing(choice: object) -> bool:
    """A choice with no delta content, no finish_reason and no logprobs."""
    if not isinstance(choice, dict):
        return True
    delta = choice.get("delta")
    return not choice.get("finish_reason") and not choice.get("logprobs") and not (
        isinstance(delta, dict) and any(delta.values()))


def _raise_on_error_envelope(block: bytes) -> None:
    """An error envelope after the first token ends the stream with our own error event (and
    counts against the target) instead of passing as if it were part of the answer."""
    events = split_events(block)
    for i, event in enumerate(events):
        if event.find(b'"error"') < 0:
            continue
        payload = json_object(event)
        error = error_of(payload) if payload is not None else None
        if error is not None:
            _, kind, message = error
            exc = OpenAIStreamError(message, kind)
            exc.partial = b"".join(events[:i])
            raise exc


def _raise_on_wrong(block: bytes, suspect: re.Pattern[bytes], judge: Callable[[dict[str, Any]], str | None],
                    error: type[OpenAIStreamError] | type[AnthropicStreamError]) -> None:
    """A field of the wrong type after the first token (``"choices": "oops"``, an Anthropic ``"text":
    5``) ends the stream with our own error event, as a translator's would: a client SDK cannot read
    it (docs/apis.md). Only an event ``suspect`` finds is parsed and judged; one that orjson cannot
    read (nested past 1,024 levels, a number past a double) would break the client's parser the same
    way (the openai SDK raised ``RecursionError``), so it ends the stream too."""
    def wrong(data: bytes, payload: Any) -> str:
        problem = judge(payload) if type(payload) is dict else None
        return f"{WRONG_TYPES} ({problem})" if problem is not None else ""

    _raise_at(block, lambda event: suspect.search(event) is not None, wrong, error)


def raise_on_deep(block: bytes, error: type[StreamError]) -> None:
    """An event nested past what a client's parser reads ends the stream, well typed or not: no type
    search finds ``"content":"x","x":[[[...]]]``, and the openai SDK raised ``RecursionError`` in the
    application. Such an event is DEEP_BYTES long or more: from each event's start, the last blank line
    within DEEP_BYTES (one ``rfind`` in C) says every event up to it is shorter, and the next look
    starts after it, so a read of ordinary events is cleared in a few looks per kilobyte. Only an event
    with no blank line within DEEP_BYTES of its start is looked at: its events split, and one long
    enough, with brackets enough, parsed (C) and its depth read from its bytes (``nested_too_deep``: no
    Python walk of its containers); one orjson cannot read ends the stream as before."""
    if not _may_hold_longer(block, DEEP_BYTES):
        return
    _raise_at(block, lambda event: len(event) >= DEEP_BYTES and event.count(b"[") + event.count(b"{") > MAX_CHUNK_DEPTH,
              lambda data, payload: TOO_DEEP if nested_too_deep(data) else "", error)


def raise_on_many(block: bytes, error: type[StreamError], limit: int = MAX_EVENT_CONTAINERS) -> None:
    """An event with more objects and arrays than ``limit`` ends the stream unparsed, as one nested too deep
    does: orjson held the loop ~0.5 s building 5M empty arrays (one 15 MB event), per event. Called before
    anything parses the block's events. Only an event longer than twice ``limit`` can be one; found as
    ``raise_on_deep`` finds long events, then counted from its bytes (``bounds.containers_past``), the whole
    event's: after ``answer_lines`` its other lines (``data:``, a plain ``event:`` name) hold no bracket or
    quote, so the count is its data's, without copying the data out (15 MB: 16 ms)."""
    reach = 2 * limit
    if not _may_hold_longer(block, reach):
        return
    events = split_events(block)
    for i, event in enumerate(events):
        if len(event) > reach and (many := containers_past(event, limit)):
            exc = error(too_many(many, limit), INVALID_STREAM)
            exc.partial = b"".join(events[:i])
            raise exc


def _may_hold_longer(block: bytes, reach: int) -> bool:
    """May ``block`` (whole events) hold an event ``reach`` bytes long or more? From each event's start, the
    last blank line within ``reach`` (one ``rfind`` in C) says every event up to it is shorter, and the next
    look starts after it."""
    start, end = 0, len(block)
    while end - start >= reach:
        found = block.rfind(b"\n\n", start, start + reach)
        if found < 0 and (found := block.rfind(b"\n\r\n", start, start + reach)) < 0:
            return True  # an event this long, maybe
        start = found + 2
    return False


def _raise_at(block: bytes, picked: Callable[[bytes], bool], verdict: Callable[[bytes, Any], str],
              error: type[StreamError]) -> None:
    """The first event ``picked`` whose data orjson cannot read, or whose ``verdict`` (on its data's bytes
    and what they parse to) says what is wrong with it, ends the stream: raised with the events before
    it (``partial``)."""
    events = split_events(block)
    for i, event in enumerate(events):
        if not picked(event):
            continue
        data = data_of(event)
        try:
            payload = orjson.loads(data)
        except orjson.JSONDecodeError as unread:
            message = f"an upstream event could not be read as JSON ({unread})"
        else:
            message = verdict(data, payload)
        if message:
            exc = error(message, INVALID_STREAM)
            exc.partial = b"".join(events[:i])
            raise exc


class AnthropicUsageTap:
    """Count an Anthropic stream relayed as it is (``/v1/messages`` to an Anthropic target).

    Usage arrives in ``message_start`` and cumulatively in ``message_delta``. An
    ``error`` event raises :class:`AnthropicStreamError`, so the relay ends the
    stream with its own error event and counts the failure against the target.
    """

    def __init__(self) -> None:
        self.usage: dict[str, int] | None = None
        self.done = False
        self._framer = EventFramer()
        self._upstream: dict[str, int] = {}

    def feed(self, data: bytes) -> bytes:
        framer = self._framer  # a read that ends on an event boundary, without a CR, needs no framing (two rfinds)
        whole = not framer.pending and data.endswith(b"\n\n") and 13 not in data
        block = answer_lines(data if whole else framer.complete(data), True)
        if block.find(b'"message_stop"') >= 0:
            self.done = True
        if len(block) > MANY_BYTES:
            raise_on_many(block, AnthropicStreamError)
        if TEXT_SUSPECT.search(block) is not None:  # a text that is not a string, maybe: parsed only then
            _raise_on_wrong(block, TEXT_SUSPECT, text_problem, AnthropicStreamError)
        if len(block) >= DEEP_BYTES:
            raise_on_deep(block, AnthropicStreamError)
        if block.find(b'"error"') < 0 and (block.find(b'"usage"') < 0 or _USAGE_OBJECT.search(block) is None):
            return block  # (the literal first: a find costs less than the regex's fixed cost, every event)
        events = split_events(block)
        for i, event in enumerate(events):
            if event.find(b'"usage"') >= 0 or event.find(b'"error"') >= 0:
                try:
                    self._inspect(event)
                except AnthropicStreamError as exc:
                    exc.partial = b"".join(events[:i])
                    raise
        return block

    def finish(self) -> bytes:
        return answer_lines(self._framer.rest(), True)

    def error_event(self, message: str) -> bytes:
        """The relay's closing event for a failed stream, in Anthropic's shape."""
        return anthropic_error_event(message)

    def _inspect(self, event: bytes) -> None:
        payload = json_object(event)
        if payload is None:
            return
        if payload.get("type") == "error":
            error = payload.get("error")
            error = error if isinstance(error, dict) else {"message": error}
            message, kind = error.get("message"), error.get("type")
            raise AnthropicStreamError(message if isinstance(message, str) and message else "Anthropic stream error",
                                       kind if isinstance(kind, str) and kind else "api_error")
        usage = payload.get("usage")
        message = payload.get("message")
        if not usage and isinstance(message, dict):
            usage = message.get("usage")
        if isinstance(usage, dict):
            self._upstream.update({k: token_count(v) for k, v in usage.items() if isinstance(v, int | str)})
            self.usage = usage_from_anthropic(self._upstream)
