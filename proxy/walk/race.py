"""The race for the first token (docs/adr/0008): targets of a ``hedge`` route side by side.

A route without ``hedge`` is walked one target at a time (``Walker.walk``); with it, the same
while nobody races (the leader's attempts run in the request's own task). A race starts so:

- the plan explores or measures (``together``): the explored or unmeasured target runs in a
  task of its own beside the leader, on to its own first token even when the leader wins (its
  figure measured, not guessed), for at most ``measure_cap`` seconds from its start (then it is
  cut, not blamed, and its time so far stands as a lower bound);
- the leader has no first token by ``hedge.after``: the next target starts in a task of its
  own (once per request; measured like a learner when its look is due, ``routing/explore.py``).
  The deadline sweeper watches the timer: a request that never hedges arms none, starts no task.
  Refused by the budget, the leader's time so far is a lower bound all the same, and the request
  waits on it: when bounds demote that leader, every request waiting on it races at once on a
  borrowed token (docs/adr/0023, "An overdue leader").

Who races from the start, who pays and each leader's hedge delay are the plan's (``Opening``,
``routing/hedge.py``); the race runs them (:class:`Phase`, :class:`Hedging`) and records in the
route's budget what happened and whom it ran (a due hedge still asks it). The first to commit
(first token, or a client error returned as it is) wins. A loser is cancelled at once, not
blamed; its time so far is a lower bound of its first token (``walk/evidence.py``, ADR 0022).
A racer that fails does not end the race: with none left running, the walk goes down the order.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Awaitable, Callable, Mapping

from ..config import Hedge, Provider, Route, Target, TargetKey
from ..providers import Call
from ..routing.decision import Attempt, Racer
from ..routing.hedge import Opening, measure_cap
from ..routing.plan import Plan
from ..state.tracker import BUFFERED, STREAMED
from .evidence import lower_bound, overdue
from .racer import HedgeTimer, Racing, cut
from .result import Answered, Committed, Settling, Trail, Walked
from .slot import Reservation
from .walker import Walker

__all__ = ["Hedging", "Phase", "Race", "walk_route"]


Left = Callable[[tuple[Attempt, ...], tuple[Racer, ...]], None]


def walk_route(walker: Walker, providers: Mapping[str, Provider], plan: Plan, call: Call,
               left: Left | None = None) -> Awaitable[Walked]:
    """Walk the planned order: one target at a time, or as a race on a route with ``hedge`` (not a
    coroutine: one frame fewer). ``left`` hears a race's attempts and racers so far when the client
    leaves before any answered, so the racers it started are still counted."""
    route = plan.route
    hedge = route.hedge
    if hedge is None or plan.opening is None:
        if hedge is not None:
            # A pin is the client's choice: its fallback is for failures, not for speed, so it never
            # races; it still earns the route its share of the budget, as every request does.
            walker.state.budget(route.name, hedge.max_extra).deposit()
        return walker.walk(route, plan.targets, call, providers, rescued=plan.rescued)
    return Race(walker, route, hedge, plan.opening, call, providers, plan.rescued, left).run()


class Phase(enum.Enum):
    """Where the request's own task stands in the race."""

    OPENING = "opening"  # the plan's opening is being carried out
    LEADING = "leading"  # a target runs inline, in the request's task
    WAITING = "waiting"  # the inline leader failed while racers run: they are ahead of a failover
    CUTTING = "cutting"  # a racer won while a leader ran inline: the leader's await is being cancelled
    DONE = "done"  # the walk has its answer; racers being measured may run on


class Hedging(enum.Enum):
    """What the request's one timed hedge may still do."""

    OPEN = "open"  # it starts when the leader has no first token by its delay, if the budget pays
    REFUSED = "refused"  # the budget refused this request once: a hedge may start, a second no is not told
    SPENT = "spent"  # a race began (a learner, or the hedge), or the hedge's one chance was refused


