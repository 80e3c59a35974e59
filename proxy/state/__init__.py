"""Everything firstbyte remembers between requests, in one place, with one door.

Every change goes through a named method of :class:`State` (a call admitted and released, a
first token with its sample, a failure, a Retry-After cool-down, a probe claimed and released):
the walk calls them, nothing else writes a :class:`TargetState`'s fields, so one place sees
every change (where the fleet link hooks in, docs/adr). The planner reads synchronously between
two awaits, which makes the read a consistent snapshot on the event loop. It survives a config
reload for targets that still exist.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from ..config import Config, Cooldown, Fastest, TargetKey
from .breaker import Breaker, Health
from .budget import HedgeBudget
from .snapshot import TargetFigures, snapshot
from .tracker import BUFFERED, STREAMED, Tracker

HISTORY = 100  # recent attempts kept per target for the health share


@dataclass(slots=True)
class TargetState:
    """One target's live record: a handle the walk holds and passes back to ``State``'s methods;
    read freely, written only by them."""

    key: TargetKey
    breaker: Breaker = field(default_factory=Breaker)
    in_flight: int = 0
    buffering: int = 0  # of those, buffered calls: a mode's figure is measured by its own calls (ADR 0007)
    history: deque[bool] = field(default_factory=lambda: deque(maxlen=HISTORY))
    retired: bool = False  # dropped by a reload: a call still in flight on it measures nobody


class State:
    def __init__(self, stale_after: float = 300.0) -> None:
        self.tracker = Tracker(stale_after)
        self.targets: dict[TargetKey, TargetState] = {}
        # Measured mean USD per call by (target name, operation), refreshed from the ledger
        # by the gateway's CostRefresher; the score strategy reads it.
        self.costs: dict[tuple[str, str], float] = {}
        self.budgets: dict[str, HedgeBudget] = {}  # per route with a hedge

    def target(self, key: TargetKey) -> TargetState:
        ts = self.targets.get(key)
        if ts is None:
            ts = self.targets[key] = TargetState(key)
        return ts

    # -- the one door: every change to what is remembered ---------------------------------------

    def admit(self, ts: TargetState, now: float, *, rescue: bool = False) -> str:
        """The breaker's word on an attempt (``GO``, ``PROBE`` or ``WAIT``); ``PROBE`` claims the
        half-open probe, given back by ``probe_released`` or settled by the attempt's verdict."""
        return ts.breaker.begin(now, rescue=rescue)

    def probe_released(self, ts: TargetState) -> None:
        """A probe ended with no verdict (the client left): the next attempt may probe."""
        ts.breaker.abandon_probe()

    def call_admitted(self, ts: TargetState, buffered: bool) -> int:
        """An attempt is in flight at the target (or a racer reserved its place); returns the
        target's other calls in flight, the load its sample is fitted against."""
        load = ts.in_flight
        ts.in_flight += 1
        ts.buffering += buffered
        return load

    def call_released(self, ts: TargetState, buffered: bool) -> None:
        """The attempt counted by ``call_admitted`` ended, whichever way."""
        ts.in_flight -= 1
        ts.buffering -= buffered

    def first_token(self, ts: TargetState, seconds: float, now: float, mode: str, load: int | None) -> None:
        """An answered attempt: its sample in its mode (unless a reload retired the target: the
        call measured an address no longer in use), and a success for the breaker and history."""
        if not ts.retired:
            self.tracker.record(ts.key, seconds, now, mode, load)
        ts.breaker.success()
        ts.history.append(True)

    def censored(self, ts: TargetState, seconds: float, now: float, mode: str) -> None:
        """A measuring call cut at its cap: its time so far is a lower bound of its first token."""
        if not ts.retired:
            self.tracker.record(ts.key, seconds, now, mode)

    def failed(self, ts: TargetState, now: float, cooldown: Cooldown, kind: str) -> None:
        """A failure that counts against the target (``kind`` is the outcome's word: 503, timeout,
        reset, cut...): the history and the breaker hear it."""
        ts.history.append(False)
        ts.breaker.failure(now, cooldown)

    def cool(self, ts: TargetState, until: float) -> None:
        """A Retry-After: the target is cooled down until then (it does not open the breaker)."""
        ts.breaker.cool(until)

    def set_costs(self, costs: dict[tuple[str, str], float]) -> None:
        """Measured mean cost per call, swapped in whole (from the ledger, off the event loop)."""
        self.costs = costs

    def health(self, key: TargetKey, now: float) -> Health:
        ts = self.targets.get(key)
        return _CLOSED if ts is None else ts.breaker.health(now)

    def figure(self, key: TargetKey, policy: Fastest, now: float, mode: str = STREAMED) -> float | None:
        return self.tracker.figure(key, policy, now, mode)

    def figures(self, key: TargetKey, policy: Fastest, now: float, mode: str,
                fast_alpha: float) -> tuple[float | None, float | None]:
        return self.tracker.figures(key, policy, now, mode, fast_alpha)

    def in_flight(self, key: TargetKey, mode: str | None = None) -> int:
        """Attempts in flight at the target: all of them (its load), or those of one mode (what
        is measuring that mode's figure)."""
        ts = self.targets.get(key)
        if ts is None:
            return 0
        if mode is None:
            return ts.in_flight
        return ts.buffering if mode == BUFFERED else ts.in_flight - ts.buffering

    def age(self, key: TargetKey, now: float, mode: str = STREAMED) -> float | None:
        return self.tracker.age(key, now, mode)

    def load_fit(self, key: TargetKey, mode: str = STREAMED) -> tuple[float, float] | None:
        return self.tracker.load_fit(key, mode)

    def success_share(self, key: TargetKey) -> float | None:
        ts = self.targets.get(key)
        if ts is None or not ts.history:
            return None
        return sum(ts.history) / len(ts.history)

    def budget(self, route: str, share: float) -> HedgeBudget:
        budget = self.budgets.get(route)
        if budget is None:
            budget = self.budgets[route] = HedgeBudget(share)
        elif budget.share != share:  # a reload changed max_extra: the saved tokens stay
            budget.share = share
        return budget

    def snapshot(self, config: Config, now: float) -> tuple[TargetFigures, ...]:
        """Every target's figures, breaker and load now, as immutable records: what observers read."""
        return snapshot(self, config, now)

    def configure(self, config: Config, moved: frozenset[str] = frozenset()) -> None:
        """Adopt a (re)loaded config: keep what still exists, drop the rest. A ``moved`` provider
        (its kind or address changed) is another upstream now: what was learnt of it is dropped."""
        keys = {key for key in config.target_keys() if key[0] not in moved}
        for key in list(self.targets):
            if key not in keys:
                self.targets.pop(key).retired = True
        self.tracker.retain(keys)
        self.budgets = {name: b for name, b in self.budgets.items() if name in config.routes}
        self.tracker.stale_after = max(
            [r.fastest.max_age_secs for r in config.routes.values()] or [300.0]
        )


_CLOSED = Breaker().health(0.0)
