"""Per-provider concurrency limit with a bounded queue.

``max_concurrent`` calls run at once; up to ``queue`` more wait for a slot; a
call beyond that is refused at once (the walker records it as ``busy`` and fails
over) so no request ever waits without bound. Its waiters are futures, so it lives
with the walk, not in ``state/`` (which holds no asyncio).
"""

from __future__ import annotations

import asyncio
from collections import deque

from ..config import Config


class Busy(Exception):
    """The limit and its queue are full."""


class Limiter:
    __slots__ = ("active", "limit", "queue", "waiters")

    def __init__(self, limit: int, queue: int) -> None:
        self.limit = limit  # 0 = unlimited
        self.queue = queue
        self.active = 0
        self.waiters: deque[asyncio.Future[None]] = deque()

    async def acquire(self) -> None:
        if self.limit == 0 or (self.active < self.limit and not self.waiters):
            self.active += 1
            return
        if len(self.waiters) >= self.queue:
            raise Busy
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.waiters.append(waiter)
        try:
            await waiter  # release() hands its slot over: active is already counted
        except BaseException:
            if waiter.done() and not waiter.cancelled():
                self.release()  # we were handed a slot but will not use it
            else:
                self.waiters.remove(waiter)
            raise

    def release(self) -> None:
        while self.waiters:
            waiter = self.waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self.active -= 1


class Limiters:
    """The limiter of every provider that sets ``max_concurrent``; a reload keeps a provider's
    limiter (its calls and waiters) while its limit and queue stay the same."""

    def __init__(self) -> None:
        self.by_provider: dict[str, Limiter] = {}

    def get(self, provider: str) -> Limiter | None:
        return self.by_provider.get(provider)

    def configure(self, config: Config) -> None:
        limiters: dict[str, Limiter] = {}
        for name, provider in config.providers.items():
            old = self.by_provider.get(name)
            if old is not None and (old.limit, old.queue) == (provider.max_concurrent, provider.queue):
                limiters[name] = old
            elif provider.max_concurrent:
                limiters[name] = Limiter(provider.max_concurrent, provider.queue)
        self.by_provider = limiters
