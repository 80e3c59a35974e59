"""The race for the first token (docs/adr/0008): targets of a ``hedge`` route side by side.

A route without ``hedge`` is walked one target at a time (``Walker.walk``). With it, the walk
is the same as long as nobody races: the leading target's attempts run in the request's own
task. A race starts in two ways:

- the plan explores or measures (``together``): the explored or unmeasured target runs in a
  task of its own beside the leader, and runs on to its own first token even when the leader
  wins, so its figure is measured, not guessed, for at most ``measure_cap`` seconds from its
  start (then it is cut, not blamed, and its time so far stands as a lower bound);
- the leader has no first token by ``hedge.after``: the next target starts in a task of its
  own (once per request). The timer is one more call the deadline sweeper watches, so a
  request that never hedges arms no timer and starts no task.

Each extra upstream call is paid from the route's hedge budget (``state/budget.py``). The first
racer to commit (first token, or a client error returned as it is) wins. A losing hedge is
cancelled at once (its upstream call aborted, its connection closed, nothing counted against
it); a leader that loses is stopped the way its first-chunk deadline would stop it, by
cancelling its await, and likewise is not blamed. A racer that fails does not end the race:
when none is left running, the walk goes on with the rest of the order.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping

from ..config import Hedge, Provider, Route, Target
from ..providers import Call
from ..routing.decision import Attempt, Decision, Racer
from ..routing.hedge import hedge_delay, measure_cap
from ..routing.plan import Plan
from ..state.budget import RESERVE
from ..state.tracker import BUFFERED, STREAMED
from .deadlines import Countdown
from .result import Answered, Committed, Settling, Trail, Walked
from .slot import Reservation
from .walker import Walker

__all__ = ["Race", "walk_route"]


Left = Callable[[tuple[Attempt, ...], tuple[Racer, ...]], None]


def walk_route(walker: Walker, providers: Mapping[str, Provider], plan: Plan, call: Call,
               left: Left | None = None) -> Awaitable[Walked]:
    """Walk the planned order: one target at a time, or as a race on a route with ``hedge``.
    (Not a coroutine itself: the caller awaits the walk's, one frame fewer per request.)
    ``left`` hears a race's attempts and racers so far when the client leaves before any answered,
    so the racers it started are still counted."""
    route = plan.route
    order = plan.decision.order
    hedge = route.hedge
    if hedge is None:
        return walker.walk(route, plan.targets, call, providers, rescued=plan.rescued)
    if order and order[0].reason == "pinned":
        # A pin is the client's choice: its fallback is for failures, not for speed, so it never
        # races; it still earns the route its share of the budget, as every request does.
        walker.state.budget(route.name, hedge.max_extra).deposit()
        return walker.walk(route, plan.targets, call, providers, rescued=plan.rescued)
    race = Race(walker, route, hedge, plan.targets, call, providers, plan.rescued)
    race.left = left
    return race.run(plan.together, plan.decision)


class _Racer:
    """A target running in a task of its own beside the leader."""

    __slots__ = ("cap", "capped", "measuring", "reserved", "started", "target", "task", "trail")

    def __init__(self, target: Target, started: float, measuring: bool, reserved: Reservation) -> None:
        self.target = target
        self.started = started
        self.measuring = measuring  # explored or measured: runs on to its own first token if it loses
        self.trail = Trail()
        self.task: asyncio.Task[None] | None = None
        self.reserved = reserved  # in flight until the racer's task runs
        self.cap: asyncio.TimerHandle | None = None  # a loser being measured: when it is cut
        self.capped = False  # the cut came: the cancel is ours, not the loop's


def _cut(racer: _Racer) -> None:
    """The measuring loser's cap: it has taken several times the winner's time, so stop it."""
    racer.cap = None
    task = racer.task
    if task is not None and not task.done():
        racer.capped = True
        task.cancel()


class _HedgeTimer(Countdown):
    """Watched by the deadline sweeper like an attempt: it "expires" when the hedge is due."""

    __slots__ = ("race",)

    def __init__(self, started: float, delay: float, race: Race) -> None:
        Countdown.__init__(self, started, delay)
        self.race = race

    def expire(self, reason: str) -> None:
        self.race.hedge_due()


class Race:
    # Class-level defaults: a request that never races sets only what __init__ does (this is
    # built for every request of a hedged route).
    leader: Target | None = None  # the target running inline now
    leader_started = 0.0
    winner: _Racer | None = None  # a racer that committed first
    rejected: _Racer | None = None  # a racer's client error, kept while another may still answer
    hedged = False  # one hedge per request: the budget's share is per request
    later: list[tuple[float, int]] | None = None  # inline leads after a race began: (start, first attempt)
    refused = False  # the budget said no once: a later no is neither counted nor shown
    timer: _HedgeTimer | None = None
    interrupted = False  # a racer won while the leader ran inline: its await was cancelled
    changed: asyncio.Future[None] | None = None  # a racer finished
    left: Left | None = None  # told what ran when the client leaves before an answer

    def __init__(self, walker: Walker, route: Route, hedge: Hedge, targets: tuple[Target, ...], call: Call,
                 providers: Mapping[str, Provider], rescued: str | None) -> None:
        self.walker = walker
        self.route = route
        self.hedge = hedge
        self.queue = list(targets)
        self.call = call
        self.providers = providers
        self.rescued = rescued
        self.budget = walker.state.budget(route.name, hedge.max_extra)
        self.inline = self.last = Trail()  # the request task's attempts; the last failure's
        self.inline_started = walker.clock()
        self.racers: list[_Racer] = []
        self.roles: list[Racer] = []
        self.task = asyncio.current_task()

    def _open(self, together: int, decision: Decision) -> None:
        """Who starts beside the leader, as the budget allows: the request's deposit, then an
        explored or unmeasured first target raced, refused, or waiting behind the leader."""
        self.budget.deposit()
        if together > 1 and len(self.queue) > 1:
            first_reason = decision.first_reason
            free = self._first_measure(first_reason)
            # A cold burst's measure (its target in flight already) may spend a hedge's token: cold
            # starts are when racing pays most. An explore, or a measure whose free call was spent
            # (a target that keeps failing), leaves one for a hedge.
            if free or self.budget.withdraw(keep=0.0 if free is None else RESERVE):
                # The plan's first is the explored (or unmeasured) target: it races in a task and
                # is measured; the next in the order leads, inline.
                explored = self._start(measuring=True)
                self.roles.append(Racer(explored.target.name, "explore" if first_reason == "explore" else "measure"))
                self.roles.append(Racer(self.queue[0].name, "leader"))
                self.hedged = True
            elif free is None:  # being measured already: it leads (a cold burst spreads), unraced
                self.roles.append(Racer(self.queue[1].name, "budget exhausted"))
                self.refused = True
            else:
                # Learning is free only as a race: unpaid, the explored target waits its turn
                # behind the leader (a hedge may still start it) instead of making the client wait
                # (the header's order says so: ``decision.as_tried``).
                self.roles.append(Racer(self.queue[0].name, "budget exhausted"))
                self.queue.insert(1, self.queue.pop(0))
                self.refused = True

    async def run(self, together: int, decision: Decision) -> Walked:
        self._open(together, decision)
        try:
            if self.queue and await self._lead(self.queue.pop(0)):
                return self._finish(self.inline)
            while self.winner is None:
                if self._running():
                    await self._wait()  # the leader failed while racers run: they are ahead of a failover
                elif self.rejected is not None:  # nobody else answered: the client error is the answer
                    return self._finish(self.rejected.trail, self.rejected)
                elif not self.queue:
                    return self._finish(self.last)  # everyone failed: the last failure is the answer
                elif await self._lead(self.queue.pop(0), again=True):  # a failover: everyone before it failed
                    return self._finish(self.inline)
            return self._finish(self.winner.trail, self.winner)
        except BaseException:
            # The client left (or the loop is closing) after a racer committed, before its lease
            # reached the relay: nobody else will let it go.
            winner = self.winner
            if winner is not None and winner.trail.lease is not None:
                winner.trail.lease.finish()
                winner.trail.lease = None
            elif self.left is not None and winner is None and self.inline.served is None and self.roles:
                so_far = self._finish(self.last)  # nobody answered: every racer still running is lost
                self.left(so_far.attempts, so_far.race)
            raise
        finally:
            if self.timer is not None:
                self._disarm()
            for racer in self.racers:
                task = racer.task
                if task is not None and not task.done() and not (racer.measuring and self._won()):
                    task.cancel()

    def _first_measure(self, first_reason: str) -> bool | None:
        """An unmeasured target nobody is measuring yet races even when the budget is empty: it is
        measured once (its figure, or the lower bound of its cap, then stands), so this costs at
        most one call per target per cold start or expired figure, and without it the target
        would serve a client alone, blind (a cold burst spends the bucket's start at once). One
        that failed its free measure gets no second until a sample of it has arrived: a target
        that always fails would otherwise race every request for free (``HedgeBudget.free_measure``).
        None: it is being measured now, by another request."""
        if first_reason != "unmeasured":
            return False
        mode = STREAMED if self.call.stream else BUFFERED
        key = self.queue[0].key
        state = self.walker.state
        if state.in_flight(key, mode):
            return None
        now = self.walker.clock()
        age = state.age(key, now, mode)
        return self.budget.free_measure((key, mode), now, None if age is None else now - age)

    async def _lead(self, target: Target, again: bool = False) -> bool:
        """Run ``target`` in the request's task; True when it committed first. ``again``: a failover
        lead, after the first (which sorts at the request's start, before any racer it began)."""
        self.leader, self.leader_started = target, self.walker.clock()
        if again and self.racers:  # a failover inline after a race began: its attempts sort by its own start
            self.later = [*(self.later or ()), (self.leader_started, len(self.inline.attempts))]
        if not self.hedged and self.queue:
            self._arm(target)
        try:
            over = await self.walker.try_target(self.inline, self.route, target, self.providers, self.call,
                                                target.name == self.rescued)
        except asyncio.CancelledError:
            # Cut: a racer committed first, or the client left (or the loop is closing).
            self.inline.attempts.append(Attempt(target.name, "lost", self.walker.clock() - self.leader_started))
            task = self.task
            if not self.interrupted or task is None or task.uncancel():
                raise  # the client left: every racer goes too
            return False
        finally:
            self.leader = None
            if self.timer is not None:  # most leaders arm none: no call to disarm it
                self._disarm()
        if not over:
            self.last = self.inline
        return over

    def hedge_due(self) -> None:
        """The leader has no first token by ``after``: the next target races it, if paid for."""
        self.timer = None
        if self.hedged or self.leader is None or self.winner is not None or not self.queue:
            return
        self.hedged = True
        if not self.budget.withdraw(count=not self.refused):
            if not self.refused:  # one request is one refusal, however many racers it wanted
                self.roles.append(Racer(self.queue[0].name, "budget exhausted"))
            return
        if not any(role == "leader" for _, role in self.roles):
            self.roles.append(Racer(self.leader.name, "leader"))
        after = self.walker.clock() - self.leader_started
        self.roles.append(Racer(self._start(measuring=False).target.name, f"hedge {after:.2f}s"))

    def _start(self, measuring: bool) -> _Racer:
        target = self.queue.pop(0)
        state = self.walker.state
        reserved = Reservation(state, state.target(target.key), not self.call.stream)
        racer = _Racer(target, self.walker.clock(), measuring, reserved)
        self.racers.append(racer)
        task = racer.task = asyncio.get_running_loop().create_task(self._run(racer))
        task.add_done_callback(lambda _task: reserved.release())  # cancelled before it ever ran
        return racer

    async def _run(self, racer: _Racer) -> None:
        """One racer: its target's attempts. The first to commit wins (and stops the leader); a
        later answer is let go at once: it was measured, not served."""
        racer.reserved.release()  # the attempt's Slot counts it from here on, with no await in between
        try:
            try:
                over = await self.walker.try_target(racer.trail, self.route, racer.target, self.providers,
                                                    self.call, racer.target.name == self.rescued,
                                                    self._won if racer.measuring else None)
            except asyncio.CancelledError:
                task = racer.task
                if not racer.capped or task is None or task.uncancel():
                    if racer.measuring and self._won():  # kept after the answer: the record waits for a word
                        racer.trail.attempts.append(Attempt(racer.target.name, "lost",
                                                            self.walker.clock() - racer.started))
                    raise  # the client left, or the loop is closing
                self._capped(racer)
                return
            if not over:
                self.last = racer.trail
                return
            if racer.trail.served is None and not self._won() and (
                    self.leader is not None or any(r is not racer and r.task is not None and not r.task.done()
                                                   for r in self.racers)):
                # A client error this target alone may give must not cut a racer that can still
                # answer (without the race the leader's answer would have been served).
                self.rejected = self.rejected or racer
                return
            if not self._won():  # no await since the commit: the first to get here won
                self.winner = racer
                if self.leader is not None and self.task is not None:
                    self.interrupted = True
                    self.task.cancel()  # lands in the leader's await, as its deadline would
                return
            lease = racer.trail.lease
            if lease is not None:
                lease.finish()
                racer.trail.lease = None
            if racer.trail.served is not None:  # a late client error keeps its own word
                racer.trail.served = None
                last = racer.trail.attempts[-1]
                racer.trail.attempts[-1] = Attempt(last.name, "measured", last.seconds)
        finally:
            if racer.cap is not None:
                racer.cap.cancel()
                racer.cap = None
            if self.changed is not None and not self.changed.done():
                self.changed.set_result(None)

    def _capped(self, racer: _Racer) -> None:
        """A measuring loser cut at its cap: not a failure (nothing counts against it), and its
        time so far is a lower bound of its first token, recorded as a censored sample that never
        lowers its figure: it ranks the target behind the winner, which is all the order needs, and
        dates its figure, so staleness does not send it straight back into a race."""
        now = self.walker.clock()
        elapsed = now - racer.started
        racer.trail.attempts.append(Attempt(racer.target.name, "capped", elapsed))
        if len(racer.trail.attempts) > 1:
            return  # an earlier try failed: this is no lower bound of a first token
        mode = STREAMED if self.call.stream else BUFFERED
        key = racer.target.key
        state = self.walker.state
        figure = state.figure(key, self.route.fastest, now, mode)
        state.censored(state.target(key), elapsed if figure is None else max(elapsed, figure), now, mode)

    def _won(self) -> bool:
        return self.winner is not None or self.inline.served is not None

    def _running(self) -> bool:
        return any(r.task is not None and not r.task.done() for r in self.racers)

    async def _wait(self) -> None:
        self.changed = asyncio.get_running_loop().create_future()
        await self.changed

    def _arm(self, leader: Target) -> None:
        mode = STREAMED if self.call.stream else BUFFERED
        delay = hedge_delay(self.hedge, self.walker.state.tracker.recent(leader.key, mode))
        if delay is not None:
            self.timer = _HedgeTimer(self.leader_started, delay, self)
            self.walker.deadlines.watch_timer(self.timer)

    def _disarm(self) -> None:
        if self.timer is not None:
            self.walker.deadlines.forget_timer(self.timer)
            self.timer = None

    def _arm_cap(self, racer: _Racer, answer: Trail, now: float) -> None:
        """Cut ``racer`` once it has run ``measure_cap`` from its start. One loop timer per
        measuring loser, which exists only on a request that raced (at most ``max_extra`` of
        them): the sweeper's coarse interval would make a half-second cap up to a second late."""
        last = answer.attempts[-1] if answer.attempts else None
        cap = measure_cap(self.hedge, None if last is None else last.ttfc)
        racer.cap = asyncio.get_running_loop().call_later(max(0.0, racer.started + cap - now), _cut, racer)

    def _finish(self, trail: Trail, winner: _Racer | None = None) -> Walked:
        """``trail``'s verdict (the winner's, the inline leader's, or the last failure's) with every attempt
        in the order the targets started; a racer cut short shows ``lost``, one still being
        measured ``measuring``, with its seconds so far (and the result says how to read its
        outcome once it ends: :class:`~proxy.walk.result.Settling`)."""
        if not self.racers:  # nobody raced: the plain walk's result
            return trail.result(tuple(trail.attempts), tuple(self.roles))
        now = self.walker.clock()
        running: dict[_Racer, Attempt] = {}
        kept: list[asyncio.Task[None]] = []
        for racer in self.racers:
            task = racer.task
            if racer is not winner and task is not None and not task.done():
                keep = racer.measuring and (winner is not None or self.inline.served is not None)
                running[racer] = Attempt(racer.target.name, "measuring" if keep else "lost", now - racer.started)
                if keep:
                    self.walker.keep(task)
                    self._arm_cap(racer, trail, now)
                    kept.append(task)
        result = trail.result(self._merged(running), tuple(self.roles))
        if kept and isinstance(result, Committed | Answered):
            lost = {racer: a for racer, a in running.items() if a.outcome == "lost"}
            result.settling = Settling(tuple(kept), lambda: self._merged(lost))
        return result

    def _merged(self, running: Mapping[_Racer, Attempt]) -> tuple[Attempt, ...]:
        """Every attempt so far in the order the targets started, ``running`` racers' with the word
        given for them (a measuring racer that has ended has its own last attempt instead)."""
        inline = self.inline.attempts
        leads = [(self.inline_started, 0), *(self.later or ())]
        ends = [at for _, at in leads[1:]] + [len(inline)]
        parts = [(start, inline[at:end]) for (start, at), end in zip(leads, ends, strict=True) if end > at]
        for racer in self.racers:
            attempts = list(racer.trail.attempts)
            if racer in running:
                attempts.append(running[racer])
            parts.append((racer.started, attempts))
        return tuple(a for _, attempts in sorted(parts, key=lambda p: p[0]) for a in attempts)
