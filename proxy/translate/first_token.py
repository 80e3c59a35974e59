"""The first token: where a streamed answer commits, per wire format (docs/adr/0007).

Until an upstream stream carries content, nothing has reached the client and
every failure may still fail over. A gate is fed the stream's bytes as they
arrive, holds back the events that carry no content yet (OpenAI's role-only
delta, SSE comments and keep-alives, Anthropic's ``message_start``,
``content_block_start`` of an empty text block, ``ping``) and says, per read,
whether the stream has committed, failed, or needs more. What it held leaves
with the first content, in the same write.

A gate only reads the events before the first token: after it commits, the
stream translator (or tap) is alone on the stream. Errors found here are
described by :class:`UpstreamError`; ``classify.classify_error`` turns one into
an outcome like its HTTP twin's.
"""

from __future__ import annotations

import re
from typing import Any, NamedTuple

import orjson

from ..bounds import MAX_ANSWER_CONTAINERS, MAX_EVENT_CONTAINERS, containers_past
from ..errors import StreamTooLarge
from ..scrub import Scrubber
from .chunk_types import MANY_BYTES, SUSPECT, TOO_DEEP, chunk_problem, nested_too_deep, text_problem, too_many
from .sse import BOM, Event, data_of, event_end, fields, lone_crs, opened, without_bom

__all__ = [
    "MAX_OPENING",
    "AnthropicFirstToken",
    "FirstToken",
    "OpenAIFirstToken",
    "ResponsesFirstToken",
    "UpstreamError",
    "error_in_body",
    "scrubbed",
]

# Bytes held back before the first token. Past it the stream commits as it is, unless what is held
# is one event that does not begin as content: that is "oversized", a failover (see _scan). Holding
# up to bounds.MAX_EVENT_BYTES per stream instead was tried: the fault drill's soak then grew RSS by
# 32 MB, against 13 MB with this bound.
MAX_OPENING = 256 * 1024

COMMITTED = "committed"
SAMPLE = 4096  # bytes of a malformed event kept for its error message (80 of them are quoted)


class UpstreamError(NamedTuple):
    """An error an upstream sent inside a 2xx: an error event, or a buffered error object."""

    status: int | None  # a numeric code the upstream gave (vLLM, OpenRouter), if any
    kind: str  # the error's code or type: ``overloaded_error``, ``rate_limit_exceeded``…
    message: str
    body: bytes  # the error as the upstream's JSON, for the client when it is returned as it is


class Ended(NamedTuple):
    """The stream ended, or broke, before any content: ``why`` is the attempt's word."""

    why: str  # "empty stream" | "malformed stream"
    detail: str
    sample: bytes = b""  # the upstream's bytes the detail quotes (scrubbed whole before they are cut)


# The longest first event the lean path commits unparsed. A real chunk is a few hundred bytes; JSON this
# short nests at most 512 levels, under orjson's 1,024 and the client's parser's recursion limit (5,000
# levels, before or behind the content, made the openai SDK raise RecursionError on a chunk committed
# unparsed). A longer event, or one not yet ended in this read, goes to the parse, which refuses them.
LEAN_REACH = 1024

Verdict = str | UpstreamError | Ended | None  # COMMITTED, a failure, or None: read more
_EMPTY = Ended("empty stream", "the stream ended before any content")


