"""Server-sent events, the one framing and parsing every stream translator uses.

Frames are written here (``data_frame`` for OpenAI's ``data:``-only events,
``event_frame`` for Anthropic's and the Responses API's named ones), and read
here (``SseDecoder``, and ``ChatChunkFeed`` for translators that read an OpenAI
chat stream). An OpenAI stream relayed to an OpenAI client never comes through
this module: it passes as bytes (``usage_taps.py`` only peeks at its usage).
"""

from __future__ import annotations

from typing import Any

import orjson

from ..bounds import MAX_EVENT_BYTES
from ..errors import StreamError, StreamTooLarge
from ..memory import trim

__all__ = ["DONE", "ChatChunkFeed", "SseDecoder", "data_frame", "event_frame", "openai_error_event"]

Json = dict[str, Any]

DONE = b"data: [DONE]\n\n"


def data_frame(payload: Json) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"


def openai_error_event(message: str) -> bytes:
    """The relay's closing error event in OpenAI's stream shape."""
    err = {"error": {"message": message, "type": "upstream_error", "param": None, "code": "stream_interrupted"}}
    return data_frame(err)


def event_frame(kind: str, payload: Json) -> bytes:
    """A named event; ``payload`` carries its own ``type`` (both APIs repeat the name there)."""
    return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n"


class SseDecoder:
    """Cut a server-sent-events byte stream into ``(event, data)`` pairs, whatever the read
    boundaries (mid-line, mid-character, one byte at a time).

    What is held has no newline, so a read is searched only for its own bytes and
    lines are cut by position, the buffer trimmed once per read: an event that
    arrives over many reads costs its length once. An event (its data lines and
    the line in progress) past ``MAX_EVENT_BYTES`` raises :class:`StreamTooLarge`,
    after the complete events of the same read have been handed back.
    """

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._event: str | None = None
        self._data: list[bytes] = []
        self._size = 0  # bytes in _data
        self._over = False

    def feed(self, data: bytes) -> list[tuple[str | None, bytes]]:
        if self._over:
            raise StreamTooLarge(MAX_EVENT_BYTES)
        buffer = self._buffer
        scan = len(buffer)
        buffer += data
        events: list[tuple[str | None, bytes]] = []
        start = 0
        while (end := buffer.find(b"\n", scan)) >= 0:
            line = bytes(buffer[start:end])
            start = scan = end + 1
            if line.endswith(b"\r"):
                line = line[:-1]
            if not line:
                if self._data:
                    events.append((self._event, b"\n".join(self._data)))
                self._event, self._data, self._size = None, [], 0
                continue
            field, _, value = line.partition(b":")
            if value.startswith(b" "):
                value = value[1:]
            if field == b"data":
                self._data.append(value)
                self._size += len(value) + 1
            elif field == b"event":
                self._event = value.decode("utf-8", "replace")
        if start:
            del buffer[:start]
        if len(buffer) + self._size > MAX_EVENT_BYTES:
            self._buffer, self._data, self._size, self._over = bytearray(), [], 0, True
            trim()  # see proxy/memory.py
            if not events:
                raise StreamTooLarge(MAX_EVENT_BYTES)
        return events


class ChatChunkFeed:
    """``feed`` for translators that read an OpenAI chat stream (``chat_to_messages``,
    ``chat_to_responses``): decode events, close on ``[DONE]``, hand each chunk to ``_on_chunk``; on a
    broken chunk or an error payload raise ``stream_error`` with what was translated before it."""

    stream_error: type[StreamError] = StreamError
    malformed = "malformed chat stream chunk"
    done: bool
    _decoder: SseDecoder

    def feed(self, data: bytes) -> bytes:
        out = bytearray()
        try:
            for _, raw in self._decoder.feed(data):
                if self.done:
                    break
                if raw.strip() == b"[DONE]":
                    out += self._start() + self._end()
                    continue
                try:
                    chunk = orjson.loads(raw)
                except orjson.JSONDecodeError as exc:
                    raise self.stream_error(f"{self.malformed}: {raw[:200]!r}", "invalid_stream") from exc
                out += self._on_chunk(chunk)
        except self.stream_error as exc:
            exc.partial = bytes(out)
            raise
        return bytes(out)

    def _start(self) -> bytes:
        raise NotImplementedError

    def _end(self) -> bytes:
        raise NotImplementedError

    def _on_chunk(self, chunk: Json) -> bytes:
        raise NotImplementedError
