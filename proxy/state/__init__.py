"""Everything firstbyte remembers between requests, in one place, with one door.

Every change goes through a named method of :class:`State` (a call admitted and released, a
first token with its sample, a failure, a Retry-After cool-down, a probe claimed and released):
the walk calls them, nothing else writes a :class:`TargetState`'s fields, so one place sees
every change (where the fleet link hooks in, docs/adr). The planner reads synchronously between
two awaits, which makes the read a consistent snapshot on the event loop. It survives a config
reload for targets that still exist.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..config import Config, Cooldown, Fastest, TargetKey
from .breaker import CLOSED, Breaker, Health
from .budget import HedgeBudget
from .snapshot import TargetFigures, snapshot
from .tracker import BUFFERED, DEMOTE_MARGIN, STREAMED, Tracker

HISTORY = 100  # recent attempts kept per target for the health share
# Targets that only a client's pin names (``provider/any-model``), no route: each costs a few KB, and
# a client naming a new model every call grew memory without bound (10,000 names: +36 MB). Beyond this
# many, the least recently asked is forgotten (unless a call is in flight on it).
UNLISTED_MAX = 1024

Listener = Callable[[tuple[Any, ...]], None]
"""Hears each change made through the door as a small tuple (the fleet link publishes them):
``("s", key, mode, seconds)`` a first token, ``("c", key, mode, seconds)`` a censored sample,
``("f", key, kind, failures, secs)`` a counted failure under its route's cooldown, ``("o", key,
open_until, cooldown)`` the breaker opened or reopened, ``("r", key, until)`` a Retry-After,
``("p", key)`` a probe given back without a verdict. Times are this process's clock."""

Seen = tuple[str, str, float]  # (instance, what it did, when on this process's clock)


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
    # Who last changed the figure and the breaker, what and when: (instance, word, this clock's time);
    # the instance is "" for this one outside a fleet. What /v1/health and explain say (docs/adr/0016).
    figure_by: Seen | None = None
    breaker_by: Seen | None = None



