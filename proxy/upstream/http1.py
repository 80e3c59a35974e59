"""The upstream HTTP/1.1 client: requests written as bytes, answers read by aiohttp's parser.

Every relayed call passes through here, so it is the hot path's largest single piece. aiohttp's
``ClientSession.request`` builds a ``ClientRequest`` per call (URL, header multidicts, cookies,
payload wrappers, trace hooks, timers) and measured about 165 µs of CPU per call on loopback,
more than all of routing. A gateway sends the same few request shapes to the same few origins:
this client keeps a parsed endpoint per URL and an idle connection list per origin, writes the
request head and body in one write, and hands the socket's bytes to aiohttp's own protocol and
response parser (``ResponseHandler``, C ``HttpResponseParser``), so chunked bodies, content
decoding and the parser's limits are aiohttp's, tested there. About 65 µs per call.

What ``ClientSession`` did as firstbyte configured it is kept: host addresses cached for five
minutes, happy eyeballs across them (aiohappyeyeballs, aiohttp's own), SNI and certificate checks
by the name without a trailing dot, ``Accept``/``Accept-Encoding`` only where the provider set
none, idle connections closed past keep-alive by one timer per pool.

A connection is reused only once it has been quiet for ``QUIET`` and its socket holds nothing
unread; what an upstream may say on it is guarded by ``proxy.upstream.connection`` (interim floods,
unsolicited answers; docs/adr/0015). A final status a client must not act on (101, 3xx, one HTTP
does not define) is :class:`BadStatus`, never an answer.

Connect failures are raised as :class:`ConnectFailed` with the word the walker logs; what the
parser or the socket raises later is aiohttp's own client errors, named by ``transport.failure_of``.
"""

from __future__ import annotations

import asyncio
import functools
import socket
import ssl
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import aiohappyeyeballs
import aiohttp
from aiohttp.http_exceptions import HttpProcessingError
from multidict import CIMultiDictProxy
from yarl import URL

from .connection import Connection, Origin, quiet

__all__ = ["BadStatus", "ConnectFailed", "MalformedAnswer", "Origin", "Pool"]

KEEPALIVE = 15.0  # an idle connection older than this is closed, not reused (aiohttp's default)
DNS_TTL = 300.0  # a host's addresses are kept this long (aiohttp's ttl_dns_cache as firstbyte set it)
QUIET = 0.05  # a released connection is reused only after this long without a byte (docs/adr/0015)
DISTRUST = 60.0  # an origin that sent an unsolicited byte has no connection kept for this long
REPLAY_WINDOW = 0.25  # a keep-alive crossing shows within a round trip; later, the upstream may have worked on it
HAPPY_EYEBALLS = 0.25  # the next address is tried this long after the previous (aiohttp's default)
READ_BUFSIZE = 2**16
ENDPOINTS_MAX = 1024  # parsed URLs kept; a config names a handful
HEADS_MAX = 1024  # request heads kept (less their length): one per target and operation, unless traced
_DEFAULT_PORTS = {"http": 80, "https": 443}
_FORBIDDEN = frozenset("\r\n\0")


class ConnectFailed(aiohttp.ClientConnectionError):
    """No connection could be opened: ``kind`` is ``refused``, ``dns`` or ``tls``."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message


class MalformedAnswer(aiohttp.ClientError):
    """The upstream's status line or headers could not be parsed as HTTP/1.1."""


class BadStatus(aiohttp.ClientError):
    """A final status firstbyte never passes on: a protocol switch, a redirect, a 304, or a number HTTP
    does not define. A client that got it would act on it (the anthropic SDK followed a relayed
    307 and posted the prompt to the address in ``Location``)."""

    def __init__(self, status: int) -> None:
        if status == 101:
            did = "switched protocols (101)"
        elif status == 304:
            did = "answered 304 (not modified) to a request that asked for no cached copy"
        elif 300 <= status < 400:
            did = f"answered {status}, a redirect, which firstbyte neither follows nor passes on"
        else:
            did = f"answered {status:03d}, a status HTTP does not define"
        super().__init__(f"upstream {did}; only 2xx, 4xx and 5xx answers are relayed")
        self.status = status


