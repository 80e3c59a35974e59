"""Server-sent events: the one framing and parsing of every upstream stream firstbyte reads or writes.

Frames are written here (``data_frame`` for OpenAI's ``data:``-only events, ``event_frame`` for
Anthropic's and the Responses API's named ones). Frames are cut and read here too: where an event
ends (``event_end``, ``last_event_end``, ``event_around``, ``split_events``), what its fields say
(``fields``, ``data_of``: one optional space after the colon, as the SSE spec has it), a stream cut
into whole events whatever the read boundaries (``EventFramer``), and into ``(event, data)`` pairs
(``SseDecoder``). The first-token gates (``first_token.py``), the usage taps (``usage_taps.py``,
``responses_via_chat.py``) and the translators all read through these, so they cannot disagree. What a
stream relayed as it is may carry (``answer_lines``) is ``passthrough.py``.

A gate decodes a stream's opening events to find the first token; it hands them on as an
:class:`Opening`, so the translator after it does not decode them again (``opening_events``).
"""

from __future__ import annotations

import re
from typing import Any

import orjson

from ..bounds import MAX_EVENT_BYTES, MAX_EVENT_CONTAINERS, containers_past
from ..errors import StreamError, StreamTooLarge
from ..memory import trim
from .chunk_types import MANY_BYTES, chunk_problem, too_many

__all__ = ["BOM", "DONE", "INVALID_STREAM", "SHAPE_ERRORS", "WRONG_TYPES", "ChatChunkFeed", "EventFramer",
           "JsonEventFeed", "Opening", "SseDecoder", "data_frame", "data_of", "event_around",
           "event_end", "event_frame", "fields", "json_object", "last_event_end", "lone_crs", "openai_error_event",
           "opening_events", "split_events", "without_bom"]

Json = dict[str, Any]
Event = tuple[str | None, Any]  # (the event's name, its decoded data)

DONE = b"data: [DONE]\n\n"
BOM = b"\xef\xbb\xbf"  # UTF-8's byte-order mark: one at a stream's very start is not its text (WHATWG SSE)


def without_bom(head: bytes, data: bytes) -> tuple[bytes, bytes | None]:
    """A stream's start less one leading BOM, whatever reads it came in: ``head`` is what came before
    ``data`` and may begin one. Returns what to read on and, while the start may still be a BOM's first
    bytes, those (else None: decided). Only one is dropped, only at the start; an event line after it
    that began with one would be a field no client knows, as the spec has it. The first-token gate, the
    first reader of every stream, calls it until decided; readers after it never see a stream's start."""
    text = head + data if head else data
    if text.startswith(BOM):
        return text[3:], None
    if len(text) < 3 and BOM.startswith(text):
        return b"", text
    return text, None

# What a translator raises when an event has the right envelope but fields of the wrong types
# (``"tool_calls": 5``, ``"index": [1]``, ``"delta": "x"``): the upstream's fault, told as
# ``WRONG_TYPES`` (a person can act on it; Python's own words are no use to a client).
SHAPE_ERRORS = (TypeError, KeyError, ValueError, AttributeError, IndexError)
INVALID_STREAM = "invalid_stream"  # the type of a StreamError for an event that is not the API's
WRONG_TYPES = "an upstream event's fields have the wrong types for its API"


def data_frame(payload: Json) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"


def openai_error_event(message: str) -> bytes:
    """The relay's closing error event in OpenAI's stream shape."""
    err = {"error": {"message": message, "type": "upstream_error", "param": None, "code": "stream_interrupted"}}
    return data_frame(err)


def event_frame(kind: str, payload: Json) -> bytes:
    """A named event; ``payload`` carries its own ``type`` (both APIs repeat the name there)."""
    return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n"


# --- where events end -------------------------------------------------------------------------