class FirstToken:
    """Hold a stream's opening until its first token; subclasses know one wire format.

    ``feed`` returns True once the opening is decided: :attr:`failure` is None
    when the stream committed (relay :attr:`held`), else what it failed with.
    What was fed waits in one bytearray (a first read that decides is never
    copied), and each read is searched from where the last search stopped, so a
    drip-fed opening costs its length, not its length squared, and a large one
    is held once."""

    __slots__ = ("_buf", "_events", "_head", "_start", "failure", "held")

    containers = MAX_EVENT_CONTAINERS  # objects and arrays an event may hold before it is parsed (bounds.py)

    def __init__(self) -> None:
        self._head: bytes | None = b""  # the stream's first bytes while they may begin a BOM; None after
        self._buf: bytearray | None = None  # everything fed so far, once a read left it undecided
        self._start = 0  # where the incomplete event at its end begins
        self._events: list[Event] = []  # what was decoded on the way, handed on with ``held``
        self.held = b""
        self.failure: UpstreamError | Ended | None = None

    compact_content = False  # OpenAI chat chunks only: a compact non-empty "content" string is a token

    def feed(self, data: bytes) -> bool:
        head = self._head
        if head is not None:  # the stream's start: one BOM there is not part of its first line (sse.without_bom)
            if head or data.startswith(BOM[:1]):
                data, self._head = without_bom(head, data)
                if self._head is not None:
                    return False  # a BOM's first bytes, maybe: the next read says
            else:
                self._head = None
        if 13 in data or (self._buf is not None and self._buf.endswith(b"\r")):  # an int: memchr
            data = self._lone_crs(data)
        if self.compact_content and self._buf is None and data.startswith(b"data: {"):
            # The common case, kept lean (it runs once per streamed call): a first read whose
            # first event is one data line that already carries content.
            end = data.find(b"\n\n")
            at = data.find(b'"content":"', 0, end)
            if (at > 0 and 0 < end <= LEAN_REACH and data[at + 11] != 0x22 and data.find(b'"error"', 0, end) < 0
                    and SUSPECT.search(data, 0, end) is None  # no field of another type (chunk_types.py)
                    and data.find(b"\\u", 0, end) < 0):  # no key spelt with an escape SUSPECT cannot see
                # Compact JSON with a non-empty "content" string: unescaped quotes are structure,
                # so this is content, known without parsing the event. An escape (``c\\u006fntent``,
                # or text escaped as ASCII) sends the event to the parse below, once per stream.
                self.held = data
                return True
            if 0 < end <= MANY_BYTES and data.find(b"\n", 0, end) < 0:  # longer: counted first (_event)
                try:
                    payload = orjson.loads(data[6:end])
                except orjson.JSONDecodeError:
                    payload = None
                if (type(payload) is dict and "error" not in payload and payload.get("object") != "error"
                        and payload.get("type") != "error" and self.carries_content(None, payload)
                        and chunk_problem(payload) is None and not nested_too_deep(data[6:end])):
                    self.held = opened(data, [(None, payload)], end + 2)
                    return True
        verdict = self._scan(data)
        if verdict is None:
            return False
        if verdict is COMMITTED:
            self.held = opened(data if self._buf is None else bytes(self._buf), self._events, self._start)
        else:
            self.failure = verdict  # type: ignore[assignment]
        return True

    def _lone_crs(self, data: bytes) -> bytes:
        """A lone CR ends a line for an SSE client: an LF here too, as in the framer after the commit
        (``sse.EventFramer``), so the opening is judged by the events the client will read (one framed
        by CRs alone found no event, and failed as empty). A CR that ended the last read is lone unless
        this one starts with an LF."""
        held = self._buf
        if held is not None and held.endswith(b"\r") and not data.startswith(b"\n"):
            held[-1] = 0x0A
        return lone_crs(data)

    def _scan(self, data: bytes) -> Verdict:
        text: bytes | bytearray
        if self._buf is None:
            text, start, searched = data, 0, 0
        else:
            text, start = self._buf, self._start
            searched = max(start, len(text) - 2)  # a blank line may straddle the two reads
            text += data
        while True:
            end, step = event_end(text, max(start, searched))
            if end < 0:
                break
            verdict = self._event(bytes(text[start:end]) if isinstance(text, bytearray) else text[start:end])
            start = self._start = end + step  # what was decoded ends here
            if verdict is not None:
                return verdict
        if self._buf is None:
            self._buf = bytearray(data)  # undecided: from now on it is held, once
        self._start = start
        if len(self._buf) > MAX_OPENING:
            # Holding more would cost memory per stream. A keep-alive flood, or one large event that
            # begins as content (a 10 MB first chunk), goes on as it is; one large event that does
            # not (an event with no end, garbage) is oversized: a failover before commit.
            pending = self._buf[start:start + 4096]
            if len(self._buf) - start > MAX_OPENING and not _BEGINS_AS_CONTENT.search(pending):
                self._buf = None
                raise StreamTooLarge(MAX_OPENING)
            return COMMITTED
        return None

    def end(self) -> bool:
        """The upstream's body ended without a first token; or it ended with a CR, which ends its line
        (an event framed by CRs is whole at it): the opening is read once more with it. So are a BOM's
        first bytes that no BOM followed."""
        head, self._head = self._head, None
        if head and self.feed(head):
            return True
        held = self._buf
        if held is not None and held.endswith(b"\r"):
            held[-1] = 0x0A
            if self.feed(b""):
                return True
        self.failure = _EMPTY
        return True

    def _event(self, event: bytes) -> Verdict:
        name, raw = fields(event)
        if raw is None:
            return None  # a comment or keep-alive
        if raw.strip() == b"[DONE]":
            return _EMPTY
        many = containers_past(raw, self.containers)  # before the parse: orjson took ~0.5 s to build 5M
        if many:
            return Ended("malformed stream", too_many(many, self.containers), raw[:SAMPLE])
        try:
            payload = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return Ended("malformed stream", "an event before the first token is not JSON", raw[:SAMPLE])
        if not isinstance(payload, dict):
            return Ended("malformed stream", "an event before the first token is not an object", raw[:SAMPLE])
        error = error_of(payload)
        if error is not None:
            return UpstreamError(*error, raw)
        if nested_too_deep(raw):  # well typed, maybe, but a client's parser cannot read it
            return Ended("malformed stream", TOO_DEEP, raw[:SAMPLE])
        problem = self.problem(payload)
        if problem is not None:  # a client would read it as it is: elsewhere, while we still can
            return Ended("malformed stream", f"an event before the first token has fields of the wrong types "
                         f"({problem})", raw[:SAMPLE])
        self._events.append((name, payload))  # the translator after the gate takes it as it is
        return COMMITTED if self.carries_content(name, payload) else None

    def carries_content(self, name: str | None, payload: dict[str, Any]) -> bool:
        raise NotImplementedError

    def problem(self, payload: dict[str, Any]) -> str | None:
        """What in an event is wrongly typed for the wire format (None: nothing, or not checked)."""
        return None