def relayable(status: int) -> bool:
    """A final status a client may act on as the upstream's answer."""
    return 200 <= status < 300 or 400 <= status < 600


class Endpoint(NamedTuple):
    origin: Origin
    head: str  # "{target} HTTP/1.1\r\nHost: {host}\r\n": the method goes before it


def _endpoint(url: str) -> Endpoint:
    u = URL(url)
    if u.scheme not in _DEFAULT_PORTS or not u.raw_host:
        raise ValueError(f"not an http(s) URL: {url!r}")
    host = u.raw_host
    port = u.port or _DEFAULT_PORTS[u.scheme]
    name = host.rstrip(".")
    shown = f"[{name}]" if ":" in name else name
    if port != _DEFAULT_PORTS[u.scheme]:
        shown = f"{shown}:{port}"
    target = u.raw_path_qs or "/"
    return Endpoint(Origin(u.scheme, host, port), f" {target} HTTP/1.1\r\nHost: {shown}\r\n")


def request_head(method: str, endpoint: Endpoint, headers: Mapping[str, str], length: int) -> bytes:
    """The request's status line and headers. A value that could end a header early (CR, LF,
    NUL: a key read from a file with its newline) is refused, as aiohttp refuses it."""
    return head_start(method, endpoint, headers) + b"Content-Length: %d\r\n\r\n" % length


def head_start(method: str, endpoint: Endpoint, headers: Mapping[str, str]) -> bytes:
    """``request_head`` up to its ``Content-Length``: the same for every call of a target and
    operation (untraced), so the pool keeps it (``Pool.head``)."""
    lines = [method, endpoint.head]
    accept = encoding = True
    for name, value in headers.items():
        low = name.lower()
        if low == "accept":
            accept = False
        elif low == "accept-encoding":
            encoding = False
        if _FORBIDDEN.intersection(name) or _FORBIDDEN.intersection(value):
            raise ValueError(f"header {name!r} holds a newline or NUL character")
        lines.append(f"{name}: {value}\r\n")
    if accept:
        lines.append("Accept: */*\r\n")
    if encoding:
        lines.append("Accept-Encoding: gzip, deflate\r\n")
    # surrogateescape: a header byte the server could not decode as UTF-8 goes on as that byte
    return "".join(lines).encode("utf-8", "surrogateescape")


class Answer(NamedTuple):
    status: int
    headers: CIMultiDictProxy[str]
    content: aiohttp.StreamReader
    protocol: Connection


