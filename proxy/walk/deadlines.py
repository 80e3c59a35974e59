"""Deadlines of upstream calls, kept by one sweeper: first chunk, idle and total.

aiohttp's ``sock_read`` and ``total`` timeouts re-arm a timer on every socket
read, which measured as the single largest cost firstbyte added to a relayed
call, and ``asyncio.timeout`` around each attempt cost another few percent.
Instead each call stamps when it started (and, once committed, when it started
waiting for the upstream), and one task per gateway looks at every open call
ten times per shortest deadline. An attempt still waiting for its first chunk
is cancelled and the walker reports a timeout; a committed call gets an
exception set on its reader, so the relay ends the client's stream with an
error event, as it would for any cut.

``sweep()`` is pure (it takes ``now``), so the rules are tested without time.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from typing import Protocol


class Expired(TimeoutError):
    """Set on a stalled upstream reader; the relay reports ``reason``."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class Watched(Protocol):
    started: float  # when the attempt began
    waiting_since: float | None  # when it started waiting for the upstream; None while writing
    idle: float
    total: float

    def expire(self, reason: str) -> None: ...


class Countdown:
    """A watched thing with a single deadline, ``limit`` after ``started``: an attempt waiting for
    its first chunk, a hedge timer. Subclasses say what expiring does."""

    __slots__ = ("idle", "started", "total", "waiting_since")

    def __init__(self, started: float, limit: float) -> None:
        self.started = started
        self.total = limit
        self.idle = limit
        self.waiting_since: float | None = None

    def expire(self, reason: str) -> None:
        raise NotImplementedError


def sweep(calls: Iterable[Watched], now: float) -> list[tuple[Watched, str]]:
    """The calls past a deadline, with the reason: ``total timeout`` wins over ``idle timeout``."""
    out: list[tuple[Watched, str]] = []
    for call in calls:
        if now - call.started > call.total:
            out.append((call, "total timeout"))
        elif call.waiting_since is not None and now - call.waiting_since > call.idle:
            out.append((call, "idle timeout"))
    return out


class Deadlines:
    """The open calls and the task that expires the stalled ones.

    Hedge timers (``race.py``) are short and few, calls are long and many: timers sit in a set
    of their own, looked at every ``fine`` seconds while there are any, so a route that hedges
    after a tenth of a second does not make the sweeper walk thousands of held streams ten
    times as often."""

    def __init__(self, clock: Callable[[], float], interval: float = 0.25) -> None:
        self.clock = clock
        self.interval = interval
        self.fine = interval
        self.calls: set[Watched] = set()
        self.timers: set[Watched] = set()
        self._swept = 0.0

    def watch_timer(self, timer: Watched) -> None:
        self.timers.add(timer)

    def forget_timer(self, timer: Watched) -> None:
        self.timers.discard(timer)

    def tune(self, limits: Iterable[float], timers: Iterable[float] = ()) -> None:
        """Look ten times per shortest idle or first-chunk period, between 20 ms and 1 s, so a
        deadline fires at most a tenth of its length late (never early); hedge timers likewise
        by the shortest hedge delay, down to 10 ms."""
        shortest = min(limits, default=10.0)
        self.interval = min(1.0, max(0.02, shortest / 10))
        self.fine = min(self.interval, max(0.01, min(timers, default=10.0) / 10))

    def expire_due(self) -> int:
        return self._expire(self.calls)

    def fire_due(self) -> int:
        return self._expire(self.timers)

    def _expire(self, watched: set[Watched]) -> int:
        due = sweep(list(watched), self.clock())
        for call, reason in due:
            watched.discard(call)
            call.expire(reason)
        return len(due)

    async def run(self) -> None:
        """Wake every ``fine`` seconds (only a hedged route makes it finer than ``interval``): a
        wake with no timer due costs a set check; the calls are swept every ``interval``."""
        while True:
            await asyncio.sleep(self.fine)
            if self.timers:
                self.fire_due()
            now = self.clock()
            if now - self._swept >= self.interval * 0.9:
                self._swept = now
                self.expire_due()