class State:
    def __init__(self, stale_after: float = 300.0) -> None:
        self.tracker = Tracker(stale_after)
        self.targets: dict[TargetKey, TargetState] = {}
        # Measured mean USD per call by (target name, operation), refreshed from the ledger
        # by the gateway's CostRefresher; the score strategy reads it.
        self.costs: dict[tuple[str, str], float] = {}
        self.budgets: dict[str, HedgeBudget] = {}  # per route with a hedge
        self.listener: Listener | None = None  # the fleet link, while it is connected
        self.gated = False  # in a fleet: a half-open probe needs the fleet's claim
        self.instance = ""  # this instance's fleet name (the access log's), "" outside a fleet
        # (target, mode) another instance holds the measuring claim of (fleet/measures.py): being
        # measured elsewhere, as a local call in flight would be; empty alone (fail open).
        self.measuring: frozenset[tuple[TargetKey, str]] = frozenset()
        self.listed: set[TargetKey] = set()  # the config's targets, never forgotten while listed
        self._unlisted: OrderedDict[TargetKey, None] = OrderedDict()  # pinned only, least recent first

    def target(self, key: TargetKey) -> TargetState:
        ts = self.targets.get(key)
        if ts is None:
            ts = self.targets[key] = TargetState(key, Breaker(self.gated))
        if key not in self.listed:
            self._unlisted[key] = None
            self._unlisted.move_to_end(key)
            if len(self._unlisted) > UNLISTED_MAX:
                self._forget_unlisted(key)
        return ts

    def _forget_unlisted(self, keep: TargetKey) -> None:
        """Forget the least recently asked pinned target that no call is using."""
        for key in self._unlisted:
            ts = self.targets.get(key)
            if key != keep and (ts is None or ts.in_flight == 0):
                del self._unlisted[key]
                if ts is not None:
                    del self.targets[key]
                    ts.retired = True  # a late sample of it measures nobody
                self.tracker.forget(key)
                return

    # -- the one door: every change to what is remembered ---------------------------------------

    def admit(self, ts: TargetState, now: float, *, rescue: bool = False) -> str:
        """The breaker's word on an attempt (``GO``, ``PROBE`` or ``WAIT``); ``PROBE`` claims the
        half-open probe, given back by ``probe_released`` or settled by the attempt's verdict."""
        return ts.breaker.begin(now, rescue=rescue)

    def probe_released(self, ts: TargetState) -> None:
        """A probe ended with no verdict (the client left): the next attempt may probe."""
        ts.breaker.abandon_probe()
        if self.listener is not None:
            self.listener(("p", ts.key))

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
            ts.figure_by = (self.instance, f"{mode} sample", now)
            if self.listener is not None:
                self.listener(("s", ts.key, mode, seconds))
        _succeeded(ts, self.instance, now)

    def censored(self, ts: TargetState, seconds: float, now: float, mode: str,
                 behind: float | None = None) -> bool:
        """A lower bound of the target's first token: a measuring call cut at its cap, a racer
        cancelled because another won first (a lost race; ``behind``: the winner's figure), or a leader
        past its hedge delay whose hedge the budget refused. The tracker holds one and demotes on two in
        a row (``state/tracker.py``, docs/adr/0022); True when this one demoted. The fleet hears the
        bound as it is lifted over the winner, so a peer demotes alike."""
        if ts.retired:
            return False
        bound = seconds if behind is None else max(seconds, behind * DEMOTE_MARGIN)
        demoted = self.tracker.censor(ts.key, bound, now, mode)
        ts.figure_by = (self.instance, f"{mode} bound", now)
        if self.listener is not None:
            self.listener(("c", ts.key, mode, bound))
        return demoted

    def failed(self, ts: TargetState, now: float, cooldown: Cooldown, kind: str) -> None:
        """A failure that counts against the target (``kind`` is the outcome's word: 503, timeout,
        reset, cut...): the history and the breaker hear it."""
        ts.history.append(False)
        breaker = ts.breaker
        was = breaker.state, breaker.open_until
        breaker.failure(now, cooldown)
        opened = (breaker.state, breaker.open_until) != was
        ts.breaker_by = (self.instance, "opened" if opened else f"failure {kind}", now)
        if self.listener is not None and not ts.retired:
            self.listener(("f", ts.key, kind, cooldown.failures, cooldown.secs))
            if opened:
                self.listener(("o", ts.key, breaker.open_until, breaker.cooldown))

    def cool(self, ts: TargetState, until: float, now: float) -> None:
        """A Retry-After: the target is cooled down until then (it does not open the breaker)."""
        ts.breaker.cool(until)
        ts.breaker_by = (self.instance, "cooled", now)
        if self.listener is not None and not ts.retired:
            self.listener(("r", ts.key, until))

    # -- what the fleet heard: other instances' changes, folded in (never told back) -------------

    def set_gated(self, gated: bool) -> None:
        """In the fleet (True) a half-open probe waits for the fleet's claim; alone, it does not."""
        self.gated = gated
        for ts in self.targets.values():
            ts.breaker.gated = gated
            if not gated:
                ts.breaker.claimed = False

    def probe_granted(self, ts: TargetState, granted: bool) -> None:
        """The fleet link claimed the target's probe for this instance (or let an unused claim go)."""
        ts.breaker.claimed = granted

    def heard_sample(self, ts: TargetState, seconds: float, at: float, mode: str, censored: bool,
                     by: str = "") -> None:
        """Another instance's (``by``) sample (``at``: when it was taken, on this process's clock); a
        first token is also a success (it closes the breaker: only a probe or a rescue can succeed at
        an open target), unless it is older than the newest failure this breaker knows: a peer's
        samples wait for its next tick, so a success taken before the failures that opened the breaker
        here arrived after them and closed it again (docs/adr/0016, "what a late success closes")."""
        if ts.retired:
            return
        ts.figure_by = (by, f"{mode} {'bound' if censored else 'sample'}", at)
        if censored:
            self.tracker.censor(ts.key, seconds, at, mode)
            return
        self.tracker.record(ts.key, seconds, at, mode)
        if at < ts.breaker.failed_at:  # older than a failure known here (samples ride the next tick, up
            ts.history.append(True)  # to a second late): it resets no count and closes no opening
            return
        _succeeded(ts, by, at)

    def heard_failure(self, ts: TargetState, now: float, cooldown: Cooldown, by: str = "",
                      at: float | None = None) -> None:
        """Another instance's counted failure (``at``: when it was told, on this process's clock): the
        fleet counts failures together, and a peer's success older than it resets nothing."""
        ts.history.append(False)
        was = ts.breaker.state
        ts.breaker.heard_failure(now, cooldown, at)
        ts.breaker_by = (by, "failure" if ts.breaker.state == was else "opened", now)

    def heard_open(self, ts: TargetState, until: float, cooldown: float, by: str, now: float) -> None:
        was = ts.breaker.state, ts.breaker.open_until
        ts.breaker.heard_open(until, cooldown)
        if (ts.breaker.state, ts.breaker.open_until) != was:
            ts.breaker_by = (by, "opened", now)
        elif ts.breaker_by is not None and ts.breaker_by[:2] == (by, "opened") and now < ts.breaker_by[2]:
            ts.breaker_by = (by, "opened", now)  # its failure opened it here when heard; this says when it opened

    def heard_cool(self, ts: TargetState, until: float, by: str, now: float) -> None:
        ts.breaker.cool(until)
        ts.breaker_by = (by, "cooled", now)

    def set_measuring(self, measuring: frozenset[tuple[TargetKey, str]]) -> None:
        """The (target, mode) pairs another instance holds the measuring claim of, swapped in whole
        by the fleet link (empty when it drops: each instance measures for itself again)."""
        self.measuring = measuring

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
        if mode is None:
            return 0 if ts is None else ts.in_flight
        own = 0 if ts is None else ts.buffering if mode == BUFFERED else ts.in_flight - ts.buffering
        # A peer's measuring claim counts as one call measuring it (fleet/measures.py).
        return own + 1 if self.measuring and (key, mode) in self.measuring else own

    def age(self, key: TargetKey, now: float, mode: str = STREAMED) -> float | None:
        return self.tracker.age(key, now, mode)

    def load_fit(self, key: TargetKey, mode: str = STREAMED) -> tuple[float, float] | None:
        return self.tracker.load_fit(key, mode)

    def success_share(self, key: TargetKey) -> float | None:
        ts = self.targets.get(key)
        if ts is None or not ts.history:
            return None
        return sum(ts.history) / len(ts.history)

    def recent(self, key: TargetKey, mode: str = STREAMED) -> list[float]:
        """The target's newest first-token samples in ``mode``, oldest first."""
        return self.tracker.recent(key, mode)

    def ranked(self, key: TargetKey, mode: str = STREAMED) -> Sequence[float]:
        """The target's newest first-token samples in ``mode``, sorted (a hedge's pNN): a read."""
        return self.tracker.ranked(key, mode)

    def began(self, key: TargetKey, mode: str = STREAMED) -> float | None:
        """When the call of the target's newest sample began."""
        return self.tracker.began(key, mode)

    def held(self, key: TargetKey, mode: str = STREAMED) -> int:
        """Censored bounds held against the target's figure (lost races since its last faster answer)."""
        return self.tracker.held(key, mode)

    def hedge_budget(self, route: str) -> HedgeBudget | None:
        """The route's hedge budget as it stands, None before its first hedged request (a read)."""
        return self.budgets.get(route)

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
        self.listed = keys
        self._unlisted.clear()
        self.tracker.retain(keys)
        self.budgets = {name: b for name, b in self.budgets.items() if name in config.routes}
        self.tracker.stale_after = max(
            [r.fastest.max_age_secs for r in config.routes.values()] or [300.0]
        )


def _succeeded(ts: TargetState, by: str, now: float) -> None:
    """An answer: the breaker closes (a change worth naming when it was open or counting)."""
    breaker = ts.breaker
    if breaker.state != CLOSED or breaker.failures:
        ts.breaker_by = (by, "closed", now)
    breaker.success()
    ts.history.append(True)


_CLOSED = Breaker().health(0.0)
