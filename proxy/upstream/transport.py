"""How an upstream request leaves: the :class:`Transport` seam and its real HTTP one.

A transport hands the walker an :class:`Upstream`: a status, headers, and the
body as chunks as they arrive. The gateway picks one transport per provider kind
when it is built (the simulator's is ``proxy/sim/transport.py``). Nothing here
decides anything, but this is the edge where aiohttp's exceptions stop: :func:`failure_of`
names a foreign failure in our words, so ``classify.py`` and the relay know no aiohttp.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import aiohttp

from ..bounds import YIELD_EVERY
from ..config import Provider
from .connection import InterimFlood
from .http1 import BadStatus, ConnectFailed, MalformedAnswer
from .session_pool import UpstreamAnswer, UpstreamPool


@dataclass(slots=True)  # built per request: a frozen init costs about three times as much
class UpstreamRequest:
    """What an adapter built for one target, as it goes on the wire (``extra``: what an in-process
    transport reads instead of bytes)."""

    method: str
    url: str
    headers: Mapping[str, str]
    body: bytes
    extra: dict[str, Any] = field(default_factory=dict)


class Upstream(Protocol):
    status: int
    headers: Mapping[str, str]

    @property
    def chunk(self) -> Callable[[], Awaitable[bytes]]:
        """Reads the next piece of body as it arrived; b"" at the end."""
        ...

    async def read(self, limit: int) -> bytes:
        """The rest of the body, at most ``limit`` bytes (more is an error)."""
        ...

    def at_eof(self) -> bool:
        """The whole body has been read."""
        ...

    def abort(self, exc: BaseException) -> None:
        """Make a pending or next read raise ``exc`` (a deadline passed)."""
        ...

    def close(self) -> None:
        """Drop the call; after a full read the connection goes back to the pool."""
        ...


class Transport(Protocol):
    async def send(self, provider: Provider, req: UpstreamRequest) -> Upstream:
        """Send ``req``; return once the status and headers are in."""
        ...


class BodyTooLarge(Exception):
    pass


# What a read or a send of an upstream call may raise when the wire fails (not our own errors).
UPSTREAM_ERRORS: tuple[type[BaseException], ...] = (TimeoutError, aiohttp.ClientError, OSError)


def failure_of(exc: BaseException) -> tuple[str, str] | None:
    """A transport failure's word and message, or None when ``exc`` is not one.

    The order matters: a failed connect is a client error too."""
    if isinstance(exc, asyncio.TimeoutError | aiohttp.ServerTimeoutError):
        return "timeout", "upstream did not answer in time"
    if isinstance(exc, ConnectFailed):
        return exc.kind, exc.message
    if isinstance(exc, BadStatus):
        return "bad upstream status", str(exc)
    if isinstance(exc, InterimFlood):
        return "interim flood", str(exc)
    if isinstance(exc, MalformedAnswer):
        return "reset", f"upstream sent a malformed answer: {exc}"
    if isinstance(exc, ssl.SSLError):
        return "tls", f"TLS failure talking to upstream: {exc}"
    if isinstance(exc, aiohttp.ClientError | OSError):
        return "reset", f"upstream connection failed: {type(exc).__name__}"
    return None


def break_of(exc: BaseException) -> str:
    """How a committed stream broke, in the words its error event and the access log use."""
    if isinstance(exc, asyncio.TimeoutError):
        return "idle timeout"
    if isinstance(exc, aiohttp.ClientPayloadError):
        return "stream cut"
    return type(exc).__name__


class HttpUpstream:
    """An answer of :mod:`proxy.upstream.http1` as an :class:`Upstream`.

    An identity body is read with aiohttp's own ``readany`` (no wrapper per
    chunk: this is the relay's hot path). A compressed one is inflated by aiohttp
    from bytes already received, without waiting for the socket, so its reads
    give the loop a turn every ``YIELD_EVERY`` decoded bytes: otherwise a fast,
    highly compressed stream starves the deadline sweeper and every other request.
    Its bytes are the upstream's, as they came: the walker scrubs what is not an answer.
    """

    __slots__ = ("_answer", "_content", "_encoded", "_pool", "_unyielded", "chunk", "headers", "status")

    def __init__(self, answer: UpstreamAnswer, pool: UpstreamPool) -> None:
        self._answer = answer
        self._pool = pool
        self._content = answer.content
        self.status = answer.status
        self.headers: Mapping[str, str] = answer.headers
        self._encoded = answer.headers.get("content-encoding", "identity").lower() != "identity"
        self._unyielded = 0
        self.chunk: Callable[[], Awaitable[bytes]] = self._inflated if self._encoded else self._content.readany

    async def _inflated(self) -> bytes:
        data = await self._content.readany()
        self._unyielded += len(data)
        if self._unyielded >= YIELD_EVERY:
            self._unyielded = 0
            await asyncio.sleep(0)  # the sweeper may expire this call meanwhile: the next read raises
        return data

    async def read(self, limit: int) -> bytes:
        parts: list[bytes] = []
        size = 0
        read = self.chunk
        while data := await read():
            size += len(data)
            if size > limit:
                raise BodyTooLarge(f"upstream body over {limit} bytes")
            parts.append(data)
        return b"".join(parts)

    def at_eof(self) -> bool:
        return self._content.at_eof()

    def abort(self, exc: BaseException) -> None:
        self._content.set_exception(exc)

    def close(self) -> None:
        self._pool.release(self._answer)  # type: ignore[arg-type]  # the answer came from this pool


class HttpTransport:
    """Upstream calls over :class:`~proxy.upstream.http1.Pool`: the only deadline it keeps is the
    connect one; first chunk, idle and total are kept by ``proxy.walk.deadlines``, without a
    timer armed per attempt or re-armed on every read."""

    def __init__(self, pool: UpstreamPool) -> None:
        self.pool = pool

    async def send(self, provider: Provider, req: UpstreamRequest) -> Upstream:
        answer = await self.pool.request(req.method, req.url, req.headers, req.body, provider.timeouts.connect)
        return HttpUpstream(answer, self.pool)