class Pool:
    """Connections kept open per origin, reused last-in first-out (among those quiet for ``quiet``
    seconds) so the warm ones stay warm."""

    def __init__(self, ssl_context: ssl.SSLContext | None = None, keepalive: float = KEEPALIVE,
                 clock: Callable[[], float] = time.monotonic, quiet: float = QUIET) -> None:
        self._ssl = ssl_context or default_tls()
        self._dns: dict[tuple[str, int], tuple[list[Any], float]] = {}
        self._keepalive = keepalive
        self._clock = clock
        self._quiet = quiet
        self._strays: dict[Origin, float] = {}  # origin -> until when its connections are not kept
        self._idle: dict[Origin, deque[tuple[Connection, float]]] = {}
        self._endpoints: dict[str, Endpoint] = {}
        self._heads: dict[tuple[str, str, tuple[tuple[str, str], ...]], bytes] = {}
        self._closed = False
        self._sweeper: asyncio.TimerHandle | None = None

    def _sweep(self) -> None:
        """Close what sat idle past keep-alive on origins nobody calls any more; one timer a pool."""
        self._sweeper = None
        now = self._clock()
        for origin, idle in list(self._idle.items()):
            self._trim(idle, now)
            if not idle:
                del self._idle[origin]
        if self._idle and not self._closed:
            self._sweeper = asyncio.get_running_loop().call_later(self._keepalive, self._sweep)

    def endpoint(self, url: str) -> Endpoint:
        endpoint = self._endpoints.get(url)
        if endpoint is None:
            if len(self._endpoints) >= ENDPOINTS_MAX:
                self._endpoints.clear()
            endpoint = self._endpoints[url] = _endpoint(url)
        return endpoint

    def head(self, method: str, url: str, headers: Mapping[str, str], length: int) -> tuple[Endpoint, bytes]:
        """The endpoint and the request's head (``request_head``), its start built once per method,
        URL and headers: checking and encoding each header measured ~6 us a call, before the write."""
        endpoint = self.endpoint(url)
        key = (method, url, tuple(headers.items()))
        start = self._heads.get(key)
        if start is None:
            if len(self._heads) >= HEADS_MAX:
                self._heads.clear()
            start = self._heads[key] = head_start(method, endpoint, headers)
        return endpoint, start + b"Content-Length: %d\r\n\r\n" % length

    async def request(self, method: str, url: str, headers: Mapping[str, str], body: bytes,
                      connect_timeout: float | None) -> Answer:
        """Send one request; return once the status and headers are in. A cancellation or a
        failure closes the connection: it is never put back half-used."""
        endpoint, head = self.head(method, url, headers, len(body))
        protocol = self._reuse(endpoint.origin)
        fresh = protocol is None  # not `or`: a connection is a queue, and an empty queue is falsy
        if protocol is None:
            protocol = await self._connect(endpoint.origin, connect_timeout)
        while True:
            try:
                written = self._clock()
                protocol.asked()
                transport = protocol.transport
                if transport is None:
                    raise aiohttp.ServerDisconnectedError()
                transport.write(head + body if len(body) < 65536 else head)
                if len(body) >= 65536:
                    transport.write(body)
                # After the write, not before (a new C parser, ~4 us): no byte of the answer can be read
                # before this task waits below, and until then the parser is not needed.
                protocol.set_response_params(read_until_eof=True, auto_decompress=True, read_bufsize=READ_BUFSIZE)
                try:
                    message, content = await protocol.read()  # the final answer: the protocol drops 1xx
                except HttpProcessingError as exc:  # its message quotes the upstream's bytes: named, not quoted
                    raise MalformedAnswer(type(exc.__cause__ or exc).__name__) from exc
            except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError):
                protocol.close()
                if fresh or protocol.heard or self._clock() - written > REPLAY_WINDOW:
                    raise  # a new connection, an answer begun, or an upstream that had the request a while
                # A reused connection the upstream closed as the request went out (its keep-alive ran
                # out first: the two crossed on the wire). Nothing came back, so nothing was answered;
                # the target is not at fault. Once more, on a new connection.
                fresh = True
                protocol = await self._connect(endpoint.origin, connect_timeout)
                continue
            except BaseException:
                protocol.close()
                raise
            if not relayable(message.code):
                protocol.close()
                raise BadStatus(message.code)
            return Answer(message.code, message.headers, content, protocol)

    def release(self, answer: Answer) -> None:
        """Give the connection back when its answer was read to the end, else close it."""
        protocol = answer.protocol
        transport = protocol.transport
        now = self._clock()
        if (answer.content.at_eof() and not protocol.should_close and transport is not None
                and not transport.is_closing() and not transport.get_write_buffer_size() and not self._closed
                and self._strays.get(protocol.origin, 0.0) <= now):
            idle = self._idle.get(protocol.origin)
            if idle is None:
                idle = self._idle[protocol.origin] = deque()
            idle.append((protocol, now))
            protocol.idle = True
            self._trim(idle, now)  # the bottom, which a busy origin's reuse never reaches
            if self._sweeper is None:
                self._sweeper = asyncio.get_running_loop().call_later(self._keepalive, self._sweep)
            return
        protocol.close()

    def _trim(self, idle: deque[tuple[Connection, float]], now: float) -> None:
        """Close the oldest idle connections (at the bottom) that are past keep-alive or already
        closed by the upstream."""
        while idle and (now - idle[0][1] >= self._keepalive or not idle[0][0].is_connected()):
            idle.popleft()[0].close()

    def close(self) -> None:
        self._closed = True
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        for idle in self._idle.values():
            for protocol, _ in idle:
                protocol.close()
        self._idle.clear()

    def _reuse(self, origin: Origin) -> Connection | None:
        """The youngest idle connection that has been quiet for ``quiet`` seconds and has nothing
        waiting on its socket; younger ones stay for later, dead ones are closed."""
        idle = self._idle.get(origin)
        if not idle:
            return None
        now = self._clock()
        i = len(idle) - 1
        while i >= 0 and now - idle[i][1] < self._quiet:  # released in order: the young are on top
            i -= 1
        while i >= 0:
            protocol, since = idle[i]
            del idle[i]
            i -= 1
            if (protocol.is_connected() and not protocol.should_close and now - since < self._keepalive
                    and quiet(protocol)):
                return protocol
            protocol.close()
        return None

    def _stray(self, origin: Origin) -> None:
        """An upstream of ``origin`` said something nobody asked for: its answers may no longer
        line up with its requests, so none of its connections goes back to the pool for a while."""
        if len(self._strays) >= ENDPOINTS_MAX:
            self._strays.clear()
        self._strays[origin] = self._clock() + DISTRUST
        for protocol, _ in self._idle.pop(origin, ()):
            protocol.close()

    async def _connect(self, origin: Origin, timeout: float | None) -> Connection:
        if self._closed:
            raise aiohttp.ClientConnectionError("upstream client closed")
        loop = asyncio.get_running_loop()
        tls = origin.scheme == "https"
        try:
            async with asyncio.timeout(timeout):
                infos = await self._resolve(loop, origin)
                try:
                    sock = await aiohappyeyeballs.start_connection(infos, happy_eyeballs_delay=HAPPY_EYEBALLS,
                                                                   interleave=1, loop=loop)
                except OSError:
                    self._dns.pop((origin.host, origin.port), None)  # the addresses may have moved
                    raise
                try:
                    _, protocol = await loop.create_connection(
                        lambda: Connection(loop, origin, self._stray), sock=sock,
                        ssl=self._ssl if tls else None, server_hostname=origin.name if tls else None,
                    )
                except BaseException:
                    sock.close()
                    raise
        except TimeoutError:
            raise  # an OSError too, but the walker's word for it is "timeout"
        except ssl.SSLError as exc:
            raise ConnectFailed("tls", f"TLS failure talking to upstream: {exc}") from exc
        except socket.gaierror as exc:
            raise ConnectFailed("dns", f"cannot resolve upstream host {origin.host}: {exc}") from exc
        except OSError as exc:
            raise ConnectFailed("refused", f"cannot connect to upstream {origin.host}:{origin.port}: {exc}") from exc
        return protocol

    async def _resolve(self, loop: asyncio.AbstractEventLoop, origin: Origin) -> list[Any]:
        """The origin's addresses, kept for ``DNS_TTL`` (as aiohttp's connector kept them): only a
        new connection asks, and a cold burst to one origin opens many at once."""
        key = (origin.host, origin.port)
        now = self._clock()
        known = self._dns.get(key)
        if known is not None and known[1] > now:
            return known[0]
        infos = await loop.getaddrinfo(origin.host, origin.port, type=socket.SOCK_STREAM)
        if len(self._dns) >= ENDPOINTS_MAX:
            self._dns.clear()
        self._dns[key] = (infos, now + DNS_TTL)
        return infos


@functools.cache
def default_tls() -> ssl.SSLContext:
    """Certificates and host names verified against the system's CA store; ALPN says HTTP/1.1.
    Made once per process (loading the store takes a loaded box tenths of a second); a box's
    supervisor makes it before it forks its workers."""
    context = ssl.create_default_context()
    context.set_alpn_protocols(["http/1.1"])
    return context
