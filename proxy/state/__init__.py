"""Everything firstbyte remembers between requests, in one place.

The walker is the only writer; the planner reads it synchronously between two
awaits, which makes the read a consistent snapshot on the event loop. It
survives a config reload for targets that still exist.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from ..config import Config, Fastest, TargetKey
from .breaker import Breaker, Health
from .budget import HedgeBudget
from .snapshot import TargetFigures, snapshot
from .tracker import BUFFERED, STREAMED, Tracker

HISTORY = 100  # recent attempts kept per target for the health share


@dataclass(slots=True)
class TargetState:
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
            ts = self.targets[key] = TargetState()
        return ts

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