_BEGINS_AS_CONTENT = re.compile(rb'"(?:content|text|delta|arguments|partial_json|thinking)"\s*:\s*"[^"]')


_DELTA_CONTENT = ("content", "tool_calls", "function_call", "refusal", "reasoning_content", "reasoning",
                  "audio")


class OpenAIFirstToken(FirstToken):
    """OpenAI-shape streams (``openai`` and ``simulated`` kinds; chat and completions): an event
    commits when a choice carries content (text, a tool-call delta, a refusal, reasoning) or a
    finish reason. A role-only delta, an empty content string and a usage-only chunk do not."""

    __slots__ = ()
    compact_content = True

    def problem(self, payload: dict[str, Any]) -> str | None:
        return chunk_problem(payload)

    def carries_content(self, name: str | None, payload: dict[str, Any]) -> bool:
        choices = payload.get("choices")
        if not isinstance(choices, list):
            return False
        for choice in choices:
            if type(choice) is not dict:
                continue
            delta = choice.get("delta")
            if type(delta) is dict:
                if delta.get("content"):  # the common case first: no loop, no generator
                    return True
                for key in _DELTA_CONTENT:
                    if delta.get(key):
                        return True
            finish = choice.get("finish_reason")
            if (finish and finish != "error") or choice.get("text"):  # "error": OpenRouter's failed end
                return True
        return False


_HELD_ANTHROPIC = (b"message_start", b"ping", b"content_block_stop")


class AnthropicFirstToken(FirstToken):
    """Anthropic's Messages stream (``anthropic`` kind; chat and ``/v1/messages``): the first
    ``content_block_delta`` with something in it, a ``content_block_start`` of a tool call or
    of a text block that already holds text, or a ``message_delta`` (its stop reason is a
    finish) commits. ``message_start``, ``ping`` and an empty text block's start do not."""

    __slots__ = ()

    def carries_content(self, name: str | None, payload: dict[str, Any]) -> bool:
        kind = payload.get("type")
        if kind == "content_block_delta":
            delta = payload.get("delta")
            if not isinstance(delta, dict):
                return False
            if delta.get("type") == "text_delta":
                return bool(delta.get("text"))
            return True  # tool input, thinking, signatures, citations: the model is answering
        if kind == "content_block_start":
            block = payload.get("content_block")
            if not isinstance(block, dict):
                return False
            kind = block.get("type")
            if kind == "thinking":  # extended thinking opens every answer with an empty one
                return bool(block.get("thinking"))
            return kind != "text" or bool(block.get("text"))
        return kind in ("message_delta", "message_stop")

    def problem(self, payload: dict[str, Any]) -> str | None:
        return text_problem(payload)


