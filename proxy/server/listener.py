"""Client connections: how long each may take, how many may be open, and aiohttp's errors in our shape.

aiohttp alone keeps a connection that trickles its request head for as long as
its keep-alive timer (about an hour by default), has no body read timeout and
no cap on connections, so slow clients can hold every file descriptor until
real requests get empty replies; and it answers its own parser's errors
(Content-Length with Transfer-Encoding, oversized headers) in plain text (ours: ``x-request-id``, logged).

:class:`Guard` adds those per listener, from ``connections:`` in routes.yaml:

- a request head must be complete within ``header_timeout`` of the connection's
  opening (or of the first byte of a later request), its body within
  ``body_timeout`` after that (a 408 in the OpenAI shape; a stalled head is
  answered 408 and closed);
- a connection may idle ``keepalive_timeout`` between requests (aiohttp's own timer);
- a response the client takes nothing of for ``send_timeout`` (the transport past its
  high-water mark, and the kernel's queue for the client no shorter: it stopped reading) is
  cut with a reset: the handler is cancelled, its upstream call and concurrency slot freed, and
  the exchange logged as the client's doing (``relay.client_fault``), never the target's;
- at ``max`` open connections the one idle longest between requests (a keep-alive connection
  with no request under way) is closed to make room, else the one that has sent nothing for
  ``SILENT_SECS``: idle or silent connections cannot lock new clients out;
- past ``max`` open connections with none idle, a new one has one second to send its request
  head, which is answered 503 in the OpenAI shape (a real request in a flood gets an
  answer, not an empty reply), and is then closed; ``max`` is held under what RLIMIT_NOFILE
  allows, two descriptors per client (its own and an upstream's), so the connections past it,
  which never reach an upstream, have the other half to live their second in. At ``max`` plus
  half again, a new connection evicts the one that has waited longest for its head (a slow
  client's, not a real request's), and only when none is waiting is the newcomer closed
  unanswered: a flood of idle connections cannot lock real requests out, nor run the
  descriptors out.

No timer is armed per request: a connection stamps when its head and body
phases began, and one sweeper task per listener looks at every connection a few
times per shortest timeout (the same design as ``deadlines.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections import deque
from collections.abc import Callable
from typing import Any, cast

from aiohttp import web
from aiohttp.http import HttpVersion11
from aiohttp.streams import EMPTY_PAYLOAD, StreamReader
from aiohttp.web_protocol import RequestHandler, RequestPayloadError

from ..config import Connections
from ..internals import Internals, checked
from ..sockets import fd_budget, raise_fd_limit, reset, unsent
from .dialect import JSON, malformed_request, over_capacity, refusal
from .replies import HEAD_KEPT, new_id, request_line
from .request import BodyTimeout

__all__ = ["ON_REFUSED", "Guard", "GuardedRunner", "fd_budget", "raise_fd_limit"]

# What an app does with an answer the listener gave itself (remote, method, path, answer): its access log line.
Refused = Callable[[str, str, str, web.StreamResponse], None]
ON_REFUSED: web.AppKey[Refused] = web.AppKey("on_refused")

log = logging.getLogger("firstbyte")

OVER_CAPACITY_HEAD_TIMEOUT = 1.0  # a connection past the cap gets this long to ask, then its 503
LINGER = 0.25  # after a 408 for a slow head or a refused gzip body: what the client sends is dropped this long
PROGRESS = 64 * 1024  # what a paused client must take per send_timeout to count as reading (not the tail of its window)
SILENT_SECS = 1.0  # at the cap, a connection that has sent no head for this long makes room
CLOSE_REASONS = ("header_timeout", "body_timeout", "send_timeout", "idle_evicted", "over_capacity", "evicted",
                 "refused")


class Guard:
    """The connections of one listener, their deadlines and the counts the metrics read."""

    def __init__(self, limits: Connections, name: str = "main") -> None:
        self.limits = limits
        self.name = name
        self.max = min(limits.max, fd_budget())
        self.hard_max = self.max + max(8, self.max // 2)
        self.conns: set[GuardedHandler] = set()
        self.closed: dict[str, int] = dict.fromkeys(CLOSE_REASONS, 0)
        shortest = min(limits.header_timeout, limits.body_timeout, limits.send_timeout, OVER_CAPACITY_HEAD_TIMEOUT)
        self.interval = min(1.0, max(0.02, shortest / 5))
        self._task: asyncio.Task[None] | None = None
        self._idle: deque[GuardedHandler] | None = None  # idle connections, oldest first, as of the last sweep
        self.on_refused: Refused | None = None  # the app's ON_REFUSED, set when its runner starts

    @property
    def open(self) -> int:
        return len(self.conns)

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name=f"connections-{self.name}")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(self.interval)
            self.sweep(loop.time())

    def evict_idle(self) -> bool:
        """At the cap: close the connection idle longest between requests, if any.

        The idle ones are listed (oldest first) once per sweep at most, not per new connection, so a
        flood past the cap costs one scan per sweep; each is checked again when its turn comes."""
        if self._idle is None:
            self._idle = deque(sorted((c for c in self.conns if c.idle), key=GuardedHandler.idle_order))
        while self._idle:
            conn = self._idle.popleft()
            if conn in self.conns and conn.idle:
                self.closed["idle_evicted"] += 1
                self.conns.discard(conn)
                conn.force_close()
                return True
        return False

    def make_room(self, waited_since: float = math.inf) -> bool:
        """Close the connection that has waited longest for a request head (at the hard limit any;
        at the cap one waiting since before ``waited_since``)."""
        oldest: GuardedHandler | None = None
        for conn in self.conns:
            since = conn.head_since
            if since is not None and (oldest is None or since < oldest.head_since):  # type: ignore[operator]
                oldest = conn
        if oldest is None or oldest.head_since >= waited_since:  # type: ignore[operator]
            return False
        self.closed["evicted"] += 1
        self.conns.discard(oldest)
        oldest.head_since = None
        oldest.force_close()
        return True

    def sweep(self, now: float) -> int:
        """Act on every connection past a deadline; how many there were."""
        limits = self.limits
        due = 0
        self._idle = None  # listed again when next needed
        for conn in list(self.conns):
            paused = conn.paused_since
            if paused is not None and now - paused > limits.send_timeout:
                if conn.reading(now):
                    continue
                due += 1
                self.closed["send_timeout"] += 1
                conn.stalled(limits.send_timeout)
                continue
            since = conn.head_since
            if since is not None:
                limit = OVER_CAPACITY_HEAD_TIMEOUT if conn.over else limits.header_timeout
                if now - since > limit:
                    due += 1
                    self.closed["header_timeout"] += 1
                    conn.head_timed_out(limit)
                continue
            body = conn.body
            if body is None:
                continue
            if body.is_eof():
                conn.body = None
            elif now - conn.body_since > limits.body_timeout:
                due += 1
                self.closed["body_timeout"] += 1
                conn.body = None
                body.set_exception(BodyTimeout(
                    f"Request body did not arrive within {limits.body_timeout:g} s "
                    "(connections.body_timeout)."))
        return due


class GuardedHandler(RequestHandler):
    """aiohttp's per-connection protocol with the guard's deadlines, cap and error shape."""

    __slots__ = ("_guard", "body", "body_since", "closing", "fault", "head_since", "head_start", "over",
                 "paused_since", "queued", "refused")

    def __init__(self, manager: web.Server, guard: Guard, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._guard = guard
        self.head_since: float | None = None  # waiting for a request head since then
        self.head_start = b""  # the start of a head cut by a read (a 408 logs its request line)
        self.body: StreamReader | None = None  # the body being received, until it is whole
        self.body_since = 0.0
        self.over = False
        self.closing = False
        self.refused = False  # closed in connection_made: aiohttp never saw it
        self.paused_since: float | None = None  # our writes wait for the client since then
        self.queued: int | None = None  # what the kernel held for the client then (None: unknown)
        self.fault: str | None = None  # why the guard cut it for the client's own doing

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        guard = self._guard
        if len(guard.conns) >= guard.max and not guard.evict_idle():
            # else from one silent for SILENT_SECS (`max` silent sockets kept newcomers at 503)
            guard.make_room(waited_since=self._loop.time() - SILENT_SECS)
        if len(guard.conns) >= guard.hard_max and not guard.make_room():
            guard.closed["refused"] += 1
            self.refused = True
            transport.close()  # every connection is busy with a real request: no room, no answer
            return
        over = len(guard.conns) >= guard.max
        super().connection_made(transport)
        guard.conns.add(self)
        self.head_since = self._loop.time()
        handle = self._keepalive_handle
        if handle is not None:  # aiohttp's idle timer on a new connection: the head deadline is ours
            handle.cancel()
            self._keepalive_handle = None
        if over:
            self.over = True
            self._request_handler = self._over_capacity  # this connection only; nothing per request
            guard.closed["over_capacity"] += 1

    def connection_lost(self, exc: BaseException | None) -> None:
        if self.refused:
            return  # refused in connection_made: aiohttp never saw it
        self._guard.conns.discard(self)  # an evicted one is gone from the set already
        self.body = None
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self.closing:
            return  # answered 408 already: dropped until the linger ends
        super().data_received(data)
        messages = self._messages
        if messages:  # a whole request head arrived
            self.head_since, self.head_start = None, b""
            payload = messages[-1][1]
            if payload is not EMPTY_PAYLOAD and isinstance(payload, StreamReader) and not payload.is_eof():
                self.body, self.body_since = payload, self._loop.time()
            return
        if data and self.head_since is None and (self.body is None or self.body.is_eof()):
            self.body = None
            self.head_since = self._loop.time()  # the first byte of the next request
        if self.head_since is not None and len(self.head_start) < HEAD_KEPT:  # a head cut by a read
            self.head_start += data[:HEAD_KEPT]

    @property
    def idle(self) -> bool:
        """Kept alive between requests: the last answer is out, no byte of the next has come."""
        waiter = self._waiter  # aiohttp waits on it for the next request head, and only then
        return (waiter is not None and not waiter.done() and not self._messages and self.head_since is None
                and not self.closing)

    def idle_order(self) -> float:
        """When the connection's keep-alive timer runs out: the earliest has been idle longest."""
        return float(getattr(self, "_next_keepalive_close_time", 0.0))

    def pause_writing(self) -> None:
        super().pause_writing()
        self.paused_since = self._loop.time()
        self.queued = unsent(self.transport)

    def reading(self, now: float) -> bool:
        """Paused a whole ``send_timeout``, but is the client reading, slowly? The kernel wakes our
        writes only once a good part of a large send buffer (megabytes on loopback) is free, so a
        client taking 400 KB/s can keep the transport paused for seconds: the kernel's queue for it
        shrinking by ``PROGRESS`` is progress, and the window starts again (less is what a client that
        stopped reading still had room for when we paused)."""
        queued = unsent(self.transport)
        if queued is None or self.queued is None or self.queued - queued < PROGRESS:
            return False
        self.paused_since, self.queued = now, queued
        return True

    def resume_writing(self) -> None:
        super().resume_writing()
        self.paused_since = None

    def stalled(self, limit: float) -> None:
        """The client took none of our bytes for ``limit``: cut the connection (no answer could reach
        it), which cancels the handler and frees whatever it holds upstream."""
        self.paused_since = None
        self.fault = f"client stopped reading (no byte taken for {limit:g} s, connections.send_timeout)"
        if self.transport is not None:
            reset(self.transport)

    def head_timed_out(self, limit: float) -> None:
        """No whole request head in time: say so (408), then close.

        The write side is shut first and what the client still sends is read and dropped for a
        moment (``LINGER``): closing with its bytes unread would send a reset that can destroy the
        408 before the client reads it."""
        self.head_since = None
        transport = cast(asyncio.Transport | None, self.transport)  # uvloop's is no asyncio subclass
        if transport is None or transport.is_closing():
            self.force_close()
            return
        body, rid = refusal(408, f"Request head did not arrive within {limit:g} s "
                                 "(connections.header_timeout).", "header_timeout"), new_id()
        transport.write(b"HTTP/1.1 408 Request Timeout\r\nContent-Type: application/json\r\nx-request-id: %s\r\n"
                        b"Connection: close\r\nContent-Length: %d\r\n\r\n%s" % (rid.encode(), len(body), body))
        if self._guard.on_refused is not None:  # no whole head: its request line, if that came
            peer = transport.get_extra_info("peername") or ("-",)
            said = web.Response(body=body, status=408, headers={"x-request-id": rid})
            self._guard.on_refused(str(peer[0]), *request_line(self.head_start), said)
        if transport.can_write_eof():
            transport.write_eof()
        self.drop_unread_body()

    def drop_unread_body(self) -> None:
        """What the client still sends is dropped unparsed for ``LINGER``, then the connection closes: after
        a 408 for a slow head, and a compressed body refused before its end. aiohttp's lingering close
        read the rest and inflated it: a 0.5 MB gzip body past ``max_body_bytes`` (500 MB inflated) held
        the event loop 1.2 s after its 413, a 4 MB one up to aiohttp's 10 s ``lingering_time``."""
        self.closing = True
        self._loop.call_later(LINGER, self.force_close)

    def handle_error(self, request: web.BaseRequest, status: int = 500, exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        """aiohttp's own errors (a head it cannot parse, CL with TE, oversized headers, a body it
        cannot decode) in the OpenAI shape, with an ``x-request-id``, logged as one line and handed
        to the access log (``ON_REFUSED``): a bad request is the client's news, not a traceback."""
        log.info("refused a malformed request from %s: %s", request.remote,
                 " ".join(str(message or exc or status).split())[:200])
        if request.writer.output_size > 0:
            raise ConnectionError("the response has begun; the error cannot be sent")
        # aiohttp's stand-in for a request it could not parse says HTTP/1.0, and the answer follows it:
        # a server answers in the highest 1.x it speaks (RFC 9110 2.5), whatever the client's was.
        request._version = HttpVersion11
        request._cache.pop("version", None)
        response = web.Response(body=malformed_request(status, message or exc), status=status, content_type=JSON,
                                headers={"x-request-id": new_id()})
        response.force_close()
        return self._refused(request, response)

    def _refused(self, request: web.BaseRequest, response: web.StreamResponse) -> web.StreamResponse:
        if self._guard.on_refused is not None:  # to the access log, as the app's own refusals are
            self._guard.on_refused(request.remote or "-", request.method, request.path, response)
        return response

    async def _over_capacity(self, request: web.BaseRequest) -> web.StreamResponse:
        """The 503 past the cap, with an ``x-request-id`` and an access log line like any refusal."""
        response = await over_capacity(request)
        response.headers["x-request-id"] = new_id()
        return self._refused(request, response)

    def log_exception(self, *args: Any, **kw: Any) -> None:
        """A body that could not be decoded or did not arrive in time was answered already (400 or
        408); aiohttp meets the same error again when it drains the rest, which is not news."""
        exc = kw.get("exc_info")
        if isinstance(exc, RequestPayloadError | BodyTimeout):
            log.debug("dropped the rest of a refused request body: %s", exc)
            return
        super().log_exception(*args, **kw)


class _GuardedServer(web.Server):
    """aiohttp's Server, making :class:`GuardedHandler` protocols."""

    guard: Guard

    def __call__(self) -> RequestHandler:
        return GuardedHandler(self, self.guard, loop=self._loop, **self._kwargs)


class GuardedRunner(web.AppRunner):
    """An AppRunner whose connections are kept by ``guard`` (keep-alive from its limits)."""

    def __init__(self, app: web.Application, guard: Guard, internals: Internals | None = None,
                 **kwargs: Any) -> None:
        kwargs.setdefault("keepalive_timeout", guard.limits.keepalive_timeout)
        super().__init__(app, **kwargs)
        self.guard = guard
        self.internals = internals  # None: the installed aiohttp's, checked at setup

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        if self.internals is not None and self.internals.server:
            return server  # aiohttp's internals moved: its own protocols, without the guard
        server.__class__ = _GuardedServer  # the same object; only its protocol factory differs
        server.guard = self.guard  # type: ignore[attr-defined]
        return server

    async def setup(self) -> None:
        if self.internals is None:
            self.internals = await checked()
        self.guard.on_refused = self.app.get(ON_REFUSED)
        await super().setup()
        self.guard.start()

    async def cleanup(self) -> None:
        await self.guard.stop()
        await super().cleanup()
