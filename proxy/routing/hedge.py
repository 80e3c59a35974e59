"""How a hedged route's walk races, decided with the plan: who races from the start, who is
measured, what pays for it, and when each leader would be hedged. Pure.

:func:`opening` is the race's plan: the walk (``walk/race.py``) carries it out and records what
happened in the state (the budget's token spent or refused, a free measure claimed); explain
shows the very same record. Whether a timed hedge is paid for is the one thing left to the
walk: the budget then, not now, answers it.

``hedge.after`` is a fixed number of seconds, or ``pNN``: the NNth percentile of the leading
target's own time-to-first-token samples in the request's mode. A leader with fewer than
``MIN_SAMPLES`` samples has no percentile yet, so it is not hedged by time (an unmeasured leader
is raced from the start instead, when ``hedge.explore`` is on).

``measure_cap`` is how long an explored (or measured) loser may run on after the answer committed,
counted from its own start: ``hedge.cap`` times the winner's time to first token, at least
``CAP_FLOOR`` and at most ``CAP_CEILING`` seconds (docs/adr/0008).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from ..config import Hedge, Target, TargetKey
from ..state.budget import BORROWED, FREE, PAID, RESERVE, HedgeBudget
from ..state.tracker import RECENT

MIN_SAMPLES = 5
WINDOW = RECENT  # the newest samples a percentile is taken over (the tracker keeps them sorted)
# A loser not answering by then is several times slower than the winner: its exact figure would
# not change the order. The floor keeps jitter and a busy machine from cutting a near-equal; the
# ceiling bounds what a stalled explored target holds (a connection, an in-flight count).
CAP_FLOOR = 0.5
CAP_CEILING = 5.0


def hedge_delay(hedge: Hedge, samples: Sequence[float]) -> float | None:
    """Seconds after the leader's start at which the next target starts too, or None."""
    if hedge.after_secs is not None:
        return hedge.after_secs
    return _percentile(hedge, sorted(samples[-WINDOW:]))


def _percentile(hedge: Hedge, ranked: Sequence[float]) -> float | None:
    """``hedge_delay`` from the newest samples already sorted (as the tracker keeps them)."""
    if hedge.after_percentile is None or len(ranked) < MIN_SAMPLES:
        return None
    rank = math.ceil(hedge.after_percentile / 100 * len(ranked)) - 1
    return ranked[max(0, rank)]


def measure_cap(hedge: Hedge, winner_ttfc: float | None) -> float:
    """Seconds from its own start an explored loser may take to its first token before it is cut.
    A winner without a time to first token (a client error returned as it is) gives the ceiling."""
    if winner_ttfc is None:
        return CAP_CEILING
    return min(CAP_CEILING, max(CAP_FLOOR, hedge.cap * winner_ttfc))


class RaceView(Protocol):
    """What the race's plan reads of the state."""

    def in_flight(self, key: TargetKey, mode: str | None = ...) -> int: ...

    def age(self, key: TargetKey, now: float, mode: str = ...) -> float | None: ...

    def ranked(self, key: TargetKey, mode: str = ...) -> Sequence[float]: ...

    def hedge_budget(self, route: str) -> HedgeBudget | None: ...


@dataclass(slots=True)  # built per request: a frozen init costs about three times as much
class Opening:
    """How a hedged route's walk begins, and each leader's hedge delay: the plan's word, which the
    race carries out as it is."""

    order: tuple[Target, ...]  # the walk's order: a learner the budget refused waits behind the leader
    learner: Target | None = None  # raced from the start in a task of its own, to be measured
    role: str = ""  # the learner's word in the header: explore or measure
    pays: str = ""  # FREE, PAID (a token, leaving ``keep`` in the bucket for a hedge) or BORROWED
    keep: float = 0.0
    refused: str | None = None  # the target the budget refused a race ("budget exhausted")
    hedge_after: Mapping[str, float | None] = field(default_factory=dict)  # a leader's hedge delay
    due: frozenset[str] = frozenset()  # a timed hedge of one of these runs to its own token (routing/explore.py)

    @property
    def leader(self) -> Target | None:
        """Who runs inline first."""
        rest = self.order[1:] if self.learner is not None else self.order
        return rest[0] if rest else None


def opening(hedge: Hedge, route: str, targets: Sequence[Target], first_reason: str, together: int,
            view: RaceView, now: float, mode: str, due: frozenset[str] = frozenset(),
            keep: float = RESERVE) -> Opening:
    """Who races from the start and who pays: an explored or unmeasured first target races the
    next one when the budget pays (an unmeasured one nobody measures yet races free, once), else
    it waits its turn behind the leader; one being measured already leads, unraced (a cold burst
    spreads). The budget is read as this request's deposit leaves it. ``due``: the targets whose
    look is due, measured when a timed hedge starts them; ``keep``: what an explore leaves for a
    hedge (none for a recovery being confirmed, routing/explore.py)."""
    order = tuple(targets)
    delays = _delays(hedge, order, view, mode)
    if together < 2 or len(order) < 2:
        return Opening(order, hedge_after=delays, due=due)
    budget = view.hedge_budget(route) or HedgeBudget(hedge.max_extra)
    first = order[0]
    role = "explore" if first_reason == "explore" else "measure"
    if first_reason == "unmeasured" and view.in_flight(first.key, mode):
        # A cold burst's measure (its target in flight already) may spend a hedge's token: cold
        # starts are when racing pays most.
        if budget.affords(hedge.max_extra):
            return Opening(order, first, role, PAID, 0.0, hedge_after=delays)
        return Opening(order, refused=order[1].name, hedge_after=delays)
    if first_reason == "unmeasured":
        age = view.age(first.key, now, mode)
        if budget.owes_free_measure((first.key, mode), None if age is None else now - age):
            return Opening(order, first, role, FREE, hedge_after=delays)
    # An explore, or a measure whose free call was spent (a target that keeps failing), leaves a
    # token for a hedge; unpaid, learning waits behind the leader instead of making the client wait.
    # While the cold start's advances are repaid (no token grows for some thirty requests) a measure
    # may take the start token: a free measure that failed would otherwise be refused all that time.
    keep = keep if role == "explore" else (0.0 if budget.owed > 0 else RESERVE)
    if budget.affords(hedge.max_extra, keep):
        return Opening(order, first, role, PAID, keep, hedge_after=delays)
    if first_reason == "unmeasured" and budget.lends((first.key, mode)):
        return Opening(order, first, role, BORROWED, hedge_after=delays)  # its free and paid calls failed
    return Opening((order[1], first, *order[2:]), refused=first.name, hedge_after=delays)


def _delays(hedge: Hedge, order: Sequence[Target], view: RaceView, mode: str) -> dict[str, float | None]:
    """Each target's hedge delay should it lead inline (a fixed ``after`` reads no samples; a pNN
    reads the tracker's sorted window: sorting it here cost a tenth of a buffered call)."""
    if hedge.after_secs is not None:
        return dict.fromkeys((t.name for t in order), hedge.after_secs)
    return {t.name: _percentile(hedge, view.ranked(t.key, mode)) for t in order}


__all__ = ["BORROWED", "FREE", "PAID", "Opening", "RaceView", "hedge_delay", "measure_cap", "opening"]