def event_end(text: bytes | bytearray, pos: int) -> tuple[int, int]:
    """Where the next event ends (and how long its blank line is: 2 or 3), searching from ``pos``."""
    lf = text.find(b"\n\n", pos)
    crlf = text.find(b"\n\r\n", pos, lf if lf >= 0 else len(text))
    if crlf >= 0:
        return crlf, 3
    return lf, 2


def last_event_end(data: bytes) -> int:
    """Where the last blank line of ``data`` ends, or -1. rfind runs in C: this sees every read."""
    lf, crlf = data.rfind(b"\n\n"), data.rfind(b"\n\r\n")
    return max(lf + 2 if lf >= 0 else -1, crlf + 3 if crlf >= 0 else -1)


def split_events(block: bytes) -> list[bytes]:
    """Split complete events, each keeping its own terminator so they rejoin unchanged."""
    out: list[bytes] = []
    start = 0
    while (found := event_end(block, start))[0] >= 0:
        end = found[0] + found[1]
        out.append(block[start:end])
        start = end
    if start < len(block):
        out.append(block[start:])
    return out


def event_around(block: bytes, pos: int) -> tuple[int, int]:
    """The bounds of the complete event that holds ``pos`` (blocks end on an event boundary).

    Each search is bounded by the nearest boundary already found, so finding one
    event costs its own length, not the block's."""
    lf = block.rfind(b"\n\n", 0, pos)
    crlf = block.rfind(b"\n\r\n", max(lf, 0), pos)
    start = max(lf + 2 if lf >= 0 else 0, crlf + 3 if crlf >= 0 else 0)
    end, step = event_end(block, pos)
    return start, end + step if end >= 0 else len(block)


# --- what an event says -----------------------------------------------------------------------


def _value(line: bytes, at: int) -> bytes:
    """A field's value: after the colon at ``at``, less one space (the SSE spec's rule)."""
    return line[at + 2:] if line[at + 1:at + 2] == b" " else line[at + 1:]


def fields(event: bytes) -> tuple[str | None, bytes | None]:
    """An event's name and data (its data lines joined by newlines); data None when it has no
    ``data`` line (a comment or a keep-alive)."""
    name: str | None = None
    data: list[bytes] = []
    for line in event.split(b"\n"):
        if line.endswith(b"\r"):
            line = line[:-1]
        if line.startswith(b"data"):
            if line == b"data":
                data.append(b"")
            elif line[4:5] == b":":
                data.append(_value(line, 4))
        elif line.startswith(b"event:"):
            name = _value(line, 5).decode("utf-8", "replace")
    return name, b"\n".join(data) if data else None


def data_of(event: bytes) -> bytes:
    """The event's data (b"" without any); most events are one ``data:`` line, which needs no split."""
    if event.startswith(b"data:") and event.find(b"\n", 0, len(event) - 2) < 0:
        return _value(event.rstrip(b"\r\n"), 4)
    return fields(event)[1] or b""


def json_object(event: bytes) -> Json | None:
    """The event's data as a JSON object; None when it is not one (a taps' look needs no verdict)."""
    try:
        payload = orjson.loads(data_of(event))
    except orjson.JSONDecodeError:
        return None
    return payload if isinstance(payload, dict) else None


# --- streams of events ------------------------------------------------------------------------


# A CR that is not part of a CRLF: a line end of its own to an SSE client (the WHATWG spec's "CRLF, LF or
# CR"), not to firstbyte, which reads lines up to LF. One at the very end of a read waits for the next byte.
_LONE_CR = re.compile(rb"\r(?!\n|\Z)")


def lone_crs(data: bytes) -> bytes:
    """``data`` with each lone CR an LF: one not before an LF, nor its last byte (that waits for the next
    read, which may start with its LF). None: the same bytes back, for a regex search's cost."""
    return _LONE_CR.sub(b"\n", data)


