"""The race for the first token (docs/adr/0008): targets of a ``hedge`` route side by side.

A route without ``hedge`` is walked one target at a time (``Walker.walk``). With it, each
target's attempts (its retries included) run in a task of their own, a *racer*, and this module
coordinates them:

- the leader starts; so does the next target when the plan explores or measures (``together``)
  and the route's hedge budget pays for it;
- when the leader has no first token by ``hedge.after``, the next target starts too (once per
  request, budget permitting); the timer is one more call the deadline sweeper watches, so a
  request that never hedges arms no timer of its own;
- the first racer to commit (first token, or a client error returned as it is) wins; every
  other racer is cancelled at once (its upstream call aborted, its connection closed, nothing
  counted against it), except an explored or measured one, which runs on to its own first token
  so its figure is measured, then lets go;
- a racer that fails does not end the race: when none is left running, the walk goes on with
  the rest of the order, as a plain walk would.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from .config import Hedge, Provider, Route, Target
from .providers import Call
from .routing.decision import Attempt, Racer
from .routing.hedge import hedge_delay
from .routing.plan import Plan
from .state.budget import HedgeBudget
from .state.tracker import BUFFERED, STREAMED
from .walk import Walker, WalkResult

__all__ = ["Race", "walk_route"]


async def walk_route(walker: Walker, providers: Mapping[str, Provider], plan: Plan, call: Call) -> WalkResult:
    """Walk the planned order: one target at a time, or as a race on a route with ``hedge``."""
    route = plan.route
    if route.hedge is None:
        return await walker.walk(route, plan.targets, call, providers, rescued=plan.rescued)
    race = Race(walker, route, route.hedge, plan.targets, call, providers, plan.rescued)
    return await race.run(plan.together, plan.decision.first_reason)


class _Racer:
    __slots__ = ("measuring", "reserved", "result", "started", "target", "task")

    def __init__(self, target: Target, started: float) -> None:
        self.target = target
        self.started = started
        self.measuring = False  # explored or measured: runs on to its own first token if it loses
        self.result = WalkResult()
        self.task: asyncio.Task[bool] | None = None
        self.reserved: Any = None  # the target's state, counted in flight until the racer's task runs


def _unreserve(racer: _Racer) -> None:
    ts = racer.reserved
    if ts is not None:
        racer.reserved = None
        ts.in_flight -= 1


class _HedgeTimer:
    """Watched by the deadline sweeper like an attempt: it "expires" when the hedge is due."""

    __slots__ = ("fired", "idle", "started", "total", "waiting_since")

    def __init__(self, started: float, delay: float, fired: asyncio.Future[None]) -> None:
        self.started = started
        self.total = delay
        self.idle = delay
        self.waiting_since: float | None = None
        self.fired = fired

    def expire(self, reason: str) -> None:
        if not self.fired.done():
            self.fired.set_result(None)


class Race:
    def __init__(self, walker: Walker, route: Route, hedge: Hedge, targets: tuple[Target, ...], call: Call,
                 providers: Mapping[str, Provider], rescued: str | None) -> None:
        self.walker = walker
        self.route = route
        self.hedge = hedge
        self.queue = list(targets)
        self.call = call
        self.providers = providers
        self.rescued = rescued
        self.racers: list[_Racer] = []
        self.roles: list[Racer] = []
        self.winner: _Racer | None = None  # the first racer to commit
        self.hedged = False  # one hedge per request: the budget's share is per request
        self.timer: _HedgeTimer | None = None

    async def run(self, together: int, first_reason: str) -> WalkResult:
        budget = self.walker.state.budget(self.route.name, self.hedge.max_extra)
        budget.deposit()
        first = self._start()
        if together > 1 and self.queue:
            if budget.withdraw():
                # The plan's first is the explored (or unmeasured) target: it is the racer to be
                # measured, and the next in the order leads beside it.
                first.measuring = True
                self.roles.append(Racer(first.target.name, "explore" if first_reason == "explore" else "measure"))
                self.roles.append(Racer(self._start().target.name, "leader"))
                self.hedged = True
            else:
                self.roles.append(Racer(self.queue[0].name, "budget exhausted"))
        try:
            return await self._coordinate(budget)
        finally:
            self._disarm()
            for racer in self.racers:
                task = racer.task
                if task is not None and not task.done() and not (racer.measuring and self.winner is not None):
                    task.cancel()

    async def _coordinate(self, budget: HedgeBudget) -> WalkResult:
        while True:
            running = [r for r in self.racers if r.task is not None and not r.task.done()]
            if not running:
                if not self.queue:
                    return self._finish(None)
                self._start()  # a plain failover: every racer before it failed
                continue
            if self.timer is None and not self.hedged and self.queue and len(running) == 1:
                self._arm(running[0])
            waits: set[asyncio.Future[Any]] = {r.task for r in running if r.task is not None}
            if self.timer is not None:
                waits.add(self.timer.fired)
            done, _ = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            if self.timer is not None and self.timer.fired in done:
                self._disarm()
                self._hedge(budget, running[0])
            for racer in running:
                if racer.task in done and racer.task is not None and racer.task.result():
                    return self._finish(racer)

    def _hedge(self, budget: HedgeBudget, leader: _Racer) -> None:
        """The leader has no first token by ``after``: the next target races it, if paid for."""
        self.hedged = True
        if not self.queue:
            return
        if not budget.withdraw():
            self.roles.append(Racer(self.queue[0].name, "budget exhausted"))
            return
        if not self.roles:
            self.roles.append(Racer(leader.target.name, "leader"))
        after = self.walker.clock() - leader.started
        self.roles.append(Racer(self._start().target.name, f"hedge {after:.2f}s"))

    def _start(self) -> _Racer:
        racer = _Racer(self.queue.pop(0), self.walker.clock())
        self.racers.append(racer)
        # In flight from now, not from when its task first runs: requests planned in between (a burst
        # that arrived together) must see it, or they all pick the same unmeasured target.
        ts = racer.reserved = self.walker.state.target(racer.target.key)
        ts.in_flight += 1
        task = racer.task = asyncio.get_running_loop().create_task(self._run(racer))
        task.add_done_callback(lambda _task: _unreserve(racer))  # cancelled before it ever ran
        return racer

    async def _run(self, racer: _Racer) -> bool:
        """One racer: its target's attempts; True when it answered (or returned a client error)
        and was first to. A later answer is let go at once: it was measured, not served."""
        _unreserve(racer)  # the attempt counts itself from here on, with no await in between
        over = await self.walker.try_target(racer.result, self.route, racer.target, self.providers,
                                            self.call, racer.target.name == self.rescued)
        if not over:
            return False
        if self.winner is None:  # no await since the commit: the first to get here won
            self.winner = racer
            return True
        lease = racer.result.lease
        if lease is not None:
            lease.finish()
            racer.result.lease = None
        racer.result.served = None
        attempts = racer.result.attempts
        if attempts:
            last = attempts[-1]
            attempts[-1] = Attempt(last.name, "measured", last.seconds)
        return False

    def _arm(self, leader: _Racer) -> None:
        mode = STREAMED if self.call.stream else BUFFERED
        delay = hedge_delay(self.hedge, self.walker.state.tracker.recent(leader.target.key, mode))
        if delay is None:
            return
        fired: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.timer = _HedgeTimer(leader.started, delay, fired)
        self.walker.deadlines.watch(self.timer)

    def _disarm(self) -> None:
        if self.timer is not None:
            self.walker.deadlines.forget(self.timer)
            self.timer = None

    def _finish(self, winner: _Racer | None) -> WalkResult:
        """The winner's result (or, when all failed, the last failure's) with every racer's
        attempts in the order they started; a racer cut short shows ``lost``, one still being
        measured ``measuring``, with its seconds so far."""
        now = self.walker.clock()
        last = winner or self.racers[-1]
        attempts: list[Attempt] = []
        for racer in self.racers:
            attempts += racer.result.attempts
            task = racer.task
            if racer is not winner and task is not None and not task.done():
                word = "measuring" if racer.measuring and winner is not None else "lost"
                attempts.append(Attempt(racer.target.name, word, now - racer.started))
                if not (racer.measuring and winner is not None):
                    continue
                self.walker.keep(task)
        result = last.result
        result.attempts = attempts
        result.race = tuple(self.roles)
        return result
