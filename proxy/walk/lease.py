"""Lease: a committed stream, held by the relay until the client has the whole answer.

The lease carries what it needs to finish itself: its :class:`~proxy.walk.slot.Slot` (the
call, the limiter place, the in-flight count), the deadline keeper that watches it, the
task set its background drain joins, and the route's cooldown for a failure after commit.
Nothing points back at the walker.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..config import Cooldown, Target
from ..providers.base import StreamTranslator
from ..sockets import reset
from ..state.tracker import STREAMED
from ..upstream.transport import UPSTREAM_ERRORS, Upstream
from .deadlines import Deadlines, Expired
from .slot import Slot

__all__ = ["MAX_DRAIN", "Background", "Lease"]

MAX_DRAIN = 64 * 1024  # read after a stream's end marker before giving up on the connection


class Background:
    """Tasks that outlive their request (a drain, a racer still being measured), held until
    they end so they are not collected midway, and stopped together at shutdown."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()

    def keep(self, task: asyncio.Task[Any]) -> None:
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def close(self) -> None:
        """At shutdown their connections are closing anyway."""
        for task in list(self._tasks):
            task.cancel()


DRAINING = "firstbyte is shutting down"  # the reason a drain's grace cut a stream: no fault of the target


@dataclass(slots=True, eq=False)
class Lease:
    target: Target
    upstream: Upstream
    first: bytes  # the events up to and with the first token, in the client's shape (answer.py)
    translator: StreamTranslator
    slot: Slot
    started: float
    idle: float
    total: float
    clock: Callable[[], float]
    deadlines: Deadlines
    background: Background
    cooldown: Cooldown
    waiting_since: float | None = None  # the relay is waiting for the upstream since then
    expired: str | None = None  # why the deadline keeper cut it
    finished: bool = False
    client: asyncio.WriteTransport | None = None  # the relay's client connection, for the drain's cut
    tail: bool = False  # the client has the whole answer; only the upstream's end is being read
    stalled: str | None = None  # the deadline came while the client was not reading: its doing
    broken: Exception | None = None  # how translating ``first`` failed: the relay tells it after ``first``
    sample: tuple[float, float] | None = None  # (time to first token, when): told the state by ``committed``

    def committed(self) -> None:
        """The client has the opening (or never will): the state hears this stream's first token now.

        Measured at the commit (``Walker._settle``), told after the relay's first write: the tracker's
        sample, the breaker's success and the fleet's event are work the client's first token need
        not wait for. Told once, and always before a failure after commit (``finish``), as before."""
        sample = self.sample
        if sample is not None:
            self.sample = None
            slot = self.slot
            slot.state.first_token(slot.ts, sample[0], sample[1], STREAMED, slot.load)

    def expire(self, reason: str) -> None:
        """Past its idle or total deadline: wake the relay's pending read with the reason.

        When the relay is not waiting for the upstream it is waiting for the client, whose socket
        takes no more (a write returns at once otherwise): no read would ever come, so the client's
        connection is cut. That is the client's doing, and the target is not blamed."""
        self.expired = reason
        self.upstream.abort(Expired(reason))
        client = self.client
        if self.waiting_since is None and client is not None and not self.tail and reason != DRAINING \
                and not client.is_closing():
            self.stalled = f"client stopped reading (the stream reached its {reason})"
            reset(client)

    def cut(self) -> None:
        """The drain's grace is over: wake the relay's read, and when the relay is stuck writing to
        a client that reads no more (its buffer past the high-water mark, so no read will come, nor
        could an error event get through), close that client's connection."""
        self.expire(DRAINING)
        client = self.client
        if client is not None and not client.is_closing() and \
                client.get_write_buffer_size() >= client.get_write_buffer_limits()[1]:
            client.abort()

    def finish_after_end(self) -> None:
        """The client has the whole answer (the stream's end marker came): read what the upstream
        still sends, its own end of body, in the background, then release.

        Releasing an unfinished body closes the connection instead of pooling it, and
        waiting for that end on the relay's path makes the client wait for it too."""
        if self.upstream.at_eof():
            self.finish()
            return
        self.tail = True
        self.background.keep(asyncio.get_running_loop().create_task(self._drain()))

    def finish(self, failure: str | None = None) -> None:
        """Release the slot and the connection; a failure after commit counts against the target."""
        if self.finished:
            return
        self.finished = True
        self.committed()
        self.deadlines.calls.discard(self)
        self.slot.release()
        if failure is not None and self.expired != DRAINING:
            slot = self.slot
            slot.state.failed(slot.ts, self.clock(), self.cooldown, failure)

    async def _drain(self) -> None:
        """Up to ``MAX_DRAIN`` bytes after the end marker, each read under the lease's idle and
        total deadlines. More than that, a stall or a cut only costs the connection: the client's
        answer was whole, so the target is not blamed."""
        left = MAX_DRAIN
        try:
            self.waiting_since = self.clock()
            while data := await self.upstream.chunk():
                left -= len(data)
                if left < 0:
                    break
        except UPSTREAM_ERRORS:
            pass
        finally:
            self.finish()
