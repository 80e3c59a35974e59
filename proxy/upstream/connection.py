"""One upstream connection, and the bytes it refuses: interim floods and answers nobody asked for.

:class:`Connection` is aiohttp's client protocol (``ResponseHandler``, its C parser) with two
guards in front of the parser, both about what an upstream may say on a connection the pool
shares between callers (docs/adr/0015):

- **Interim answers are bounded.** Until the final head of an answer is in, bytes reach the
  parser in slices of ``SLICE``, so one read cannot become thousands of ``103 Early Hints``
  messages in one callback; past ``INTERIM_MAX`` interim answers or ``HEAD_BYTES`` of heads the
  read stops and the call fails with :class:`InterimFlood` (failover-safe). Interim answers are
  counted and dropped here: the caller only ever sees the final one.
- **Nothing unasked is read.** Once the final answer's body has ended, the upstream has nothing
  more to say until the next request: a byte it sends anyway (a second answer, half a head) is
  never parsed, the connection is cut and its origin is told (``on_stray``), whether the
  connection sits idle in the pool or its answer is still being relayed. :func:`quiet` checks the
  socket itself before reuse, for bytes (or a close) the loop has not delivered yet.
"""

from __future__ import annotations

import asyncio
import select
from collections.abc import Callable
from typing import Any, NamedTuple

import aiohttp
from aiohttp.client_proto import ResponseHandler

__all__ = ["HEAD_BYTES", "INTERIM_MAX", "Connection", "InterimFlood", "Origin", "quiet"]

INTERIM_MAX = 8  # interim (1xx) answers before the final one: 100 Continue, 102, 103 come once or twice
HEAD_BYTES = 64 * 1024  # the heads of an answer, interim and final together (aiohttp's parser allows ~1 MB)
SLICE = 4096  # bytes handed to the parser at once before the final head: at most ~150 tiny heads
_STATUS_DIGIT = 9  # "HTTP/1.1 103": where the status code starts
_READABLE = select.POLLIN | select.POLLPRI  # poll adds POLLHUP and POLLERR by itself


class Origin(NamedTuple):
    scheme: str
    host: str  # as resolved: a trailing dot kept (no search-domain expansion)
    port: int

    @property
    def name(self) -> str:  # for Host, SNI and the certificate check: without the dot, as aiohttp
        return self.host.rstrip(".")


class InterimFlood(aiohttp.ClientError):
    """The upstream sent interim (1xx) answers past the bound without a final one."""


class Connection(ResponseHandler):
    """aiohttp's client protocol, knowing which origin's idle list it goes back to, and
    refusing what no request asked for (module docstring)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, origin: Origin,
                 on_stray: Callable[[Origin], None] | None = None) -> None:
        super().__init__(loop)
        self.origin = origin
        self.on_stray = on_stray
        self.idle = False
        self.heard = False  # the upstream has said something since the connection was last taken
        self.awaiting = False  # a request is out and the final head of its answer is not in yet
        self.answered = False  # the final answer's body has ended: a later byte is unsolicited
        self.cut = False  # refused for good: what still arrives is dropped unread
        self.interims = 0
        self.head_bytes = 0
        self.fd = -1  # the socket's, for the readiness check before reuse

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        sock = transport.get_extra_info("socket")
        self.fd = -1 if sock is None else sock.fileno()

    def asked(self) -> None:
        """A request is about to be written: its answer is the only thing the upstream may say."""
        self.idle = self.heard = self.answered = False
        self.awaiting = True
        self.interims = self.head_bytes = 0

    def data_received(self, data: bytes) -> None:
        if not data:  # aiohttp resuming a paused parser, not the socket
            super().data_received(data)
            return
        if self.cut:
            return
        if self.idle or self.answered:
            self._unsolicited()
            return
        self.heard = True
        if not self.awaiting:
            super().data_received(data)  # the answer's body: the hot path
        elif self.head_bytes == 0 and len(data) > _STATUS_DIGIT and data[_STATUS_DIGIT] != 0x31:
            self.head_bytes = len(data)  # a read that begins with a final head ("HTTP/1.1 200"): at once
            super().data_received(data)
        else:
            self._heads(data)

    def _heads(self, data: bytes) -> None:
        """Feed the parser slice by slice while only interim answers come, checking the bounds
        between slices; the rest goes at once as soon as the final head is in."""
        pos = 0
        while self.awaiting and pos < len(data):
            piece = data[pos:pos + SLICE]
            pos += len(piece)
            self.head_bytes += len(piece)
            super().data_received(piece)
            if self.interims > INTERIM_MAX or (self.awaiting and self.head_bytes > HEAD_BYTES):
                self._flood()
                return
        if pos < len(data) and not self.cut and self.transport is not None:
            super().data_received(data[pos:])

    def feed_data(self, data: Any, size: int = 0) -> None:
        """A message the parser finished: interim ones are counted and dropped, the final one
        queued for the caller, and anything after it is unsolicited (it came in the same read)."""
        message, payload = data
        if self.cut:
            return
        if not self.awaiting:
            self._unsolicited()
            return
        if 100 <= message.code < 200 and message.code != 101:
            self.interims += 1
            return
        self.awaiting = False
        super().feed_data(data, size)
        payload.on_eof(self._ended)

    def _ended(self) -> None:
        self.answered = True

    def _flood(self) -> None:
        """Stop reading (the caller's failure closes the connection) and fail the call, even when
        the final answer came in the same slice."""
        self.force_close()
        self.cut = True
        self._buffer.clear()
        if self.transport is not None:
            self.transport.pause_reading()
        self.set_exception(InterimFlood(
            f"upstream sent {self.interims} interim (1xx) answers and {self.head_bytes} bytes of heads "
            f"without a final answer (at most {INTERIM_MAX} and {HEAD_BYTES} are read)"))

    def _unsolicited(self) -> None:
        """Bytes no request asked for: never read as the next caller's answer."""
        self.cut = True
        self.force_close()
        if self.transport is not None:
            self.close()
        if self.on_stray is not None:
            self.on_stray(self.origin)


def quiet(protocol: Connection) -> bool:
    """Nothing waits on the socket: no byte and no close the loop has not delivered yet. One
    ``poll`` with no timeout, a few microseconds (scripts/pool_reuse.py); ``poll``, not ``select``,
    for any fd number."""
    if protocol.transport is None or protocol.fd < 0:
        return False
    poller = select.poll()
    poller.register(protocol.fd, _READABLE)
    return not poller.poll(0)
