"""The running gateway: the current config, the state, the walker, and the observers it feeds.

The gateway hands finished exchanges to ``observers`` but does not own them: in
``firstbyte serve`` the Hub builds, swaps and closes them (a test that passes its
own closes its own).

A reload swaps ``config`` in one assignment; a request reads ``gateway.config``
once when it starts, so requests in flight finish on the config they began
with, while state (figures, breakers, history) carries over for targets that
still exist.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import sqlite3
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from .config import Config
from .internals import Internals, checked
from .observe import Finished, Observer
from .observe.ledger_read import measured_costs
from .providers import transports
from .scrub import Scrubber
from .state import State
from .upstream.session_pool import UpstreamPool, close_pool, upstream_pool
from .upstream.transport import HttpTransport
from .walk.deadlines import Deadlines
from .walk.lease import Lease
from .walk.limiter import Limiters
from .walk.walker import Walker

if TYPE_CHECKING:
    from .server.listener import Guard
    from .walk.result import Settling

log = logging.getLogger("firstbyte")


HEDGE_TICK_BASIS = 0.3  # the sweeper looks every 30 ms on a route hedged by percentile
REFRESH_SECS = 30.0  # how often measured costs are read from the ledger
WINDOW_SECS = 7 * 86400.0
MIN_CALLS = 5


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
        self.state = State()
        self.observers: list[Observer] = observers or []
        self.deadlines = Deadlines(clock)
        self.limiters = Limiters()
        self._sweeper: asyncio.Task[None] | None = None
        self._finished: list[Finished] = []
        self.pool: UpstreamPool | None = None
        self.internals = internals  # aiohttp's internals as checked at start (proxy/internals.py)
        self.walker: Walker | None = None
        self.draining = False
        self.loaded_at = time.time()  # when the config in force was taken
        self.reload_ok = True  # the last load was taken (False after a refused reload)
        self.reloads = {"taken": 0, "refused": 0}  # SIGHUP reloads since start, for /metrics
        self.rngs: dict[str, random.Random] = {}
        self._shared_rng = random.Random()
        self.config = config
        self.sized_routes: frozenset[str] = frozenset()
        self.costs: CostRefresher | None = None
        self.guards: list[Guard] = []  # the listeners' connection guards, for /metrics
        self.scrubber = Scrubber()  # every key of every config applied: scrubbed from upstream text
        self.apply(config)

    def apply(self, config: Config) -> None:
        """Adopt a validated config (at start and on reload)."""
        old = self.rngs
        rngs: dict[str, random.Random] = {}
        for name, route in config.routes.items():
            prev = old.get(name)
            same_seed = name in self.config.routes and (
                self.config.routes[name].fastest.seed == route.fastest.seed
            )
            rngs[name] = prev if prev is not None and same_seed else random.Random(route.fastest.seed)
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
        self.rngs = rngs
        self.config = config
        self.loaded_at = time.time()

    def rng(self, route: str) -> random.Random:
        return self.rngs.get(route) or self._shared_rng

    async def start(self) -> None:
        # No cookie jar, no redirects, no User-Agent: one pool serves every client, and an
        # upstream's Set-Cookie for one client's call must never ride along on another's.
        if self.internals is None:
            self.internals = await checked()
        self.internals.log()
        self.pool = upstream_pool(self.internals)
        http = HttpTransport(self.pool, self.scrubber)
        self.walker = Walker(self.state, transports(http), clock=self.clock, deadlines=self.deadlines,
                             limiters=self.limiters)
        self._sweeper = asyncio.get_running_loop().create_task(self.deadlines.run(), name="deadlines")
        # Measured cost per call for the score strategy, from whatever ledger the config names now.
        self.costs = CostRefresher(lambda: self.config.ledger.path, self.state)
        self.costs.start()

    async def close(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
        if self.walker is not None:
            self.walker.close()
        if self.costs is not None:
            await self.costs.close()
        self.notify_observers()  # what finished during the drain reaches the observers; their owner closes them
        if self.pool is not None:
            await close_pool(self.pool)

    def finished(self, finished: Finished) -> None:
        """Queue a finished exchange for the observers.

        The handler calls this before aiohttp writes a buffered response, so the
        observers run on the next turn of the loop, after the write, in batches.
        """
        self._finished.append(finished)
        if len(self._finished) == 1:
            try:
                asyncio.get_running_loop().call_soon(self.notify_observers)
            except RuntimeError:  # no loop: a synchronous caller, tell them now
                self.notify_observers()

    def cut_streams(self) -> int:
        """A drain's grace is over: end every relayed stream now, each with an error event that
        says why (``DRAINING``), logged as the drain's cut and not counted against its target."""
        leases = [call for call in self.deadlines.calls if isinstance(call, Lease) and not call.finished]
        for lease in leases:
            lease.cut()
        return sum(not lease.tail for lease in leases)  # a post-end drain's client has its whole answer

    def finished_when_settled(self, finished: Finished, settling: Settling) -> None:
        """Queue ``finished`` once the losers still being measured have ended, with their own
        outcomes (``measured``, ``capped``…) in its attempts instead of ``measuring``: they are
        bounded by the race's cap, and the access log, metrics and ledger then say what happened."""
        decision = finished.decision
        pending = {task for task in settling.tasks if not task.done()}

        def hand_over() -> None:
            settled = None if decision is None else decision.but(attempts=settling.attempts())
            self.finished(finished._replace(decision=settled))

        def ended(task: asyncio.Task[None]) -> None:
            pending.discard(task)
            if not pending:
                hand_over()

        if not pending:
            hand_over()
        for task in pending:
            task.add_done_callback(ended)

    def notify_observers(self) -> None:
        """Hand every queued exchange to every observer; one failing never affects the others."""
        batch, self._finished = self._finished, []
        for observer in self.observers:
            try:
                for finished in batch:
                    observer.on_finished(finished)
            except Exception:
                log.exception("observer %s failed", type(observer).__name__)


class CostRefresher:
    """Measured cost per call, carried from the ledger into ``State.costs`` for the score strategy.

    The planner is pure and must not touch SQLite, and observers do not write state: this task,
    owned by the gateway that owns the state, reads the ledger's mean cost per clean call (last
    7 days, at least ``MIN_CALLS`` calls, per target and operation) off the event loop every
    ``interval`` seconds and swaps the result in with one assignment. A missing or unreadable
    ledger leaves the last figures in place: the planner falls back to declared prices on its own.
    """

    def __init__(self, path: str | Callable[[], str | None], state: State, interval: float = REFRESH_SECS,
                 clock: Callable[[], float] = time.time) -> None:
        # A callable follows the running config, so a reload that moves or sets the ledger is heard.
        self.path_of: Callable[[], str | None] = path if callable(path) else (lambda: path)
        self.state = state
        self.interval = interval
        self.clock = clock
        self._task: asyncio.Task[None] | None = None  # kept: a bare task may be collected

    async def refresh(self) -> None:
        """Read the ledger once and publish the figures."""
        path = self.path_of()
        if not path:
            return
        try:
            costs = await asyncio.to_thread(measured_costs, path, WINDOW_SECS, MIN_CALLS, self.clock())
        except FileNotFoundError:
            return  # the ledger has not written its first row yet
        except sqlite3.Error as exc:
            log.warning("cost refresh from %s failed: %s", path, exc)
            return
        self.state.set_costs(costs)

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="firstbyte-costs")

    async def _run(self) -> None:
        while True:
            await self.refresh()
            await asyncio.sleep(self.interval)

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