class EventFramer:
    """Cut bytes into complete SSE events; an event cut by a read waits for its end.

    A pending event is held as a list of pieces, and a read searches only its own
    bytes (and the two held before them, where a boundary may begin), so an event
    that arrives over many reads costs its length once, not once per read. An
    event past ``MAX_EVENT_BYTES`` raises :class:`StreamTooLarge`, carrying the
    complete events before it (``partial``).

    A lone CR (one not before an LF) ends a line for an SSE client as an LF does: it becomes an LF
    here, so every reader after the framer (``answer_lines``, the taps, the translators) splits the
    lines the client will. Else ``data: {..}\\r: secret\\rid: x\\r\\r`` was one line to firstbyte's
    filter and a data line, a comment and an ``id:`` line to the client. A read without a CR pays one
    ``memchr``; one with CRLFs, a regex search (~2.7k instructions, a CRLF stream's event ~30k).
    """

    __slots__ = ("_size", "_tail", "pending")

    def __init__(self) -> None:
        # Truthy while an event waits for its end: read as is by a tap on every read (a property
        # was a Python call, ~1k instructions).
        self.pending: list[bytes] = []
        self._size = 0
        self._tail = b""  # the last two bytes held: a boundary may straddle two reads

    def complete(self, data: bytes) -> bytes:
        """The complete events ``data`` finishes (the prefix up to the last blank line). An empty ``data``
        is the body's end: a CR held for an LF that may follow ends its line then."""
        if 13 in data or (self.pending and self.pending[-1].endswith(b"\r")):  # an int: memchr, no TypeError
            data = self._lone_crs(data)
        if not self.pending:
            end = last_event_end(data)
            if end == len(data):
                return data
            if end < 0:
                self._hold(data)
                return b""
            self._hold(data[end:], data[:end])
            return data[:end]
        tail = self._tail
        end = last_event_end(tail + data)
        if end < 0:
            self._hold(data)
            return b""
        end -= len(tail)  # >= 1: what is held has no boundary, so this one ends inside data
        self.pending.append(data[:end])
        out = b"".join(self.pending)
        self.pending, self._size, self._tail = [], 0, b""
        if end < len(data):
            self._hold(data[end:], out)
        return out

    def _lone_crs(self, data: bytes) -> bytes:
        """``data`` with each lone CR an LF. A CR that ended the last read (always held: no event ends
        with it) is lone unless ``data`` starts with an LF."""
        if self.pending and self.pending[-1].endswith(b"\r") and not data.startswith(b"\n"):
            self.pending[-1] = self.pending[-1][:-1] + b"\n"
            self._tail = self._tail[:-1] + b"\n"
        return lone_crs(data)  # a regex search's cost, less than two counts' (a CRLF stream's every read)

    def _hold(self, piece: bytes, partial: bytes = b"") -> None:
        self.pending.append(piece)
        self._size += len(piece)
        self._tail = (self._tail + piece[-2:])[-2:]
        if self._size > MAX_EVENT_BYTES:
            self.pending, self._size, self._tail = [], 0, b""
            trim()  # the megabytes just dropped go back to the system, not to the heap's high-water mark
            raise StreamTooLarge(MAX_EVENT_BYTES, partial)

    def rest(self) -> bytes:
        rest = b"".join(self.pending)
        self.pending, self._size, self._tail = [], 0, b""
        return rest


class SseDecoder:
    """Cut a server-sent-events byte stream into ``(event, data)`` pairs, whatever the read
    boundaries (mid-line, mid-character, one byte at a time): :class:`EventFramer`, then
    :func:`fields`. An event past ``MAX_EVENT_BYTES`` raises :class:`StreamTooLarge`, after the
    complete events of the same read have been handed back."""

    __slots__ = ("_framer", "_over")

    def __init__(self) -> None:
        self._framer = EventFramer()
        self._over = False

    def feed(self, data: bytes) -> list[tuple[str | None, bytes]]:
        if self._over:
            raise StreamTooLarge(MAX_EVENT_BYTES)
        try:
            block = self._framer.complete(data)
        except StreamTooLarge as exc:
            self._over = True
            events = _decoded(exc.partial)
            if not events:
                raise
            return events
        return _decoded(block) if block else []