_RESPONSES_HELD = frozenset({"response.created", "response.in_progress", "response.queued",
                             "response.content_part.added", "response.output_item.added"})


class ResponsesFirstToken(FirstToken):
    """OpenAI's Responses event stream (a provider with ``responses: true`` on ``/v1/responses``):
    ``response.created``, ``response.in_progress``, an empty ``output_item.added`` or
    ``content_part.added`` are held; a text, refusal, reasoning or function-call delta, a function
    call's item, or ``response.completed`` commits. ``response.failed`` and ``error`` are failures."""

    __slots__ = ()
    containers = MAX_ANSWER_CONTAINERS  # response.completed carries the whole answer, its logprobs too

    def carries_content(self, name: str | None, payload: dict[str, Any]) -> bool:
        kind = payload.get("type")
        if kind == "response.output_item.added":
            item = payload.get("item")
            return isinstance(item, dict) and item.get("type") not in (None, "message")
        return isinstance(kind, str) and kind not in _RESPONSES_HELD

    def _event(self, event: bytes) -> Verdict:
        verdict = super()._event(event)
        if verdict is COMMITTED and event.find(b'"response.failed"') >= 0:
            failed = orjson.loads(data_of(event))
            error = (failed.get("response") or {}).get("error") or {}
            found = error_of({"error": error if isinstance(error, dict) and error else {"message": "failed"}})
            assert found is not None
            return UpstreamError(*found, orjson.dumps({"error": error}))
        return verdict


def error_of(payload: dict[str, Any]) -> tuple[int | None, str, str] | None:
    """(numeric code, kind, message) when ``payload`` is an error in any shape upstreams use:
    OpenAI's ``{"error": {...}}``, Anthropic's ``{"type": "error", "error": {...}}``, or vLLM's
    ``{"object": "error", "message": ...}``."""
    error = payload.get("error")
    if isinstance(error, dict):
        pass
    elif payload.get("object") == "error" or payload.get("type") == "error":
        error = payload
    elif isinstance(error, str) and error:
        error = {"message": error}
    else:
        return None
    code = error.get("code")
    status = code if isinstance(code, int) else int(code) if isinstance(code, str) and code.isdigit() else None
    kind = code if isinstance(code, str) and code and status is None else error.get("type")
    if not isinstance(kind, str) or not kind or kind == "error":
        kind = "unknown"
    message = error.get("message")
    return status, kind, message if isinstance(message, str) and message else "upstream error"


def error_in_body(body: bytes) -> UpstreamError | None:
    """A buffered 2xx whose JSON body is an error object, not an answer."""
    # An answer has no such key or value (quotes in text are escaped); find, not `in` (usage_taps.py says why).
    if body.find(b'"error"') < 0 or containers_past(body, MAX_ANSWER_CONTAINERS):
        return None  # (too many containers to parse: answer.buffered_answer refuses it, unparsed)
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(payload, dict) or payload.get("choices") or payload.get("content"):
        return None
    error = error_of(payload)
    return None if error is None else UpstreamError(*error, body)


def scrubbed(failure: UpstreamError | Ended, scrubber: Scrubber) -> UpstreamError | Ended:
    """``failure`` without a configured secret in it: the upstream's bytes are scrubbed whole (a
    JSON error written again first, see ``Scrubber.error_body``), and what was read from them
    (kind, message) is read again from what is left, before anything quotes or cuts it."""
    if isinstance(failure, Ended):
        return failure._replace(sample=scrubber.bytes(failure.sample)) if failure.sample else failure
    body = scrubber.error_body(failure.body)
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError:
        payload = None
    error = error_of(payload) if isinstance(payload, dict) else None
    if error is None:
        return UpstreamError(failure.status, "unknown", "upstream error", body)
    status, kind, message = error
    return UpstreamError(status, scrubber.text(kind), scrubber.text(message), body)
