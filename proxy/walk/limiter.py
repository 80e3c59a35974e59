"""Per-provider concurrency limit with a bounded queue.

``max_concurrent`` calls run at once; up to ``queue`` more wait for a slot; a
call beyond that is refused at once (the walker records it as ``busy`` and fails
over) so no request ever waits without bound. In a fleet the limit is the fleet's: each
instance runs its share of it (split among the live members, docs/adr/0016), read from
memory, never awaiting Redis. Its waiters are futures, so it lives
with the walk, not in ``state/`` (which holds no asyncio).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable

from ..config import Config


class Busy(Exception):
    """The limit and its queue are full."""


class Limiter:
    __slots__ = ("active", "limit", "queue", "share", "waiters")

    def __init__(self, limit: int, queue: int, share: Callable[[int], int] | None = None) -> None:
        self.limit = limit  # 0 = unlimited
        self.queue = queue
        # In a fleet, this instance's part of ``limit`` now (docs/adr/0016); None: all of it.
        self.share = share
        self.active = 0
        self.waiters: deque[asyncio.Future[None]] = deque()

    def cap(self) -> int:
        """The calls this instance may have running at once now."""
        return self.limit if self.share is None else self.share(self.limit)

    async def acquire(self) -> None:
        cap = self.cap()
        if self.limit == 0 or (self.active < cap and not self.waiters):
            self.active += 1
            return
        if cap == 0 or len(self.waiters) >= self.queue:
            raise Busy  # no share of the fleet's limit here: a waiter would have nothing to wait for
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.waiters.append(waiter)
        try:
            await waiter  # wake() hands a place over: active is already counted
        except BaseException:
            if waiter.done() and not waiter.cancelled():
                self.release()  # we were handed a place but will not use it
            else:
                self.waiters.remove(waiter)
            raise

    def release(self) -> None:
        self.active -= 1
        self.wake()

    def wake(self) -> None:
        """Hand places to waiters while under the cap: after a release, or when this instance's
        share of the fleet's limit grew (a member left, or the fleet link dropped)."""
        cap = self.cap()
        while self.waiters and self.active < cap:
            waiter = self.waiters.popleft()
            if not waiter.done():
                self.active += 1
                waiter.set_result(None)


class Limiters:
    """The limiter of every provider that sets ``max_concurrent``; a reload keeps a provider's
    limiter (its calls and waiters) while its limit and queue stay the same. ``share`` (set by a
    fleet) splits each limit among the fleet's live members."""

    def __init__(self) -> None:
        self.by_provider: dict[str, Limiter] = {}
        self.share: Callable[[int], int] | None = None

    def get(self, provider: str) -> Limiter | None:
        return self.by_provider.get(provider)

    def configure(self, config: Config) -> None:
        limiters: dict[str, Limiter] = {}
        for name, provider in config.providers.items():
            old = self.by_provider.get(name)
            if old is not None and (old.limit, old.queue) == (provider.max_concurrent, provider.queue):
                limiters[name] = old
            elif provider.max_concurrent:
                limiters[name] = Limiter(provider.max_concurrent, provider.queue, self.share)
        self.by_provider = limiters

    def shared(self, share: Callable[[int], int] | None) -> None:
        """Every limit from now on is the fleet's, split by ``share`` (None: each instance's own)."""
        self.share = share
        for limiter in self.by_provider.values():
            limiter.share = share
        self.wake()

    def wake(self) -> None:
        for limiter in self.by_provider.values():
            limiter.wake()