class Race:
    # Class-level defaults: a request that never races sets only what __init__ does (per request).
    leader: Target | None = None  # the target running inline now (Phase.LEADING)
    leader_started = 0.0
    winner: Racing | None = None  # a racer that committed first
    rejected: Racing | None = None  # a racer's client error, kept while another may still answer
    later: list[tuple[float, int]] | None = None  # inline leads after a race began: (start, first attempt)
    timer: HedgeTimer | None = None
    changed: asyncio.Future[None] | None = None  # a racer finished (awaited in Phase.WAITING)
    overdue: tuple[TargetKey, str] | None = None  # waiting on this leader, its hedge refused (``_rerace``)
    told = False  # the inline leader's overdue bound was told: one call, one bound

    def __init__(self, walker: Walker, route: Route, hedge: Hedge, opening: Opening, call: Call,
                 providers: Mapping[str, Provider], rescued: str | None, left: Left | None = None) -> None:
        self.walker = walker
        self.route = route
        self.hedge = hedge
        self.opening = opening
        self.queue = list(opening.order)
        self.call = call
        self.providers = providers
        self.rescued = rescued
        self.left = left  # told what ran when the client leaves before an answer
        self.phase = Phase.OPENING
        self.hedging = Hedging.OPEN
        self.budget = walker.state.budget(route.name, hedge.max_extra)
        self.mode = STREAMED if call.stream else BUFFERED
        self.inline = self.last = Trail()  # the request task's attempts; the last failure's
        self.inline_started = walker.clock()
        self.racers: list[Racing] = []
        self.roles: list[Racer] = []
        self.task = asyncio.current_task()

    async def run(self) -> Walked:
        self._open()
        try:
            return await self._walk()
        except BaseException:
            self._left()
            raise
        finally:
            self.phase = Phase.DONE
            if self.timer is not None:
                self._disarm()
            for racer in self.racers:
                task = racer.task
                if task is not None and not task.done() and not (racer.measuring and self._won()):
                    task.cancel()

    def _open(self) -> None:
        """Carry out the plan's opening: this request's share into the budget, then the learner
        started (its free measure claimed, or a token spent) or the budget's refusal recorded."""
        self.budget.deposit()
        opening = self.opening
        learner = opening.learner
        if learner is not None:
            self.budget.pay(opening.pays, (learner.key, self.mode), self.walker.clock())
            self._start(measuring=True)
            self.roles.append(Racer(learner.name, opening.role))
            self.roles.append(Racer(self.queue[0].name, "leader"))
            self.hedging = Hedging.SPENT
        elif opening.refused is not None:
            self.budget.refuse()
            self.roles.append(Racer(opening.refused, "budget exhausted"))
            self.hedging = Hedging.REFUSED

    async def _walk(self) -> Walked:
        """Lead inline, fail over, or wait for the racers, until someone's answer is the walk's."""
        if self.queue and await self._lead(self.queue.pop(0)):
            return self._finish(self.inline)
        while self.winner is None:
            if self._running():
                self.phase = Phase.WAITING  # the leader failed while racers run: they are ahead of a failover
                await self._wait()
            elif self.rejected is not None:  # nobody else answered: the client error is the answer
                return self._finish(self.rejected.trail, self.rejected)
            elif not self.queue:
                return self._finish(self.last)  # everyone failed: the last failure is the answer
            elif await self._lead(self.queue.pop(0), again=True):  # a failover: everyone before it failed
                return self._finish(self.inline)
        return self._finish(self.winner.trail, self.winner)

    def _left(self) -> None:
        """The client left (or the loop is closing). A racer that committed before its lease reached
        the relay is let go (nobody else will); with nobody answered, what ran is told as lost."""
        winner = self.winner
        if winner is not None and winner.trail.lease is not None:
            winner.trail.lease.finish()
            winner.trail.lease = None
        elif self.left is not None and winner is None and self.inline.served is None and self.roles:
            so_far = self._finish(self.last)  # nobody answered: every racer still running is lost
            self.left(so_far.attempts, so_far.race)

    async def _lead(self, target: Target, again: bool = False) -> bool:
        """Run ``target`` in the request's task; True when it committed first. ``again``: a failover
        lead, after the first (which sorts at the request's start, before any racer it began)."""
        self.phase = Phase.LEADING
        self.leader, self.leader_started = target, self.walker.clock()
        self.budget.look((target.key, self.mode), self.leader_started)  # as fresh as this request (routing/explore.py)
        if again and self.racers:  # a failover inline after a race began: its attempts sort by its own start
            self.later = [*(self.later or ()), (self.leader_started, len(self.inline.attempts))]
        if self.hedging is not Hedging.SPENT and self.queue:
            self._arm(target)
        try:
            over = await self.walker.try_target(self.inline, self.route, target, self.providers, self.call,
                                                target.name == self.rescued)
        except asyncio.CancelledError:
            # Cut: a racer committed first, or the client left (or the loop is closing).
            self.inline.attempts.append(Attempt(target.name, "lost", self.walker.clock() - self.leader_started))
            task = self.task
            if self.phase is not Phase.CUTTING or task is None or task.uncancel():
                raise  # the client left: every racer goes too
            before = self.inline.attempts[-2:-1]  # a lost race is evidence, unless a try of it failed
            if self.winner is not None and not self.told and not (before and before[0].name == target.name):
                self._bound(target, self.leader_started, self.winner.target)
            return False
        finally:
            self.leader = None
            if self.timer is not None:  # most leaders arm none: no call to disarm it
                self._disarm()
            self.told = False
            if self.overdue is not None:  # no longer waiting on this leader
                self.budget.waiting.get(self.overdue, set()).discard(self)
                self.overdue = None
        if not over:
            self.last = self.inline
        return over

    def hedge_due(self) -> None:
        """The leader has no first token by ``after``: the next target races it, if paid for."""
        self.timer = None
        if self.hedging is Hedging.SPENT or self.leader is None or self.winner is not None or not self.queue:
            return
        refused = self.hedging is Hedging.REFUSED
        self.hedging = Hedging.SPENT
        if self.budget.withdraw(count=not refused):
            self._hedge()
            return
        if not refused:  # one request is one refusal, however many racers it wanted
            self.roles.append(Racer(self.queue[0].name, "budget exhausted"))
        if self.route.strategy != "fastest":
            return  # the order is not the figures': a bound would move nobody, a re-race only spend
        # Past its hedge delay, unraced: a lower bound now, not when a race would have been lost. It
        # waits on its leader: should the leader be demoted, it races on a borrowed token.
        leader, waiting = self.leader, self.budget.waiting
        self.overdue = (leader.key, self.mode)
        waiting.setdefault(self.overdue, set()).add(self)
        told = overdue(self.walker.state, self.route.fastest, self.call.stream, leader, self.leader_started,
                       self.walker.clock(), self.queue[0], self.budget)
        self.told = told is not None  # its bound is told: should it lose a race later, that is not told again
        if told:
            self._rerace(leader)

    def _hedge(self) -> None:
        """Start the next target beside the leader, paid for."""
        assert self.leader is not None
        if not any(role == "leader" for _, role in self.roles):
            self.roles.append(Racer(self.leader.name, "leader"))
        racer = self._start(measuring=self.queue[0].name in self.opening.due)  # a due look: run to its token
        self.roles.append(Racer(racer.target.name, f"hedge {racer.started - self.leader_started:.2f}s"))

    def _rerace(self, demoted: Target) -> None:
        """``demoted`` has just been demoted: every request still waiting on it with its hedge refused
        races the next target now, on a token of the bucket or a borrowed one (docs/adr/0023, "An overdue leader")."""
        for race in self.budget.waiting.pop((demoted.key, self.mode), ()):
            race.overdue = None
            if (race.leader is not None and race.leader.key == demoted.key and not race._won() and race.queue
                    and (race.budget.withdraw(count=False) or race.budget.borrow())):
                race._hedge()

    def _start(self, measuring: bool) -> Racing:
        target = self.queue.pop(0)
        state = self.walker.state
        reserved = Reservation(state, state.target(target.key), not self.call.stream)
        racer = Racing(target, self.walker.clock(), measuring, reserved)
        if measuring:
            self.budget.look((target.key, self.mode), racer.started)
        self.racers.append(racer)
        task = racer.task = asyncio.get_running_loop().create_task(self._run(racer))
        task.add_done_callback(lambda _task: reserved.release())  # cancelled before it ever ran
        return racer

    async def _run(self, racer: Racing) -> None:
        """One racer: its target's attempts. The first to commit wins (and stops the leader); a
        later answer is let go at once: it was measured, not served."""
        racer.reserved.release()  # the attempt's Slot counts it from here on, with no await in between
        try:
            try:
                over = await self.walker.try_target(racer.trail, self.route, racer.target, self.providers,
                                                    self.call, racer.target.name == self.rescued,
                                                    self._won if racer.measuring else None)
            except asyncio.CancelledError:
                if self._cancelled(racer):
                    raise  # the client left, or the loop is closing
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
                if racer.trail.lease is not None:  # told now: the cut leader's bound reads the winner's figure
                    racer.trail.lease.committed()
                if self.leader is not None and self.task is not None:
                    self.phase = Phase.CUTTING
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

    def _cancelled(self, racer: Racing) -> bool:
        """True unless it was our cut at its cap. A hedge that lost its race, or a measure cut at its
        cap, is not blamed: it tells a lower bound of its first token (unless a try of it failed)."""
        task = racer.task
        first = not racer.trail.attempts
        if not racer.capped or task is None or task.uncancel():
            if racer.measuring and self._won():  # kept after the answer: the record waits for a word
                racer.trail.attempts.append(Attempt(racer.target.name, "lost", self.walker.clock() - racer.started))
            elif self._won() and first:  # a hedge that lost its race
                self._bound(racer.target, racer.started)
            return True
        racer.trail.attempts.append(Attempt(racer.target.name, "capped", self.walker.clock() - racer.started))
        if first:
            self._bound(racer.target, racer.started, capped=True)
        return False

    def _bound(self, target: Target, started: float, winner: Target | None = None, capped: bool = False) -> None:
        """``target`` had no first token since ``started``: a censored sample (``walk/evidence.py``).
        Should it demote ``target``, the requests waiting on it race at once."""
        if lower_bound(self.walker.state, self.route.fastest, self.call.stream, target, started, self.walker.clock(),
                       winner, capped) and self.route.strategy == "fastest":
            self._rerace(target)

    def _won(self) -> bool:
        return self.winner is not None or self.inline.served is not None

    def _running(self) -> bool:
        return any(r.task is not None and not r.task.done() for r in self.racers)

    async def _wait(self) -> None:
        self.changed = asyncio.get_running_loop().create_future()
        await self.changed

    def _arm(self, leader: Target) -> None:
        """The leader's hedge timer, at the delay the plan gave it (None: a pNN without its samples)."""
        delay = self.opening.hedge_after.get(leader.name)
        if delay is not None:
            self.timer = HedgeTimer(self.leader_started, delay, self)
            self.walker.deadlines.watch_timer(self.timer)

    def _disarm(self) -> None:
        if self.timer is not None:
            self.walker.deadlines.forget_timer(self.timer)
            self.timer = None

    def _arm_cap(self, racer: Racing, answer: Trail, now: float) -> None:
        """Cut ``racer`` once it has run ``measure_cap`` from its start. One loop timer per measuring loser
        (only on a request that raced): the sweeper's coarse interval would make a 0.5 s cap 1 s late."""
        last = answer.attempts[-1] if answer.attempts else None
        cap = measure_cap(self.hedge, None if last is None else last.ttfc)
        racer.cap = asyncio.get_running_loop().call_later(max(0.0, racer.started + cap - now), cut, racer)

    def _finish(self, trail: Trail, winner: Racing | None = None) -> Walked:
        """``trail``'s verdict (the winner's, the inline leader's, or the last failure's) with every attempt
        in the order the targets started; a racer cut short shows ``lost``, one still being measured
        ``measuring``, with its seconds so far (its outcome, once it ends: ``result.Settling``)."""
        if not self.racers:  # nobody raced: the plain walk's result
            return trail.result(tuple(trail.attempts), tuple(self.roles))
        now = self.walker.clock()
        running: dict[Racing, Attempt] = {}
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

    def _merged(self, running: Mapping[Racing, Attempt]) -> tuple[Attempt, ...]:
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
