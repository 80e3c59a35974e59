"""relay: send a committed answer to the client, chunk by chunk, as it arrives.

``StreamResponse.prepare()`` is the commit point on the client side: headers
(with ``x-route-decision``) go out, and from then on a failure can only end the
stream with an error event. Writes wait for the client (backpressure), so a
slow reader holds the upstream back instead of filling our memory.

The client's stream ends with the upstream's end marker (``[DONE]``,
``message_stop``), in the same write as the last events: the upstream's own end
of body usually arrives a read later, and waiting for it measured as the
largest share of what a short stream added at concurrency 1. That tail is read
in the background (``Lease.finish_after_end``), so the connection still goes
back to the pool.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Protocol

import aiohttp
from aiohttp import web

from .errors import StreamError
from .providers.base import StreamTranslator
from .scrub import Scrubber
from .translate.sse import SHAPE_ERRORS, WRONG_TYPES
from .upstream.transport import UPSTREAM_ERRORS, break_of
from .walk.lease import DRAINING, Lease

log = logging.getLogger(__name__)


class _CommitResponse(web.StreamResponse):
    """A StreamResponse whose headers leave with the first chunk, in one write.

    ``prepare()`` is still the commit point; since the relay only prepares once
    it holds the first chunk, holding the headers back for that write costs no
    time and saves the client a separate segment on its first-chunk path.
    """

    _send_headers_immediately = False  # aiohttp's own switch (web.Response uses it too)


class Meter(Protocol):
    """Where the relay records progress as it goes, so a cancelled stream is still accounted."""

    sent: int
    first_sent: float | None
    error: str | None


# kept whole: the loop in a coroutine of its own is one more frame on every chunk's await, measured
# with callgrind (the docstring; docs/history/2026-12-03.md)
async def relay_stream(request: web.Request, lease: Lease, status: int, headers: Mapping[str, str],
                       clock: Callable[[], float], meter: Meter, scrubber: Scrubber) -> web.StreamResponse:
    """Translate and write until the stream's end marker, a break or the upstream's end
    (``scrubber``: the configured keys, taken out of a failure's words before they are told).

    One coroutine, the loop inline: every chunk's await passes through each frame of the
    request's chain, and a coroutine of its own for the loop measured (callgrind)."""
    response = _CommitResponse(status=status, headers=headers)
    translator = lease.translator
    failure: str | None = None
    last = b""  # the end marker, or what a broken stream translated before its break
    ended = False  # the upstream's body ended
    handed_off = False  # the lease is released by its drain, not here
    try:
        await response.prepare(request)
        lease.client = request.transport
        # The opening comes translated (the walker did it before the commit), with its failure if any.
        data, read, broken = lease.first, lease.upstream.chunk, lease.broken
        while True:
            if broken is not None:  # a translator's verdict on a broken stream
                failure, last = _broken(broken, lease), data
                break
            if translator.done:
                last = data  # the end marker: the answer is whole
                break
            if data:
                await response.write(data)
                if meter.first_sent is None:  # inline, not _sent(): a call a read (~700 instructions)
                    meter.first_sent = clock()
                    lease.committed()  # the state hears the first token now, off the client's path
                meter.sent += len(data)
            if ended:
                break
            try:
                lease.waiting_since = clock()
                data = await read()
                lease.waiting_since = None
            except UPSTREAM_ERRORS as exc:
                failure = lease.expired or break_of(exc)
                break
            ended = not data
            try:
                data = _end_of_body(translator) if ended else translator.feed(data)
            except Exception as exc:
                broken, data = exc, exc.partial if isinstance(exc, StreamError) else b""
        if failure is None and not translator.done:
            failure = "the upstream stream ended before its end marker"
        if failure is not None:
            failure, last = await _fail(response, lease, scrubber.text(failure), last, meter, clock, scrubber), b""
        elif last:
            _sent(meter, len(last), clock)
        await response.write_eof(last)
        lease.committed()  # when the opening was the whole answer (or nothing): told before the drain
        if failure is None and not ended:
            handed_off = True
            lease.finish_after_end()  # the upstream's own end is read off the client's path
    except (ConnectionResetError, aiohttp.ClientConnectionResetError):
        # The client left (or was cut for reading no more): nothing to say about the provider.
        meter.error = meter.error or _left(request, lease)
    except asyncio.CancelledError:
        meter.error = meter.error or _left(request, lease)
        raise
    finally:
        if not handed_off:
            lease.finish(failure)
    return response


async def _fail(response: web.StreamResponse, lease: Lease, failure: str, tail: bytes,
                meter: Meter, clock: Callable[[], float], scrubber: Scrubber) -> str:
    """End a broken stream: ``tail`` (the events before the translator's verdict), then the
    translator's error event. ``failure`` comes scrubbed (an upstream's words may quote its key);
    ``tail`` is scrubbed here: it may be the upstream's own error event (a Responses stream as it is)."""
    if tail:
        tail = scrubber.bytes(tail)
        await response.write(tail)
        _sent(meter, len(tail), clock)
    meter.error = failure
    if lease.expired == DRAINING:
        message = "firstbyte is shutting down: the answer is incomplete; send the request again."
    else:
        message = (f"{lease.target.name}: the upstream stream failed after it started ({failure}); "
                   "the answer is incomplete.")
    event = lease.translator.error_event(message)
    await response.write(event)
    meter.sent += len(event)
    return failure


def _end_of_body(translator: StreamTranslator) -> bytes:
    """What the translator still holds when the upstream's body ends. An empty read first: a CR its framer
    held for an LF that may follow ends its line now (``EventFramer``), so a stream framed by lone CRs,
    whose end marker's blank line is the body's last byte, ends at its end marker and not as a cut."""
    data = translator.feed(b"")
    return data if translator.done else data + translator.finish()


def _broken(exc: Exception, lease: Lease) -> str:
    """What a translator's failure says to a person: a StreamError's own words (the upstream's
    error, or what was wrong with its stream); anything else is a fault of ours, logged with its
    traceback (a wrongly typed event a translator did not foresee, or a bug), and the client is
    told what was wrong with the stream, never Python's text."""
    if isinstance(exc, StreamError):
        return exc.message
    log.warning("%s: translating the upstream's stream failed", lease.target.name, exc_info=exc)
    return WRONG_TYPES if isinstance(exc, SHAPE_ERRORS) else "firstbyte could not read the upstream's stream"


def _left(request: web.Request, lease: Lease) -> str:
    """Why the client's stream ended early on its side: it left, or it stopped reading and was cut
    (by the stream's deadline or the listener's ``send_timeout``), or the drain's grace ran out."""
    if lease.expired == DRAINING:
        return DRAINING
    return lease.stalled or client_fault(request) or "client disconnected"


def client_fault(request: web.BaseRequest) -> str | None:
    """Why the guard cut this request's connection, when it was the client's doing (it stopped
    reading); None when the client simply left or the connection is not guarded. The guard
    (``server/listener.py``) sets ``fault`` on the connection's protocol."""
    return getattr(request.protocol, "fault", None)


def _sent(meter: Meter, size: int, clock: Callable[[], float]) -> None:
    if meter.first_sent is None:
        meter.first_sent = clock()
    meter.sent += size
