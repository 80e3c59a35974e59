"""The running gateway: the composition root that builds the parts and hands them to each other.

It holds the config in force and the parts built from it: the state, the deadline keeper, the
limiters, the upstream pool and the walker, the observers' outbox, the cost refresher. Policy
lives in the parts (``routing/randoms.py`` keeps a route's generator across a reload,
``observe/outbox.py`` hands finished exchanges to the observers); the Hub owns the observers
themselves and swaps them into the outbox on reload.

A reload swaps ``config`` in one assignment; a request reads ``gateway.config``
once when it starts, so requests in flight finish on the config they began
with, while state (figures, breakers, history) carries over for targets that
still exist.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable

from .box import Box
from .config import Config
from .config.loaded import Loaded
from .fleet import FleetLink
from .internals import Internals, checked
from .observe import Observer
from .observe.cost_refresher import CostRefresher
from .observe.outbox import Outbox
from .providers import transports
from .routing.randoms import RouteRandoms
from .scrub import Scrubber
from .state import State
from .upstream.session_pool import UpstreamPool, close_pool, upstream_pool
from .upstream.transport import HttpTransport
from .walk.deadlines import Deadlines
from .walk.lease import Lease
from .walk.limiter import Limiters
from .walk.walker import Walker

HEDGE_TICK_BASIS = 0.3  # the sweeper looks every 30 ms on a route hedged by percentile


class Gateway:
    def __init__(
        self,
        config: Config,
        *,
        clock: Callable[[], float] = time.monotonic,
        observers: list[Observer] | None = None,
        internals: Internals | None = None,
    ) -> None:
        self.clock = clock
        self.config = config
        self.state = State()
        self.outbox = Outbox(observers)  # finished exchanges, handed to the observers off the request path
        self.deadlines = Deadlines(clock)
        self.limiters = Limiters()
        self.randoms = RouteRandoms()
        self.scrubber = Scrubber()  # every key of every config applied: scrubbed from upstream text
        self.sized_routes: frozenset[str] = frozenset()
        self.loaded = Loaded()  # when the config in force was taken, and what the reloads did
        self.draining = False
        self.pool: UpstreamPool | None = None  # built at start, on the running loop
        self.internals = internals  # aiohttp's internals as checked at start (proxy/internals.py)
        self.walker: Walker | None = None
        self.costs: CostRefresher | None = None
        self._sweeper: asyncio.Task[None] | None = None
        self.fleet: FleetLink | None = None  # with state.redis: the link to the other instances
        self.box: Box | None = None  # a worker of several (serve under proxy/supervisor.py)
        self.apply(config)

    def apply(self, config: Config) -> None:
        """Adopt a validated config (at start and on reload)."""
        self.scrubber.add([p.api_key for p in config.providers.values() if p.api_key] + list(config.clients.keys))
        before = self.config.providers
        moved = frozenset(name for name, p in config.providers.items()
                          if name in before and (before[name].kind, before[name].base_url) != (p.kind, p.base_url))
        self.state.configure(config, moved)
        self.limiters.configure(config)
        limits = [t for p in config.providers.values() for t in (p.timeouts.idle, p.timeouts.first_chunk)]
        hedges = [route.hedge.after_secs or HEDGE_TICK_BASIS  # a percentile: some tenths of a second
                  for route in config.routes.values() if route.hedge is not None]
        self.deadlines.tune(limits, hedges)
        self.sized_routes = frozenset(
            name
            for name, route in config.routes.items()
            if any(t.context_window is not None for t in route.targets)
        )
        self.randoms.apply(config.routes)
        self.config = config
        self.loaded.at = time.time()
        if self.fleet is not None:
            self.fleet.configure(config)

    def rng(self, route: str) -> random.Random:
        return self.randoms.of(route)

    async def start(self) -> None:
        # No cookie jar, no redirects, no User-Agent: one pool serves every client, and an
        # upstream's Set-Cookie for one client's call must never ride along on another's.
        if self.internals is None:
            self.internals = await checked()
        self.internals.log()
        self.pool = upstream_pool(self.internals)
        http = HttpTransport(self.pool)
        self.walker = Walker(self.state, transports(http), clock=self.clock, deadlines=self.deadlines,
                             limiters=self.limiters, scrubber=self.scrubber)
        self._sweeper = asyncio.get_running_loop().create_task(self.deadlines.run(), name="deadlines")
        # Measured cost per call for the score strategy, from whatever ledger the config names now.
        self.costs = CostRefresher(lambda: self.config.ledger.path, self.state)
        self.costs.start()
        if self.config.state.redis is not None:  # warm start: the fleet's figures before we say ready
            self.fleet = FleetLink(self.config.state, self.state, self.clock)
            self.fleet.configure(self.config)
            self.limiters.shared(self.fleet.share, self.fleet.members)  # max_concurrent is the fleet's (docs/adr/0016)
            self.fleet.on_change = self.limiters.wake
            await self.fleet.start()

    async def close(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
        if self.walker is not None:
            self.walker.close()
        if self.costs is not None:
            await self.costs.close()
        if self.fleet is not None:
            await self.fleet.close()
        self.outbox.notify()  # what finished during the drain reaches the observers; their owner closes them
        if self.pool is not None:
            await close_pool(self.pool)

    def cut_streams(self) -> int:
        """A drain's grace is over: end every relayed stream now, each with an error event that
        says why (``DRAINING``), logged as the drain's cut and not counted against its target."""
        leases = [call for call in self.deadlines.calls if isinstance(call, Lease) and not call.finished]
        for lease in leases:
            lease.cut()
        return sum(not lease.tail for lease in leases)  # a post-end drain's client has its whole answer
