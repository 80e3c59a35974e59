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
import logging
from collections import deque
from collections.abc import Callable

from ..config import Config

log = logging.getLogger("firstbyte.limits")


class Busy(Exception):
    """The limit and its queue are full; with words (``args[0]``), why else there is no place."""


def no_place(limit: int) -> Busy:
    """What the client reads when this instance holds no part of a fleet's limit (docs/adr/0016)."""
    return Busy(f"provider concurrency limit: this gateway worker or instance holds no place of the "
                f"provider's max_concurrent ({limit}), which is split among more workers and instances than it "
                "has places; try again (another may take it), and tell the gateway's operator to set "
                "max_concurrent at least to the number of workers and instances")


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
        if cap == 0:
            raise no_place(self.limit)  # no share of the fleet's limit here: a waiter would have nothing to wait for
        if len(self.waiters) >= self.queue:
            raise Busy
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.waiters.append(waiter)
        try:
            await waiter  # wake() hands a place over (active is already counted), or Busy
        except BaseException:
            if not waiter.done() or waiter.cancelled():
                self.waiters.remove(waiter)
            elif waiter.exception() is None:
                self.release()  # we were handed a place but will not use it
            raise

    def release(self) -> None:
        self.active -= 1
        self.wake()

    def wake(self) -> None:
        """Hand places to waiters while under the cap: after a release, or when this instance's
        share of the fleet's limit grew (a member left, or the fleet link dropped). A share that
        fell to none (a member joined) will not grow while the members stay: its waiters are told
        Busy now and fail over, rather than wait for a place that is not coming."""
        cap = self.cap()
        if cap == 0 and self.limit:
            while self.waiters:
                waiter = self.waiters.popleft()
                if not waiter.done():
                    waiter.set_exception(no_place(self.limit))
            return
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
        self.members: Callable[[], int] = lambda: 1  # the fleet's live members, this one included
        self.placeless: set[str] = set()  # the providers whose limit leaves this instance no place (said once)

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
        if self.share is not None:
            self.placeless.clear()
            self.wake()  # at a reload, a limit that leaves this instance no place is said again

    def shared(self, share: Callable[[int], int] | None, members: Callable[[], int] | None = None) -> None:
        """Every limit from now on is the fleet's, split by ``share`` (None: each instance's own)
        among ``members`` (what a warning names)."""
        self.share = share
        if members is not None:
            self.members = members
        for limiter in self.by_provider.values():
            limiter.share = share
        self.wake()

    def wake(self) -> None:
        """The members or the link changed: each limit re-split, and a share that became none said."""
        for name, limiter in self.by_provider.items():
            limiter.wake()
            if limiter.limit and limiter.cap() == 0:
                if name not in self.placeless:
                    self.placeless.add(name)
                    self._warn(name, limiter.limit)
            else:
                self.placeless.discard(name)

    def _warn(self, name: str, limit: int) -> None:
        """Once each time it happens: at a start or reload, ``firstbyte check`` says it for a box's
        workers (proxy/config/advice.py); a fleet of boxes is known here only."""
        members = self.members()
        log.warning("providers.%s.max_concurrent: %d is split among the fleet's %d live members (workers and "
                    "instances) and this one holds no place: its calls to %s fail over at once (503 busy when "
                    "the route has no other target) while the upstream may idle; set max_concurrent to at "
                    "least %d (docs/adr/0016)", name, limit, members, name, members)
