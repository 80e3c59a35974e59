"""Ordering: rank the eligible targets. It never adds one back.

Each strategy returns the targets in the order the walker will try them, with
the detail the decision header shows for each: the first item's detail starts
with the word that put it first (``written``, ``weighted``, ``fastest``,
``explore``, ``unmeasured``, ``cheapest``, ``score``).

``fastest`` ranks by a target's figure (its ``signal``), except that a target whose
newest samples say it has become much faster is ranked by them at once: when a
fast EWMA (``RECOVERY_ALPHA``) of its samples is under ``1/RECOVERY_FACTOR`` of the
figure, the fast EWMA stands. A target that is not first is only measured when it
is explored, so a slowly smoothed figure would need many rare samples to show a
recovery. A slower sample never takes this path: a spike moves a figure no more
than its signal lets it (docs/adr/0006).
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Protocol

from ..config import Fastest, Route, Target, TargetKey
from ..state.budget import HedgeBudget
from ..state.tracker import STREAMED
from .decision import PRICE, Ranked
from .explore import stale as explore_now
from .score import ScoreView, score


class FigureView(Protocol):
    def figure(self, key: TargetKey, policy: Fastest, now: float, mode: str = ...) -> float | None: ...


class OrderView(FigureView, ScoreView, Protocol):
    """What ordering reads of the state snapshot."""

    def figures(self, key: TargetKey, policy: Fastest, now: float, mode: str,
                fast_alpha: float) -> tuple[float | None, float | None]: ...

    def in_flight(self, key: TargetKey, mode: str | None = ...) -> int: ...

    def age(self, key: TargetKey, now: float, mode: str = ...) -> float | None: ...

    def load_fit(self, key: TargetKey, mode: str = ...) -> tuple[float, float] | None: ...

    def recent(self, key: TargetKey, mode: str = ...) -> list[float]: ...

    def held(self, key: TargetKey, mode: str = ...) -> int: ...

    def began(self, key: TargetKey, mode: str = ...) -> float | None: ...

    def hedge_budget(self, route: str) -> HedgeBudget | None: ...


Figures = dict[str, float | None]

RECOVERY_ALPHA = 0.8  # mostly the newest sample or two
RECOVERY_FACTOR = 2.0  # a figure halved by them is a recovery, not jitter
RECOVERED_AFTER = 2  # samples in a row that say so stand for the target themselves (docs/adr/0023)


def fastest_figures(targets: Sequence[Target], state: OrderView, policy: Fastest, now: float,
                    mode: str) -> Figures:
    """The figures ``fastest`` ranks by: the signal's, or the fast EWMA where that is under half of it;
    with ``load_fit``, moved along the target's load line to the calls it has in flight now; with
    ``load_aware``, times ``load_penalty`` (the requests the target already has in flight)."""
    fit = policy.load_fit and len(targets) > 1  # a lone target is served at any load: nothing to move
    figures: Figures = {}
    for t in targets:
        figure, recent = state.figures(t.key, policy, now, mode, RECOVERY_ALPHA)
        if figure is not None:
            if recent is not None and recent * RECOVERY_FACTOR < figure:
                figure = _recovered(state.recent(t.key, mode)[-RECOVERED_AFTER:], figure, recent)
            if fit:
                figure += load_fit(policy, state, t.key, mode)
            if policy.load_aware:
                figure *= load_penalty(policy, state.in_flight(t.key))
        figures[t.name] = figure
    return figures


def _recovered(newest: Sequence[float], figure: float, recent: float) -> float:
    """A recovery's figure: the fast EWMA, or, once ``RECOVERED_AFTER`` samples in a row came in under
    half the old figure, the slowest of them: the old figure describes another moment (as two lost
    races in a row demote a leader, docs/adr/0022). From 20x the leader's time, the fast EWMA alone
    needs three samples to lead; a single lucky sample of a jittery target still moves it no more."""
    if len(newest) == RECOVERED_AFTER and max(newest) * RECOVERY_FACTOR < figure:
        return max(newest)
    return recent


def load_fit(policy: Fastest, state: OrderView, key: TargetKey, mode: str) -> float:
    """Seconds the load fit adds to a figure now (negative: fewer calls in flight than its samples
    saw). A figure is the mean of samples taken at the target's usual load; a burst that lands on
    a leader inflates it, and the leader then sits idle behind a figure of a load it no longer has.
    The target's own slope (``state/tracker.py``) says what a call in flight costs it, so a target
    whose time does not grow with load is not penalised, and the correction is never more than
    the figure (the line's value at no load is at least 0)."""
    if not policy.load_fit:
        return 0.0
    fitted = state.load_fit(key, mode)
    if fitted is None:
        return 0.0
    slope, mean_load = fitted
    return policy.load_weight * slope * (max(state.in_flight(key) - mean_load, -mean_load))


def load_penalty(policy: Fastest, in_flight: int) -> float:
    """Peak-EWMA style (Finagle, Linkerd): a figure counts ``1 + load_weight x in_flight`` times,
    so a burst spreads over the pool instead of landing on a leader whose figure is still good."""
    return 1.0 + policy.load_weight * in_flight if policy.load_aware else 1.0


def _ranked(targets: Sequence[Target], first: str, figures: Figures) -> list[Ranked]:
    """The first carries the word that put it first; an unmeasured first shows no figure."""
    ranked: list[Ranked] = []
    for t in targets:  # each built once: the first with its word, the rest bare
        if ranked:
            ranked.append(Ranked(t.name, None, figures[t.name]))
        else:
            ranked.append(Ranked(t.name, first, None if first == "unmeasured" else figures[t.name]))
    return ranked


def weighted(targets: Sequence[Target], rng: random.Random) -> tuple[list[Target], str]:
    """Draw without replacement, each pick proportional to weight; weight-0 targets go last."""
    pool = [t for t in targets if t.weight > 0]
    out: list[Target] = []
    while pool:
        total = sum(t.weight for t in pool)
        point = rng.random() * total
        for i, t in enumerate(pool):
            point -= t.weight
            if point < 0 or i == len(pool) - 1:
                out.append(pool.pop(i))
                break
    out.extend(t for t in targets if t.weight <= 0)
    return out, "weighted"


def fastest(
    targets: Sequence[Target],
    figures: Figures,
    policy: Fastest,
    rng: random.Random | None,
    measuring: Mapping[str, int] = MappingProxyType({}),
    stale: str | None = None,
) -> tuple[list[Target], str]:
    """Unmeasured first (so they get measured), then fastest first; sometimes explore.

    A target in ``measuring`` (unmeasured, an attempt already in flight) is not put first again:
    concurrent requests of a cold start go by the figures that exist, and it goes last. ``stale``
    names a target to explore because its figure is old (only under a race, where exploring is free).
    """
    unmeasured: list[Target] = []
    busy: list[Target] = []  # being measured already
    measured: list[Target] = []
    for t in targets:  # one pass, not three comprehensions: this runs for every request
        if figures[t.name] is not None:
            measured.append(t)
        else:
            (busy if t.name in measuring else unmeasured).append(t)
    if busy:
        busy.sort(key=lambda t: measuring[t.name])  # least in flight first: a cold burst spreads
    if policy.quality_weight > 0:
        w = policy.quality_weight
        target_s = policy.latency_target_ms / 1000.0

        def blended(t: Target) -> tuple[float, float]:
            fig = figures[t.name] or 0.0
            speed = min(1.0, target_s / fig) if fig > 0 else 1.0
            quality = policy.unknown_quality if t.quality is None else t.quality
            return (-((1 - w) * speed + w * quality), fig)

        measured.sort(key=blended)
    elif len(measured) > 1:
        measured.sort(key=lambda t: figures[t.name] or 0.0)
    out = unmeasured + measured + busy
    if unmeasured or not measured:
        return out, "unmeasured"
    if rng is not None and stale is not None and out[0].name != stale:
        out.insert(0, out.pop(next(i for i, t in enumerate(out) if t.name == stale)))
        return out, "explore"
    if rng is not None and len(out) > 1 and policy.explore > 0 and rng.random() < policy.explore:
        pick = 1 + int(rng.random() * (len(out) - 1))
        out.insert(0, out.pop(pick))
        return out, "explore"
    return out, "fastest"


def cheapest(targets: Sequence[Target], figures: Figures) -> tuple[list[Target], str]:
    """Declared input+output price ascending; ties by measured speed; no price last."""

    def key(t: Target) -> tuple[int, float, int, float]:
        fig = figures[t.name]
        price = t.price.total if t.price is not None else 0.0
        return (t.price is None, price, fig is None, fig or 0.0)

    return sorted(targets, key=key), "cheapest"


def order_targets(
    route: Route,
    targets: Sequence[Target],
    state: OrderView,
    now: float,
    rng: random.Random,
    explore: bool = True,
    op: str = "chat",
    mode: str = STREAMED,
) -> tuple[list[Target], list[Ranked]]:
    """Rank ``targets`` by the route's strategy and the figures of the request's ``mode``
    (streamed or buffered); ``explore=False`` is what explain shows."""
    strategy = route.strategy
    if strategy == "fastest":
        figures = fastest_figures(targets, state, route.fastest, now, mode)
    else:
        figures = {t.name: state.figure(t.key, route.fastest, now, mode) for t in targets}
    if strategy == "score":
        return score(route.score, targets, figures, state, op)
    if strategy == "weighted":
        out, first = weighted(targets, rng)
    elif strategy == "fastest":
        measuring = ({t.name: n for t in targets if figures[t.name] is None and (n := state.in_flight(t.key, mode))}
                     if None in figures.values() else {})
        stale = explore_now(route, targets, state, now, mode, figures) if explore else None
        out, first = fastest(targets, figures, route.fastest, rng if explore else None, measuring, stale)
    elif strategy == "cheapest":
        out, first = cheapest(targets, figures)
    else:
        out, first = list(targets), "written"
    if strategy == "cheapest":
        return out, [Ranked(t.name, first if i == 0 else None, None if t.price is None else t.price.total, PRICE)
                     for i, t in enumerate(out)]
    return out, _ranked(out, first, figures)