def _decoded(block: bytes) -> list[tuple[str | None, bytes]]:
    out = []
    for event in split_events(block):
        name, data = fields(event)
        if data is not None:
            out.append((name, data))
    return out


class Opening(bytes):
    """The bytes a first-token gate held until the commit, with the events it decoded on the way
    (``events``: each event's name and JSON payload, in order, covering ``data[:decoded]``)."""

    events: list[Event]
    decoded: int


def opened(held: bytes, events: list[Event], decoded: int) -> bytes:
    """``held`` as an :class:`Opening` when the gate decoded any of it, else as it is."""
    if not events:
        return held
    opening = Opening(held)
    opening.events, opening.decoded = events, decoded
    return opening


def opening_events(data: bytes) -> tuple[list[Event], bytes]:
    """What a translator still has to decode: the gate's events when ``data`` is its opening, and
    the bytes after them."""
    if type(data) is Opening:
        return data.events, data[data.decoded:]
    return [], data


class JsonEventFeed:
    """``feed`` for translators that read a stream of JSON events: the events the first-token gate
    decoded already (an :class:`Opening`), then each further event decoded once and handed to
    ``_on_event``; ``[DONE]`` to ``_on_done`` where the format has it. A broken event, or an error
    a handler raises, is ``stream_error`` carrying what was translated before it."""

    stream_error: type[StreamError] = StreamError
    malformed = "malformed stream event"
    ends_on_done = False  # OpenAI chat streams end with data: [DONE]
    done: bool
    _decoder: SseDecoder

    def feed(self, data: bytes) -> bytes:
        opening, data = opening_events(data)
        out = bytearray()
        try:
            try:
                for name, event in opening:
                    if self.done:
                        break
                    out += self._on_event(name, event)
                for name, raw in self._decoder.feed(data):
                    if self.done:
                        break
                    if self.ends_on_done and raw.strip() == b"[DONE]":
                        out += self._on_done()
                        continue
                    if len(raw) > MANY_BYTES and (many := containers_past(raw, MAX_EVENT_CONTAINERS)):
                        raise self.stream_error(too_many(many), INVALID_STREAM)  # unparsed: bounds.py
                    try:
                        event = orjson.loads(raw)
                    except orjson.JSONDecodeError as exc:
                        raise self.stream_error(f"{self.malformed}: {raw[:200]!r}", INVALID_STREAM) from exc
                    out += self._on_event(name, event)
            except SHAPE_ERRORS as exc:
                raise self.stream_error(WRONG_TYPES, INVALID_STREAM) from exc
        except self.stream_error as exc:
            exc.partial = bytes(out)
            raise
        return bytes(out)

    def _on_event(self, name: str | None, event: Any) -> bytes:
        raise NotImplementedError

    def _on_done(self) -> bytes:
        raise NotImplementedError


class ChatChunkFeed(JsonEventFeed):
    """A :class:`JsonEventFeed` over an OpenAI chat stream (``chat_to_messages``, ``chat_to_responses``):
    each chunk to ``_on_chunk``, ``[DONE]`` closes."""

    malformed = "malformed chat stream chunk"
    ends_on_done = True

    def _on_event(self, name: str | None, event: Any) -> bytes:
        problem = chunk_problem(event) if type(event) is dict else None
        if problem is not None:  # translated, ``"content": 5`` would be an event of the wrong types too
            raise self.stream_error(f"{WRONG_TYPES} ({problem})", INVALID_STREAM)
        return self._on_chunk(event)

    def _on_done(self) -> bytes:
        return self._start() + self._end()

    def _start(self) -> bytes:
        raise NotImplementedError

    def _end(self) -> bytes:
        raise NotImplementedError

    def _on_chunk(self, chunk: Json) -> bytes:
        raise NotImplementedError
