"""Which target a racing route looks at beside its leader, and how often: by what a look could win.
Pure: the state is read as the plan reads it, ``now`` comes in.

Under a race (``hedge.explore``) a look costs the client nothing, only an upstream call the route's
hedge budget pays for; so the question is which call teaches most. A look's *worth* is the product
of three things:

- **How long the target has gone unlooked at**, in the route's requests (``HedgeBudget.unlooked``:
  since the route last ran it to its own first token, as leader, learner or measured hedge). A
  busy route loses more requests to a recovery nobody has seen in a second than a quiet one does in
  a minute, so the pace follows the route's traffic, not the clock.
- **How uncertain its figure is**: fewer than ``MIN_SAMPLES`` samples, or a figure resting on a
  censored bound (a lost race, docs/adr/0022), counts ``UNCERTAIN`` times.
- **How much faster than the leader it could be**: a target whose newest samples include a time
  under the leading figure has shown it can lead; its reach grows with that margin, up to
  ``1 + 1`` (a time of zero). One that never came under the leader reaches ``1``: only a shift
  would bring it there, and a shift is as likely far behind as near (docs/adr/0008).

The worthiest target is looked at once its worth reaches ``LOOK_AFTER`` and the budget pays for it
while leaving ``LOOK_KEEP`` tokens for hedges: exploring is paced by the tokens the route's requests
earn (what hedges leave of them), so it never reads ``budget exhausted``. A target a timed hedge
starts while its look is due is run to its own first token (``due``), not cut when the leader
answers: the hedge has already paid.

Before that rule, as before it (docs/adr/0008): a target whose newest sample beats the leading
figure while its figure still ranks it behind is looked at by the next request (a recovery seen
once, confirmed); after it, a figure older than ``hedge.refresh`` seconds (a quiet route's floor).
docs/adr/0023 says why and what was measured.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Protocol

from ..config import Fastest, Route, Target, TargetKey
from ..state.budget import RESERVE, HedgeBudget
from .hedge import MIN_SAMPLES

LOOK_AFTER = 10  # worth (route requests, weighted) at which a look is due
UNCERTAIN = 2.0  # a figure on few samples or on a censored bound: its requests count this much
REACH_SAMPLES = 10  # the newest samples a target's reach is read from
LOOK_KEEP = RESERVE  # tokens a look leaves for hedges, as any explore does (docs/adr/0023: two starved it)

Figures = Mapping[str, float | None]


class ExploreView(Protocol):
    """What choosing a look reads of the state."""

    def figure(self, key: TargetKey, policy: Fastest, now: float, mode: str = ...) -> float | None: ...

    def in_flight(self, key: TargetKey, mode: str | None = ...) -> int: ...

    def age(self, key: TargetKey, now: float, mode: str = ...) -> float | None: ...

    def recent(self, key: TargetKey, mode: str = ...) -> list[float]: ...

    def held(self, key: TargetKey, mode: str = ...) -> int: ...

    def began(self, key: TargetKey, mode: str = ...) -> float | None: ...

    def hedge_budget(self, route: str) -> HedgeBudget | None: ...


@dataclass(frozen=True, slots=True)
class Prospect:
    """A non-leading measured target, as a look at it is weighed."""

    name: str
    unlooked: int  # the route's requests since it last ran this target
    samples: int
    censored: bool  # a lower bound is held against its figure
    fastest: float  # its fastest of the newest REACH_SAMPLES samples


def worth(p: Prospect, leading: float) -> float:
    """What a look at ``p`` could win, in weighted requests: unlooked x uncertainty x reach."""
    uncertain = UNCERTAIN if p.samples < MIN_SAMPLES or p.censored else 1.0
    reach = 1.0 + (min(1.0, (leading - p.fastest) / leading) if leading > 0 and p.fastest < leading else 0.0)
    return p.unlooked * uncertain * reach


def worthiest(prospects: Sequence[Prospect], leading: float) -> str | None:
    """The prospect whose look is due (worth at least ``LOOK_AFTER``) and worth most; the first
    written wins a tie."""
    best: tuple[float, str] | None = None
    for p in prospects:
        w = worth(p, leading)
        if w >= LOOK_AFTER and (best is None or w > best[0]):
            best = (w, p.name)
    return None if best is None else best[1]


@lru_cache(maxsize=64)
def _newest_policy(policy: Fastest) -> Fastest:
    return replace(policy, signal="ewma", alpha=1.0)  # an EWMA of weight 1 is the newest sample


def stale(route: Route, targets: Sequence[Target], state: ExploreView, now: float, mode: str,
          figures: Figures) -> str | None:
    """Under a racing route with ``hedge.explore``: the target this request explores, or None.
    A recovery seen once first; then the worthiest look the budget pays for; then the figure
    oldest by the clock past ``hedge.refresh`` (its age counted from the start of the call that
    measured it: from the arrival, a 200 ms target refreshed every 0.3 s is seen every 0.5 s)."""
    hedge = route.hedge
    if hedge is None or not hedge.explore or len(targets) < 2:
        return None  # alone, a target has nobody to race: exploring it would change nothing
    leading = min((f for f in figures.values() if f is not None), default=None)
    newest_policy = _newest_policy(route.fastest)
    oldest: tuple[float, str] | None = None
    behind: list[Target] = []
    budget = state.hedge_budget(route.name)
    for t in targets:
        age = state.age(t.key, now, mode)
        if age is None:
            continue
        fig = figures.get(t.name)
        if fig is not None and fig > (leading or 0.0):
            behind.append(t)  # in flight or not: a look counts from its start (docs/adr/0023, amendment)
        flying = state.in_flight(t.key, mode)
        newest = state.figure(t.key, newest_policy, now, mode)
        if leading is not None and fig is not None and fig > leading and newest is not None and newest < leading \
                and not (flying and _confirming(t, state, budget, mode)):
            return t.name
        if flying:  # one request re-measures it, not every one
            continue
        age += newest or 0.0
        if age > hedge.refresh_secs and (oldest is None or age > oldest[0]):
            oldest = (age, t.name)
    if leading is not None and budget is not None and behind and budget.affords(hedge.max_extra, LOOK_KEEP):
        look = worthiest(_prospects(behind, state, budget, mode), leading)
        if look is not None:
            return look
    return None if oldest is None else oldest[1]


def due(route: Route, order: Sequence[Target], state: ExploreView, mode: str, figures: Figures) -> frozenset[str]:
    """The targets behind the leader whose look is due: a timed hedge that starts one runs it to its
    own first token, since the hedge has paid for the call."""
    if len(order) < 2:
        return frozenset()
    budget = state.hedge_budget(route.name)
    leading = min((f for f in figures.values() if f is not None), default=None)
    if budget is None or leading is None:
        return frozenset()
    behind = [t for t in order if (f := figures.get(t.name)) is not None and f > leading]
    return frozenset(p.name for p in _prospects(behind, state, budget, mode) if worth(p, leading) >= LOOK_AFTER)


def _confirming(target: Target, state: ExploreView, budget: HedgeBudget | None, mode: str) -> bool:
    """Is a look at ``target`` in flight that began after the call of its newest sample (the one that
    showed the recovery)? Then that look confirms it; an older one in flight (begun before the target
    recovered, a slow look still running) tells only of the old moment."""
    looked = None if budget is None else budget.looked_at.get((target.key, mode))
    began = state.began(target.key, mode)
    return looked is None or began is None or looked >= began


def confirming(target: Target, figures: Figures, state: ExploreView, mode: str) -> bool:
    """Is ``target`` explored to confirm a recovery (its newest sample beats every other figure)?
    Such a look may take the token an explore otherwise leaves for a hedge: it is the look most
    likely to change the order, and it is rare in a steady pool."""
    recent = state.recent(target.key, mode)
    others = [f for name, f in figures.items() if name != target.name and f is not None]
    return bool(recent and others and recent[-1] < min(others))


def _prospects(targets: Sequence[Target], state: ExploreView, budget: HedgeBudget, mode: str) -> list[Prospect]:
    """Each target as a look at it is weighed; one unlooked at for fewer requests than a quarter
    of ``LOOK_AFTER`` cannot be due (the most uncertain, farthest-reaching weighs four times)."""
    out: list[Prospect] = []
    for t in targets:
        unlooked = budget.unlooked((t.key, mode))
        if unlooked * UNCERTAIN * 2 < LOOK_AFTER:
            continue
        recent = state.recent(t.key, mode)
        if recent:
            out.append(Prospect(t.name, unlooked, len(recent), state.held(t.key, mode) > 0,
                                min(recent[-REACH_SAMPLES:])))
    return out


__all__ = ["LOOK_AFTER", "LOOK_KEEP", "REACH_SAMPLES", "UNCERTAIN", "ExploreView", "Prospect", "confirming", "due",
           "stale", "worth", "worthiest"]
